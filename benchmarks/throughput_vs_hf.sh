#!/usr/bin/env bash
# Issue 3's comparison: `jaxserve bench throughput` vs the HF transformers backend on the same
# random-weight small Llama (6.5M params), 64 requests, for the `random` and the ShareGPT-like
# workloads, one after the other in one run. Run it on an idle machine: on the shared 2-core CPU
# the HF backend's threads slow down far more than jaxserve's under load, so loaded ratios mislead.
#   bash benchmarks/throughput_vs_hf.sh [out_dir]
set -euo pipefail
out=${1:-/tmp/throughput_vs_hf}
mkdir -p "$out"
engine=(engine.max_num_seqs=64 engine.max_num_batched_tokens=512)
for dataset in random sharegpt; do
  uptime
  jaxserve bench throughput --model random:small-llama --dataset "$dataset" --num-prompts 64 \
    --out "$out/jaxserve_$dataset.json" "${engine[@]}" > /dev/null
  uptime
  jaxserve bench throughput --model random:small-llama --dataset "$dataset" --num-prompts 64 \
    --backend hf --out "$out/hf_$dataset.json" > /dev/null
done
python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'dataset':>9} {'jaxserve tok/s':>15} {'hf tok/s':>9} {'ratio':>6}")
for d in ("random", "sharegpt"):
    j, h = (json.load(open(f"{out}/{b}_{d}.json")) for b in ("jaxserve", "hf"))
    print(f"{d:>9} {j['output_tokens_per_s']:>15.0f} {h['output_tokens_per_s']:>9.0f} "
          f"{j['output_tokens_per_s'] / h['output_tokens_per_s']:>6.2f}")
PY
