#!/usr/bin/env bash
# Batch-1 decode of SmolLM2-135M-Instruct with the CPU FFI matmuls on and off (JAXSERVE_CPU_KERNELS),
# for each weight format, alternating on/off so that drift in the machine's load hits both.
#   bash benchmarks/cpu_kernels_decode.sh OUTDIR [ROUNDS]
# One JSON per run in OUTDIR (jaxserve bench latency's record) and `uptime` before each run in OUTDIR/load.txt.
set -euo pipefail
out=${1:?usage: $0 OUTDIR [ROUNDS]}; rounds=${2:-1}
mkdir -p "$out"
configs=("bfloat16:" "bfloat16:engine.quantization=nvfp4" "bfloat16:engine.quantization=mxfp4")
for r in $(seq 1 "$rounds"); do
  for cfg in "${configs[@]}"; do
    dtype=${cfg%%:*}; quant=${cfg#*:}
    for on in 1 0; do
      name="r${r}_${dtype}_${quant##*=}_k${on}"; name=${name/__/_none_}
      echo "$name $(uptime)" | tee -a "$out/load.txt"
      JAXSERVE_CPU_KERNELS=$on nice -n 10 python -m jaxserve.cli bench latency --model smollm2-135m-instruct \
        --dtype "$dtype" --input-len 32 --output-len 64 --num-iters 3 --num-iters-warmup 1 \
        --out "$out/$name.json" $quant > "$out/$name.log" 2>&1 || echo "FAILED $name" | tee -a "$out/load.txt"
    done
  done
done
