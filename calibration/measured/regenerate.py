"""Rebuild calibration/measured/ from fetched git checkouts of the three source projects.

A maintainer's tool, never run by tests or users: it reads each project at a
pinned commit (`git show COMMIT:PATH`, so any clone or bare mirror will do),
keeps only the columns servesim uses, and writes each source's trimmed CSVs
beside that project's licence and a PROVENANCE.md naming repository, commit,
file, blob and the date read.

    python calibration/measured/regenerate.py --vidur DIR --llmservingsim DIR \\
        --inference-sim DIR [--out calibration/measured] [--date YYYY-MM-DD]

A source whose directory is not given is left as it is.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Pick:
    """One upstream file: where it is, where its trimmed copy goes, how it is trimmed."""

    commit: str
    path: str
    out: str
    trim: Callable[[pd.DataFrame], pd.DataFrame]
    note: str


def _git_show(repo: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"],
                          check=True, capture_output=True).stdout


def _blob(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout.strip()


def _ls(repo: Path, commit: str, prefix: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit,
                          prefix], check=True, capture_output=True, text=True).stdout
    return sorted(out.split())


def _columns(*names: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda df: df.loc[:, list(names)]


# ---------------------------------------------------------------- Vidur (MIT)
VIDUR_REPO = "microsoft/vidur"
VIDUR_HEAD = "7d47513363ec447a741ac5e47241580b47724fbf"  # main, 2024-11-19
# The only attention.csv whose content the history still holds (later ones are
# 10 MB files kept outside git); one A100 shape (8192 hidden, 64 q / 8 kv heads, TP2).
VIDUR_OLD_ATTENTION = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"  # 2024-05-08
VIDUR_OLD_CPU = "57720caf01edae3e5e7391581266e57c258e97dd"  # 2024-05-14, last with this file
VIDUR_MLP_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                 "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
VIDUR_MLP_KEYS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                  "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers")
VIDUR_DEVICES = ("a100", "h100")  # a40 left out: servesim has no A40
# Layer counts are not in mlp.csv; these are the models' published configs.
VIDUR_LAYERS = {"Qwen/Qwen-72B": 80, "codellama/CodeLlama-34b-Instruct-hf": 48,
                "internlm/internlm-20b": 60, "meta-llama/Llama-2-70b-hf": 80,
                "meta-llama/Llama-2-7b-hf": 32, "meta-llama/Meta-Llama-3-70B": 80,
                "meta-llama/Meta-Llama-3-8B": 32, "microsoft/phi-2": 32}
VIDUR_NETWORK = ("a100_dgx", "a100_pairwise_nvlink", "h100_dgx", "h100_pairwise_nvlink")


def _vidur_mlp(df: pd.DataFrame) -> pd.DataFrame:
    """Median per op; an op the model lacks (phi-2's post-attention norm) has no column."""
    ops = [f"time_stats.{op}.median" for op in VIDUR_MLP_OPS]
    return df.loc[:, [c for c in ops if c in df.columns] + list(VIDUR_MLP_KEYS)]


def _vidur_attention(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "is_prefill",
            "batch_size", "prefill_chunk_size", "kv_cache_size"]
    for key, value in {"block_size": 16, "max_model_len": 4096,
                       "attention_backend": "AttentionBackend.FLASH_ATTENTION"}.items():
        if set(df[key]) != {value}:
            raise SystemExit(f"attention.csv: {key} is not constant {value!r}")
    return df.loc[:, keys + ["time_stats.attn_decode.median", "time_stats.attn_prefill.median"]]


def _network(kind: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def trim(df: pd.DataFrame) -> pd.DataFrame:
        if set(df["rank"]) != {0}:
            raise SystemExit(f"{kind}: rows of ranks other than 0")
        return df.loc[:, ["num_workers", "devices_per_node", "size",
                          f"time_stats.{kind}.median"]]
    return trim


def vidur_picks(repo: Path) -> list[Pick]:
    picks = []
    for device in VIDUR_DEVICES:
        for path in _ls(repo, VIDUR_HEAD, f"data/profiling/compute/{device}/"):
            if path.endswith("/mlp.csv"):
                picks.append(Pick(VIDUR_HEAD, path, path.removeprefix("data/profiling/"),
                                  _vidur_mlp, "per-op median ms and the shape keys"))
    for node in VIDUR_NETWORK:
        for kind in ("all_reduce", "send_recv"):
            path = f"data/profiling/network/{node}/{kind}.csv"
            picks.append(Pick(VIDUR_HEAD, path, path.removeprefix("data/profiling/"),
                              _network(kind), "median ms by workers, devices per node, bytes"))
    picks.append(Pick(VIDUR_OLD_ATTENTION, "data/profiling/a100/attention.csv",
                      "attention/a100/attention.csv", _vidur_attention,
                      "decode/prefill median ms and their keys; block_size 16, max_model_len "
                      "4096, FlashAttention backend checked constant and dropped"))
    picks.append(Pick(VIDUR_OLD_CPU, "data/profiling/a100/cpu_overheads.csv",
                      "cpu_overheads/a100/cpu_overheads.csv",
                      lambda df: df.drop(columns=df.columns[0]), "unnamed index column dropped"))
    return picks


def vidur_models(out: Path) -> None:
    """Layer counts per model, which mlp.csv lacks; the loader checks the rest."""
    rows = [{"model": model, "num_layers": layers} for model, layers in VIDUR_LAYERS.items()]
    pd.DataFrame(rows).to_csv(out / "models.csv", index=False)


# --------------------------------------------------------- LLMServingSim (MIT)
LSS_REPO = "casys-kaist/LLMServingSim"
LSS_COMMIT = "5f18d86bf100a3d50b012693c2efd1064268ab9a"  # main, 2026-05-29, last with v0 H100
LSS_PROFILES = (("meta-llama/Llama-3.1-8B", 1), ("meta-llama/Llama-3.1-8B", 2),
                ("meta-llama/Llama-3.1-70B", 1), ("meta-llama/Llama-3.1-70B", 2),
                ("meta-llama/Llama-3.1-70B", 4))
# Shapes from each model's config.json (LLMServingSim's layers.csv names none).
LSS_MODELS = [
    {"model": "meta-llama/Llama-3.1-8B", "num_layers": 32, "hidden": 4096, "heads": 32,
     "kv_heads": 8, "head_dim": 128, "intermediate": 14336, "vocab": 128256, "gated": True},
    {"model": "meta-llama/Llama-3.1-70B", "num_layers": 80, "hidden": 8192, "heads": 64,
     "kv_heads": 8, "head_dim": 128, "intermediate": 28672, "vocab": 128256, "gated": True},
]


def _lss_wide(df: pd.DataFrame) -> pd.DataFrame:
    """Long (layer, tokens) rows -> one row per token count, one ns column per layer."""
    if set(df["kv_cache"]) != {0} or df["tp_size"].nunique() != 1:
        raise SystemExit("layers.csv: kv_cache not all 0 or several tp sizes")
    wide = df.pivot(index="input", columns="layer_name", values="latency(ns)")
    wide.columns = [f"{name}_ns" for name in wide.columns]
    wide.insert(0, "tp_size", int(df["tp_size"].iloc[0]))
    return wide.reset_index().rename(columns={"input": "num_tokens"})


def lss_picks(repo: Path) -> list[Pick]:
    picks = []
    for model, tp in LSS_PROFILES:
        path = f"profiler/v0/perf_models/H100/{model}/tp{tp}/layers.csv"
        picks.append(Pick(LSS_COMMIT, path, f"H100/{model}/tp{tp}/layers.csv", _lss_wide,
                          "pivoted to one row per token count, one latency(ns) column per "
                          "layer; kv_cache (all 0) dropped"))
    return picks


# ------------------------------------------------ inference-sim / BLIS (Apache-2.0)
IS_REPO = "inference-sim/inference-sim"
# bench_data/ lives on branch roofline-go-and-hypotheses only.
IS_COMMIT = "a410740f69ca0c7a8843b4800f402e2777636f58"  # 2026-02-26


def is_picks(repo: Path) -> list[Pick]:
    picks = [Pick(IS_COMMIT, "bench_data/gemm/h100/data.csv", "gemm/h100/data.csv",
                  _columns("m", "k", "n", "latency_us"), "mfu (derived) dropped")]
    for path in _ls(repo, IS_COMMIT, "bench_data/mha/"):
        if "/h100/" not in path:
            continue
        trim = (_columns("dtype", "kv_dtype", "batch_size", "kv_len", "latency_us")
                if "/decode/" in path else _columns("dtype", "seq_len", "latency_us"))
        picks.append(Pick(IS_COMMIT, path, path.removeprefix("bench_data/"), trim,
                          "mfu (derived) dropped"))
    return picks


# ---------------------------------------------------------------- writing
def _write_source(name: str, repo_name: str, licence: str, repo: Path, picks: list[Pick],
                  out: Path, date: str, extra: Callable[[Path], None] | None = None) -> None:
    dest = out / name
    dest.mkdir(parents=True, exist_ok=True)
    rows = []
    for pick in picks:
        df = pick.trim(pd.read_csv(io.BytesIO(_git_show(repo, pick.commit, pick.path))))
        target = dest / pick.out
        target.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(target, index=False)
        rows.append(f"| `{pick.out}` | `{pick.path}` | `{pick.commit[:12]}` | "
                    f"`{_blob(repo, pick.commit, pick.path)[:12]}` | {len(df)} | {pick.note} |")
    licence_commit = picks[0].commit
    (dest / "LICENSE").write_bytes(_git_show(repo, licence_commit, "LICENSE"))
    if extra is not None:
        extra(dest)
    commits = sorted({p.commit for p in picks})
    text = [f"# {name}: provenance", "",
            f"- repository: https://github.com/{repo_name} ({licence}; its LICENSE file, "
            f"from commit `{licence_commit}`, is beside this one)",
            f"- commits read: {', '.join(f'`{c}`' for c in commits)}",
            f"- date read: {date}",
            "- regenerate: `python calibration/measured/regenerate.py` (see its docstring)",
            "", "Every file is a trimmed copy: the rows as published, only the columns that "
            "servesim uses (unless the note says otherwise).", "",
            "| file here | upstream path | commit | blob | rows | trimmed |",
            "| --- | --- | --- | --- | ---: | --- |", *rows, ""]
    (dest / "PROVENANCE.md").write_text("\n".join(text))
    print(f"{name}: {len(picks)} files -> {dest}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, help="git dir or clone of microsoft/vidur")
    parser.add_argument("--llmservingsim", type=Path, help="... of casys-kaist/LLMServingSim")
    parser.add_argument("--inference-sim", type=Path, help="... of inference-sim/inference-sim")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--date", default=dt.date.today().isoformat(), help="date read")
    args = parser.parse_args(argv)
    if not (args.vidur or args.llmservingsim or args.inference_sim):
        parser.error("name at least one of --vidur, --llmservingsim, --inference-sim")
    if args.vidur:
        _write_source("vidur", VIDUR_REPO, "MIT", args.vidur, vidur_picks(args.vidur),
                      args.out, args.date, vidur_models)
    if args.llmservingsim:
        _write_source("llmservingsim", LSS_REPO, "MIT", args.llmservingsim,
                      lss_picks(args.llmservingsim), args.out, args.date,
                      lambda d: pd.DataFrame(LSS_MODELS).to_csv(d / "models.csv", index=False))
    if args.inference_sim:
        _write_source("inference_sim", IS_REPO, "Apache-2.0", args.inference_sim,
                      is_picks(args.inference_sim), args.out, args.date)
    return 0


if __name__ == "__main__":
    sys.exit(main())
