#!/usr/bin/env bash
# GPU smoke test of the FLUX.1 / SD3.5 policies (see scripts/gpu_smoke.py): two Dynamic-TreeRPO
# iterations per full-size model with random weights, LoRA and gradient checkpointing at 512x512.
# Run from the repository root: `bash scripts/gpu_smoke.sh` (extra arguments go to the script,
# e.g. `--models flux`). Installs nothing when torch, diffusers, transformers and peft import;
# otherwise installs requirements.txt into the current python (torch must already be there).
# Budget: well under 8 minutes on one H200; exits non-zero on any failure.
#
# A ComfyUI template on random weights of its files' shapes (sampling, scripted picks, training,
# before/after images; a 24 GiB card emulated), one RESULT line per stage and the peak:
#   bash scripts/gpu_smoke.sh --template flux_pick_fp8          # or flux_dev_train_fp8
# It needs ComfyUI in $TREERPO_COMFYUI or .comfyui (`make comfyui`) and about 19 GB of free disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
if ! "$PYTHON" -c "import torch, diffusers, transformers, peft, safetensors" >/dev/null 2>&1; then
    echo "gpu_smoke.sh: installing requirements.txt into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    "$PYTHON" -m pip install -r requirements.txt
fi
if ! "$PYTHON" -c "import dynamic_treerpo" >/dev/null 2>&1; then  # the pack's import name (pyproject.toml)
    "$PYTHON" -m pip install --quiet --no-deps --no-build-isolation -e .
fi
if [[ " $* " == *" --template "* ]] && [[ ! -f "${TREERPO_COMFYUI:-.comfyui}/main.py" ]]; then
    echo "gpu_smoke.sh: --template needs ComfyUI: run \`make comfyui\` or set TREERPO_COMFYUI" >&2
    exit 2
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
exec "$PYTHON" scripts/gpu_smoke.py "$@"
