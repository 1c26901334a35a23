"""Result directories: checked before the work, one run each, swapped in whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.results.files.output_dir import OutputDirError, Staging, check_output_dir, variant_dir


def stage_files(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".servesim-"))


def write_run(directory: Path, **files: str) -> None:
    for name, text in files.items():
        (directory / name).write_text(text)


def test_a_new_directory_appears_only_on_commit(tmp_path: Path) -> None:
    target = tmp_path / "results" / "run"
    with Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "{}"})
        assert not target.exists()  # nothing at the target while the run is written
        stage.commit()
    assert sorted(os.listdir(target)) == ["summary.json"]
    assert stage_files(target.parent) == []


def test_a_new_run_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """After `run --timeline 8` then a plain run, the old timeline.csv must be gone."""
    target = tmp_path / "run"
    target.mkdir()
    write_run(target, **{"summary.json": "old", "timeline.csv": "old"})
    with Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "new"})
        stage.commit()
    assert sorted(os.listdir(target)) == ["summary.json"]
    assert (target / "summary.json").read_text() == "new"
    assert stage_files(tmp_path) == []


@pytest.mark.parametrize("failure", [RuntimeError("crash mid-write"), KeyboardInterrupt()])
def test_a_failed_run_leaves_the_old_result_and_no_partial_directory(
        tmp_path: Path, failure: BaseException) -> None:
    target = tmp_path / "run"
    target.mkdir()
    write_run(target, **{"summary.json": "old", "requests.csv": "old"})
    with pytest.raises(type(failure)), Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "half"})
        raise failure
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "summary.json": "old", "requests.csv": "old"}
    assert stage_files(tmp_path) == []


def test_leaving_without_commit_removes_the_parents_it_made(tmp_path: Path) -> None:
    with Staging(tmp_path / "a" / "b" / "run", "--out"):
        assert (tmp_path / "a" / "b").is_dir()
    assert list(tmp_path.iterdir()) == []


def test_an_empty_directory_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with Staging(tmp_path / "run", "--out") as stage:
        write_run(stage.path, **{"summary.json": "{}"})
        stage.commit()
    assert os.listdir(tmp_path / "run") == ["summary.json"]


def test_a_directory_of_other_files_is_refused_not_wiped(tmp_path: Path) -> None:
    """`--out .` in a project folder must not delete the project."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="not a servesim result"):
        Staging(tmp_path, "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("marker", ["summary.json", "compare.csv", "sweep.csv"])
def test_every_kind_of_result_may_be_replaced(tmp_path: Path, marker: str) -> None:
    write_run(tmp_path, **{marker: "x", "plot.png": "x"})
    check_output_dir(tmp_path, "--out", replace=True)


def test_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputDirError, match=r"^--out '.*f': is a file, not a directory"):
        check_output_dir(tmp_path / "f", "--out")
    with pytest.raises(OutputDirError, match="is a file, so no directory can be made inside"):
        check_output_dir(tmp_path / "f" / "run", "--out")


def test_a_name_too_long_for_the_file_system(tmp_path: Path) -> None:
    with pytest.raises(OutputDirError, match="is 300 bytes long; this file system allows"):
        check_output_dir(tmp_path / ("x" * 300) / "run", "output.dir")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_directory_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputDirError, match="not writable"):
            check_output_dir(locked / "run", "--out")
    finally:
        locked.chmod(0o700)


def test_an_os_refusal_when_creating_is_a_user_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What the checks cannot see (a read-only mount, a quota) still ends in one message."""

    def refuse(path: object, mode: int = 0o777) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(OutputDirError, match="cannot create it: Permission denied"):
        Staging(tmp_path / "run", "--out")


def test_each_variant_has_its_own_directory() -> None:
    plain = variant_dir("routing")
    aware = variant_dir("routing", ["router.policy=prefix_aware"])
    least = variant_dir("routing", ["router.policy = least_kv"])
    assert plain == Path("results/routing")
    assert aware == Path("results/routing+router.policy=prefix_aware")
    assert len({plain, aware, least}) == 3
    assert variant_dir("x", ["trace.path=a/b c"]).name == "x+trace.path=a_b_c"  # one directory


def test_long_override_lists_end_in_a_hash_that_keeps_them_apart() -> None:
    many = [f"scheduler.field_{i}={i}" for i in range(20)]
    other = [*many[:-1], "scheduler.field_19=20"]
    name, other_name = variant_dir("q", many).name, variant_dir("q", other).name
    assert len(name) < 200 and name != other_name


def test_ctrl_c_while_the_hidden_directory_is_made_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt lands right after the directory exists (as a user's Ctrl-C may): it waits
    until the clean-up is registered, so the directory goes with the dropped Staging."""
    import gc
    import os
    import signal

    import sim.results.files.output_dir as output_dir

    real_mkdir = os.mkdir

    def mkdir_then_ctrl_c(path: object, *args: object) -> None:
        real_mkdir(path, *args)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(output_dir.os, "mkdir", mkdir_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        output_dir.Staging(tmp_path / "run", "--out")
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_waits_too_while_another_thread_is_alive(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a second thread alive (a progress bar's monitor, say) the kernel may hand the
    process its SIGINT through that thread; the held block must still not be cut."""
    import os
    import signal
    import threading

    import sim.results.files.output_dir as output_dir

    real_mkdir = os.mkdir
    seen: list[bool] = []

    def mkdir_then_ctrl_c(path: object, *args: object) -> None:
        real_mkdir(path, *args)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # Python checks for handlers between bytecodes here
            pass
        seen.append(True)  # reached: the interrupt waited

    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    monkeypatch.setattr(output_dir.os, "mkdir", mkdir_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            output_dir.Staging(tmp_path / "run", "--out")
    finally:
        release.set()
        other.join()
    assert seen == [True]
    assert list(tmp_path.iterdir()) == []


def test_a_staging_dropped_before_its_block_removes_its_directory(tmp_path: Path) -> None:
    import gc

    stage = Staging(tmp_path / "run", "--out")
    assert stage.path.is_dir()
    del stage
    gc.collect()
    assert list(tmp_path.iterdir()) == []
