#!/usr/bin/env bash
# Fetches, here (where PyPI is reachable), the pure-Python wheels that benchmarks/gpu_check.sh needs and
# the GPU image lacks, into .whl/ (git-ignored). The device call then carries them:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540)
# omegaconf: jaxserve.config imports it, so every step that imports jaxserve (roofline, spec_round_costs)
# needs it; 2.4 needs only PyYAML, which the image has (2.3 would also need antlr4, an sdist).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl omegaconf==2.4.0
ls -l .whl
