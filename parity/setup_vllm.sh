#!/usr/bin/env bash
# Make a venv with vLLM (0.32.0 unless VLLM_VERSION says) for the parity recorder, reusing a
# CPU torch 2.13.0.
#
#   parity/setup_vllm.sh VENV_DIR [TORCH_PYTHON] [VLLM_VERSION]
#
# TORCH_PYTHON (default: .venv/bin/python) is an interpreter whose torch is 2.13.0, the
# version vLLM 0.32.0 pins; its torch is linked into VENV_DIR rather than installed, and
# nothing is installed with dependencies, so no CUDA torch is ever pulled. The other
# packages are pinned in parity/vllm-requirements.txt. vLLM wants transformers < 5.20,
# which clashes with the test extra: that is why it has a venv of its own.
# VLLM_VERSION: another release to record (e.g. 0.34.0, which pins torch 2.14.0: its
# scheduler runs on the linked 2.13.0 all the same, parity/NOTES.md); the same pinned
# packages, those it needs on top from parity/vllm-requirements-VLLM_VERSION.txt if present.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 3 ]; then
  echo "usage: parity/setup_vllm.sh VENV_DIR [TORCH_PYTHON] [VLLM_VERSION]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
venv="$1"
torch_python="${2:-.venv/bin/python}"
vllm_version="${3:-0.32.0}"
extra_reqs=()
if [ -f "$here/vllm-requirements-$vllm_version.txt" ]; then
  extra_reqs=(-r "$here/vllm-requirements-$vllm_version.txt")
fi
if ! [ -x "$torch_python" ]; then
  echo "TORCH_PYTHON: $torch_python is not an executable python (make the main venv first)" >&2
  exit 2
fi
torch_site="$("$torch_python" - <<'PY'
import os, sys
try:
    import torch
except ImportError:
    sys.exit("TORCH_PYTHON has no torch")
if torch.__version__.split("+")[0] != "2.13.0":
    sys.exit(f"TORCH_PYTHON has torch {torch.__version__}; the recorder links 2.13.0")
print(os.path.dirname(os.path.dirname(torch.__file__)))
PY
)" || exit 2

python3 -m venv "$venv"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# torch comes from the other venv through a folder of links, so that only torch (and not
# that venv's other packages, e.g. a newer transformers) is visible here
mkdir -p "$site/_servesim_torch"
for name in torch torchgen functorch "$(basename "$torch_site"/torch-2.13.0*.dist-info)"; do
  ln -sfn "$torch_site/$name" "$site/_servesim_torch/$name"
done
echo "$site/_servesim_torch" > "$site/_servesim_torch.pth"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps "vllm==$vllm_version" \
  -r "$here/vllm-requirements.txt" "${extra_reqs[@]}" 2>&1 | grep -v "is ignored" || true
HF_HUB_OFFLINE=1 VLLM_USE_V2_MODEL_RUNNER=0 "$venv/bin/python" -W ignore -c \
  'import vllm, vllm.v1.core.sched.scheduler, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
