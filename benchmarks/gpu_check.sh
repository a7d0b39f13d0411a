#!/usr/bin/env bash
# One-call GPU check (docs/architecture.md, "Platforms"): device and JAX info, compiled-kernel tests (pytest -m gpu),
# the benchmark scripts, JSON under $OUT, a short table last. Installs only the wheels carried in .whl/.
#
#   bash benchmarks/gpu_wheels.sh                   # here, once: omegaconf's wheel into .whl/ (ignored by git)
#   OUT=/some/dir bash benchmarks/gpu_check.sh      # there: run(command=..., carry=[".whl"], timeout_s=540)
#
# Every step runs under `timeout`; the whole script stays within TOTAL_S seconds (default 540,
# under the device tool's 600 s per call), so one hang cannot eat the session's device time.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-540}
START=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
STATUS="$OUT/steps.tsv"
# Pure-Python packages the GPU image lacks (omegaconf), carried as wheels: into a private target, never
# over the image's own packages (--no-deps), and only on PYTHONPATH's end.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
: > "$STATUS"

# step NAME LIMIT_S CMD...: run CMD with a timeout of min(LIMIT_S, time left), log to $OUT/NAME.log.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( TOTAL_S - ($(date +%s) - START) ))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then
    echo "== $name: skipped, out of time"; printf '%s\tskipped\t0\n' "$name" >> "$STATUS"; return
  fi
  echo "== $name (timeout ${limit}s): $*"
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$STATUS"
  echo "== $name: rc=$rc"
}

step nvidia_smi 30 nvidia-smi
step jax_info 120 python -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__); print(jax.devices())"
MOSAIC_TESTS=tests/paged_attention/test_mosaic_kernel.py
MOSAIC_FP4_TESTS=tests/fp4/test_fp4_mosaic.py
step pytest_gpu 240 python -m pytest -m gpu tests/ -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
  --ignore="$MOSAIC_TESTS" --ignore="$MOSAIC_FP4_TESTS" --junitxml="$OUT/pytest_gpu.xml"
step bench_paged_attention 150 python benchmarks/paged_attention.py --out "$OUT/paged_attention.json"
if [[ -f benchmarks/fp4_matmul.py ]]; then
  step bench_fp4_matmul 100 python benchmarks/fp4_matmul.py --out "$OUT/fp4.json"
  step bench_fp4_matmul_mxfp4 60 python benchmarks/fp4_matmul.py --fmt mxfp4 --iters 10 --out "$OUT/fp4_mxfp4.json"
fi
# The roofline model (experiments/blackwell_roofline/perfmodel.py) against jaxserve's measured decode step on this GPU
# (experiments/blackwell_roofline, its config.GPU overrides). It imports jaxserve, which needs
# omegaconf: not in the GPU image, so carry its wheel (benchmarks/gpu_wheels.sh) to run it.
if python -c "import omegaconf" 2>/dev/null; then
  step roofline 60 python -c "import sys; from experiments.blackwell_roofline.config import GPU; \
from experiments.harness import main; main('blackwell_roofline', [*GPU, 'out_dir=' + sys.argv[1]])" "$OUT/roofline"
  # Speculative decoding's round vs decode step with the zoo pair (batch 1, greedy; the CPU figures are in
  # benchmarks/RESULTS.md): on a GPU the 6-token verify should cost about one decode step.
  step spec_round_costs 90 python benchmarks/spec_round_costs.py --reps 10 --calls 5 --prompts 4 \
    --out "$OUT/spec_round_costs.json"
else
  echo "== roofline: skipped, omegaconf missing"; printf 'roofline\tskipped\t0\n' >> "$STATUS"
  echo "== spec_round_costs: skipped, omegaconf missing"; printf 'spec_round_costs\tskipped\t0\n' >> "$STATUS"
fi
# The Mosaic GPU kernel has never run on hardware: its own steps, last, so a crash costs nothing else.
step pytest_gpu_mosaic 90 python -m pytest -m gpu "$MOSAIC_TESTS" -q -rfEs -p no:cacheprovider --continue-on-collection-errors
step bench_mosaic 90 python benchmarks/paged_attention.py --impls mosaic,pallas,contiguous --limit 4 \
  --out "$OUT/paged_attention_mosaic.json"
# The Mosaic FP4 matmul (never run on hardware either): compiled against dequantize-then-dot, then timed at
# small M beside the portable (Triton) kernel, XLA's dequantize+dot and a bf16 dot (K = N = 8192).
step pytest_gpu_mosaic_fp4 90 python -m pytest -m gpu "$MOSAIC_FP4_TESTS" -q -rfEs -p no:cacheprovider
FP4_MOSAIC_IMPLS=bf16_dot,xla_dequant_dot,pallas_fp4_bfloat16,pallas_fp4_float32,mosaic_fp4
step bench_fp4_mosaic 90 python benchmarks/fp4_matmul.py --impls "$FP4_MOSAIC_IMPLS" --m 1,4,16,64,128 --iters 10 \
  --out "$OUT/fp4_mosaic.json"
step bench_fp4_mosaic_mxfp4 60 python benchmarks/fp4_matmul.py --fmt mxfp4 --impls "$FP4_MOSAIC_IMPLS" --m 1,16,64 \
  --iters 10 --out "$OUT/fp4_mosaic_mxfp4.json"
# The engine's paths end to end (attention_impl pallas/mosaic vs reference, quant_impl pallas vs
# reference for nvfp4/mxfp4): tok/s, tokens equal, max log-prob difference. Needs omegaconf (jaxserve).
if python -c "import omegaconf" 2>/dev/null; then
  step engine_paths 120 python benchmarks/gpu_engine_paths.py --out "$OUT/engine_paths.json"
else
  echo "== engine_paths: skipped, omegaconf missing"; printf 'engine_paths\tskipped\t0\n' >> "$STATUS"
fi

python - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n==== summary ====")
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, secs = line.split("\t")
    print(f"{name:24} rc={rc:>7}  {secs:>4}s")
junit = out / "pytest_gpu.xml"
if junit.exists():
    import xml.etree.ElementTree as ET
    s = ET.parse(junit).getroot()
    s = s if s.tag == "testsuite" else s[0]
    print(f"pytest -m gpu: {s.get('tests')} tests, {s.get('failures')} failed, "
          f"{s.get('errors')} errors, {s.get('skipped')} skipped")
for pa in (out / "paged_attention.json", out / "paged_attention_mosaic.json"):
  if pa.exists():
    data = json.loads(pa.read_text())
    m = data["meta"]
    print(f"{pa.name} ({m['device']}, jax {m['jax']}, {m['dtype']}, copy {m['copy_bw_gb_per_s']:.0f} GB/s):")
    print(f"{'B':>4} {'ctx':>6} {'H/K':>6} {'D':>4} {'S':>4} {'impl':>11} {'ms':>8} {'GB/s':>7} {'%copy':>6} {'x contig':>8}")
    for r in data["rows"]:
        print(f"{r['batch']:>4} {r['context']:>6} {r['heads']:>3}/{r['kv_heads']:<2} {r['head_dim']:>4} "
              f"{r['block_size']:>4} {r['impl']:>11} {r['time_ms']:>8.3f} {r['gb_per_s']:>7.1f} "
              f"{r['pct_copy_bw']:>6.1f} {r.get('vs_contiguous', float('nan')):>8.2f}")
roof = out / "roofline" / "results.json"
if roof.exists():
    for r in json.loads(roof.read_text())["tables"].get("validation", []):
        print(f"roofline b={r['batch']:>4} ctx={r['context']:>5} measured {r['measured_ms']:.3f} ms, "
              + ", ".join(f"{k[5:-3]} {r[k]:.3f} ms (x{r['ratio_' + k[5:-3]]:.2f})" for k in r if k.startswith("pred_")))
spec = out / "spec_round_costs.json"
if spec.exists():
    data = json.loads(spec.read_text())
    print("spec_round_costs (zoo pair, batch 1, greedy, γ %d): " % data["gamma"]
          + ", ".join(f"{k} {v['min_ms']:.3f} ms" for k, v in data["parts"].items()))
    if "program" in data:
        print("  in the programs: " + ", ".join(f"{k} {v:.4g}" for k, v in data["program"].items()))
paths = out / "engine_paths.json"
if paths.exists():
    data = json.loads(paths.read_text())
    print(f"engine paths ({data['meta']['device']}, jax {data['meta']['jax']}, batch {data['meta']['batch']}):")
    for r in data["rows"]:
        print(f"  {r['path']:24} " + (r["error"] if "error" in r else
              f"{r['tok_per_s']:9.1f} tok/s  tokens_equal={r.get('tokens_equal', '-')}  "
              f"max|dlogp|={r.get('max_abs_logprob_diff', float('nan')):.2e}"))
for fp4 in (out / "fp4.json", out / "fp4_mxfp4.json", out / "fp4_mosaic.json", out / "fp4_mosaic_mxfp4.json"):
    if not fp4.exists():
        continue
    data = json.loads(fp4.read_text())
    print(f"{fp4.name} ({data.get('device')}, copy {data.get('copy_bandwidth_GBps', 0):.0f} GB/s):")
    keys = ["impl", "fmt", "M", "K", "N", "time_us", "GBps", "speedup_vs_bf16", "frac_of_copy_bw", "max_rel_err", "error"]
    for r in data.get("rows", []):
        shown = [k for k in keys if k in r] or list(r)
        print("  " + "  ".join(f"{k}={r[k]:.4g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                               for k in shown))
EOF
