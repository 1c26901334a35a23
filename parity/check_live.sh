#!/usr/bin/env bash
# The live parity check: record vLLM's own Scheduler now, synchronous and with async
# scheduling (its AsyncScheduler, driven one step ahead as its engine core drives it),
# require the committed traces of its version to be exactly what it records, and replay
# servesim against the live recordings (the async one with servesim's async scheduling);
# the same for the parallel-sampling (n > 1) configurations of parity/parallel.py.
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
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
for set in main parallel-sampling; do
for mode in sync async; do
  suffix=""; flag=""
  if [ "$set" = parallel-sampling ]; then suffix="-parallel-sampling"; flag="--parallel-sampling"; fi
  if [ "$mode" = async ]; then suffix="$suffix-async"; flag="$flag --async"; fi
  committed="parity/traces/vllm-$version$suffix.jsonl.gz"
  if ! [ -f "$committed" ]; then
    echo "no committed trace for vLLM $version ($committed): record it with" \
         "$venv/bin/python -m parity.record_vllm $flag" >&2
    exit 1
  fi
  live="$out/live$suffix.jsonl.gz"
  "$venv/bin/python" -m parity.record_vllm --no-progress $flag --out "$live"
  if ! cmp -s <(zcat "$live") <(zcat "$committed"); then
    echo "live vLLM $version ($set, $mode) differs from $committed: re-record it" >&2
    diff <(zcat "$live" | cut -c1-200) <(zcat "$committed" | cut -c1-200) | head -20 >&2
    exit 1
  fi
  echo "live vLLM $version ($set, $mode) matches $committed"
  "$python" -m parity.compare --trace "$live" || status=1
done
done
exit $status
