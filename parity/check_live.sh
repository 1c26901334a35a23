#!/usr/bin/env bash
# The live parity check: record vLLM's own Scheduler now, require the committed trace of its
# version to be exactly what it records, and replay servesim against the live recording on
# every scheduling path (per-request, array, and the default that switches between them).
#
#   parity/check_live.sh VENV_DIR [TORCH_PYTHON]
#
# VENV_DIR is made with parity/setup_vllm.sh when it has no python yet; TORCH_PYTHON (default
# .venv/bin/python, from the repository root) is the main venv's python, which runs servesim.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: parity/check_live.sh VENV_DIR [TORCH_PYTHON]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."
venv="$1"
python="${2:-.venv/bin/python}"
[ -x "$venv/bin/python" ] || parity/setup_vllm.sh "$venv" "$python"
version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')"
committed="parity/traces/vllm-$version.jsonl.gz"
if ! [ -f "$committed" ]; then
  echo "no committed trace for vLLM $version ($committed): record it with" \
       "$venv/bin/python -m parity.record_vllm" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$venv/bin/python" -m parity.record_vllm --no-progress --out "$out/live.jsonl.gz"
if ! cmp -s <(zcat "$out/live.jsonl.gz") <(zcat "$committed"); then
  echo "live vLLM $version differs from $committed: re-record it" >&2
  diff <(zcat "$out/live.jsonl.gz" | cut -c1-200) <(zcat "$committed" | cut -c1-200) \
    | head -20 >&2
  exit 1
fi
echo "live vLLM $version matches $committed"
"$python" -m parity.compare --trace "$out/live.jsonl.gz"
