#!/usr/bin/env bash
# The live parity check: record vLLM 0.32.0's own Scheduler now and require the committed
# trace to be exactly what it records (pytest then checks servesim against that trace).
#
#   parity/check_live.sh VENV_DIR [TORCH_PYTHON]
#
# VENV_DIR is made with parity/setup_vllm.sh when it has no python yet.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: parity/check_live.sh VENV_DIR [TORCH_PYTHON]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
venv="$1"
[ -x "$venv/bin/python" ] || "$here/setup_vllm.sh" "$venv" "${2:-.venv/bin/python}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
(cd "$here/.." && "$venv/bin/python" -m parity.record_vllm --no-progress --out "$out/live.jsonl.gz")
if ! cmp -s <(zcat "$out/live.jsonl.gz") <(zcat "$here/traces/vllm-0.32.0.jsonl.gz"); then
  echo "live vLLM differs from parity/traces/vllm-0.32.0.jsonl.gz: re-record it" >&2
  diff <(zcat "$out/live.jsonl.gz" | cut -c1-200) \
       <(zcat "$here/traces/vllm-0.32.0.jsonl.gz" | cut -c1-200) | head -20 >&2
  exit 1
fi
echo "live vLLM matches the committed trace"
