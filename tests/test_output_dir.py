"""Result directories: checked before the work, locked while it runs (one run each), only
servesim's own files replaced (the manifest), swapped in whole."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sim.results.files.manifest import MANIFEST
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
    assert sorted(os.listdir(target)) == [MANIFEST, "summary.json"]
    assert stage_files(target.parent) == []


def commit_run(target: Path, command: str = "run", force: bool = False, **files: str) -> None:
    with Staging(target, "--out", command, force) as stage:
        write_run(stage.path, **files)
        stage.commit()


def test_a_new_run_replaces_the_old_one_whole(tmp_path: Path) -> None:
    """After `run --timeline 8` then a plain run, the old timeline.csv must be gone."""
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old", "timeline.csv": "old"})
    commit_run(target, **{"summary.json": "new"})
    assert sorted(os.listdir(target)) == [MANIFEST, "summary.json"]
    assert (target / "summary.json").read_text() == "new"
    assert stage_files(tmp_path) == []


@pytest.mark.parametrize("failure", [RuntimeError("crash mid-write"), KeyboardInterrupt()])
def test_a_failed_run_leaves_the_old_result_and_no_partial_directory(
        tmp_path: Path, failure: BaseException) -> None:
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old", "requests.csv": "old"})
    with pytest.raises(type(failure)), Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "half"})
        raise failure
    assert {p.name: p.read_text() for p in target.iterdir() if p.name != MANIFEST} == {
        "summary.json": "old", "requests.csv": "old"}
    assert stage_files(tmp_path) == []  # neither the hidden directory nor the lock file


def test_leaving_without_commit_removes_the_parents_it_made(tmp_path: Path) -> None:
    with Staging(tmp_path / "a" / "b" / "run", "--out"):
        assert (tmp_path / "a" / "b").is_dir()
    assert list(tmp_path.iterdir()) == []


def test_an_empty_directory_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    commit_run(tmp_path / "run", **{"summary.json": "{}"})
    assert sorted(os.listdir(tmp_path / "run")) == [MANIFEST, "summary.json"]


def test_a_directory_of_other_files_is_refused_not_wiped(tmp_path: Path) -> None:
    """`--out .` in a project folder must not delete the project."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match=r"holds 'notes.txt', which servesim did not write "
                                             r"\(the directory has no \.servesim-manifest"):
        Staging(tmp_path, "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_manifest_lists_every_file_with_its_size_and_digest(tmp_path: Path) -> None:
    target = tmp_path / "sweep"
    with Staging(target, "--out", "sweep") as stage:
        write_run(stage.path, **{"sweep.csv": "a,b\n"})
        (stage.path / "runs" / "000").mkdir(parents=True)
        write_run(stage.path / "runs" / "000", **{"summary.json": "{}"})
        stage.commit()
    body = json.loads((target / MANIFEST).read_text())
    assert body["written_by"] == "servesim sweep"
    on_disk = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
    assert set(body["files"]) == on_disk - {MANIFEST}
    for name, entry in body["files"].items():
        data = (target / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_users_file_beside_a_result_is_refused_then_kept_with_force(tmp_path: Path) -> None:
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old", "timeline.csv": "old"})
    (target / "notes.txt").write_text("mine")
    inode = (target / "notes.txt").stat().st_ino
    with pytest.raises(OutputDirError, match=r"holds 'notes.txt', which servesim did not write "
                                             r"\(no \.servesim-manifest\.json there lists it\)"
                                             r";\nchoose another directory, or give --force"):
        Staging(target, "--out")
    assert (target / "timeline.csv").read_text() == "old"  # refused: nothing touched
    commit_run(target, force=True, **{"summary.json": "new"})
    assert sorted(os.listdir(target)) == [MANIFEST, "notes.txt", "summary.json"]
    assert (target / "notes.txt").stat().st_ino == inode  # the same file, never copied
    assert "notes.txt" not in json.loads((target / MANIFEST).read_text())["files"]


def test_a_users_file_inside_a_result_subdirectory_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "sweep"
    with Staging(target, "--out", "sweep") as stage:
        (stage.path / "runs").mkdir()
        write_run(stage.path / "runs", **{"a.csv": "old"})
        stage.commit()
    write_run(target / "runs", **{"notes.txt": "mine"})
    with pytest.raises(OutputDirError, match="holds 'runs/notes.txt'"):
        Staging(target, "--out", "sweep")
    commit_run(target, "sweep", force=True, **{"sweep.csv": "new"})
    assert (target / "runs" / "notes.txt").read_text() == "mine"
    assert not (target / "runs" / "a.csv").exists()


def test_another_commands_result_is_not_replaced_without_force(tmp_path: Path) -> None:
    """`run --out results/compare_x` must not wipe a compare."""
    target = tmp_path / "c"
    commit_run(target, "compare", **{"compare.csv": "x", "compare.md": "x"})
    with pytest.raises(OutputDirError, match=r"holds a `servesim compare` result, which "
                                             r"`servesim run` does not replace"):
        Staging(target, "--out", "run")
    assert (target / "compare.csv").read_text() == "x"
    commit_run(target, "compare", **{"compare.csv": "y"})  # the same command may
    commit_run(target, "run", force=True, **{"summary.json": "z"})
    assert sorted(os.listdir(target)) == [MANIFEST, "summary.json"]


def test_a_file_added_while_the_run_works_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    with Staging(target, "--out") as stage:
        write_run(target, **{"notes.txt": "written meanwhile"})
        write_run(stage.path, **{"summary.json": "new"})
        stage.commit()
    assert (target / "notes.txt").read_text() == "written meanwhile"
    assert stage.kept == ["notes.txt"]


def test_check_output_dir_can_check_what_a_replace_would_meet(tmp_path: Path) -> None:
    commit_run(tmp_path / "run", **{"summary.json": "x", "plot.png": "x"})
    check_output_dir(tmp_path / "run", "--out", replace=True, command="run")
    with pytest.raises(OutputDirError, match="`servesim run` result"):
        check_output_dir(tmp_path / "run", "--out", replace=True, command="plan")


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


# -- one run per directory: the lock ---------------------------------------------------

def test_a_second_run_into_a_locked_directory_fails_at_once_naming_the_first(
        tmp_path: Path) -> None:
    target = tmp_path / "run"
    with Staging(target, "--out") as first:
        with pytest.raises(OutputDirError, match=rf"^--out '.*run': in use by another servesim "
                                                 rf"run \(pid {os.getpid()}, `servesim[^`]*`, "
                                                 r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)"):
            Staging(target, "--out")
        write_run(first.path, **{"summary.json": "first"})
        first.commit()
    assert (target / "summary.json").read_text() == "first"  # the refused run took nothing
    assert stage_files(tmp_path) == []  # the lock file goes with its holder
    commit_run(target, **{"summary.json": "third"})  # free again


def test_a_lock_file_left_by_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    """`kill -9` leaves the file but the kernel drops the lock with the process."""
    (tmp_path / ".servesim-lock-run").write_text('{"pid": 1, "command": "x"')
    commit_run(tmp_path / "run", **{"summary.json": "new"})
    assert stage_files(tmp_path) == []


HOLD = """
import sys
from pathlib import Path
from sim.results.files.dir_lock import DirLock
target, sys.argv = Path(sys.argv[1]), ["/bin/servesim", "run", "--out", "x"]
lock = DirLock(target)
print("held", flush=True)
sys.stdin.readline()
"""


def test_the_lock_is_another_processs_until_that_process_dies(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    target = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(target)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(OutputDirError, match=rf"in use by another servesim run \(pid "
                                                 rf"{holder.pid}, `servesim run --out x`"):
            Staging(target, "--out")
        holder.send_signal(signal.SIGKILL)  # as `kill -9`: no clean-up of its own
        holder.wait(timeout=30)
        commit_run(target, **{"summary.json": "mine"})
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert stage_files(tmp_path) == []


def test_a_lock_file_deleted_under_a_new_holder_is_locked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run may lock the file its last holder deletes a moment later: it must notice that
    it holds a file no longer at the path, or two runs would both hold the directory."""
    import fcntl

    from sim.results.files import dir_lock

    real_flock, calls = fcntl.flock, []

    def flock_then_holder_deletes(fd: int, how: int) -> None:
        real_flock(fd, how)
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(tmp_path / ".servesim-lock-run")

    monkeypatch.setattr(dir_lock.fcntl, "flock", flock_then_holder_deletes)
    lock = dir_lock.DirLock(tmp_path / "run")
    assert len(calls) == 2 and lock.held
    assert os.stat(lock.path).st_ino == os.fstat(calls[1]).st_ino
    lock.release()
    assert not lock.path.exists()


def test_a_long_directory_name_gets_a_hashed_lock_name(tmp_path: Path) -> None:
    from sim.results.files.dir_lock import lock_path

    assert lock_path(tmp_path / "run").name == ".servesim-lock-run"
    long = lock_path(tmp_path / ("x" * 250))
    assert len(long.name) < 255 and long.name != lock_path(tmp_path / ("x" * 249)).name


# -- the swap --------------------------------------------------------------------------

@pytest.mark.parametrize("exchange", [True, False], ids=["one-step", "two-renames"])
def test_both_swaps_put_the_new_run_in_and_leave_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    import sim.results.files.output_dir as output_dir

    if not exchange:
        monkeypatch.setattr(output_dir, "exchange", lambda a, b: False)
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old", "timeline.csv": "old"})
    commit_run(target, **{"summary.json": "new"})
    assert (target / "summary.json").read_text() == "new"
    assert not (target / "timeline.csv").exists()
    assert stage_files(tmp_path) == []


def test_a_failed_second_rename_puts_the_old_run_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.results.files.output_dir as output_dir

    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    monkeypatch.setattr(output_dir, "exchange", lambda a, b: False)
    real_rename = os.rename

    def second_fails(src: object, dst: object) -> None:
        if Path(str(dst)) == target and Path(str(src)).name.startswith(".servesim-") and \
                not Path(str(src)).name.startswith(".servesim-old-"):
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(output_dir.os, "rename", second_fails)
    with pytest.raises(OutputDirError, match="cannot put the new result in place: No space "
                                             "left on device; the old result is untouched"), \
            Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "new"})
        stage.commit()
    assert (target / "summary.json").read_text() == "old"
    assert stage_files(tmp_path) == []


# -- through the command line ----------------------------------------------------------

def servesim(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from sim.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().err


def test_run_refuses_a_users_file_then_keeps_it_with_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    tiny = ("run", "--set", "workload.num_requests=20", "--out", str(out), "--quiet",
            "--no-plots")
    assert servesim(capsys, *tiny)[0] == 0
    written = json.loads((out / MANIFEST).read_text())["files"]
    assert "summary.json" in written and "requests.csv" in written
    (out / "notes.txt").write_text("mine")
    code, err = servesim(capsys, *tiny)
    assert code == 2 and err.startswith(f"error: --out {str(out)!r}: holds 'notes.txt'"), err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3
    code, err = servesim(capsys, *tiny, "--force")
    assert code == 0 and "kept 'notes.txt'" in err, err
    assert (out / "notes.txt").read_text() == "mine"


def test_run_does_not_wipe_a_compare_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.results.files.manifest import write_manifest

    out = tmp_path / "compare_x"
    out.mkdir()
    (out / "compare.csv").write_text("rate\n1\n")
    write_manifest(out, "compare")
    code, err = servesim(capsys, "run", "--set", "workload.num_requests=20", "--out", str(out),
                         "--quiet", "--no-plots")
    assert code == 2 and "holds a `servesim compare` result" in err, err
    assert (out / "compare.csv").read_text() == "rate\n1\n"


WRITERS = (["run"], ["compare"], ["sweep"], ["plan"], ["engine", "replay"], ["serve"],
           ["load"], ["calibrate", "validate"])


@pytest.mark.parametrize("command", WRITERS, ids=" ".join)
def test_every_command_that_writes_a_directory_explains_force(command: list[str]) -> None:
    import argparse

    from sim.cli import build_parser

    parser: argparse.ArgumentParser = build_parser(command[0])
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    text = " ".join(parser.format_help().split())
    assert "--force" in text and ".servesim-manifest.json" in text
    force = next(a for a in parser._actions if "--force" in a.option_strings)
    assert (force.dest, force.default, force.const) == ("force", False, True)


def test_exchange_swaps_two_directories_in_one_step(tmp_path: Path) -> None:
    from sim.results.files.swap import exchange

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_run(tmp_path / "a", x="a")
    write_run(tmp_path / "b", y="b")
    if not exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this system or file system cannot swap two names in one step")
    assert os.listdir(tmp_path / "a") == ["y"] and os.listdir(tmp_path / "b") == ["x"]


def manifest_of(directory: Path) -> dict:
    return json.loads((directory / MANIFEST).read_text())


def test_an_adding_writer_keeps_every_old_file_and_extends_the_manifest(tmp_path: Path) -> None:
    """calibrate fit adds fit.json to a table: nothing of the old directory goes, the old
    fit.json is replaced by name, and the manifest keeps the table's command."""
    table = tmp_path / "table"
    commit_run(table, "calibrate profile", **{"measurements.csv": "m", "fit.json": "old"})
    write_run(table, **{"notes.txt": "mine"})
    with Staging(table, "DIR", "calibrate fit", adds=True) as stage:  # no --force needed
        write_run(stage.path, **{"fit.json": "new"})
        stage.commit()
    assert sorted(os.listdir(table)) == [MANIFEST, "fit.json", "measurements.csv", "notes.txt"]
    assert (table / "fit.json").read_text() == "new"
    assert (table / "notes.txt").read_text() == "mine"
    body = manifest_of(table)
    assert body["written_by"] == "servesim calibrate profile"
    assert sorted(body["files"]) == ["fit.json", "measurements.csv"]  # not the user's file
    assert body["files"]["fit.json"]["sha256"] == hashlib.sha256(b"new").hexdigest()
    assert stage_files(tmp_path) == []
    commit_run(table, "calibrate profile", True, **{"measurements.csv": "again"})  # re-profile
    assert sorted(os.listdir(table)) == [MANIFEST, "measurements.csv", "notes.txt"]


def test_an_adding_writer_into_a_table_without_a_manifest_lists_only_its_files(
        tmp_path: Path) -> None:
    table = tmp_path / "table"
    table.mkdir()
    write_run(table, **{"measurements.csv": "by hand"})
    with Staging(table, "DIR", "calibrate fit", adds=True) as stage:
        write_run(stage.path, **{"fit.json": "f"})
        stage.commit()
    body = manifest_of(table)
    assert body["written_by"] == "servesim calibrate fit" and list(body["files"]) == ["fit.json"]
    assert (table / "measurements.csv").read_text() == "by hand"
    with pytest.raises(OutputDirError, match="--force"):  # measurements.csv is not servesim's
        Staging(table, "--out", "calibrate profile")


def test_an_adding_writer_that_fails_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    table = tmp_path / "table"
    commit_run(table, "calibrate import", **{"fit.json": "old"})
    before = {name: (table / name).read_bytes() for name in os.listdir(table)}
    with pytest.raises(RuntimeError), Staging(table, "DIR", "calibrate fit", adds=True) as stage:
        write_run(stage.path, **{"fit.json": "half"})
        raise RuntimeError("the fit failed")
    assert {name: (table / name).read_bytes() for name in os.listdir(table)} == before
    assert stage_files(tmp_path) == []


def test_staged_and_adding_writers_hold_the_same_lock(tmp_path: Path) -> None:
    table = tmp_path / "tables" / "cpu"
    with Staging(table, "--out", "calibrate profile"):
        with pytest.raises(OutputDirError, match="in use by another servesim run"):
            Staging(table, "DIR", "calibrate fit", adds=True)
        with pytest.raises(OutputDirError, match="in use by another servesim run"):
            Staging(table, "--out", "calibrate profile")
    assert not (tmp_path / "tables").exists()  # nothing committed: the parents it made go


def test_calibrate_fit_goes_through_staging(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from calibrate.profile.synthetic import write_synthetic_table
    from sim.cli import main
    from sim.config.catalogue import get_model

    table = write_synthetic_table(tmp_path / "t", get_model("tiny"), noise_cv=0.03)
    (table / "notes.txt").write_text("mine")
    with Staging(table, "--out", "calibrate profile", True):  # another writer holds it
        assert main(["calibrate", "fit", str(table)]) == 2
        assert "DIR" in capsys.readouterr().err and not (table / "fit.json").exists()
    assert main(["calibrate", "fit", str(table)]) == 0
    assert sorted(os.listdir(table)) == sorted(
        [MANIFEST, "fit.json", "measurements.csv", "metadata.json", "notes.txt"])
    assert sorted(manifest_of(table)["files"]) == ["fit.json"]
    assert stage_files(tmp_path) == []


def test_calibrate_profile_and_import_refuse_a_users_directory_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    out = tmp_path / "table"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu",
                 "--out", str(out)]) == 2
    assert "'notes.txt', which servesim did not write" in capsys.readouterr().err
    assert main(["calibrate", "import", "vidur", str(tmp_path / "none"), "--model", "tiny",
                 "--gpu", "a100-80gb", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert os.listdir(out) == ["notes.txt"] and stage_files(tmp_path) == []


def test_calibrate_profile_locks_an_outside_fidelity_out_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    scenario = Path(__file__).parent.parent / "scenarios" / "calibrate_cpu.yaml"
    report = tmp_path / "reports" / "f"
    with Staging(report, "--out", "calibrate validate"):  # a validate writing there
        assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu",
                     "--out", str(tmp_path / "t"), "--validate", str(scenario),
                     "--fidelity-out", str(report), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--fidelity-out" in err and "in use by another servesim run" in err
    assert sorted(os.listdir(tmp_path)) == []  # the table's staging went too


def test_ctrl_c_during_the_swap_waits_for_it_and_leaves_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    import sim.results.files.output_dir as output_dir
    from sim.results.files.swap import exchange

    def ctrl_c_then_exchange(a: Path, b: Path) -> bool:
        os.kill(os.getpid(), signal.SIGINT)
        return exchange(a, b)

    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    monkeypatch.setattr(output_dir, "exchange", ctrl_c_then_exchange)
    with pytest.raises(KeyboardInterrupt), Staging(target, "--out") as stage:
        write_run(stage.path, **{"summary.json": "new"})
        stage.commit()
    assert (target / "summary.json").read_text() == "new"  # the swap and clean-up finished
    assert stage_files(tmp_path) == []


def test_ctrl_c_while_keeping_a_users_files_leaves_the_old_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.results.files.output_dir as output_dir
    from sim.results.files.manifest import keep_others

    def keep_then_ctrl_c(old: Path, new: Path, manifest: object) -> list[str]:
        keep_others(old, new, manifest)  # type: ignore[arg-type]
        raise KeyboardInterrupt

    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    write_run(target, **{"notes.txt": "mine"})
    monkeypatch.setattr(output_dir, "keep_others", keep_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt), Staging(target, "--out", force=True) as stage:
        write_run(stage.path, **{"summary.json": "new"})
        stage.commit()
    assert (target / "summary.json").read_text() == "old"
    assert (target / "notes.txt").read_text() == "mine"
    assert stage_files(tmp_path) == []


def test_what_a_killed_run_left_is_cleared_by_the_next_run_into_the_target(
        tmp_path: Path) -> None:
    """`kill -9` mid-run leaves its hidden directory; mid-swap (two renames) the old run
    aside with no target. The next run into the same target clears the first and puts the
    second back; a neighbour's hidden directories are not its business."""
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    dead = tmp_path / ".servesim-stage-run-0badc0de"
    dead.mkdir()
    neighbour = tmp_path / ".servesim-stage-run-b-0badc0de"  # target `run-b`'s, alive
    neighbour.mkdir()
    with Staging(target, "--out") as stage:
        assert not dead.exists() and neighbour.exists()
        stage.commit()
    aside = tmp_path / ".servesim-old-run-0badc0de"
    target.rename(aside)  # killed between `old aside` and `new in`
    with Staging(target, "--out") as stage:
        assert (target / MANIFEST).is_file()  # put back before anything looks at it
    assert stage_files(tmp_path) == [neighbour.name]


def test_an_unreadable_manifest_proves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "run"
    commit_run(target, **{"summary.json": "old"})
    (target / MANIFEST).write_text('{"format": 1, "written_by": "servesim run", "fi')
    with pytest.raises(OutputDirError, match=r"holds 'summary.json', which servesim did not "
                                             r"write \(its \.servesim-manifest\.json cannot be "
                                             r"read\)"):
        Staging(target, "--out")


TINY_CPU_SCENARIO = """
name: tiny_cpu
seed: 1
model: tiny
hardware:
  gpu: {name: cpu-host, bf16_flops_per_s: 5.0e10, memory_bytes: 268435456,
        memory_bandwidth_bytes_per_s: 1.0e10, interconnect_bandwidth_bytes_per_s: 1.0e10,
        host_link_bandwidth_bytes_per_s: 1.0e10}
  memory_utilization: 0.5
scheduler: {policy: continuous, max_num_seqs: 8, max_num_batched_tokens: 256,
            max_model_len: 512}
kv: {block_size: 16}
engine: {device: cpu, dtype: float32}
workload:
  arrivals: {process: poisson, rate: 6.0}
  prompt_tokens: {dist: lognormal, mean: 64, cv: 0.5, min: 4, max: 240}
  output_tokens: {dist: lognormal, mean: 8, cv: 0.5, min: 2, max: 16}
  num_requests: 6
"""


def test_calibrate_profile_stages_the_table_and_an_outside_report_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both land whole, each with its manifest, and the report names the table where it
    lies after the swap, not where it was staged."""
    from sim.cli import main

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_CPU_SCENARIO)
    table, report = tmp_path / "tables" / "t", tmp_path / "reports" / "f"
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(table), "--budget-s", "1", "--passes", "2", "--repeats", "2",
                 "--max-num-batched-tokens", "256", "--max-num-seqs", "8",
                 "--max-model-len", "512", "--quiet", "--validate", str(scenario),
                 "--fidelity-out", str(report)]) == 0
    assert f"wrote the table to {table}/" in capsys.readouterr().out
    assert manifest_of(table)["written_by"] == "servesim calibrate profile"
    assert {"fit.json", "measurements.csv", "metadata.json"} <= set(manifest_of(table)["files"])
    assert manifest_of(report)["written_by"] == "servesim calibrate validate"
    body = json.loads((report / "fidelity.json").read_text())
    assert (report / body["table"]).resolve() == table.resolve()
    assert "`t`" in (report / "fidelity.md").read_text()  # the table's name, not the stage's
    assert stage_files(tmp_path / "tables") == [] and stage_files(tmp_path / "reports") == []
