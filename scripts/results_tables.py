"""Renders benchmarks/RESULTS.md, one current table per claim, from the committed results/*/results.json.

    python scripts/results_tables.py            # rewrite benchmarks/RESULTS.md
    python scripts/results_tables.py --check    # exit 1 if benchmarks/RESULTS.md is not what this renders

Each claim below names the results.json files its figures come from and how to read them; a section
is the figures' table, a short caveat where one matters, and a table of the runs (command, date,
machine, commit: each file's ``meta``). Nothing here is typed in by hand but the captions: a new run
into the same folder changes the tables, and ``tests/scripts/test_results_tables.py`` fails until
RESULTS.md is re-rendered. Plain Python and json only (no JAX), so the test is instant.
"""
from __future__ import annotations

import functools
import json
import pathlib
import statistics
import sys
from typing import Callable, NamedTuple

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "RESULTS.md"
SPEC = "results/spec_decoding"
INTERLEAVED = f"{SPEC}/batch1_greedy_processes_interleaved"
RUNS = tuple(f"run{k}" for k in range(1, 7))


@functools.cache
def load(rel: str) -> dict:
    with open(REPO / rel) as f:
        return json.load(f)


def table(name: str, rel: str) -> list[dict]:
    return load(rel)["tables"][name]


def x(v: float) -> str:
    return f"{v:.2f}×"


def pct(v: float, digits: int = 1) -> str:
    return f"{100 * v:.{digits}f}%"


def md(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


class Claim(NamedTuple):
    title: str
    sources: tuple[str, ...]  # results.json paths, relative to the repository
    figures: Callable[[], tuple[list[str], list[list]]]  # (headers, rows) read from the sources
    notes: str = ""  # caveats that matter for reading the figures


# --- benchmarks -------------------------------------------------------------------------------------

def throughput_vs_hf():
    rows = [[r["workload"], r["requests"], f"{r['jaxserve_tok_s']:,}", f"{r['hf_tok_s']:,}", f"**{x(r['ratio'])}**"]
            for r in table("throughput", "results/throughput_vs_hf/results.json")]
    return ["workload", "requests", "jaxserve output tok/s", "HF transformers output tok/s", "jaxserve / HF"], rows


PEER_RUNS = ("results/peer_throughput/small_llama/results.json",)
SMALL_LLAMA_2THREADS = ("results/peer_throughput/small_llama_2threads/results.json",)
SMOLLM2_PEER_RUNS = ("results/peer_throughput/smollm2/results.json",)
SMOLLM2_BF16_VLLM_RUNS = ("results/peer_throughput/smollm2_bfloat16_vllm_bf16_attention/results.json",)
SMOLLM2_BF16_VLLM_PREFILL = ("results/peer_throughput/smollm2_bfloat16_vllm_prefill/results.json",)
SMOLLM2_BF16_VLLM_PREFETCH = "results/peer_throughput/smollm2_bfloat16_vllm_prefetch/results.json"
SMOLLM2_BF16_VLLM_RESIDUAL = "results/peer_throughput/smollm2_bfloat16_vllm_residual/results.json"
SMOLLM2_BF16_VLLM_GREEDY_HEAD = "results/peer_throughput/smollm2_bfloat16_vllm_greedy_head/results.json"
SMOLLM2_BF16_VLLM_EPILOGUES = "results/peer_throughput/smollm2_bfloat16_vllm_epilogues/results.json"
SMOLLM2_BF16_VLLM_ARGMAX = "results/peer_throughput/smollm2_bfloat16_vllm_argmax/results.json"
SMOLLM2_F32_VLLM_RUNS = ("results/peer_throughput/smollm2_float32_vllm/results.json",)
SMOLLM2_BF16_MULTI_STEP = "results/peer_throughput/smollm2_bfloat16_vllm_multi_step/results.json"
SMOLLM2_BF16_ATTENTION_WRITE = "results/peer_throughput/smollm2_bfloat16_vllm_attention_write/results.json"
SMOLLM2_BF16_NORM_IN_GEMM = "results/peer_throughput/smollm2_bfloat16_vllm_norm_in_gemm/results.json"
SMOLLM2_BF16_ICELAKE_FMA = "results/peer_throughput/smollm2_bfloat16_icelake_fma/results.json"
SMOLLM2_F32_ICELAKE = "results/peer_throughput/smollm2_float32_icelake/results.json"
SMOLLM2_F32_ICELAKE_PACKED = "results/peer_throughput/smollm2_float32_icelake_packed/results.json"
SMOLLM2_F32_ICELAKE_PACKED_HEAD = "results/peer_throughput/smollm2_float32_icelake_packed_head/results.json"
SMOLLM2_F32_ICELAKE_STREAMS = "results/peer_throughput/smollm2_float32_icelake_streams/results.json"
SMALL_LLAMA_MULTI_STEP = "results/peer_throughput/small_llama_multi_step/results.json"
SMALL_LLAMA_ICELAKE = "results/peer_throughput/small_llama_icelake/results.json"
MULTI_STEP_SERVING = "results/multi_step_serving/results.json"
SMOLLM2_F32_MULTI_STEP = "results/peer_throughput/smollm2_float32_vllm_multi_step/results.json"
SMOLLM2_BF16_XEON_480 = "results/peer_throughput/smollm2_bfloat16_vllm_xeon_l3_480/results.json"
SMOLLM2_F32_XEON_480 = "results/peer_throughput/smollm2_float32_vllm_xeon_l3_480/results.json"
SMOLLM2_BF16_BACK_TO_BACK = "results/peer_throughput/smollm2_bfloat16_vllm_back_to_back/results.json"


def multi_step_serving():
    """A live server's figures per (num_scheduler_steps, request rate): ms, but the throughputs."""
    rows = [[r["num_scheduler_steps"], f"{r['rate']:g}", f"{r['request_throughput']:.2f}",
             f"{r['output_throughput']:,.0f}", *(f"{r[k]:,.0f}" for k in (
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                 "median_e2el_ms")), f"{r['server_ready_s']:.0f}"]
            for r in table("serving", MULTI_STEP_SERVING)]
    return ["num_scheduler_steps", "request rate (req/s)", "completed req/s", "output tok/s", "TTFT median (ms)",
            "TTFT p99", "TPOT median", "TPOT p99", "ITL median", "ITL p99", "E2E latency median",
            "server ready (s)"], rows


def by_workload(rel: str) -> dict[tuple[str, int], dict[str, dict]]:
    """A peer run's throughput rows as {(workload, requests): {backend: row}}, in the run's order."""
    by = {}
    for r in table("throughput", rel):
        by.setdefault((r["workload"], r["requests"]), {})[r["backend"]] = r
    return by


def tok_s(c: dict) -> str:
    """A backend's output tok/s over the rounds: median (range)."""
    return f"{c['tok_s_median']:,.0f} ({c['tok_s_min']:,.0f}–{c['tok_s_max']:,.0f})"


def multi_step_vllm(rel: str = SMOLLM2_BF16_MULTI_STEP, weight_bytes: int | None = None, ceiling: str | None = None):
    """jaxserve with one decode step a program and with K (``num_scheduler_steps``, one or more K) beside vLLM, in
    one run: output tok/s median (range), and each against vLLM's median; with ``weight_bytes``, at batch 64 the
    weight bytes a second each backend reads (one read of every weight a step of 64 tokens) against ``ceiling``'s
    read ceiling."""
    by = by_workload(rel)
    multis = sorted({b for cells in by.values() for b in cells if "num_scheduler_steps" in b},
                    key=lambda b: int(b.split("=")[-1]))
    ks = [b.split("=")[-1] for b in multis]
    rows = []
    for (workload, requests), cells in by.items():
        peer = cells["vllm"]["tok_s_median"]
        rows.append([workload, requests, *(tok_s(cells[b]) for b in ("jaxserve", *multis, "vllm")),
                     x(cells["jaxserve"]["tok_s_median"] / peer),
                     *(f"**{x(cells[b]['tok_s_median'] / peer)}**" for b in multis)])
    headers = ["workload", "requests", "jaxserve tok/s, 1 step a program",
               *(f"jaxserve tok/s, num_scheduler_steps={k}" for k in ks), "vllm tok/s", "1 step / vllm",
               *(f"{k} steps / vllm" for k in ks)]
    if weight_bytes is None:
        return headers, rows
    read = read_ceiling(ceiling)
    for row, cells in zip(rows, by.values()):
        row.append("—" if row[0] != "batch64" else " / ".join(
            f"{cells[b]['tok_s_median'] / row[1] * weight_bytes / 1e9:.1f} "
            f"({pct(cells[b]['tok_s_median'] / row[1] * weight_bytes / 1e9 / read, 0)})" for b in (multis[-1], "vllm")))
    return headers + [f"weights read GB/s, jaxserve {ks[-1]} steps / vllm (of the {read:.1f} GB/s read ceiling)"], rows


def backends_vs_vllm(rel: str):
    """Each backend of one run, output tok/s median (range) per workload, and each jaxserve backend's median against
    vLLM's."""
    by = by_workload(rel)
    backends = list(dict.fromkeys(b for cells in by.values() for b in cells))
    ours = [b for b in backends if b.startswith("jaxserve")]
    rows = [[workload, requests, *(tok_s(c[b]) for b in backends),
             *(f"**{x(c[b]['tok_s_median'] / c['vllm']['tok_s_median'])}**" for b in ours)]
            for (workload, requests), c in by.items()]
    return ["workload", "requests", *(f"{b} tok/s" for b in backends), *(f"{b} / vllm" for b in ours)], rows


def run_spread(rel: str):
    """One process's repeated runs of a workload (``compare.py --back-to-back``): each run's seconds in order, output
    tok/s median (range), and the spread, the slowest run's time over the fastest's."""
    rows = [[r["workload"], r["backend"], " ".join(f"{t:.2f}" for t in r["seconds"]),
             tok_s(r), f"**{pct(max(r['seconds']) / min(r['seconds']) - 1, 0)}**"] for r in table("throughput", rel)]
    return ["workload", "backend", "seconds, run by run", "tok/s median (range)", "slowest / fastest − 1"], rows


def packed_fma_vllm(rel: str = SMOLLM2_BF16_ICELAKE_FMA, ceiling: str | None = None, bytes_per_weight: int = 2,
                    packed: str = "packed (FMA)", stored: str = "XLA's bf16 dot"):
    """A CPU without AMX: jaxserve's packed GEMM on float32 FMAs (bf16 weights by default; ``bytes_per_weight=4``:
    a float32 model's, ``packed_f32``) at 1 and 8 decode steps a program, the same engine with its weights as stored
    (``stored``: the path before), and vLLM, in one run: output tok/s median (range), against vLLM's median and the
    stored layout's; at batch 64 the weight bytes a second the 8-step engine reads against ``ceiling``'s read
    ceiling."""
    by = by_workload(rel)
    multi, as_stored = "jaxserve@engine.num_scheduler_steps=8", "jaxserve@engine.weight_layout=as_stored"
    read = read_ceiling(ceiling) if ceiling else None
    rows = []
    for (workload, requests), c in by.items():
        best = max(c["jaxserve"]["tok_s_median"], c[multi]["tok_s_median"])
        rows.append([workload, requests, *(tok_s(c[b]) for b in ("jaxserve", multi, as_stored, "vllm")),
                     f"**{x(best / c['vllm']['tok_s_median'])}**", x(best / c[as_stored]["tok_s_median"])])
        if read:
            gb_s = c[multi]["tok_s_median"] / requests * SMOLLM2_PARAMS * bytes_per_weight / 1e9
            rows[-1].append(f"{gb_s:.1f} ({pct(gb_s / read, 0)})" if workload == "batch64" else "—")
    headers = ["workload", "requests", f"jaxserve {packed} tok/s, 1 step a program", "packed, 8 steps a program",
               f"weights as stored ({stored})", "vllm tok/s", "best packed / vllm", "best packed / as stored"]
    return headers + ([f"weights read GB/s, 8 steps (of the {read:.1f} GB/s read ceiling)"] if read else []), rows


def smollm2_bf16_vllm(runs=SMOLLM2_BF16_VLLM_RUNS, bytes_per_weight=2, ceiling=None):
    """``peer_throughput``'s table, and for batch 64 (every request decoding together: one read of every weight a
    step of 64 tokens) the weight bytes each backend streams per second against this VM's read ceiling."""
    headers, rows = peer_throughput(runs)
    weight_bytes, read = SMOLLM2_PARAMS * bytes_per_weight, read_ceiling(ceiling or MEMORY_BANDWIDTH)
    by = {(r["workload"], r["backend"]): r for r in table("throughput", runs[0])}
    for row in rows:
        cells = [by.get((row[1], b)) for b in ("jaxserve", "vllm")]
        row.append("—" if row[1] != "batch64" else " / ".join(
            f"{c['tok_s_median'] / row[2] * weight_bytes / 1e9:.1f} ({pct(c['tok_s_median'] / row[2] * weight_bytes / 1e9 / read, 0)})"
            for c in cells))
    return headers + [f"weights read GB/s, jaxserve / vllm (of the {read:.1f} GB/s read ceiling)"], rows
PEER_BACKENDS = ("jaxserve", "hf", "vllm", "llama.cpp")


def peer_throughput(runs=PEER_RUNS):
    """Output tok/s, median (range) over rounds, per model and workload; jaxserve against the best other backend."""
    rows = []
    for rel in runs:
        by = {}
        for r in table("throughput", rel):
            by.setdefault((r["model"], r["workload"], r["requests"]), {})[r["backend"]] = r
        for (model, workload, requests), cells in by.items():
            best = max((r for b, r in cells.items() if b != "jaxserve"), key=lambda r: r["tok_s_median"])
            ratio = cells["jaxserve"]["tok_s_median"] / best["tok_s_median"] if "jaxserve" in cells else None
            rows.append([model, workload, requests,
                         *(tok_s(cells[b]) if b in cells else "—" for b in PEER_BACKENDS),
                         "—" if ratio is None else f"**{x(ratio)}** {best['backend']}",
                         f"{min(r['agrees_with_jaxserve'] for r in cells.values()):.2f}"])
    return ["model", "workload", "requests", *(f"{b} tok/s" for b in PEER_BACKENDS), "jaxserve / best other",
            "same first 8 tokens as jaxserve (worst backend)"], rows


SMOLLM2_RUNS = tuple(f"results/peer_throughput/smollm2_{d}/results.json" for d in ("float32", "bfloat16"))


SMOLLM2_PARAMS = 134_515_008  # SmolLM2-135M: 30 layers of 3,540,096 + the tied 49,152 x 576 embedding + a norm


def smollm2_speed():
    """SmolLM2 output tok/s, median (range), jaxserve and transformers per dtype and workload, and the weight
    bytes each backend streams per second (one read of every weight per decode step: tok/s / requests)."""
    rows = []
    for rel in SMOLLM2_RUNS:
        dtype = load(rel)["config"]["dtype"]
        weight_bytes = SMOLLM2_PARAMS * (4 if dtype == "float32" else 2)
        by = by_workload(rel)
        for (workload, requests), cells in by.items():
            j, h = cells["jaxserve"], cells["hf"]
            rows.append([dtype, workload, requests,
                         *(f"{c['tok_s_median']:,.1f} ({c['tok_s_min']:,.1f}–{c['tok_s_max']:,.1f})" for c in (j, h)),
                         f"**{x(j['tok_s_median'] / h['tok_s_median'])}**",
                         " / ".join(f"{c['tok_s_median'] / requests * weight_bytes / 1e9:.1f}" for c in (j, h)),
                         f"{h['agrees_with_jaxserve']:.2f}"])
    return ["dtype", "workload", "requests", "jaxserve tok/s", "HF transformers tok/s", "jaxserve / HF",
            "weights read GB/s (jaxserve / HF)", "HF's first 8 tokens = jaxserve's"], rows


LOWBIT_RUN = "results/peer_throughput/smollm2_lowbit_vnni/results.json"  # --max-num-seqs 1 (the latency setting)
LOWBIT_RUN64 = "results/peer_throughput/smollm2_lowbit_vnni_seqs64/results.json"  # the default 64 slots, minutes after
LOWBIT_RERUN = "results/peer_throughput/smollm2_lowbit_vnni_rerun/results.json"  # a 4-backend rerun, at 815cde2
LOWBIT_PACKED_HEAD = "results/peer_throughput/smollm2_lowbit_packed_head_run2/results.json"  # before the VNNI kernels
LOWBIT_RUN1 = "results/peer_throughput/smollm2_lowbit_packed_head/results.json"  # the same command, just before
LOWBIT_36AF0D6 = "results/peer_throughput/smollm2_lowbit/results.json"  # before the packed head, a faster VM day
LOWBIT_BEFORE_KERNEL = "results/peer_throughput/smollm2_lowbit_37b1d84/results.json"  # the caption's "before"
LOWBIT_F16_DEFAULT = "results/peer_throughput/smollm2_lowbit_f16_amx/results.json"  # llama.cpp with its AMX buffers
LOWBIT_ICELAKE = "results/peer_throughput/smollm2_lowbit_icelake_streams_rerun/results.json"  # Ice Lake, 7 rounds
LOWBIT_ICELAKE_5 = "results/peer_throughput/smollm2_lowbit_icelake_streams/results.json"  # minutes before, 5 rounds
LOWBIT_ICELAKE_FIRST = "results/peer_throughput/smollm2_lowbit_icelake/results.json"  # the same VM at ab7e67e, before
LOWBIT_XEON_480 = "results/peer_throughput/smollm2_lowbit_xeon_l3_480/results.json"  # the 480 MiB-L3 AMX VM
LOWBIT_F16_AMX_XEON_480 = "results/peer_throughput/smollm2_lowbit_f16_amx_xeon_l3_480/results.json"  # its AMX buffers
LOWBIT_PEER = {16: "llama.cpp@F16", 4: "llama.cpp@Q4_0"}  # the llama.cpp row each weight width is held against


MEMORY_BANDWIDTH = "results/memory_bandwidth/results.json"
MEMORY_BANDWIDTH_XEON_L3 = "results/memory_bandwidth/xeon_l3/results.json"  # the 300 MiB-L3 VM of 2026-12-06
MEMORY_BANDWIDTH_ICELAKE = "results/memory_bandwidth/icelake/results.json"  # the Ice Lake VM (no AMX) of 2026-12-07
MEMORY_BANDWIDTH_XEON_480 = "results/memory_bandwidth/xeon_l3_480/results.json"  # the 480 MiB-L3 AMX VM of 2026-12-07


def read_ceiling(rel: str = MEMORY_BANDWIDTH) -> float:
    """A VM's memory-read rate, GB/s: two threads reading a 1 GiB buffer, the faster way
    (``benchmarks/memory_bandwidth.py``)."""
    return max(r["gb_s"] for r in table("bandwidth", rel) if r["op"].startswith("read") and r["threads"] == 2)


AMX_ROOFLINE = "results/amx_roofline/results.json"


def amx_roofline():
    """Each probe's figure beside the ceiling it is held against: the tile multiply's peak (same threads) for the
    multiply and prefill rows, the tile-load stream (same threads) for the decode GEMM."""
    rows = table("probes", AMX_ROOFLINE)
    peak = {r["threads"]: r["value"] for r in rows if r["probe"] == "tdp_peak"}
    stream = {r["threads"]: r["value"] for r in rows if r["probe"] == "stream"}
    what = {"tdp_peak": "TDPBF16PS, tiles resident", "tdp_l1": "TDPBF16PS, 2 A + 2 B tiles loaded from L1 per 4",
            "stream": "tile loads alone over 1 GiB", "decode_gemm": "packed GEMM loop, K 576, N 3072, weights from "
            "memory", "prefill_gemm": "packed GEMM loop, M 512, K 576, N 1536, weights in L2"}
    out = []
    for r in rows:
        detail = f"M {r['M']}" if "M" in r else r.get("output", "")
        ceiling = {"decode_gemm": (stream, "of the tile stream"), "stream": (None, "")}.get(
            r["probe"], (peak, "of the tile peak"))
        frac = "—" if ceiling[0] is None else f"{pct(r['value'] / ceiling[0][r['threads']], 0)} {ceiling[1]}"
        out.append([what[r["probe"]], r["threads"], detail or "—", f"{r['value']:,.1f} {r['unit']}", frac])
    return ["probe", "threads", "rows / output", "measured", "against"], out


W4A8_PPL = {head: f"results/fp4_perplexity/smollm2_w4a8{'_int8head' if head else ''}_16w/results.json"
            for head in (False, True)}


def smollm2_w4a8_ppl():
    """Perplexity of weight-only FP4, W4A8 (int8 activations) and W4A8 with the int8 LM head, the same windows."""
    model = "smollm2-135m-instruct"
    ppl = {head: {r["variant"]: r for r in table(f"ppl/{model}/float32", rel)} for head, rel in W4A8_PPL.items()}
    rows = []
    for fmt in ("nvfp4", "mxfp4_floor"):
        cells = [ppl[False][fmt], ppl[False][f"{fmt}_w4a8"], ppl[True][f"{fmt}_w4a8"]]
        rows.append([fmt, *(f"{c['val_ppl']:.3f} ({c['ppl_vs_ref_pct']:+.2f}%)" for c in cells)])
    ref = ppl[False]["float32"]
    return ["weights (float32: %.3f)" % ref["val_ppl"], "weight-only (vs float32)", "W4A8: int8 activations",
            "W4A8 and the int8 LM head"], rows


def _weight_bits(backend: str, dtype: str) -> int:
    """16 for a bf16/F16 row, 4 for a 4-bit one (jaxserve@...quantization=nvfp4|mxfp4, llama.cpp@Q4_*)."""
    return 4 if any(f in backend for f in ("nvfp4", "mxfp4", "int4", "@Q4")) else 16 if dtype != "float32" else 32


def smollm2_lowbit(run: str = LOWBIT_RUN, bandwidth: str = MEMORY_BANDWIDTH):
    """Batch-1 decode with 16-bit and 4-bit weights: jaxserve beside llama.cpp on the same weights, and the weight
    bytes each streams per second (every weight read once per token) against the machine's read ceiling."""
    d = load(run)
    dtype, infos = d["config"]["dtype"], d["config"]["backends"]
    cells = {r["backend"]: r for r in table("throughput", run) if r["workload"] == "batch1"}
    ceiling = read_ceiling(bandwidth)
    rows = []
    for name, c in cells.items():
        bits, weight_bytes = _weight_bits(name, dtype), infos[name].get("weight_bytes")
        peer = cells.get(LOWBIT_PEER.get(bits))
        rows.append([name, bits, "" if weight_bytes is None else f"{weight_bytes / 1e6:,.0f}",
                     f"{c['tok_s_median']:,.1f} ({c['tok_s_min']:,.1f}–{c['tok_s_max']:,.1f})",
                     "" if weight_bytes is None else f"{c['tok_s_median'] * weight_bytes / 1e9:.1f} "
                     f"({pct(c['tok_s_median'] * weight_bytes / 1e9 / ceiling, 0)})",
                     "" if peer is None or name.startswith("llama.cpp") else
                     f"**{x(c['tok_s_median'] / peer['tok_s_median'])}** {LOWBIT_PEER[bits]}",
                     f"{c['agrees_with_jaxserve']:.2f}" if "agrees_with_jaxserve" in c else ""])
    return ["backend", "weight bits", "weights MB", "batch-1 tok/s",
            f"weights read GB/s (of the {ceiling:.1f} GB/s read ceiling)", "jaxserve / llama.cpp",
            "first 8 tokens = jaxserve's"], rows


FP4STREAM = ("results/peer_throughput/smollm2_fp4stream_main_t2/results.json",  # main, before the change
             "results/peer_throughput/smollm2_fp4stream_t2/results.json")
FP4STREAM_PPL = {head: f"results/fp4_perplexity/smollm2_{'lm_head' if head else 'dense'}_16w/results.json"
                 for head in (False, True)}


def smollm2_fp4stream():
    """Batch-1 decode tok/s at main and after the streaming FP4 kernels and the quantized tied head (2 threads)."""
    before, after = ({r["backend"]: r for r in table("throughput", rel) if r["workload"] == "batch1"}
                     for rel in FP4STREAM)
    infos = load(FP4STREAM[1])["config"]["backends"]

    def rate(r):
        return f"{r['tok_s_median']:,.1f} ({r['tok_s_min']:,.1f}–{r['tok_s_max']:,.1f})"

    rows = []
    for name, r in after.items():
        wb = infos[name].get("weight_bytes")
        rows.append([name, "" if wb is None else f"{wb / 1e6:,.0f}", rate(before[name]) if name in before else "",
                     rate(r), f"**{x(r['tok_s_median'] / before[name]['tok_s_median'])}**" if name in before else "",
                     "" if wb is None else f"{r['tok_s_median'] * wb / 1e9:.1f}"])
    return ["backend", "weights MB", "main tok/s", "after tok/s", "after / main", "weights read GB/s"], rows


def smollm2_fp4stream_ppl():
    """Perplexity with the LM head kept bf16/float32 and quantized, the same windows."""
    model = "smollm2-135m-instruct"
    ppl = {head: {r["variant"]: r for r in table(f"ppl/{model}/float32", rel)} for head, rel in FP4STREAM_PPL.items()}
    rows = [[v, f"{ppl[False][v]['val_ppl']:.3f} ({ppl[False][v]['ppl_vs_ref_pct']:+.2f}%)",
             f"{ppl[True][v]['val_ppl']:.3f} ({ppl[True][v]['ppl_vs_ref_pct']:+.2f}%)"] for v in ppl[True]]
    return ["weights", "ppl, head not quantized (vs float32)", "ppl, head quantized too (vs float32)"], rows


def paged_attention_decode():
    rows = [[r["batch"], r["context"], f"{r['q_heads']}/{r['kv_heads']}", r["head_dim"], r["page_size"], r["impl"],
             r["ms"], r["gb_s"], r["pct_copy"], f"{r['x_contiguous']:.2f}"]
            for r in table("decode", "results/paged_attention/results.json")]
    return ["B", "context", "Hq/Hkv", "D", "page", "impl", "ms", "GB/s", "% of copy bandwidth", "× contiguous"], rows


def attention_whole_table():
    d = load("results/attention_whole_table/results.json")
    rows = [[r["batch"], r["table_tokens"], r["live"], r["q_len"], f"{r['loop']['min_ms']:.3f}",
             f"{r['whole_table']['min_ms']:.3f}", f"{r['whole_table']['min_ms'] / r['loop']['min_ms']:.2f}"]
            for r in d["op"]]
    for name, label in (("verify_5_tokens", "zoo target, 5-token verify"), ("spec_round_gamma4", "zoo pair, γ 4 round")):
        loop, one = d["model"][f"{name}/loop"]["min_ms"], d["model"][f"{name}/whole_table"]["min_ms"]
        rows.append([f"{label} (batch 1)", 144, 100, "", f"{loop:.3f}", f"{one:.3f}", f"{one / loop:.2f}"])
    return ["batch", "table tokens", "live tokens", "queries", "page loop ms", "one step ms", "one step / loop"], rows


def spec_round_costs():
    rows = [[r["target"], r["params_mib"], r["decode_step_ms"], r["verify_ms"], r["round_ms"],
             f"{r['verify_per_step']:.2f}", f"**{r['round_per_step']:.2f}**"]
            for r in table("round_costs", "results/spec_round_costs/results.json")]
    return ["target", "params MiB", "decode step ms", "6-token verify ms", "γ 5 round ms", "verify / step",
            "round / step"], rows


# --- speculative decoding ---------------------------------------------------------------------------

def _rows_by_gamma(run: str) -> dict[int, dict]:
    return {r["gamma"]: r for r in table("draft_model", run) if r["path"] == "generate"}


def _spread(values: list[float]) -> str:
    return f"{x(statistics.median(values))} ({min(values):.2f}–{max(values):.2f})"


def spec_across_processes():
    """Median (range) over six processes per γ, and of each process's best γ, for both draft heads."""
    heads = {head: [_rows_by_gamma(f"{INTERLEAVED}/{head}/{run}/results.json") for run in RUNS]
             for head in ("full", "vocab1024")}
    gammas = sorted(heads["full"][0])
    rows = []
    for g in gammas:
        rows.append([g] + [_spread([run[g][key] for run in heads[head]])
                           for head in ("full", "vocab1024") for key in ("speedup", "decode_speedup")])
    best = {head: [max(run.values(), key=lambda r: r["speedup"]) for run in runs] for head, runs in heads.items()}
    rows.append(["each process's best γ"] + [
        ("**" if head == "vocab1024" and key == "speedup" else "") + _spread([r[key] for r in best[head]])
        + ("**" if head == "vocab1024" and key == "speedup" else "")
        for head in ("full", "vocab1024") for key in ("speedup", "decode_speedup")])
    return ["γ", "whole draft head: end to end", "decode phase", "1024-token head: end to end", "decode phase"], rows


def _best(rel: str, path: str, method: str, temperature: float, batch: int) -> str:
    for r in table("best", rel):
        if (r["path"], r["method"], r["temperature"], r["batch"]) == (path, method, temperature, batch):
            return f"{x(r['speedup'])} / {x(r['decode_speedup'])} (γ {r['gamma']})"
    return "—"


def _grid(rel: str, batches=(1, 4, 16)):
    rows = []
    for path in ("generate", "engine"):
        for method in ("draft_model", "ngram", "medusa"):
            for temperature in (0.0, 1.0):
                cells = [_best(rel, path, method, temperature, b) for b in batches]
                if any(c != "—" for c in cells):
                    rows.append([{"generate": "while loop", "engine": "engine"}[path], method, f"{temperature:g}", *cells])
    return ["path", "proposer", "T", *[f"batch {b}" for b in batches]], rows


def _theory_gap(rel: str) -> str:
    gaps = [r["acceptance_length_vs_theory"] for r in table("draft_model", rel)]
    within = sum(abs(g) <= 0.05 for g in gaps)
    return f"Draft acceptance length within 5% of theory (1 − α^(γ+1)) / (1 − α) in {within} of {len(gaps)} rows."


def spec_fastest_grid():
    return _grid(f"{SPEC}/full_grid_mmbf16_draftf32_vocab1024_greedy_only/results.json")


def spec_default_grid():
    return _grid(f"{SPEC}/results.json")


def spec_widened():
    headers, rows = _grid(f"{SPEC}/widened4928_mmbf16_draftf32/results.json")
    _, all_methods = _grid(f"{SPEC}/widened4928_batch1_all_methods/results.json", batches=(1,))
    for r in all_methods:
        r[1] += " (all-proposer run)"
    return headers, rows + [r + ["", ""] for r in all_methods]


SUFFIX = {"first": f"{SPEC}/suffix_repetitive/results.json",  # batch 1 and 4, the trees of c1bebef
          "second": f"{SPEC}/suffix_repetitive_batch1/results.json"}  # batch 1 again, the faster trees


def spec_suffix():
    """Best γ per (run, path, proposer, batch) on the repetitive prompt set: α, length, calls/token, speedups."""
    rows = []
    for run, rel in SUFFIX.items():
        for r in sorted(table("best", rel), key=lambda r: (r["path"] != "generate", r["method"], r["batch"])):
            decode = "—" if r["decode_speedup"] is None else x(r["decode_speedup"])
            rows.append([run, {"generate": "standalone", "engine": "engine"}[r["path"]], r["method"],
                         f"{r['temperature']:g}", r["batch"], r["gamma"], f"{r['token_acceptance_prob']:.3f}",
                         f"{r['mean_acceptance_length']:.2f}", f"{r['target_calls_per_token']:.3f}", x(r["speedup"]),
                         decode])
    return ["run", "path", "proposer", "T", "batch", "best γ", "α", "length", "calls/tok", "end to end",
            "decode phase"], rows


SMOLLM2 = f"{SPEC}/smollm2/results.json"


def spec_smollm2():
    """Every row of the SmolLM2 run: while-loop path per proposer and γ, then the engine rows."""
    rows = []
    for name, path in (("draft_model", "standalone"), ("ngram", "standalone"), ("engine", "engine")):
        for r in table(name, SMOLLM2):
            decode = "—" if r["decode_speedup"] is None else x(r["decode_speedup"])
            rows.append([path, r["method"], f"{r['temperature']:g}", r["batch"], r["gamma"],
                         f"{r['token_acceptance_prob']:.3f}", f"{r['mean_acceptance_length']:.2f}",
                         f"{r['theory_acceptance_length']:.2f}", f"{r['target_calls_per_token']:.3f}",
                         f"{r['baseline_tokens_per_s']:.1f}", x(r["speedup"]), decode])
    return ["path", "proposer", "T", "batch", "γ", "α", "length", "theory", "calls/tok", "base tok/s", "end to end",
            "decode phase"], rows


SMOLLM2_CHAT = {"repetitive": f"{SPEC}/smollm2_chat_repetitive/results.json",
                "free": f"{SPEC}/smollm2_chat_free/results.json",
                "repetitive, idle VM": f"{SPEC}/smollm2_chat_repetitive_batch16_idle/results.json",
                "repetitive, idle AVX2 VM, by_batch counts running": (
                    f"{SPEC}/smollm2_chat_repetitive_batch16_running/results.json"),
                "repetitive, idle AVX2 VM, fastest of 5": f"{SPEC}/smollm2_chat_repetitive_batch16_by4/results.json",
                "repetitive, bfloat16, packed AMX weights": (
                    f"{SPEC}/smollm2_chat_repetitive_batch16_bfloat16_packed/results.json"),
                "repetitive, bfloat16, row-invariant RMSNorm, every proposer": (
                    f"{SPEC}/smollm2_chat_repetitive_batch16_bfloat16_by4/results.json"),
                "repetitive, bfloat16, plain steps skip the draft, fastest of 5": (
                    f"{SPEC}/smollm2_chat_repetitive_batch16_bfloat16_by4_catchup/results.json"),
                "repetitive, bfloat16, plain steps skip the draft, stop at EOS (≤ 160 tokens)": (
                    f"{SPEC}/smollm2_chat_repetitive_batch16_bfloat16_by4_eos/results.json"),
                "repetitive, bfloat16, EAGLE draft, γ 3, fastest of 2": f"{SPEC}/smollm2_eagle_grid/results.json",
                "repetitive, bfloat16, fill steps take the packed head's argmax, stop at EOS, fastest of 5": (
                    f"{SPEC}/smollm2_batch16_by4_fill_head/results.json"),
                "repetitive, bfloat16, stage-3 EAGLE draft, γ 3, fastest of 2": f"{SPEC}/smollm2_eagle2_grid/results.json",
                "repetitive, bfloat16, EAGLE's plain steps skip its draft too, stop at EOS, fastest of 5": (
                    f"{SPEC}/smollm2_batch16_by4_eagle_catchup/results.json")}


def _engine_rows(rel: str) -> list[dict]:
    """The engine table, or, for a run stopped before its end, the rows its finished points saved."""
    res = load(rel)
    return res["tables"].get("engine") or res["engine_progress"]["rows"]


def spec_smollm2_chat():
    """Engine rows of the SmolLM2 chat runs: per (prompt set, proposer, policy, T), batch 1's α, length against
    theory and target calls per token, then the end-to-end speedup over the plain engine at each batch."""
    rows = []
    for name, rel in SMOLLM2_CHAT.items():
        by = {(r["method"], r["policy"], r["temperature"], r["batch"]): r for r in _engine_rows(rel)}
        for method, policy, temperature in dict.fromkeys(k[:3] for k in by):
            cells = {b: by.get((method, policy, temperature, b)) for b in (1, 4, 16)}
            one = cells[1] or next(r for r in cells.values() if r)
            rounds = one["token_acceptance_prob"] is not None  # None: the timed calls ran no round
            rows.append([name, method, policy, f"{temperature:g}",
                         f"{one['token_acceptance_prob']:.3f}" if rounds else "no round",
                         f"{one['mean_acceptance_length']:.2f} / {one['theory_acceptance_length']:.2f}" if rounds
                         else "—",
                         f"{one['target_calls_per_token']:.3f}",
                         *["—" if r is None else ("**" if r["speedup"] < 1 else "") + x(r["speedup"])
                           + ("**" if r["speedup"] < 1 else "") for r in cells.values()]])
    return ["prompts", "proposer", "policy", "T", "α (smallest batch)", "length / theory", "calls/tok", "batch 1",
            "batch 4", "batch 16"], rows


SUFFIX_GAMMAS = {"float32": f"{SPEC}/smollm2_chat_repetitive_suffix_gammas/results.json",
                 "bfloat16": f"{SPEC}/smollm2_bf16_chat_repetitive_gammas/results.json"}


SUFFIX_LONG = {**{dtype: f"{SPEC}/smollm2_chat_repetitive_suffix_160_{dtype}/results.json"
                  for dtype in ("float32", "bfloat16")},
               **{f"bfloat16, idle, spec factor {k}": f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_idle_sf{k}/"
                  "results.json" for k in (1, 2, 4)},
               "bfloat16, idle Intel Xeon, CPU attention kernel": f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_cpuattn/"
               "results.json",
               "bfloat16, idle Intel Xeon, AMX GEMMs": f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_amx/results.json",
               "bfloat16, idle Intel Xeon, attention page groups + RoPE tables":
                   f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_groups/results.json",
               "bfloat16, idle Intel Xeon, Dense kernels packed for AMX tiles":
                   f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_packed/results.json",
               "bfloat16, idle Intel Xeon, row-invariant RMSNorm":
                   f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_exact/results.json",
               "bfloat16, idle Intel Xeon, row-invariant RMSNorm, spec factor 4":
                   f"{SPEC}/smollm2_chat_repetitive_suffix_160_bfloat16_sf4/results.json"}


EAGLE_DRAFT = {"repetitive (code and text edits), first draft": f"{SPEC}/smollm2_eagle_rep/results.json",
               "free (open questions), first draft": f"{SPEC}/smollm2_eagle_free/results.json",
               "repetitive, first draft, rounds folding the next first step": (
                   f"{SPEC}/smollm2_eagle_rep_fused/results.json"),
               "repetitive, stage-3 draft (bundled)": f"{SPEC}/smollm2_eagle2_rep/results.json",
               "free, stage-3 draft (bundled)": f"{SPEC}/smollm2_eagle2_free/results.json"}


DRAFT_RETRAINED = {"stream windows of 256 (3 epochs)": f"{SPEC}/smollm2_draft2_rep/results.json",
                   "whole pieces packed in windows of 512 (2.5 epochs)": f"{SPEC}/smollm2_draft3_rep/results.json"}


def spec_suffix_gammas(runs=SUFFIX_GAMMAS, first: str = "target dtype"):
    """Engine rows by γ at batch 1 (greedy) for each target dtype: how far the drafts reach and what a round costs."""
    rows = []
    for dtype, rel in runs.items():
        for r in _engine_rows(rel):
            slow = r["speedup"] < 1
            rows.append([dtype, r["method"], r["gamma"], f"{r['token_acceptance_prob']:.3f}",
                         f"{r['drafted'] / r['rounds']:.2f}",
                         f"{r['mean_acceptance_length']:.2f} / {r['theory_acceptance_length']:.2f}",
                         f"{r['target_calls_per_token']:.3f}", f"{r['baseline_tokens_per_s']:.1f}",
                         ("**" if slow else "") + x(r["speedup"]) + ("**" if slow else ""), x(r["decode_speedup"]),
                         "yes" if r["greedy_identical"] else "**no**"])
    return [first, "proposer", "γ", "α", "drafted / round", "length / theory", "calls/tok", "base tok/s",
            "end to end", "decode phase", "= plain engine"], rows


F32_MATMUL = tuple(f"results/cpu_f32_kernels/matmul/run{k}/results.json" for k in (1, 2, 3))
F32_E2E = "results/cpu_f32_kernels/e2e/results.json"


def cpu_f32_kernels():
    """XLA's float32 dot against f32_matmul per shape and rows (medians of the runs' medians), then SmolLM2's
    batch-1 decode and 5-token verify with the kernels on and off (medians of 3 alternating rounds)."""
    us: dict = {}
    for rel in F32_MATMUL:
        for r in load(rel)["rows"]:
            us.setdefault((r["shape"], r["m"], r["path"].startswith("kernel")), []).append(r["us"])
    med = {k: statistics.median(v) for k, v in us.items()}
    rows = []
    for shape in dict.fromkeys(k[0] for k in med):
        ms = sorted({k[1] for k in med if k[0] == shape})
        xla, ker = [med[(shape, m, False)] for m in ms], [med[(shape, m, True)] for m in ms]
        rows.append([f"{shape}, M = {' / '.join(map(str, ms))}", " / ".join(f"{v:.0f}" for v in xla),
                     " / ".join(f"{v:.0f}" for v in ker), " / ".join(f"{a / b:.2f}" for a, b in zip(xla, ker))])
    runs = load(F32_E2E)["runs"]
    for label, get in (("SmolLM2 float32 batch-1 decode tok/s", lambda r: r["generate"]["decode_tok_s"]),
                       ("decode step ms (p25)", lambda r: r["parts"]["decode_step"]["p25_ms"]),
                       ("5-token verify ms (p25)", lambda r: r["parts"]["verify_5_tokens"]["p25_ms"])):
        on = statistics.median(get(r) for k, r in runs.items() if k.endswith("k1"))
        off = statistics.median(get(r) for k, r in runs.items() if k.endswith("k0"))
        rows.append([label, f"{off:.1f}", f"{on:.1f}", f"{off / on:.2f}"])
    return ["shape / figure", "XLA (kernels off)", "f32_matmul (kernels on)", "off / on"], rows


def gemm_ab(rel: str = "results/cpu_blas/results.json", variant: str = "float32 GEMMs (> 16 rows)"):
    """SmolLM2 end to end with one GEMM path against another (``benchmarks/cpu_blas_ab.py``), rounds alternating."""
    rows = [[r["workload"], r["variant"], f"{r['tok_s']:.1f} ({r['tok_s_min']:.1f}–{r['tok_s_max']:.1f})",
             f"{r['agree']:.2f}"] for r in load(rel)["results"]]
    return ["workload", variant, "output tok/s, median (range)", "greedy heads agree"], rows


CPU_AMX = "results/cpu_amx/results.json"
CPU_BF16_KV = "results/cpu_bf16_kv/results.json"
WEIGHT_LAYOUT = "results/peer_throughput/smollm2_bf16_weight_layout/results.json"


def weight_layout_ab():
    """SmolLM2 bf16 with its Dense kernels packed for the tiles (the default) against as stored, per workload."""
    by = {}
    for r in table("throughput", WEIGHT_LAYOUT):
        by.setdefault(r["workload"], {})[r["backend"]] = r
    rows = []
    for workload, cells in by.items():
        packed, stored = cells["jaxserve"], cells["jaxserve@engine.weight_layout=as_stored"]
        rows.append([workload, *(f"{c['tok_s_median']:,.1f} ({c['tok_s_min']:,.1f}–{c['tok_s_max']:,.1f})"
                                 for c in (packed, stored)),
                     f"**{x(packed['tok_s_median'] / stored['tok_s_median'])}**", f"{stored['agrees_with_jaxserve']:.2f}"])
    return ["workload", "packed (weight_layout=auto) tok/s", "as stored tok/s", "packed / as stored",
            "same first 8 tokens"], rows


CPU_ATTENTION = "results/cpu_attention/results.json"
ATTENTION_POOL = ("results/cpu_attention_pool/before/results.json", "results/cpu_attention_pool/after/results.json")


def cpu_attention_pool():
    """The attention kernel before and after its page groups: ms a call per pool, then the engine's tok/s."""
    runs = [load(rel) for rel in ATTENTION_POOL]
    rows = [[f"one layer, decode at batch 64, pool of {r0['pool_mib']:,.0f} MiB, ms/call (GB/s of K/V)",
             f"{r0['best_ms']:.3f} ({r0['gb_s']:.1f})", f"{r1['best_ms']:.3f} ({r1['gb_s']:.1f})",
             f"**{x(r0['best_ms'] / r1['best_ms'])}**"]
            for r0, r1 in zip(runs[0]["results"], runs[1]["results"])]
    rows += [[f"engine, {e0['dtype']}, {e0['workload']}, output tok/s, median (range)",
              _median_range(e0["tok_s"], e0["tok_s_range"], ".1f"), _median_range(e1["tok_s"], e1["tok_s_range"], ".1f"),
              f"**{x(e1['tok_s'] / e0['tok_s'])}**"] for e0, e1 in zip(runs[0]["engine"], runs[1]["engine"])]
    return ["figure", f"kernel {runs[0]['meta']['attention_cc_sha256'][:8]} (one page at a time)",
            f"kernel {runs[1]['meta']['attention_cc_sha256'][:8]} (page groups)", "speedup"], rows


def _median_range(v: float, lo_hi: list[float], fmt: str) -> str:
    return f"{v:{fmt}} ({lo_hi[0]:{fmt}}–{lo_hi[1]:{fmt}})"


def cpu_attention():
    """One layer's paged attention at SmolLM2-135M's shapes, then the engine end to end: the XLA loop
    (``JAXSERVE_CPU_ATTENTION=0``) against the C++ kernel, medians (ranges) of alternating rounds."""
    tables = load(CPU_ATTENTION)["tables"]
    rows = [[f"one layer, {r['case']} ({r['tokens']} query tokens), ms",
             _median_range(r["xla_ms"], r["xla_ms_range"], ".3f"), _median_range(r["kernel_ms"], r["kernel_ms_range"], ".3f"), f"**{x(r['speedup'])}**",
             f"max abs diff {r['max_abs_diff']:.1e}"] for r in tables["layer"]]
    rows += [[f"engine, {r['dtype']}, {r['requests']} × (64 → {r['new_tokens']}), output tok/s",
              _median_range(r["xla_tok_s"], r["xla_tok_s_range"], ".1f"),
              _median_range(r["kernel_tok_s"], r["kernel_tok_s_range"], ".1f"), f"**{x(r['speedup'])}**",
              f"greedy heads agree {r['greedy_heads_agree']:.2f}"] for r in tables.get("engine", [])]
    return ["figure", "XLA loop", "C++ kernel", "kernel speedup", "outputs"], rows


# --- experiments ------------------------------------------------------------------------------------

def fp4_quant_error():
    rows = {}
    for r in table("sqnr", "results/fp4_quant_error/results.json"):
        rows.setdefault(r["variant"], {"bits": r["bits_per_element"]})[r["distribution"]] = r["sqnr_db"]
    dists = ("gaussian", "student_t5", "student_t4", "student_t3")
    return (["format", "bits/element", "SQNR dB, Gaussian", "Student-t ν=5", "ν=4", "ν=3"],
            [[v, f"{d['bits']:.3f}", *(f"{d[k]:.2f}" for k in dists)] for v, d in rows.items()])


def fp4_perplexity():
    rel = "results/fp4_perplexity/results.json"
    models = ("jaxserve/tiny-code", "jaxserve/tiny-code-draft")
    by_model = {m: {r["variant"]: r for r in table(f"ppl/{m}", rel)} for m in models}
    rows = [[v, f"{by_model[models[0]][v]['bits_per_weight']:.2f}",
             *(f"{by_model[m][v]['val_ppl']:.2f} ({by_model[m][v]['ppl_vs_ref_pct']:+.2f}%)" for m in models)]
            for v in by_model[models[0]]]
    return ["weights", "bits/weight", "tiny-code ppl (vs float32)", "tiny-code-draft ppl (vs float32)"], rows


def fp4_perplexity_smollm2():
    rel, model = "results/fp4_perplexity/smollm2/results.json", "smollm2-135m-instruct"
    sources = load(rel)["config"]["weight_sources"]
    ppl = {src: {r["variant"]: r for r in table(f"ppl/{model}/{src}", rel)} for src in sources}
    claims = {(r["source"], r["variant"]): r for r in table(f"claim/{model}", rel)}

    def band(r, key):
        return "n/a" if r[f"vs_{key}_pct"] is None else \
            f"{r[f'vs_{key}_pct']:+.1f}% [{r[f'vs_{key}_lo']:+.1f}, {r[f'vs_{key}_hi']:+.1f}]"

    rows = []
    for v, r in ppl[sources[0]].items():
        c = claims.get((sources[0], v))
        rows.append([v, "n/a" if r["bits_per_weight"] is None else f"{r['bits_per_weight']:.2f}",
                     *(f"{ppl[src][v]['val_ppl']:.2f}" for src in sources),
                     band(c, "bf16") if c else "", band(c, "fp8") if c else ""])
    return ["weights", "bits/weight", *(f"ppl from {src}" for src in sources),
            "vs bfloat16 [± 2 SE]", "vs fp8_tensor [± 2 SE]"], rows


def moe_balance():
    rows = [[r["variant"], f"{r['max_vio_global']:.2f}", f"{r['max_vio_batch_last20pct']:.2f}", f"{r['val_ppl']:.2f}"]
            for r in table("variants", "results/moe_balance/results.json")]
    return ["balancing", "MaxVio_global (held-out)", "MaxVio_batch (last 20% of steps)", "val ppl"], rows


def moe_ep():
    rows = [[r["mesh"], r["tokens_per_device"], r["capacity_factor"] or "dropless", f"{r['dropped']}/{r['assignments']}",
             f"{r['sent_bytes'] / r['live_bytes']:.2f}", f"{r['a2a_ms']:.2f}", f"{r['layer_ms']:.2f}"]
            for r in table("points", "results/moe_ep/results.json")]
    return ["mesh", "tokens/device", "capacity factor", "dropped", "padded / routed bytes", "all_to_all ms",
            "layer ms"], rows


def mesh_collectives():
    def bytes_of(ops: dict) -> str:
        return ", ".join(f"{op} {v['bytes'] if isinstance(v, dict) else v:,}" for op, v in ops.items())
    rows = [[r["model"], r["T"], "on" if r["EP"] else "off", r["D"], r["batch"], bytes_of(r["collectives"]),
             bytes_of(r["predicted"]), f"{r['measured_bytes']:,}", f"{r['predicted_bytes']:,}"]
            for r in table("layouts", "results/mesh_collectives/results.json")]
    return ["model", "T", "EP", "D", "B", "bytes per device by collective (HLO)", "predicted", "total (HLO)",
            "total predicted"], rows


def vllm_paged():
    rel = "results/vllm_paged/results.json"
    rows = [[f"KV memory holding token states, {r['policy']}", pct(r["paper_token_states"]), pct(r["token_states"])]
            for r in table("fig2", rel)]
    sustained = {(r["dataset"], r["policy"]): r for r in table("sustained", rel)}
    for base, paper in (("orca_oracle", ("1.7–2.7×", "2.2×")), ("orca_max", ("2.7–8×", "4.3×"))):
        s, a = sustained[("sharegpt", base)], sustained[("alpaca", base)]
        rows.append([f"sustainable request rate, vLLM / {base} (latency knee)", paper[0],
                     f"{x(s['paged_rate_x'])} ShareGPT, {x(a['paged_rate_x'])} Alpaca"])
        rows.append([f"batched requests, vLLM / {base}", paper[1],
                     f"{x(s['paged_batch_x'])} ShareGPT, {x(a['paged_batch_x'])} Alpaca"])
    paper_saving = {("alpaca", "parallel sampling"): "6.1–9.8%", ("sharegpt", "parallel sampling"): "16.2–30.5%",
                    ("alpaca", "beam search"): "37.6–55.2%", ("sharegpt", "beam search"): "44.3–66.3%"}
    sharing: dict[tuple, list] = {}
    for r in table("sharing", rel):
        sharing.setdefault((r["dataset"], r["mode"]), []).append(r)
    for key, paper in paper_saving.items():
        rs = sorted(sharing[key], key=lambda r: r["width"])
        rows.append([f"memory saved, {key[1]} width {' / '.join(str(r['width']) for r in rs)}, {key[0]}", paper,
                     " / ".join(pct(r["saving"]) for r in rs)])
    prefix = {(r["prefix_len"], r["policy"], r["prefix_caching"]): r for r in table("prefix", rel)}
    for n, paper in ((80, "1.67×"), (341, "3.58×")):
        rows.append([f"shared-prefix throughput vs orca_oracle, {n}-token prefix", paper,
                     x(prefix[(n, "paged", True)]["vs_oracle_x"])])
    return ["quantity", "paper (OPT-13B, A100)", "ours (engine steps, NullRunner)"], rows


LIVE = "results/vllm_paged/live_server/results.json"
LIVE_TINY = "results/vllm_paged/live_server/tiny_code/results.json"  # cited: the run that moved the default model


def vllm_paged_live():
    """Per KV policy: the sustained rate at the latency target (mean and p99), paged's rate over it, the paper's."""
    paper = {"orca_oracle": "1.7–2.7×", "orca_max": "2.7–8×"}

    def rate(r, stat):
        bound = "" if r[f"{stat}_bound"] == "=" else r[f"{stat}_bound"]
        return f"{bound}{r[f'{stat}_rate']:.3g}"
    def times(r, stat):  # a policy that misses the target at the lowest rate: paged's ratio is a lower bound
        return ("≥ " if r[f"{stat}_bound"] == "<" else "") + x(r[f"{stat}_paged_x"])
    rows = [[r["policy"], rate(r, "mean"), times(r, "mean"), rate(r, "p99"), times(r, "p99"),
             f"{r['top_throughput']:.2f}", paper.get(r["policy"], "—")] for r in table("sustained", LIVE)]
    targets = load(LIVE)["targets_s_per_token"]
    return ["policy", f"sustained req/s, mean norm. latency ≤ {targets['mean'] * 1000:.0f} ms/token", "vLLM ×",
            f"sustained req/s, p99 ≤ {targets['p99'] * 1000:.0f} ms/token", "vLLM ×", "highest req/s measured",
            "paper: vLLM × (ShareGPT, OPT-13B)"], rows


def blackwell_roofline():
    rel = "results/blackwell_roofline/results.json"
    rows = [[r["claim"], f"{r['value']:.3f}"] for r in table("seed_claims", rel)]
    ratios = [r["ratio_read"] for r in table("validation", rel)]
    fit = load(rel)["fit"]
    rows.append(["jaxserve decode step on this CPU / roofline prediction (small-llama, batch 1–64)",
                 f"{min(ratios):.1f}–{max(ratios):.1f}"])
    rows.append(["fit: measured ms = a + b × predicted ms", f"a = {fit['overhead_ms']:.1f}, b = {fit['slope']:.1f}"])
    return ["figure (datasheets and the roofline model)", "value"], rows


def medusa_heads():
    last = table("eval", "results/medusa_heads/results.json")[-1]
    rows = [[h, f"{last[f'agree_head{h}']:.3f}", f"{last[f'acc_head{h}']:.3f}"] for h in range(1, 5)]
    return [f"head (step {last['step']})", "top-1 agreement with the target's argmax", "top-1 accuracy on the corpus"], rows


MEDUSA_SMOLLM2 = ("results/medusa_heads/smollm2/results.json", f"{SPEC}/smollm2_chat_repetitive_medusa/results.json")


def medusa_smollm2():
    """The SmolLM2 heads' agreement with the target, then each engine row: α, length against theory, target
    calls per token, speedup over the plain engine and whether greedy output matched it."""
    last = table("eval", MEDUSA_SMOLLM2[0])[-1]
    heads = sorted(int(k[len("agree_head"):]) for k in last if k.startswith("agree_head"))
    rows = [["heads (step {})".format(last["step"]), "—", "—", "agreement with the target: "
             + " / ".join(f"{last[f'agree_head{h}']:.3f}" for h in heads), "—", "—", "—", "—"]]
    for r in _engine_rows(MEDUSA_SMOLLM2[1]):
        same = {True: "yes", False: "**no**"}.get(r.get("greedy_identical"), "—")
        rows.append([f"engine, T {r['temperature']:g}", r["batch"], r["gamma"], f"{r['token_acceptance_prob']:.3f}",
                     f"{r['mean_acceptance_length']:.2f} / {r['theory_acceptance_length']:.2f}",
                     f"{r['target_calls_per_token']:.3f}",
                     ("**" if r["speedup"] < 1 else "") + x(r["speedup"]) + ("**" if r["speedup"] < 1 else ""), same])
    return ["row", "batch", "γ", "α", "length / theory", "calls/tok", "speedup", "greedy = plain"], rows


# --- the claims, in order ---------------------------------------------------------------------------

PEER_LEDGER_WORKLOADS = ("batch1", "batch64", "sharegpt")


def _served(backend: str) -> bool:
    """A jaxserve backend as served by default, one decode step a program or K: not an A/B arm (weights as stored,
    quantized)."""
    return backend == "jaxserve" or backend.removeprefix("jaxserve@engine.num_scheduler_steps=").isdigit()


FULL_PRECISION_PEERS = ("hf", "vllm", "llama.cpp", "llama.cpp@F16")  # not llama.cpp@Q4_0: the 4-bit column's


def peer_ledger():
    """Every peer-throughput run a table below cites, oldest first: per workload, jaxserve's best served
    configuration (``_served``) against the fastest peer at the run's precision (``FULL_PRECISION_PEERS``), with
    a link to the table whose caption says what changed; where the run has them, the batch-1 decode of 4-bit
    weights (jaxserve's fastest NVFP4 / MXFP4 configuration against llama.cpp's Q4_0)."""
    titles = {}
    for claim in CLAIMS:
        for rel in claim.sources:
            if rel.startswith("results/peer_throughput/"):
                titles.setdefault(rel, claim.title)
    rows = []
    for rel, title in sorted(titles.items(), key=lambda kv: load(kv[0])["meta"]["date"]):
        meta, cells = load(rel)["meta"], {}
        for r in table("throughput", rel):
            cells.setdefault((r["model"], r["workload"]), {})[r["backend"]] = r["tok_s_median"]
        for model in dict.fromkeys(m for m, _ in cells):
            ratios = []
            for workload in PEER_LEDGER_WORKLOADS:
                by = cells.get((model, workload), {})
                ours = [v for b, v in by.items() if _served(b)]
                peers = {b: v for b, v in by.items() if b in FULL_PRECISION_PEERS}
                if not ours or not peers:
                    ratios.append("—")
                    continue
                peer = max(peers, key=peers.get)
                ratios.append(f"{x(max(ours) / peers[peer])} {peer}")
            batch1 = cells.get((model, "batch1"), {})
            fp4 = [v for b, v in batch1.items() if "quantization=nvfp4" in b or "quantization=mxfp4" in b]
            ratios.append(f"{x(max(fp4) / batch1['llama.cpp@Q4_0'])} llama.cpp@Q4_0"
                          if fp4 and "llama.cpp@Q4_0" in batch1 else "—")
            if set(ratios) == {"—"}:
                continue
            dtype = meta["command"].split("--dtype ")[1].split()[0] if "--dtype " in meta["command"] else "float32"
            machine = meta["machine"].replace("(R)", "").replace(" (cpu)", "")
            run = pathlib.PurePosixPath(rel).parent.name
            rows.append([meta["date"][:10], meta["git_commit"][:7], machine, model, dtype,
                         f"[`{run}`](#{_anchor(title)})", *ratios])
    return ["date", "commit", "machine", "model", "dtype", "run (its table says what changed)",
            *(f"{w}: jaxserve / fastest peer" for w in PEER_LEDGER_WORKLOADS),
            "batch1, 4-bit weights: jaxserve's FP4 / llama.cpp's Q4_0"], rows


def _anchor(title: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


CLAIMS = (
    Claim("Offline throughput: jaxserve vs Hugging Face transformers", ("results/throughput_vs_hf/results.json",),
          throughput_vs_hf,
          "Same random weights in both backends (`random:small-llama`, 6.8M parameters, float32), 64 requests, "
          "greedy, EOS ignored; HF runs `generate` on one left-padded batch. The ≥ 2× goal holds on the "
          "ShareGPT-like workload (long-tailed lengths, where static batching pads and waits), not on `random` "
          "(outputs 64–192). Both backends moved ~15% between idle runs: compare ratios within one run."),
    Claim("Every peer run, oldest first: jaxserve against the engines users would pick instead", (),
          peer_ledger,
          "One row per run (and model) of `benchmarks/peers/compare.py` that a table below cites: jaxserve's best "
          "served configuration (one decode step a program or `num_scheduler_steps=K`; not the A/B arms such as "
          "weights as stored or quantized weights) against the fastest other backend at the same precision "
          "(vLLM CPU, transformers, llama.cpp with F16 weights), medians of the run's rounds. Ratios are within "
          "one run; the machines differ between rows (the 2-core VMs this project ran on: an AMD EPYC, an "
          "Intel Xeon with AMX and a 300 MiB L3, an Intel Xeon @ 2.80GHz without AMX, Ice Lake), so read a change "
          "against the row before it on the same machine. The linked table gives the run's command, ranges and "
          "caveats. Issue 28's goals: ≥ 1.2× vLLM at batch 64 and ShareGPT; at batch 1, ≥ llama.cpp with 16-bit "
          "weights and with 4-bit weights (the last column: any of jaxserve's FP4 configurations, including int8 "
          "activations, against llama.cpp's Q4_0)."),
    Claim("The tiny Llama beside vLLM CPU and transformers, 2 threads (float32)",
          SMALL_LLAMA_2THREADS, functools.partial(peer_throughput, SMALL_LLAMA_2THREADS),
          "`benchmarks/peers/compare.py --model random:small-llama --backends jaxserve,hf,vllm --workloads "
          "batch1,batch64,sharegpt --rounds 3 --threads 2 --sharegpt-scale 0.25` at 9f54002, the rerun the table "
          "below asks for: the same random float32 Llama (vocab 4096, hidden 256, 6 layers) in every backend, on "
          "the idle 2-core Intel Xeon VM with a 300 MiB L3 of the bf16 table above (load average 0.1 before). "
          "llama.cpp is not in this run (its vendored build takes ~16 min of both cores; not built on this VM). "
          "jaxserve leads at batch 1 (1.24× vLLM) and ties on ShareGPT (0.99×); vLLM leads at batch 64 (jaxserve "
          "0.84×): the goal (≥ 1.2× vLLM at batch 64 and ShareGPT) is not met on the tiny model. Its float32 "
          "weights (~10 MB) sit in the L2/L3, so its steps are bound by per-step work, not memory."),
    Claim("Side by side with the engines users would pick instead: vLLM CPU, llama.cpp, transformers",
          PEER_RUNS, peer_throughput,
          "`benchmarks/peers/compare.py`: one process, the same float32 weights in every backend (HF export for "
          "transformers and vLLM, an F32 GGUF export for llama.cpp), greedy, EOS ignored, rounds alternating the "
          "backends with the order rotated. batch1: 1 request 64 → 128 tokens; batch64: 64 of them; sharegpt: 64 "
          "ShareGPT-like requests with the lengths scaled (`config.sharegpt_scale`); the last column is the fraction "
          "of requests whose first 8 greedy tokens match jaxserve's, for the backend that matches least (a near-tie "
          "flipping under other summation orders; different weights would score ~0). Every backend on ONE core "
          "(`taskset -c 1`, `--threads 1`, XLA with `--xla_cpu_multi_thread_eigen=false`) under `nice -n 19`, "
          "because the shared 2-core VM ran at load average 14–15 (other engineers' builds and tests): at 2 "
          "threads the OpenMP backends (torch, llama.cpp, vLLM) collapsed 14–28× (an aborted first run: HF, vLLM and llama.cpp "
          "batch1, HF batch64) waiting at barriers for a "
          "descheduled thread. Only 2 rounds, and wide ranges: a first side-by-side, not the issue's idle-machine "
          "table; rerun on an idle machine with `--threads 2` before drawing conclusions."),
    Claim("SmolLM2-135M-Instruct beside vLLM CPU, llama.cpp and transformers (float32, 2 threads)",
          SMOLLM2_PEER_RUNS, functools.partial(peer_throughput, SMOLLM2_PEER_RUNS),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends jaxserve,hf,vllm,llama.cpp --workloads "
          "batch1,batch64,sharegpt --rounds 3 --threads 2 --dtype float32`: the packaged Q4_1 GGUF dequantized to float32 "
          "and exported to every backend (HF directory for transformers and vLLM 0.32 CPU, an F32 GGUF for llama.cpp "
          "0.3.36's vendored build), greedy, EOS ignored, rounds rotating the backends. The 2-core AMD EPYC VM had no "
          "other job but a niced `pytest --collect-only` for ~7 min of the first round (load average 1.7 before, "
          "see the run's meta after). jaxserve ran at d166b68 (the meta's commit is the tree's when the file was written). "
          "vLLM's CPU backend (oneDNN GEMMs, its own paged attention) leads at batch 64 and on ShareGPT; llama.cpp at "
          "batch 1. The issue's goal (jaxserve ≥ 1.2× vLLM CPU at batch 64 and ShareGPT) is not met."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU at batch 64 and ShareGPT (one KV budget, AMX GEMMs)",
          SMOLLM2_BF16_VLLM_RUNS + (SMOLLM2_BF16_VLLM_PREFETCH, SMOLLM2_BF16_VLLM_RESIDUAL, SMOLLM2_BF16_VLLM_GREEDY_HEAD,
                                    SMOLLM2_BF16_VLLM_EPILOGUES, SMOLLM2_BF16_VLLM_ARGMAX, MEMORY_BANDWIDTH_XEON_L3),
          functools.partial(smollm2_bf16_vllm, ceiling=MEMORY_BANDWIDTH_XEON_L3),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends jaxserve,vllm --workloads "
          "batch64,sharegpt --rounds 5 --threads 2 --dtype bfloat16` at b84bf2f, on a 2-core Intel Xeon VM "
          "(AMX) with a 300 MiB L3 (two threads read 1 GiB at 29.9 GB/s: `benchmarks/memory_bandwidth.py`, "
          "[`xeon_l3`](../results/memory_bandwidth/xeon_l3); a step's 269 MB of weights come partly from the L3), "
          "load average 1.2 "
          "before: the packaged Q4_1 GGUF dequantized and cast to bf16 for both, greedy, EOS ignored, 1 GiB of KV "
          "cache each, every run from an empty prefix cache, rounds rotating the backends. jaxserve 1,674 against "
          "vLLM 1,718 tok/s at batch 64 (**0.97×**; vLLM's five runs spread 1,525-1,945), 871 against 696 on "
          "ShareGPT (**1.25×**): the goal (≥ 1.2× vLLM at both) is met on ShareGPT in this run, not at batch 64. "
          "The run before, at 84390ba (minutes earlier, 5 rounds, without the last two attention changes below; its "
          "record's +dirty: an experiment edited attention.cc after the processes had loaded the kernels, "
          "[`_prefetch`](../results/peer_throughput/smollm2_bfloat16_vllm_prefetch)): 1,927 vs 1,928 (**1.00×**) "
          "and 981 vs 872 (**1.13×**). What changed since the 5f470d9 run below: the packed AMX GEMM passes every 32-row "
          "block of x over one weight group before the next and prefetches the stream 32 KB ahead into L2 from the "
          "first block (gate/up at 64 rows, weights from memory, two threads 206 -> 172 µs; the batch-64 step "
          "36-40 -> 32-33 ms, alternating processes); the attention kernel hands few work items out one at a time "
          "(16 a chunk had left a batch of up to 5 sequences, 15 items, on one thread: ShareGPT's tail, one running "
          "sequence with a long context 11.5 -> 8.9 ms a step, five 17.9 -> 12.1) and asks for the next page "
          "group's K and V into L2 (batch 64 over a scattered pool, `benchmarks/cpu_attention_pool.py`: 0.34-0.39 "
          "-> 0.28-0.32 ms a call; not in the 84390ba run), and takes a bf16 model's queries and gives its output as bf16 "
          "(no converts around the call: the converts' bits, tested; not in the 84390ba run). The VM moved between runs of the same code (jaxserve 1,644 and 1,888, vLLM "
          "1,584 and 1,773 at batch 64 in two 3-round runs within the hour; jaxserve's ShareGPT 757-774), so only "
          "ratios within one run compare. The batch-64 decode step after the changes (`benchmarks/profile_step.py`, "
          "30.5 ms untraced, 30.2 traced): attention 8.6 ms (its K/V at ~22 GB/s), gate/up 6.4, down 4.1, q/k/v "
          "2.4, o 1.8, the tied head's argmax 2.4 (the GEMMs' 269 MB at ~16 GB/s), the KV scatters 1.4, the "
          "norm / RoPE / convert fusions ~2.7; a 512-token prefill step costs ~85 ms (9 of the workload's 136 steps, "
          "18% of its time: the GEMMs at 512 rows are bound by their tile loads, not memory). ShareGPT's 761 steps "
          "spend 46% of the time with at most 8 sequences running. The previous run of the same command (3 rounds, "
          "at 5f470d9, another Intel Xeon VM, [`_residual`](../results/peer_throughput/smollm2_bfloat16_vllm_residual)): "
          "1,126 vs 1,193 (0.94×) and 486 vs 479 (1.01×), after the AMX GEMM's bf16 and gated-SiLU epilogues, the "
          "residual adds in the o and down GEMMs' epilogues (rounded to bf16 at each add, as the model defines it), "
          "and the greedy head's argmax in the tied head's GEMM; before the residual adds, at f72987b "
          "([`_greedy_head`](../results/peer_throughput/smollm2_bfloat16_vllm_greedy_head)): 1,139 vs 1,197 (0.95×) "
          "and 496 vs 491 (1.01×); before the greedy head, at 96d7ff8 "
          "([`_epilogues`](../results/peer_throughput/smollm2_bfloat16_vllm_epilogues)): 1,081 vs 1,232 (0.88×) and "
          "490 vs 503 (0.97×); at 4be4029 ([`_argmax`](../results/peer_throughput/smollm2_bfloat16_vllm_argmax)): "
          "0.75× and 0.92×. Earlier runs without a record here: at 36af0d6 914 vs 1,322 and 474 vs 528 tok/s; at "
          "467c94c 845 vs 1,333 and 409 vs 542; at 6f61d3b (float32 KV pool) 657 vs 1,248 and 326 vs 521. The "
          "weight columns count one read of every weight per step of 64 tokens (KV reads come on top) against this "
          "VM's read ceiling (two threads reading 1 GiB with `numpy.max`)."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU: multi-step decoding (num_scheduler_steps)",
          (SMOLLM2_BF16_MULTI_STEP, MEMORY_BANDWIDTH_XEON_L3),
          functools.partial(multi_step_vllm, weight_bytes=SMOLLM2_PARAMS * 2, ceiling=MEMORY_BANDWIDTH_XEON_L3),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm --workloads batch64,sharegpt --rounds 5 --threads 2 "
          "--dtype bfloat16` at d779ad7 (its +dirty: README and docs only), the VM and settings of the bf16 table "
          "above (load average 0.9 before): the plain engine, the same engine running up to 8 decode steps in one "
          "program whenever every running request decodes (`EngineConfig.num_scheduler_steps`, vLLM's multi-step "
          "scheduling; same tokens, bit for bit), and vLLM 0.32, rounds rotating the three. With 8 steps a program "
          "jaxserve is **1.10×** vLLM at batch 64 and **1.23×** on ShareGPT (one step a program: 1.07× and 1.16× in "
          "this run; vLLM ran ~7% slower than in the table above). Round by round the 8-step engine was faster in "
          "4 of 5 batch-64 rounds (0-3%) and all 5 ShareGPT rounds (1-12%): it saves the jitted call's dispatch (most "
          "of it the pool's 60 donated buffers) and the engine's host work for 7 of every 8 tokens "
          "(`benchmarks/multi_step_decode.py`: 0.8-1.5 ms of a ~29 ms batch-64 step, 0.6-1.1 of ~10 ms at batch 1). "
          "The goal (≥ 1.2× vLLM at both) is met on ShareGPT, not at batch 64, where the prefill is still 0.65× "
          "vLLM's (below). The five runs of each backend spread 14-17% at batch 64 (rounds 1 and 4 slow for all "
          "three: the VM). The cost: warm-up compiled the 10 decode buckets' programs in 206 s against 17 s "
          "(each runs 8 steps unrolled; a `lax.fori_loop` over the steps compiles once but ran slower than separate "
          "calls on XLA:CPU), and a request that arrives during a multi-step waits for it; one waiting with a free "
          "seat is admitted at once (the step then runs single)."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU: decode steps write their K/V in the attention kernel",
          (SMOLLM2_BF16_ATTENTION_WRITE, MEMORY_BANDWIDTH_XEON_L3),
          functools.partial(multi_step_vllm, SMOLLM2_BF16_ATTENTION_WRITE, weight_bytes=SMOLLM2_PARAMS * 2,
                            ceiling=MEMORY_BANDWIDTH_XEON_L3),
          "The multi-step table's command again, at 9eedd9e (its +dirty: a float32-only runner edit made after the "
          "engines had loaded, since reverted), 2026-12-06 18:43 UTC, the same VM (load average 1.4 before). What "
          "changed: a decode step (and a verify round: at most 8 new tokens a sequence) no longer scatters its K/V "
          "rows into the pool with XLA before the attention call; the C++ kernel's writing variant takes the rows and "
          "the pools aliased in place, and each work item stores its (sequence, head)'s rows just before it reads "
          "their pages, so the write's cache misses are the read's (the scatter, a pass of its own, missed on every "
          "K line of pages written a step ago: 1.4 ms of a 30 ms batch-64 step). Same pools and outputs bit for bit "
          "(tests/kernels/test_cpu_attention.py). The batch-64 decode step (`benchmarks/profile_step.py`, processes "
          "alternating with the commit before, three pairs): 28.7-29.1 ms against 30.0-32.4. Against vLLM: 8 steps a "
          "program **1.12×** at batch 64 (1.10× in the run above) and **1.32×** on ShareGPT (1.23×); one step a "
          "program 1.07× and 1.12×. The VM slowed through the run for every backend (round 0 at ~4 s, round 4 at "
          "~6.5 s for batch 64), so the rounds' own ratios matter: at batch 64 the 8-step engine was 1.05-1.25× "
          "vLLM round by round, on ShareGPT 1.22-1.37×. The goal (≥ 1.2× vLLM at both) is met on ShareGPT, not at "
          "batch 64."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU on a CPU without AMX or AVX512-BF16 (Ice Lake): the packed "
          "GEMM on float32 FMAs",
          (SMOLLM2_BF16_ICELAKE_FMA, MEMORY_BANDWIDTH_ICELAKE),
          functools.partial(packed_fma_vllm, SMOLLM2_BF16_ICELAKE_FMA, ceiling=MEMORY_BANDWIDTH_ICELAKE),
          "`python benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,jaxserve@engine.weight_layout=as_stored,vllm\" "
          "--workloads batch1,batch64,sharegpt --rounds 3 --threads 2 --dtype bfloat16`, at 3509234 (+dirty: a "
          "docstring), 2026-12-07 00:28-00:59 UTC, on a 2-core Intel Xeon VM of another kind than the tables above: Ice Lake "
          "(model 106), AVX-512 F/BW/VNNI but neither AMX nor AVX512-BF16, 48 MiB L3, its read ceiling measured the "
          "same day (`python benchmarks/memory_bandwidth.py`). There the AMX kernels cannot run and, before this "
          "change, the engine kept a bf16 model's weights as stored: 1-16 rows on the streaming kernel, more on "
          "XLA's bf16 dot, which converts the weights to float32 on every call (the \"as stored\" column). The packed "
          "GEMM now has a second implementation, float32 FMAs on the same packed layout with the same epilogues and "
          "norm (`jaxserve/kernels/cpu/packed_fma.h`: its sums a float32 loop over k, bit for bit), and the engine "
          "packs wherever the kernels load. The decode step at batch 64 (`benchmarks/profile_step.py --workload "
          "batch64`): 195 ms against 283 with the weights as stored; it is bound by the FMAs (~17 GFLOP a step), not "
          "by memory. vLLM's bf16 on this CPU has no bf16 dot either (126 tok/s at batch 64); its float32 is faster "
          "there (the next table: 319 tok/s, so jaxserve's bf16 is ~1.16× vLLM's best setting, across two runs). "
          "The VM was noisy (the same kernel binary measured 29-92 GFLOP/s minute to minute in a "
          "one-thread harness): read the ranges."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU on the Ice Lake VM (no AMX, no AVX512-BF16)",
          (SMOLLM2_F32_ICELAKE, MEMORY_BANDWIDTH_ICELAKE),
          functools.partial(multi_step_vllm, SMOLLM2_F32_ICELAKE, weight_bytes=SMOLLM2_PARAMS * 4,
                            ceiling=MEMORY_BANDWIDTH_ICELAKE),
          "`python benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm\" --workloads batch64 --rounds 3 --threads 2 --dtype "
          "float32`, at 0420d88, 2026-12-07 01:41-01:59 UTC, the VM of the table above. On this CPU vLLM is faster in "
          "float32 (319 tok/s here) than in bf16 (127 in the run above: it has no bf16 dot here either), so float32 is "
          "vLLM's best setting on it, and jaxserve's float32 path (OpenBLAS's sgemm from 17 rows) reaches only 0.53-0.70× "
          "of it. jaxserve's best on this CPU is bf16 on the packed FMA GEMM: 369 tok/s at batch 64 in the run above "
          "(8 steps a program), against this run's vLLM float32 319: ~1.16×, across two runs of the same VM an hour "
          "apart, not side by side (compare.py runs one dtype a run)."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU on the Ice Lake VM: a float32 model's Dense kernels packed "
          "(float32 FMAs over k in order)",
          (SMOLLM2_F32_ICELAKE_PACKED, MEMORY_BANDWIDTH_ICELAKE),
          functools.partial(packed_fma_vllm, SMOLLM2_F32_ICELAKE_PACKED, ceiling=MEMORY_BANDWIDTH_ICELAKE,
                            bytes_per_weight=4, packed="float32 packed",
                            stored="gemv / f32_matmul / OpenBLAS sgemm"),
          "`python benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,jaxserve@engine.weight_layout=as_stored,vllm\" "
          "--workloads batch1,batch64,sharegpt --rounds 3 --threads 2 --dtype float32`, at 0c0d777, 2026-12-07 "
          "04:04-04:37 UTC, the Ice Lake VM of the two tables above (its third round ran slower for every backend: "
          "read the medians). What changed: the engine now packs a float32 model's Dense kernels too "
          "(`jaxserve/kernels/cpu/packed_f32.py`, `packed_fma.h`'s `gemm_packed_f32`: 32-column groups streamed once "
          "a call while blocks of up to 12 rows keep their sums in registers, each output float32 FMAs over k in "
          "order, so a row gets the same bits alone or in a batch), where the stored layout runs XLA's gemv at one "
          "row, `f32_matmul` at 2-16 and OpenBLAS's sgemm above, which packs the whole weight into its panels on "
          "every call. The decode step at batch 64 (`benchmarks/profile_step.py --dtype float32 --workload batch64`, "
          "`engine.weight_layout=as_stored` against the default): 263 -> 221 ms; at batch 1, 40 -> 32-37 ms. Against "
          "vLLM's float32 (its best setting on this CPU): batch 64 0.88× (0.53-0.70× before, previous table), "
          "ShareGPT **1.09×**, batch 1 1.19×; the goal (≥ 1.2× at batch 64 and ShareGPT) is not met in float32. "
          "The tied LM head (49152 × 576, ~36 ms of the 221 ms step) ran OpenBLAS's sgemm at this commit (packed in "
          "the next table)."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU on the Ice Lake VM: few-row GEMMs one range a thread",
          (SMOLLM2_F32_ICELAKE_STREAMS,),
          functools.partial(multi_step_vllm, SMOLLM2_F32_ICELAKE_STREAMS),
          "`python benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm\" --workloads batch1,sharegpt --rounds 3 --threads 2 "
          "--dtype float32`, at 3c18146, 2026-12-07 14:02-14:18 UTC, the Ice Lake VM in a slow phase (vLLM's "
          "ShareGPT 191 tok/s against 236 in the next table's quiet hour). What changed: the packed GEMMs split a call "
          "of up to 4 rows into one contiguous range a thread instead of 8 chunks each (6485b2c), which ShareGPT's "
          "tail (431 of its 758 decode steps run 1-8 rows) and batch 1 use. ShareGPT **1.11×** vLLM (the table "
          "below: 1.04×), batch 1 1.24× (1.21×); the goal (≥ 1.2× at ShareGPT) is still not met in float32 here. "
          "Eight steps a program ran slower than one in this run, at both workloads (4.8-5.0 s against 4.1-4.5 s "
          "a batch-1 round), as in no float32 run before; an alternating A/B afterwards (batch 1, one process per "
          "arm, 4 runs each, 14:56-15:01 UTC) gave 8 steps 28.0 / 29.8 tok/s against one step 25.1 / 26.8 with the "
          "change and 27.9 / 28.4 against 26.4 / 24.5 without it: that run's order was the VM's, not the change's."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU on the Ice Lake VM: the tied LM head packed too",
          (SMOLLM2_F32_ICELAKE_PACKED_HEAD, MEMORY_BANDWIDTH_ICELAKE),
          functools.partial(multi_step_vllm, SMOLLM2_F32_ICELAKE_PACKED_HEAD, weight_bytes=SMOLLM2_PARAMS * 4,
                            ceiling=MEMORY_BANDWIDTH_ICELAKE),
          "`python benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm\" --workloads batch1,batch64,sharegpt --rounds 3 "
          "--threads 2 --dtype float32`, at f87ae76, 2026-12-07 09:31-09:46 UTC, the Ice Lake VM of the tables above, "
          "quiet this hour (vLLM's own batch-64 rounds 406-413 tok/s). What changed since the previous table: the tied "
          "embedding is packed once as the LM head (`pack_tied_head` for a float32 model: `PackedF32`, whose columns "
          "are the token lookups), so the head is the packed GEMM too, in place of OpenBLAS's sgemm (from 17 rows) and "
          "the streaming kernel (2-16): on the model's own [576, 49152] head at 64 rows, 23 ms a call against "
          "OpenBLAS's 32 in a harness (`f32_gemm_packed` against `f32_gemm` on the engine's weights). Against vLLM's "
          "float32: batch 1 **1.21×**, batch 64 **0.98×**, ShareGPT **1.04×** at 8 steps a program. A first run at "
          "c2f3bf4 in a noisy hour (vLLM 312-360 tok/s at batch 64) read 1.38×, 0.92× and 1.21×: its ShareGPT figure "
          "was noise. The goal (≥ 1.2× at batch 64 and ShareGPT) is not met, and this VM leaves little room for it: "
          "its two cores peak at 218 GFLOP/s (numpy's 4096² sgemm, quiet) and read 26.7 GB/s. Batch 64 is 3.14 TFLOP "
          "(the 64 × 64 prompt tokens 0.87, then 127 decode steps of 64 rows, 17.8 GFLOP each), at most 569 tok/s: "
          "jaxserve's 402 is 71% of it, vLLM's 408 72%, and 1.2× vLLM (490) would need 86% of the sgemm peak end to "
          "end. ShareGPT has 758 decode steps, most of a few rows, each reading all 538 MB of weights: with a step at "
          "least max(20 ms of reads, 1.23 ms of FMAs a row) it is at most ~422 tok/s; jaxserve 246 is 58%, vLLM 236 "
          "56%. 1.2× vLLM (283) would need the few-row steps near the read ceiling: batch 1 runs 26.9 ms a step, 20 "
          "GB/s of weights (75%). `XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`, which looked "
          "faster in the noisy hour, changed nothing here (batch 64, 4 runs in each of two processes per setting, "
          "alternated: 407 / 415 and 426 / 426 tok/s medians)."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU: the RMSNorms applied inside the q/k/v and gate/up GEMMs",
          (SMOLLM2_BF16_NORM_IN_GEMM, MEMORY_BANDWIDTH_XEON_L3),
          functools.partial(multi_step_vllm, SMOLLM2_BF16_NORM_IN_GEMM, weight_bytes=SMOLLM2_PARAMS * 2,
                            ceiling=MEMORY_BANDWIDTH_XEON_L3),
          "The multi-step table's command again, at a8ee6d6 (its +dirty: docs/architecture.md only), 2026-12-06 "
          "21:07 UTC, the same VM (load average 1.1 before, 2.1 after). What changed: the two RMSNorms of a layer are "
          "no longer XLA fusions writing the normed [T, 576] matrix; the model hands the packed q/k/v and gate/up "
          "GEMMs its rows unnormed with each row's inverse RMS (`jaxserve.layers.NormedRows`), and the GEMM applies "
          "the norm's last multiplies as it pads its copy of the rows, the bits of XLA's fusion "
          "(tests/kernels/test_cpu_amx_packed.py). The batch-64 decode step (`benchmarks/profile_step.py`, processes "
          "alternating with the commit before, three pairs): 29.5-32.0 ms against 30.3-34.9; a 512-token prefill "
          "step (`--workload prefill64`, two pairs) 77 ms against 84. Against vLLM: 8 steps a program **1.11×** at "
          "batch 64 (1.04-1.14× round by round) and **1.32×** on ShareGPT (1.27-1.37×); one step a program 1.08× and "
          "1.20×. The step-level gain (~2-3% of a decode step, ~8% of a prefill step) is inside the run-to-run spread "
          "of the batch-64 ratio (1.12× in the run above): the goal (≥ 1.2× vLLM at both) is met on ShareGPT, not at "
          "batch 64."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU on a third VM kind (AMX, 480 MiB L3)",
          (SMOLLM2_BF16_XEON_480, MEMORY_BANDWIDTH_XEON_480),
          functools.partial(multi_step_vllm, SMOLLM2_BF16_XEON_480, weight_bytes=SMOLLM2_PARAMS * 2,
                            ceiling=MEMORY_BANDWIDTH_XEON_480),
          "The multi-step table's command with the prefill-only workload added, at 612007e (its +dirty: "
          "scripts/results_tables.py only), 2026-12-07 22:45-22:55 UTC, on a 2-core Intel Xeon VM of a kind not "
          "seen before: AMX and AVX512-BF16, 2.6 GHz, 2 MiB L2 a core and 480 MiB of L3 reported, reading 34.6 GB/s "
          "with two threads (`python benchmarks/memory_bandwidth.py`), load average 0.5 before. No code changed "
          "since the tables above. With 8 steps a program jaxserve is **1.31×** vLLM at batch 64 (1.23× with one "
          "step) and **1.43×** on ShareGPT (1.35×); both goals (≥ 1.2× vLLM) are met on this VM, five rounds each, "
          "every batch-64 round of the 8-step engine 1.23-1.37× vLLM's of the same round. vLLM's batch-64 rate here "
          "(1,067 tok/s) is 0.62-0.67× its rate on the 300 MiB-L3 VM of the tables above (1,603-1,718), jaxserve's "
          "(1,400) 0.75-0.80× (1,760-1,857): the ratio depends on the VM, and on that VM batch 64 stays at "
          "1.11-1.12×. Prefill alone (`prefill64`) is still vLLM's: jaxserve 0.76-0.79×. A 512-row prefill step "
          "here (`benchmarks/profile_step.py --workload prefill64`, traced): ~100 ms, of it gate/up 29, down 21, "
          "attention 16, q/k/v 11, o 8; the GEMMs at 0.6-0.9 TFLOP/s a thread (gate/up the fastest, down the slowest) against a tile peak of ~3.3 measured on the 300 MiB-L3 VM."),
    Claim("Five runs in one process, back to back: SmolLM2-135M-Instruct in bf16 on the AMX VM with 480 MiB of L3",
          (SMOLLM2_BF16_BACK_TO_BACK,), functools.partial(run_spread, SMOLLM2_BF16_BACK_TO_BACK),
          "Issue 28's stability goal (no bimodal runs: five runs in one process within 10% of each other), judged on "
          "the quietest VM this project has had: `python benchmarks/peers/compare.py --model smollm2-135m-instruct "
          "--backends \"jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm\" --workloads batch64,sharegpt --rounds 5 "
          "--back-to-back --threads 2 --dtype bfloat16`, each backend's five runs of a workload in a row with nothing "
          "else running between them (`--back-to-back`; the tables above rotate the backends round by round), "
          "2026-12-07 23:01-23:11 UTC, the VM of the two tables above, at b5538c9 (its +dirty: `--back-to-back` "
          "itself, scripts/ and tests/). Every jaxserve setting's five runs are within **7%** of each other (the "
          "slowest over the fastest), vLLM's within 8%: the goal is met here. The same engine's runs rotating with "
          "vLLM's in the table above spread 13% (8 steps a program at batch 64: 5.50-6.24 s), and a `/tmp` script "
          "running the 8-step engine's batch 64 eight times in one process minutes earlier gave 5.57-5.93 s (6.5%, "
          "25 engine steps every run): the wider spread came from the VM's minutes and the other processes between "
          "the runs, not from the engine. In this run jaxserve with 8 steps a program is 1.37× vLLM at batch 64 "
          "(median against median) and 1.37× on ShareGPT."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU on the AMX VM with 480 MiB of L3",
          (SMOLLM2_F32_XEON_480,), functools.partial(backends_vs_vllm, SMOLLM2_F32_XEON_480),
          "The same VM as the table above, 20 minutes earlier, at 612007e: 3 rounds, jaxserve with 8 decode steps a "
          "program (its float32 Dense kernels and tied head packed, float32 FMAs: no AMX in float32) and vLLM's "
          "float32 (the run wrote to /tmp and was copied here; its command names this folder). Batch 64 **1.05×**, "
          "ShareGPT **1.11×**: the float32 goal (≥ 1.2× vLLM) is not met here either (0.98× and 1.04× on the Ice "
          "Lake VM). Float32 runs at ~0.29× of bf16 here for jaxserve and ~0.36× for vLLM: float32 is neither "
          "backend's best setting on an AMX CPU."),
    Claim("The tiny Llama beside vLLM CPU: multi-step decoding (num_scheduler_steps, float32, 2 threads)",
          (SMALL_LLAMA_MULTI_STEP,), functools.partial(multi_step_vllm, SMALL_LLAMA_MULTI_STEP),
          "`benchmarks/peers/compare.py --model random:small-llama --backends "
          "jaxserve,jaxserve@engine.num_scheduler_steps=8,jaxserve@engine.num_scheduler_steps=16,vllm --workloads "
          "batch1,batch64,sharegpt --rounds 3 --threads 2 --sharegpt-scale 0.25` at 95211e0 (its +dirty: "
          "scripts/results_tables.py only), the VM of the tiny-Llama table above, load average 1.0 before: the same "
          "random float32 Llama (vocab 4096, hidden 256, 6 layers) in every backend. Its steps are short (~9 ms at "
          "batch 64, ~1.4 ms at batch 1), so the dispatch and host work a multi-step saves are a large share: 8 "
          "steps a program are 1.50× the single-step engine at batch 1, 1.16× at batch 64 and 1.35× on ShareGPT "
          "(every round faster), which puts jaxserve at 0.99-1.01× vLLM at batch 64 (was 0.85× in this run) and "
          "1.18-1.22× on ShareGPT (was 0.90×): the goal (≥ 1.2× vLLM at both) is met on ShareGPT with 8 steps, not at "
          "batch 64. 16 steps add a little at batch 1 and 64 and nothing on ShareGPT (more tokens computed past a "
          "request's end). Warm-up: 5 s with one step a program, 60 s with 8, 116 s with 16."),
    Claim("The tiny Llama beside vLLM CPU on the Ice Lake VM: float32 packed kernels, multi-step decoding",
          (SMALL_LLAMA_ICELAKE,), functools.partial(multi_step_vllm, SMALL_LLAMA_ICELAKE),
          "`python benchmarks/peers/compare.py --model random:small-llama --backends "
          "\"jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm\" --workloads batch1,batch64,sharegpt --rounds 5 "
          "--threads 2 --sharegpt-scale 0.25` at f87ae76 (its +dirty: results files only), 2026-12-07 09:57-10:00 UTC, "
          "the Ice Lake VM of the SmolLM2 float32 tables (2-core Xeon, AVX-512 without AMX; load average 0.6 before): "
          "the same random float32 Llama (vocab 4096, hidden 256, 6 layers) in every backend. Since the table above "
          "(another VM, before the float32 kernels) a float32 model's Dense kernels and tied head run the packed "
          "float32 GEMM at every row count. With 8 steps a program jaxserve is **1.31×** vLLM at batch 64 and "
          "**1.80×** on ShareGPT, every round of it above vLLM's fastest (4,525 against 4,119 and 3,390 against 2,141 "
          "tok/s), and 3.4× at batch 1: the goal (≥ 1.2× vLLM at both) is met on the tiny model on this VM. vLLM's "
          "own figures here are about half of its figures on the AMX VM above (its CPU backend's kernels use AMX "
          "there); a 3-round run just before read 1.27× / 1.84× / 3.3×. The spread is wide for every backend (vLLM "
          "2,963-4,119 at batch 64): the five runs of one process are not within 10% (8 steps at batch 64: 4,525-5,196, "
          "15%) on this shared VM."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU: multi-step decoding (num_scheduler_steps)",
          (SMOLLM2_F32_MULTI_STEP, MEMORY_BANDWIDTH_XEON_L3),
          functools.partial(multi_step_vllm, SMOLLM2_F32_MULTI_STEP, weight_bytes=SMOLLM2_PARAMS * 4,
                            ceiling=MEMORY_BANDWIDTH_XEON_L3),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "jaxserve,jaxserve@engine.num_scheduler_steps=8,vllm --workloads batch64,sharegpt --rounds 3 --threads 2 "
          "--dtype float32` at e5a0fd0, the VM and settings of the bf16 multi-step table above. Multi-step decoding "
          "changes nothing in float32 (481 vs 482 tok/s at batch 64, 256 vs 253 on ShareGPT): a float32 batch-64 "
          "step takes ~125 ms (17 s a run), so the ~1 ms of dispatch and host work it saves is under 1%. "
          "vLLM leads 1.16× at batch 64 and 1.21-1.23× on ShareGPT (the float32 table below, at 5adf525 on the same "
          "kind of VM: 1.35× and 1.36×); the goal (≥ 1.2× vLLM) is not met in float32."),
    Claim("Multi-step decoding at a live server: latency for throughput (SmolLM2-135M-Instruct, bf16)",
          (MULTI_STEP_SERVING,), multi_step_serving,
          "`python benchmarks/multi_step_serving.py` (defaults: `jaxserve serve smollm2-135m-instruct --dtype bfloat16` "
          "with compare.py's engine, 1 GiB of KV cache, 64 seats, once with one decode step a program and once with "
          "`engine.num_scheduler_steps=8`; 120 ShareGPT-like requests, lengths x 0.5, greedy, Poisson arrivals at 4 "
          "and 8 req/s, after 16 untimed) on the VM of the bf16 tables above. At 8 req/s (more than either server "
          "completes: throughput-bound) the 8-step server completes 1.14× the requests (4.50 vs 3.94 req/s) with a "
          "lower median TPOT (16.9 vs 20.0 ms); at 4 req/s (arrival-bound) both complete about what arrives (2.97 and 3.15 req/s over the run and its tail). The price, at "
          "both rates: a request arriving during a multi-step waits for it (median TTFT 75-95 ms against 37-39), and "
          "tokens stream in bursts of up to 8 (median ITL ~0, p99 145-156 ms against 33-50). A manual run of the "
          "same commands minutes earlier gave the same picture (rate 8: 4.9 vs 4.4 req/s; TTFT 66 vs 34 ms). So: K > "
          "1 for offline batches and saturated servers, 1 where time to first token and smooth streaming matter "
          "(vLLM's advice for its multi-step scheduling too)."),
    Claim("What AMX tiles can do on this CPU, beside the packed GEMM's loop (the bf16 steps' ceilings)",
          (AMX_ROOFLINE,), amx_roofline,
          "`python benchmarks/amx_roofline.py` (`benchmarks/amx_roofline.cc`, no JAX; best of 5-40 repeats) on the "
          "2-core Intel Xeon VM of the bf16 tables above, load 0.6-0.7 (ranges: six runs within an hour, the VM's clock moving between them; the table: the last): the tile multiply peaks at 2.7-3.3 TFLOP/s a thread "
          "(5-6 ns a TDPBF16PS), loads from L1 cost it nothing; tile loads stream memory at the VM's read ceiling "
          "(28-35 GB/s with two threads, as `numpy.max`). The packed GEMM's loop (`jaxserve/kernels/cpu/amx.cc`: every "
          "32-row block of x over one 32-column group before the next, the first prefetching 32 KB ahead into L2) "
          "streams gate/up's weights at 87-95% of that with 32 rows (two threads; one thread keeps up with its stream) but 67-81% with 64, a batch-64 decode step's "
          "case: its second 32-row pass over each group runs from cache while memory idles (in the engine, gate/up "
          "at 64 rows reads ~22 GB/s, the layers' four GEMMs together ~17). Scratch variants measured this session "
          "and not kept: prefetching the next group over every pass (T0, T1 or T2, 4-64 KB ahead) +0-5%; 16-column "
          "groups read by 4 row tiles at once (each B tile loaded once) no faster; claiming 8-32 smaller chunks a call "
          "instead of one range a thread cut the caller's wait for its helper (9 -> 3 us of ~106 us a call) but not the "
          "call. At 512 prefill rows the loop reaches 58-65% of the tile peak (A tiles from L2), and writing its bf16 "
          "output [M, N] (a block of 32 rows x 64 bytes a group, 3 KB apart) costs another 17-30% (staging a stretch of "
          "groups, streaming stores: no faster; prefetching the next block's output lines for writing +5%; splitting K "
          "in chunks of 288 so the weight panel stays in L1 +5%). The engine's 512-row prefill GEMMs run at ~1 "
          "TFLOP/s a thread (56 ms for 109 GFLOP), the probe's loop with its output at ~1.4."),
    Claim("SmolLM2-135M-Instruct in bf16 beside vLLM CPU: the batch-64 workload's prefill alone",
          SMOLLM2_BF16_VLLM_PREFILL, functools.partial(peer_throughput, SMOLLM2_BF16_VLLM_PREFILL),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends jaxserve,vllm --workloads prefill64 "
          "--rounds 5 --threads 2 --dtype bfloat16` at 32adb47, the VM of the bf16 table above: batch64's 64 prompts "
          "of 64 tokens with one output token each, so a run is the prefill of 4,096 tokens (the tok/s column counts "
          "the 64 output tokens: 81 tok/s is 0.79 s a run). vLLM prefills ~1.5× faster (jaxserve **0.65×**): of "
          "the batch-64 run's ~4.3 s, jaxserve spends ~0.8 s in prefill against vLLM's ~0.5, which is where the "
          "batch-64 goal is lost (the decode steps are a few percent ahead). jaxserve's 512-token prefill step "
          "(`max_num_batched_tokens`, 8 prompts a step; `jax.profiler` trace, ~85 ms): the packed GEMMs 56 ms "
          "(gate/up 22, down 16, q/k/v 9, o 7: at 512 rows bound by the tile loads, 13-20 ns a TDPBF16PS per "
          "thread against ~10 from L1), the attention kernel 12 (scalar FMAs), the norm, RoPE, convert and KV "
          "scatter fusions ~13."),
    Claim("SmolLM2-135M-Instruct in float32 beside vLLM CPU at batch 64 and ShareGPT (one KV budget, cold cache)",
          SMOLLM2_F32_VLLM_RUNS + (MEMORY_BANDWIDTH,), functools.partial(smollm2_bf16_vllm, SMOLLM2_F32_VLLM_RUNS, 4),
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends jaxserve,vllm --workloads "
          "batch64,sharegpt --rounds 3 --threads 2 --dtype float32` at 5adf525 (dirty in scripts/ only), the "
          "same VM and settings as the bf16 table: 1 GiB of KV cache each, every "
          "run from an empty prefix cache. jaxserve's float32 GEMMs above 16 rows are OpenBLAS's sgemm (`f32_gemm`), "
          "its float32 KV pool read by the C++ attention kernel. vLLM leads 1.35× at batch 64 and 1.36× on "
          "ShareGPT (the one-round probe at a7aa42f: 204 vs 439 and 155 vs 249): the goal (≥ 1.2× vLLM) is not met. "
          "Three runs each: jaxserve's spread 3.5% and 2.0%, vLLM's 1.1% and 3.4%. The four-backend float32 table "
          "above (2026-12-02, warm prefix caches after the first round) was not rerun."),
    Claim("SmolLM2-135M-Instruct batch-1 decode with 16-bit and 4-bit weights on the AMX VM with 480 MiB of L3: "
          "jaxserve beside llama.cpp",
          (LOWBIT_XEON_480, LOWBIT_F16_AMX_XEON_480, MEMORY_BANDWIDTH_XEON_480),
          functools.partial(smollm2_lowbit, LOWBIT_XEON_480, MEMORY_BANDWIDTH_XEON_480),
          "The Ice Lake table's command below with 5 rounds, at b59e007, 2026-12-08 00:05-00:06 UTC (warm-up from the compile cache the first attempt filled), on the VM of the "
          "bf16 and float32 vLLM tables above (AMX, 480 MiB L3; llama.cpp 0.3.36 built there the same evening with "
          "`bash benchmarks/peers/setup_llamacpp.sh`: AVX512, AVX512_VNNI, AVX512_BF16, AMX_INT8). One slot each, 1 "
          "request 64 → 128 greedy tokens including its prefill, rounds rotating the backends, "
          "`JAXSERVE_LLAMACPP_EXTRA_BUFTS=0` as in every low-bit table (llama.cpp's AMX Q4_0 path crashes on these "
          "Xeons). **Both batch-1 goals met**: bf16 with 8 steps a program **1.61×** llama.cpp F16 (one step a "
          "program 1.37×), NVFP4 with int8 activations and the int8 head **1.71×** llama.cpp Q4_0. llama.cpp's F16 with "
          "its extra buffer types on (its default, AMX-repacked where it has them), minutes after "
          "([`smollm2_lowbit_f16_amx_xeon_l3_480`](../results/peer_throughput/smollm2_lowbit_f16_amx_xeon_l3_480), "
          "5 rounds against one-step jaxserve): 53.6 tok/s against jaxserve's 68.8 (1.28×), no faster than without "
          "them (54.9). A first attempt at this run, minutes before, ran the jaxserve of a CI clone's editable install "
          "(the same code) with llama.cpp skipped and read jaxserve 63.7 / 75.7 / 121.2 tok/s: the VM's minute."),
    Claim("SmolLM2-135M-Instruct batch-1 decode with 16-bit and 4-bit weights on the Ice Lake VM (no AMX, no "
          "AVX512-BF16): jaxserve beside llama.cpp",
          (LOWBIT_ICELAKE, LOWBIT_ICELAKE_5, LOWBIT_ICELAKE_FIRST, MEMORY_BANDWIDTH_ICELAKE),
          functools.partial(smollm2_lowbit, LOWBIT_ICELAKE, MEMORY_BANDWIDTH_ICELAKE),
          "`JAXSERVE_LLAMACPP_EXTRA_BUFTS=0 python benchmarks/peers/compare.py --model smollm2-135m-instruct --dtype "
          "bfloat16 --workloads batch1 --rounds 7 --threads 2 --max-num-seqs 1 --backends \"jaxserve,"
          "jaxserve@engine.num_scheduler_steps=8,jaxserve@engine.quantization=nvfp4+engine.activation_quantization=int8"
          "+engine.lm_head_quantization=int8+engine.num_scheduler_steps=8,llama.cpp@F16,llama.cpp@Q4_0\"` at 6485b2c "
          "(+dirty: this script), 2026-12-07 13:52-13:57 UTC, on the 2-core Ice Lake VM (AVX-512 F/BW/VNNI; llama.cpp "
          "built there with `-DGGML_NATIVE=ON`: AVX512, AVX512_VNNI, no BF16). One slot each, 1 request 64 → 128 "
          "greedy tokens including its prefill, 7 rounds rotating the backends. **Both batch-1 goals met in this run**, "
          "with jaxserve's multi-step decoding (`num_scheduler_steps=8`, one program for 8 decode steps): bf16 "
          "1.32× llama.cpp F16 (one step a program: 1.07×); NVFP4 with int8 activations and the int8 head 1.29× "
          "llama.cpp Q4_0 (its weights MB count the bf16 embedding kept for the lookup, of which a token reads one row). Every figure moved with the VM: the same backends five rounds each minutes before "
          "([`smollm2_lowbit_icelake_streams`](../results/peer_throughput/smollm2_lowbit_icelake_streams), a slow "
          "phase: llama.cpp F16 42.6, Q4_0 85.5) gave bf16 51.0 / 47.9 (one step / 8 steps a program: 1.20× / 1.12× "
          "F16) and W4A8 68.3 / 88.2 (0.80× / 1.03× Q4_0); so the 16-bit goal held in both runs and the 4-bit one by 3% "
          "in the slower. Before this commit's change (packed GEMMs up to 4 rows: one contiguous range a thread, not 8 "
          "chunks each; `jaxserve/kernels/cpu/parallel.h`), one step a program only, at d81c5c4 "
          "([`smollm2_lowbit_icelake`](../results/peer_throughput/smollm2_lowbit_icelake), 13:03 UTC): bf16 47.2 vs "
          "F16 56.9 (0.83×), NVFP4 weight-only 54.9, W4A8 with the int8 head 66.2 vs Q4_0 114.7 (0.58×). "
          "Where a step's time goes (`benchmarks/profile_step.py --dtype bfloat16 --workload batch1`): the program "
          "~16.2-16.4 ms, of it the GEMMs ~14.9 (gate/up 5.7, down 3.0, the tied head 2.8, q/k/v 2.0, o 1.4-1.5: "
          "~18-20 GB/s, the VM's two-thread read rate that hour 20-21 GB/s in a C loop), attention 0.6; one step a "
          "program adds the host's and the dispatch's 2-4 ms, which 8 steps a program share. The W4A8 kernels are "
          "bound by their integer work, not by memory (~9 GB/s). The weights-read column holds each row's rate "
          "against the read ceiling measured on this VM that morning (26.7 GB/s; the same C loop read 20-22 GB/s this "
          "hour)."),
    Claim("SmolLM2-135M-Instruct batch-1 decode with 16-bit and 4-bit weights: jaxserve beside llama.cpp",
          (LOWBIT_RUN, LOWBIT_RUN64, LOWBIT_RERUN, LOWBIT_PACKED_HEAD, LOWBIT_RUN1, LOWBIT_36AF0D6, LOWBIT_F16_DEFAULT,
           LOWBIT_BEFORE_KERNEL, MEMORY_BANDWIDTH),
          smollm2_lowbit,
          "`JAXSERVE_LLAMACPP_EXTRA_BUFTS=0 benchmarks/peers/compare.py --model smollm2-135m-instruct --dtype bfloat16 "
          "--workloads batch1 --rounds 3 --threads 2 --max-num-seqs 1 --backends jaxserve,"
          "jaxserve@engine.lm_head_quantization=int8,jaxserve@engine.quantization=nvfp4,"
          "jaxserve@engine.quantization=nvfp4+engine.activation_quantization=int8+engine.lm_head_quantization=int8,"
          "jaxserve@engine.quantization=mxfp4+engine.activation_quantization=int8+engine.lm_head_quantization=int8,"
          "llama.cpp@F16,llama.cpp@Q4_0` at c87904c (dirty in docs only; 2026-12-05): one slot each (`jaxserve bench latency`'s setting), "
          "1 request 64 → 128 greedy tokens including its prefill, rounds rotating the backends. "
          "**Both batch-1 goals met in this run**: bf16 1.14× llama.cpp F16; 4-bit NVFP4 with int8 activations "
          "(`activation_quantization=\"int8\"`, W4A8: llama.cpp's own Q8 rule for its Q4_0 dot products) and the "
          "int8 LM head (`lm_head_quantization=\"int8\"`) **1.06×** llama.cpp Q4_0 (MXFP4 1.09×, but +68% "
          "perplexity against NVFP4's +18%: table below); NVFP4 weight-only 0.74×. An int8-head row's weights MB "
          "counts the bf16 embedding it keeps for the lookup, which a token reads one row of. The margins are small and the ranges overlap (load average "
          "1.8 before the run). The same backends with the harness's default 64 slots, minutes after "
          "([`smollm2_lowbit_vnni_seqs64`](../results/peer_throughput/smollm2_lowbit_vnni_seqs64)): bf16 65.0 vs F16 "
          "52.5 (1.24×), NVFP4 weight-only 72.5, W4A8 84.5, W4A8 + int8 head 91.4 vs Q4_0 87.1 (**1.05×**). "
          "A rerun of four of the backends (jaxserve bf16, NVFP4 + W4A8 + int8 head, llama.cpp F16 and Q4_0; the same "
          "flags) at 815cde2 on the idle VM, 2026-12-05 15:39 UTC "
          "([`smollm2_lowbit_vnni_rerun`](../results/peer_throughput/smollm2_lowbit_vnni_rerun)): bf16 69.4 "
          "(67.8–69.9) vs F16 54.7 (54.2–54.7) tok/s, **1.27×**; NVFP4 + W4A8 + int8 head 129.6 (125.8–130.4) vs "
          "Q4_0 94.6 (91.8–95.6), **1.37×**: both goals met again, with ranges apart this time. "
          "What changed since the previous run (`smollm2_lowbit_packed_head_run2`: NVFP4 weight-only 0.88× Q4_0): "
          "NVFP4's float8 scales reach the FP4 kernel without a copy (210 thunks a step, ~2 ms: weight-only "
          "82 → 88 tok/s, A/B); the W4A8 VNNI kernel (`jaxserve/kernels/cpu/vnni.cc`: E2M1 codes looked up as int8, "
          "exact integer block sums by vpdpbusd; 1.6× the bf16-x FP4 kernel per matmul, and at any row count, so "
          "a 64-token prefill 181 → 80 ms); the int8 head (SmolLM2's [49152, 576]: 1.15 → 0.59 ms a row); and decode "
          "buckets of 1, 2 and 4 rows on the CPU attention path (a lone request ran an 8-row program). llama.cpp's "
          "Q4_0 file stores the tied embedding, its LM head, in Q4_0 too; jaxserve's head is int8 (or bf16). "
          "Before: at 1c059d3 ([`smollm2_lowbit_packed_head_run2`](../results/peer_throughput/smollm2_lowbit_packed_head_run2)), "
          "bf16 1.22× llama.cpp F16, NVFP4 **0.88×** Q4_0. The same command minutes before "
          "([`smollm2_lowbit_packed_head`](../results/peer_throughput/smollm2_lowbit_packed_head)): bf16 55.5 vs F16 "
          "47.9 tok/s (1.16×), NVFP4 57.9 vs Q4_0 71.7 (0.81×): the VM's speed moved within the hour, so only ratios "
          "within one run compare. A/B of the packed head alone (jaxserve rows only, the commit before in a worktree, "
          "processes alternating twice): NVFP4 64.7 / 69.6 -> 70.6 / 68.3, bf16 56.5 / 60.0 -> 62.3 / 61.7 tok/s, "
          "inside that noise; the head itself went 1.94 -> 1.27 ms a step (~4% of a step). "
          "The run before these, at 36af0d6 ([`smollm2_lowbit`](../results/peer_throughput/smollm2_lowbit), with "
          "`jaxserve@engine.quantization=nvfp4+engine.quantize_lm_head=true` too): the packaged "
          "Q4_1 GGUF dequantized, cast to bf16, and quantized by each backend to its own 4-bit format (jaxserve NVFP4 "
          "weight-only, the tied head bf16 or, with `quantize_lm_head`, NVFP4 too; llama.cpp Q4_0 via gguf-py), 1 request "
          "64 → 128 greedy tokens, rounds rotating the backends, on an idle 2-core AMX-capable Intel Xeon VM "
          "(load average 0.5 before), at 36af0d6. **Caveat**: llama.cpp 0.3.36's vendored build crashes (SIGSEGV) in its AMX "
          "Q4_0 path on this CPU, so these runs load llama.cpp without its extra buffer types (no AMX or CPU_REPACK "
          "repacking): its Q4_0 row is not its best. Its F16 row with the default buffers (AMX), in a second run "
          "([`smollm2_lowbit_f16_amx`](../results/peer_throughput/smollm2_lowbit_f16_amx), jaxserve bf16 and llama.cpp "
          "F16 only): jaxserve 69.0 (64.0–69.1) tok/s, llama.cpp 55.7 (55.5–56.5), 1.24×. The same two runs at 9432479 (2026-12-04, [K, N] "
          "kernels): bf16 1.12× / 1.09× of F16, NVFP4 0.87× and 0.98× of Q4_0 (76.9 tok/s then, 92.2 now: the VM's "
          "speed moves between days, so compare within a run). "
          "On the AVX-512 AMD EPYC VM of 2026-12-03/04 llama.cpp was far faster (F16 75–79, Q4_0 140–151 tok/s) and "
          "jaxserve bf16 reached 0.54× of F16 (at 27ec969; at 37b1d84, before the bf16 kernel streamed whole row "
          "segments, 0.36×: [`smollm2_lowbit_37b1d84`](../results/peer_throughput/smollm2_lowbit_37b1d84)): "
          "compare within one run only. Different 4-bit formats give different tokens (agreement 0)."),
    Claim("SmolLM2-135M-Instruct batch-1 decode with FP4 weights: streaming FP4 kernels and the quantized tied head",
          FP4STREAM, smollm2_fp4stream,
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --dtype bfloat16 --workloads batch1 --rounds 3 "
          "--threads 2 --backends ...` twice, one process after the other: at main (8ff77ff, a detached worktree: "
          "jaxserve, nvfp4, mxfp4) and at this branch (jaxserve, nvfp4 and nvfp4 `+engine.quantize_lm_head=true`), 1 request 64 → 128 greedy tokens, rounds rotating the backends within a process. The bf16 row runs "
          "the same code in both and is the control. The branch's FP4 [K, N] kernel streams row segments with L2 "
          "prefetch (one thread, per matmul at M = 1: q/o 50.6 → 23.5 µs, gate/up 155 → 65, down 207 → 60; "
          "`benchmarks/cpu_fp4_kn.cc`), and quantize_lm_head reads the tied embedding as NVFP4/MXFP4 through the "
          "new [N, K] kernel (one thread, M = 1: 2.2–2.8 ms against the bf16 head's 3.6; slower from M = 4). "
          "Measured: NVFP4 40.3 → 48.0 tok/s (1.19×; 1.12× after the bf16 control's 1.07× drift between the runs), "
          "and 53.1 with the tied head quantized too (1.32× main's NVFP4; +37% perplexity, next table). Far from "
          "the goal (4-bit ≥ llama.cpp Q4_0, 140.5 tok/s in the table above): at ~20 ms a step the FP4 matmuls "
          "(~8 ms a step on one thread by the per-matmul figures) are not what remains. Not measured: MXFP4 after the "
          "change and the 1-thread pinned runs (five engines in one process ran out of the VM's 24 GB; pinned to one "
          "core shared with another engineer's tests each engine took ~5 min to build), and llama.cpp beside them "
          "(its driver crashed, SIGSEGV, in the one run that had it). The main run shared the VM with another "
          "engineer's tests (load average in its meta)."),
    Claim("SmolLM2-135M-Instruct perplexity with the tied LM head quantized too (16 windows of 257 tokens)",
          tuple(FP4STREAM_PPL.values()), smollm2_fp4stream_ppl,
          "`python -m experiments.fp4_perplexity out_dir=results/fp4_perplexity/smollm2_{dense,lm_head}_16w "
          "num_windows=16 'variants=[nvfp4,mxfp4_floor]' 'baselines=[float32]' 'weight_sources=[float32]' "
          "kernel_check_tokens=0 lm_head={false,true}`: the weights as loaded (GGUF Q4_1 dequantized to float32), "
          "16 windows evenly spaced over `tests/data/real_text`, the same in both runs; float32 compute, the "
          "reference (dequantize-then-dot) matmul. Quantizing the tied 49152 × 576 embedding (28M of 135M "
          "parameters) along the hidden axis costs far more perplexity than all 210 Dense kernels together: "
          "NVFP4 +17.9% → +37.3%, MXFP4 (floor scales) +68% → +177% against float32. (The runs' `kernels` "
          "column counts the table as a 211th quantized tensor.) Hence `quantize_lm_head` stays off by default."),
    Claim("SmolLM2-135M-Instruct perplexity with int8 activations (W4A8) and the int8 LM head (16 windows of 257 "
          "tokens)",
          tuple(W4A8_PPL.values()), smollm2_w4a8_ppl,
          "`python -m experiments.fp4_perplexity out_dir=results/fp4_perplexity/smollm2_w4a8_16w num_windows=16 "
          "'variants=[nvfp4,nvfp4_w4a8,mxfp4_floor,mxfp4_floor_w4a8]' 'baselines=[float32]' "
          "'weight_sources=[float32]' kernel_check_tokens=0`, and `... out_dir=results/fp4_perplexity/"
          "smollm2_w4a8_int8head_16w 'variants=[nvfp4_w4a8,mxfp4_floor_w4a8]' ... int8_head=true` (2026-12-05, "
          "at c87904c): the windows and weights of the quantized-head table above, the "
          "reference matmuls (`jaxserve.quant.w4a8`, `jaxserve.kernels.cpu.int8_head`: what the VNNI kernels compute, "
          "float32 rounding apart). int8 activations on the weights' blocks add +0.2 points of perplexity to NVFP4 "
          "(Δ loss +0.0020 nats against weight-only), the int8 head 0.4 more: the accuracy the batch-1 table's "
          "fastest 4-bit row costs is NVFP4's (+18% against float32), not the integer kernels'."),
    Claim("SmolLM2-135M-Instruct decode speed: jaxserve beside transformers, float32 and bfloat16", SMOLLM2_RUNS,
          smollm2_speed,
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends jaxserve,hf --workloads batch1,batch64 "
          "--rounds 3 --threads 2 --dtype D`: the packaged Q4_1 GGUF dequantized, then cast to D, in both backends; "
          "batch1: 1 request 64 → 128 greedy tokens (EOS ignored), batch64: 64 of them; rounds alternate the "
          "backends. Measured on the 2-core AMD EPYC VM with nothing else running (load average 2.5 → 1.9). "
          "jaxserve leads in float32 and at bfloat16 batch 1 and trails HF (torch's bf16 GEMMs) at bfloat16 batch 64. "
          "Batch-1 float32 streams the weights at 27 GB/s (numpy on this VM, one thread: a copy moves 42 GB/s counting "
          "read and write, a sum reads 23 GB/s): memory-bound; bfloat16 "
          "batch 1 reads half the bytes in the same time (XLA:CPU's bf16 dots at 1–2 rows are compute-bound). "
          "The change behind the bfloat16 rows (198c6ad, the KV pool of a 16-bit model held in float32 on XLA:CPU): "
          "the same command at b38f2cd, same VM and hour, gave bfloat16 batch 1 17.5 (15.6–17.7) tok/s beside HF's 41.2 "
          "and batch 64 172.4 (169.4–176.3) beside 340.0: the change made bfloat16 2.9× faster at batch 1, 1.6× at 64. The previous table (float32 24.0 / 172.0, bfloat16 9.7 / 134.7 tok/s) was measured on "
          "an Intel Xeon VM and is not comparable. In bfloat16 only 0.56 of the batch-64 requests agree with "
          "jaxserve on 8 tokens (different bf16 rounding, then near-ties; batch 1 agrees)."),
    Claim("Paged attention decode on CPU: gather-then-attend reference vs a contiguous cache",
          ("results/paged_attention/results.json",), paged_attention_decode,
          "Load average 10–12 during the run (a shared machine): read the ratios, not the times. The Pallas kernels "
          "are not timed on CPU (interpret mode checks correctness only); the engine's CPU path now uses the "
          "live-pages online attention, which this run predates. No GPU figures yet (`benchmarks/gpu_check.sh`)."),
    Claim("Multi-query paged attention: page loop vs one whole-table step", ("results/attention_whole_table/results.json",),
          attention_whole_table,
          "Six chained calls (the zoo target's layers), fastest of 30. At 144 table tokens one step was never slower; "
          "at 256 it lost when few tokens were live, hence `WHOLE_TABLE_TOKENS` = 160."),
    Claim("Speculative decoding, the goal's figure: batch 1, greedy, zoo pair, across six processes",
          tuple(f"{INTERLEAVED}/{h}/{run}/results.json" for h in ("full", "vocab1024") for run in RUNS),
          spec_across_processes,
          "`jaxserve/tiny-code` with `jaxserve/tiny-code-draft`, bf16 matmuls for the target and a float32 draft; "
          "8 prompts × 64 tokens, each point the fastest of 15 calls alternating with its own target-only baseline; "
          "processes alternated between the whole draft head and `draft_vocab_size=1024` (FR-Spec: greedy rounds "
          "propose only the 1024 most frequent tokens; the output stays the target's). End to end includes the "
          "64-token prefill (~11% of a baseline call); the decode phase excludes it. With bf16 matmuls one of the "
          "8 prompts flips at a near-tie (logits 4.21227 vs 4.21297), which a 6-row verify and a 1-row step round "
          "apart; in float32 all 8 agree."),
    Claim("Speculative decoding, full grid, fastest configuration (bf16 matmuls, float32 draft, 1024-token draft head)",
          (f"{SPEC}/full_grid_mmbf16_draftf32_vocab1024_greedy_only/results.json",), spec_fastest_grid,
          "Each cell: best γ's speedup end to end / in the decode phase, 8 prompts per point (batch 4: 2 sets), "
          "fastest of 5 calls per prompt set: small samples, so neighbouring γ wobble. "
          + _theory_gap(f"{SPEC}/full_grid_mmbf16_draftf32_vocab1024_greedy_only/results.json")
          + " Speculation stops paying around batch 16 on this CPU."),
    Claim("Speculative decoding, full grid, default configuration (float32; `python -m experiments.spec_decoding`)",
          (f"{SPEC}/results.json",), spec_default_grid,
          "Same estimator as above, on the earlier Sapphire Rapids VM (the runs above are on a Zen 4 VM, whose "
          "float32 6-token verify costs 2.06 decode steps against 1.45 here). " + _theory_gap(f"{SPEC}/results.json")),
    Claim("Speculative decoding with the target's MLPs widened by zero weights to 4928 (52 MiB: past the caches)",
          (f"{SPEC}/widened4928_mmbf16_draftf32/results.json", f"{SPEC}/widened4928_batch1_all_methods/results.json"),
          spec_widened,
          "`target_widen_mlp=4928`: the same function as the zoo target (silu(0)·0 = 0), so the zoo draft keeps its "
          "acceptance, with weights that stream from memory as a real model's do. Not the zoo pair the goal names. "
          + _theory_gap(f"{SPEC}/widened4928_mmbf16_draftf32/results.json")),
    Claim("Suffix decoding against n-gram lookup on a repetitive prompt set (zoo target, float32)",
          tuple(SUFFIX.values()),
          spec_suffix,
          "Each prompt is a 32-token window of the pycode val split written twice (an edit or a quote of its "
          "input); 64 tokens generated, 8 prompts per point, fastest of 3 calls per prompt set. `suffix` standalone "
          "is `suffix_generate` (a host loop, one jitted round per iteration, each call with a fresh cache: no "
          "call drafts from another's outputs); in the engine its global tree is off for the same reason. Both "
          "runs ran under `nice -n 19` at a load average of ~10 on the 2 cores (other sessions' tests; the "
          "baseline moved 314–801 tok/s between points): read the α, length and calls/token columns, not the "
          "speedups. Suffix decoding drafts fewer, surer tokens than n-gram lookup (α 0.80–0.83 vs 0.61–0.68, "
          "a vLLM rate of 0.72–0.78 vs 0.22–0.46) for about the same target calls per token, and lost to "
          "target-only on time: standalone it syncs with the host every round, and a niced process waits for "
          "each wake-up on a loaded machine (~5 ms a round at γ 2 against a ~1.5 ms verify). The second run has "
          "the faster trees (propose 198 → 64 µs). Not the SmolLM2 run issue 30 asks for: the zoo target only."),
    Claim("Speculative decoding on SmolLM2-135M-Instruct: the zoo draft and n-gram lookup (float32, batch 1, greedy)",
          (SMOLLM2,), spec_smollm2,
          "Target `smollm2-135m-instruct` (the GGUF's Q4_1 weights dequantized to float32), draft "
          "`jaxserve/smollm2-135m-instruct-draft` (7.1M parameters, a decode step ~0.03 of the target's; trained 16 "
          "min on 62k tokens of the target's own chat answers: see its model card). Prompts: 64-token windows of "
          "the pycode-v1 validation split (plain code, not chat), 64 tokens generated (engine: 32), 4 prompts per "
          "point, fastest of 3 calls per prompt. Run under `nice -n 19` on the shared 2-core machine with other "
          "sessions' jobs: the speedups are noisy; α and length are not. EOS is ignored (the experiment's default). "
          "On these code prompts the draft's α is 0.17 (0.34 on its held-out chat prompts, model card): trained on "
          "little data, mostly chat answers, it makes speculation slower than target-only (0.76–0.89×), while "
          "n-gram lookup, copying from the code, reaches 1.6–1.8×. The goal's 2.0× for the draft is **not met**."),
    Claim("A speculative round's cost in target decode steps, by target size", ("results/spec_round_costs/results.json",),
          spec_round_costs,
          "Random targets of the zoo target's family (timing only: no draft agrees with them). The zoo target nearly "
          "fits in the 32 MiB L3, so its decode step is cheap against a round; the excess is the draft reading its "
          "weights back after each target pass."),
    Claim("Block-scaled FP4 quantization error (2048×2048 matrices, 3 seeds)", ("results/fp4_quant_error/results.json",),
          fp4_quant_error,
          "MXFP4 `floor` is the OCP spec's scale rule, `ceil` the round-up variant some libraries use."),
    Claim("FP4 perplexity of the zoo models (128 validation windows of 257 tokens)",
          ("results/fp4_perplexity/results.json",), fp4_perplexity,
          "Weights-only rows quantize every Dense kernel but the embedding and LM head; `_w4a4` rows also "
          "fake-quantize each Dense input. Run with the defaults of the time (zoo models); the folder's Notes give "
          "the command under today's defaults."),
    Claim("FP4 perplexity of SmolLM2-135M-Instruct (GGUF Q4_1, dequantized) on license texts",
          ("results/fp4_perplexity/smollm2/results.json",), fp4_perplexity_smollm2,
          "The GGUF file stores the Dense weights as llama.cpp Q4_1 (4-bit, 32-element blocks, f16 scale and min): "
          "every row starts from those weights dequantized to float32 (\"from float32\") or rounded on to bfloat16 "
          "(\"from bfloat16\", a 16-bit export), so it re-quantizes an already 4-bit grid. 32 windows of 257 tokens "
          "(8,192 predicted tokens) evenly spaced over the 7 license texts of `tests/data/real_text`; the bands are "
          "exp(Δ loss ± 2 SE) − 1 of the per-window paired difference. The vs-bfloat16/fp8 columns are for the "
          "float32 source; weights-only FP8, NVIDIA's comparison is against FP8 W8A8. `int4_g128` quantizes only the 30 "
          "`down_proj` kernels (K = 576 is not a multiple of 128). The run's code is commit e4e7f8b (uncommitted then)."),
    Claim("Auxiliary-loss-free MoE balancing (2-layer, 16-expert top-2 byte-level LM, 300 steps, one seed)",
          ("results/moe_balance/results.json",), moe_balance,
          "The paper's rate u = 1e-3 needs far more than 300 steps; the perplexity differences are within one seed's noise."),
    Claim("Expert-parallel all_to_all on 8 simulated CPU devices", ("results/moe_ep/results.json",), moe_ep,
          "The padded `all_to_all` XLA:CPU can run (the ragged one is GPU/TPU only); the devices are threads of one process."),
    Claim("Bytes moved by collectives per decode step, per mesh layout (8 simulated CPU devices)",
          ("results/mesh_collectives/results.json",), mesh_collectives,
          "Read from the compiled decode program's HLO (each collective's result bytes, per device) for random "
          "models, hidden 256, 4 layers, 8 heads, 4 KV heads, 8 experts top-2. EP off: every expert split on its "
          "intermediate dim over T, one all-reduce after the experts as after a dense MLP. The expert-parallel "
          "rows' bytes over the prediction are GSPMD's gather of the router probabilities [B, 8], not predicted."),
    Claim("vLLM's PagedAttention vs Orca's reservations, in engine steps", ("results/vllm_paged/results.json",), vllm_paged,
          "The paper's memory (15.7K KV slots), max_model_len 2048; synthetic ShareGPT-like and Alpaca-like lengths. "
          "Time is engine steps (the device replaced by `NullRunner`; the real forward pass gives the same schedule), "
          "so the GPU cost of big batches is not in these numbers; 200 / 1000 requests per point overstate the knee."),
    Claim("vLLM's PagedAttention vs Orca's reservations against a live server, in wall-clock time", (LIVE, LIVE_TINY),
          vllm_paged_live,
          "`jaxserve serve smollm2-135m-instruct` (float32) per policy and `jaxserve bench serve` (Poisson, ShareGPT-like "
          "lengths x 0.1, 40 requests per rate), 768 KV slots, max_model_len 256; the target is 2x the best mean (p99) "
          "normalized latency at the lowest rate; >=: never crossed on the grid, <: crossed at the lowest rate. One run "
          "on the shared 2-core VM (the load average is in RESULTS.md, per point): wall-clock figures are noisy. With "
          "tiny-code instead (the second run below) every policy topped out at about the same token rate "
          "(`results/vllm_paged/live_server/tiny_code`)."),
    Claim("Decode roofline for H100 / H200 / B200, and jaxserve's CPU decode step against it",
          ("results/blackwell_roofline/results.json",), blackwell_roofline,
          "Datasheet peaks with perfect overlap: an upper bound. The H200 validation (`benchmarks/gpu_check.sh`, its "
          "roofline step) has not run yet."),
    Claim("Speculative decoding on SmolLM2-135M-Instruct, chat prompts, in the engine: with and without the adaptive "
          "policy (float32 but the last rows, γ 4)",
          tuple(SMOLLM2_CHAT.values()), spec_smollm2_chat,
          "`LLM.generate` with one speculative round per step against a plain engine timed alongside (calls "
          "alternating, fastest of 2 per prompt set), 48 tokens per request, EOS ignored; prompts from "
          "`experiments/spec_decoding/prompt_sets.py` through SmolLM2's chat template (at most 160 tokens): "
          "`repetitive` = code edits and text edits whose answers quote the input, `free` = open questions. "
          "policy `none` speculates every decode step; `adaptive` is `SpeculativeConfig(adaptive=True)`. Bold: "
          "slower than the plain engine. The repetitive run is complete; the free run (batch 1 and 16 only, 2 prompts "
          "at batch 1) was killed by the kernel's OOM killer during its last point: its rows are what its 3 finished "
          "points saved (`engine_progress` in results.json; its RESULTS.md's notes). A policy row whose timed calls "
          "ran no round shows α 0 and length 1. `by_batch:16` is `disable_by_batch_size=16`; the `repetitive, idle VM` "
          "rows are a batch-16 rerun at load average 1.0–2.6 (10:00 UTC, nothing else running); the `by_batch counts "
          "running` rows rerun `by_batch:16` once the rule counted running sequences (vLLM's running-queue size), "
          "on another, AVX2-only VM at load 0.3–1.7: the same steps speculated (the rounds are in the tail, once "
          "fewer than 16 remain). The `fastest of 5` rows run `by_batch:4` (`disable_by_batch_size=4`) at batch 16 "
          "(load 1.3–1.5, fastest of 5 calls per side): 250 of 255 steps plain, the plain engine alongside each row at "
          "78.6, 82.3 and 79.5 tok/s (±2.3%): speculation switched off costs the draft and n-gram engines nothing "
          "measurable (1.04×, 1.00×); suffix 0.93× (74.1 tok/s, below every baseline: a ~5% cost not isolated; a side "
          "test with random prompts, median of 5 calls, put all three within 2% of the plain engine). The last two "
          "rows: suffix only, bfloat16 with the Dense kernels packed for AMX tiles (1c7980f, the Intel Xeon VM at "
          "load 1.1–1.5, fastest of 3 calls a side): speculating every step 0.67× (a round of 16 × 5 rows costs more "
          "than the ~2.3 tokens it gains), `by_batch:4` 0.98× (150 of 153 steps plain), outputs identical to the "
          "plain engine's in both. The last three rows: every proposer, bfloat16, `by_batch:4` (af65397, the same VM, "
          "load 1.3–2.0, fastest of 3): draft model **0.95×**, n-gram 1.00×, suffix **0.98×**, 150 of 153 steps plain, "
          "outputs identical to the plain engine's; a draft-model engine's plain steps then still ran the draft's pass "
          "(to keep its KV cache whole for later rounds), ~5% of a bf16 step. The `plain steps skip the draft` rows "
          "(the next commits: a plain decode step runs the target alone, and a round first runs the draft alone over "
          "the positions it skipped, `draft_catch_up`; a fill step computes log-probs only when asked; a decode with "
          "one token left runs plain): fastest of 5, 48 tokens, EOS ignored: draft model 0.97×, n-gram 0.97×, suffix "
          "1.00× (baselines 375–386 tok/s; no round ran: the three rounds a call ran before were each request's last "
          "token); stopping at EOS (up to 160 tokens, fastest of 3, 483 of ~487 steps plain): 0.95×, 0.97×, 0.98× "
          "(all baselines 361 tok/s). The n-gram and suffix engines do the same work as the plain engine in these "
          "runs but for ≤ 3 rounds a call, so their 2–3% is the measurement's spread; timing each step directly "
          "(`LLM.generate` of the same 16 prompts, 4 calls a side alternating, no prefix cache, 208 steps a side) "
          "gave 7.83 s against the plain engine's 7.82 s (n-gram) and 8.75 s against 8.84 s (draft model). The goal "
          "(no proposer slower than target-only at batch 16): no proposer is measurably slower in the step timing; "
          "the experiment's end-to-end figures are 0.95–1.00×, within its ±3% spread but not shown ≥ 1. The "
          "2-core VM ran at load average 5–12 with other sessions' jobs and both runs side by side: baselines "
          "moved 13–25 tok/s between rows at batch 1, so single speedups are ±30% noise; α, length and calls/token "
          "are not timing. The `EAGLE draft` rows (`jaxserve/smollm2-135m-instruct-eagle`, 4a21b87, idle AMX Xeon, "
          "48 tokens, EOS ignored, fastest of only 2 calls a side: the batch-16 baselines moved 448–544 tok/s between "
          "rows): T = 1 drafts from the whole head and α stays at 0.35 (0.90–0.96×); at batch 16 speculating every "
          "step costs 0.44–0.69×, `by_batch:4` runs 100 of 102 steps plain (their draft pass included) at 0.90× "
          "and 1.25× of baselines that moved by 20%: within this run's noise. The `fill steps take the packed "
          "head's argmax` rows (60091cc: a speculative engine's fill and plain decode steps take all-greedy tokens "
          "from the packed tied head's GEMM, `packed_argmax`, as the plain engine's steps do, instead of writing "
          "[R, V] logits): every proposer with `by_batch:4` at batch 16, up to 160 tokens to EOS, fastest of 5 calls "
          "a side (idle AMX Xeon, load 0.0): 805 of 810–815 steps plain; draft model 0.97×, n-gram 0.96×, suffix "
          "1.00×, EAGLE 0.95× (its plain steps still run the draft's one-layer pass: it reads the target's hidden "
          "states and cannot catch up later), against baselines of 713–744 tok/s for the same plain engine (4% "
          "apart): within the run's spread, not shown ≥ 1. An ad-hoc A/B of engines that never speculate (16 of "
          "these prompts, 96 tokens, 5 calls a side alternating) put n-gram at 0.98× and EAGLE at 1.05× of the plain "
          "engine by the fastest call, its calls spreading 1.43–1.62 s: the machine's noise exceeds the difference. "
          "The `stage-3 EAGLE draft` rows (the bundled draft after its third training stage, rounds folding the next "
          "first draft step, 47a0926, the same grid with batch 4 added, load 1.6–2.3): batch 1 greedy α 0.38 over "
          "these 48 tokens, 1.11–1.17×; T = 1 α 0.41, 0.94–0.98×; batch 4 speculating every step 0.84× (T 0) and "
          "0.80× (T 1); batch 16 0.72× / 0.51×; `by_batch:4` runs batch 4 and 16 plain (94 of 96, 100 of 102 steps: "
          "four running sequences already switch it off) at 0.94–0.98×, its plain steps running the draft's pass. "
          "The last rows (`EAGLE's plain steps skip its draft too`, 741e6d6: a plain decode step of an EAGLE engine "
          "runs the target alone, the runner keeps each skipped position's feature and the sequence's next round "
          "first runs the draft over them, `draft_catch_up` (a draft model's catch-up, reading the kept features); idle AMX Xeon, "
          "load 1.4, every proposer with `by_batch:4` at batch 16, up to 160 tokens to EOS, fastest of 5): 805 of "
          "810–815 steps plain; EAGLE **1.01×** (was 0.95×), draft model 0.95×, n-gram 0.97×, suffix 0.99×, "
          "against baselines of 583–649 tok/s for the same plain engine (±5% within the run); outputs identical to "
          "the plain engine's. An interleaved A/B in one process (`PYTHONPATH=. python scripts/spec_batch16_ab.py`, "
          "16 prompts, calls alternating, 5 and 8 calls a side): every proposer at 0.95–1.00× of the plain engine by "
          "the fastest call and 0.95–0.99× by the median, with the plain engine's own calls spreading 4–33%: no "
          "proposer is measurably slower, and none is shown ≥ 1.0."),
    Claim("Suffix decoding and n-gram lookup on SmolLM2-135M-Instruct by γ, batch 1, greedy, in the engine: "
          "float32 and bfloat16", tuple(SUFFIX_GAMMAS.values()), spec_suffix_gammas,
          "`LLM.generate`, one round per step (suffix rounds as wide as their longest host draft: γ and its "
          "quarters), against a plain engine timed alongside, the `chat_repetitive` prompts (4, one at a time), 48 "
          "tokens each, EOS ignored, fastest of 3 calls per side, on the idle 2-core AVX2 VM (the bfloat16 run with "
          "a helper's build on the other core for part of it: its speedups ±20%). The drafts are short (drafted / "
          "round), which bounds any speedup by 1 / calls-per-token (≤ ~1.9×) on these prompts. The float32 rows "
          "ran with the float32 CPU kernels (a 5-token round ~1.25 plain steps; just before them the same command "
          "gave 1.09× / 0.97× / 1.07×: XLA's float32 dot of 2–16 rows made a round 1.9 steps); the bfloat16 run "
          "predates them (its kernels existed: 1.4 steps). The goal (suffix ≥ 2.5×) is not met. bfloat16 greedy outputs differed from the plain "
          "engine's at γ 8 and 16 (near-ties under differently shaped bf16 computations; float32 identical: the "
          "runs' notes)."),
    Claim("Suffix decoding and n-gram lookup on SmolLM2-135M-Instruct, whole answers (up to 160 tokens, ending at "
          "EOS), batch 1, greedy, in the engine", tuple(SUFFIX_LONG.values()),
          functools.partial(spec_suffix_gammas, SUFFIX_LONG),
          "As the table above, but each answer runs to its EOS (up to 160 tokens: a code edit returns the whole "
          "snippet) instead of stopping at 48, and suffix rounds verify γ or one of its halves (γ 16: 1, 2, 4, 8, "
          "16 slots). Longer answers repeat more of their input and of themselves, so the drafts reach further "
          "(length 2.6–4.1 against 1.8–2.5). **Current (last three rows, af65397, idle 2-core AMX Intel Xeon, load "
          "average 1.3–2.2):** bfloat16 with the Dense kernels packed for AMX tiles and RMSNorm summed in one order "
          "for any row count (a 9-row verify pass now computes each row's bits as a 1-row step does): spec factor 1, "
          "γ 8: **2.39×** end to end, 2.56× decode phase; `suffix_spec_factor=4` (drafts reach up to 4× the matched "
          "length; vLLM's default, kept here, is 1): γ 8 **2.54×** / 2.74×, γ 16 **2.57×** / 2.79× (a first run of "
          "the same command: 2.50× / 2.62×). Every one of these rows' outputs is the plain engine's, token for token. "
          "The goal (suffix ≥ 2.5× end to end) is met with spec factor 4. Earlier rows, oldest first: the AVX-512 VM "
          "with a helper's benchmarks on the other core (load 1.5–2.7: baselines moved 16–32 tok/s between rows, "
          "speedups ±20%): bfloat16 suffix γ 8 2.25×, float32 1.73–1.74×; the idle AVX-512 VM after 27ec969, spec "
          "factor 1 / 2 / 4: 2.16× / 2.11× / 2.29×; the AMX Intel Xeon with the C++ attention kernel (9432479) 1.93× "
          "(its 9-row bf16 matmuls compute-bound on vdpbf16ps: a round ~1.5 plain steps); with bf16 GEMMs on AMX "
          "tiles (a158648) 2.13×; after the attention page groups and RoPE tables (467c94c) 1.89×; Dense kernels "
          "packed for AMX tiles (36af0d6) 2.27× (a round ~1.21 plain steps). Rows marked **no** under \"= plain "
          "engine\" ran before af65397: a bf16 near-tie changed the answer because a verify pass rounded some row "
          "differently from a 1-row step: its RMSNorm reduced the rows in another order (XLA:CPU picks a reduction's "
          "loop order by shape), and before the packed AMX GEMMs (36af0d6) its matmuls did too."),
    Claim("An EAGLE draft for SmolLM2-135M-Instruct (one decoder layer over the target's hidden states) beside the "
          "zoo draft, whole answers, batch 1, greedy, in the engine", tuple(EAGLE_DRAFT.values()),
          functools.partial(spec_suffix_gammas, EAGLE_DRAFT, first="prompt set"),
          "Issue 30's draft-model goal (≥ 2.0×). `jaxserve/smollm2-135m-instruct-eagle` (4.2M parameters: fc 2E→E, "
          "one layer of the target's shape, a norm; the target's embedding and tied head, cut to the 8,192 most "
          "frequent greedy labels, 99.2% of them) against `jaxserve/smollm2-135m-instruct-draft` (`draft_model`), "
          "bfloat16 target with packed AMX kernels, `LLM.generate` against a plain engine timed alongside, 4 prompts "
          "one at a time, each answer to its EOS (up to 160 tokens), fastest of 3 calls a side, idle 2-core AMX Intel "
          "Xeon (git 5ed102e and the next commits). Trained on CPU in ~60 min: `scripts/onpolicy_chat.py mix=edits` "
          "(633k tokens of the target's own answers in 9 min, 75% greedy), the target's hidden states once (14 min), "
          "900 steps at cls_weight 0.1, then 900 more at 0.3 (`scripts/train_eagle.py`, the model card's commands); "
          "held-out first-token agreement with the target (every position, teacher-forced) 0.50 and still rising. "
          "A round (γ 4, nothing accepted) costs ~1.2 plain steps; a draft step ~0.10 of a target step. The goal "
          "needs α ≈ 0.7 at these costs: **not met** (1.34× at best). The `first draft` rows are the draft as first "
          "bundled (b71bd6d). `rounds folding the next first step` (47a0926): a round's fix-up pass runs over the "
          "emitted tokens, so it also runs the next round's first draft step at the new last token, and a row that "
          "did not accept all γ skips that step next round: the same draft, α 0.458 and 1.34× at γ 3, 1.23× at γ 4, "
          "against a plain engine at 84 and 98 tok/s in two rows of one run (it was 111–114 in the first run): the "
          "saving (one of ~4 draft passes, ~5% of a round) is below this VM's noise. The `stage-3 draft` (the bundled "
          "one now): 1400 more steps (cls_weight 0.5, two passes over its own features, `ttt_steps=2`) on 1.58M "
          "tokens (a second on-policy run, seed 5, 946k tokens, most of its greedy answers repeating the first run's "
          "prompts), 48 min: α 0.458 → 0.477 at γ 3, 0.466 → 0.490 at γ 5, free 0.250 → 0.269; end to end 1.28× / "
          "1.22× / 1.23× and free 1.10× against plain engines at 100–108 tok/s. Held-out first-token agreement "
          "rose 0.555 → 0.606 (on rows whose prompts the first run also saw): the engine's α moved less."),
    Claim("A retrained SmolLM2 draft (4 x 256 wide, head cut to 12,288 tokens) on its own answers to edit prompts, "
          "whole answers, batch 1, greedy, in the engine", tuple(DRAFT_RETRAINED.values()),
          functools.partial(spec_suffix_gammas, DRAFT_RETRAINED),
          "Issue 30's draft-model goal (≥ 2.0×) after more and better-aimed data (git 3dfeb43 and the next commit): "
          "`scripts/onpolicy_chat.py mix=edits` (code edits over the pycode-v1 train split, text edits over the "
          "target's own answers, topic questions; bf16 engine, 75% greedy): 824k answer tokens in 25 min (two runs, "
          "seeds 2 and 3, written as stream windows and cut into whole pieces for packing afterwards; the first "
          "stopped at 877 s when its prompt list ran out, a loop bug since fixed), 13x the bundled draft's 62k; a draft twice as wide (`draft_init` projection to 256, 4 "
          "layers, 15.7M parameters), trained with `train.loss_on=answers train.head_vocab_size=12288` (its "
          "softmax over the 12,288 most frequent answer tokens, 96% of these answers' tokens; served the same "
          "with `draft_vocab_size=12288`), 1,000–1,100 steps of 4,096 tokens, 21–26 min on the 2 cores. Both "
          "drafts: α 0.32–0.35, the bundled draft's (0.34), 0.92–1.07× end to end; output = plain engine. "
          "The windows change (every answer with its whole prompt, at serving's positions) lowered the training loss, "
          "not α. Teacher-forced top-1 agreement with the target's greedy answers (an ad-hoc check): 0.30 on these "
          "prompts, 0.26 on open questions, 0.46 on training pieces: the draft neither copies its prompt nor fits "
          "its data; a standalone draft within 1/8 of a target step (a round here: ~0.07 of a step per draft "
          "token) that reaches the α the goal needs (~0.7 at γ 4) is out of reach of CPU training at this scale. "
          "Neither draft replaced the bundled one (no better, twice the size). Commands: the data as in "
          "`scripts/onpolicy_chat.py`'s docstring, `python -m jaxserve.train.draft_init "
          "draft=smollm2-135m-instruct-draft-256 out=runs/smollm2-draft2-init`, then `python -m jaxserve.train "
          "model=smollm2-135m-instruct-draft-256 train.init_from=runs/smollm2-draft2-init "
          "data.tokenizer=runs/smollm2-draft2-init/tokenizer.json data.train_windows=... data.seq_len=512 "
          "train.steps=1000 train.batch_size=8 train.lr=0.002 train.warmup_steps=40 train.loss_on=answers "
          "train.head_vocab_size=12288`."),
    Claim("Float32 CPU kernels (`f32_matmul`): few-row matmuls and SmolLM2-135M-Instruct's 5-token verify "
          "(float32, 2 threads)", F32_MATMUL + (F32_E2E,), cpu_f32_kernels,
          "Matmuls in µs: `benchmarks/cpu_matmul.py` (distinct weights per call, past the L3), medians of 3 runs; "
          "end to end: `benchmarks/cpu_kernels_f32_e2e.py`, separate processes alternating kernels on and off, 3 "
          "each, greedy tokens identical. At one row XLA's gemv streams near the memory bound and the kernel was "
          "slower, so `jaxserve.layers` sends float32 Dense layers and tied heads to the kernel at 2–16 rows only: "
          "batch-1 decode runs the same programs, while a 5-token speculative verify drops from ~2.2 to ~1.25 "
          "decode steps. At 16 rows the [K, N] kernel is compute-bound (sums in an L1 buffer). The 2-core AVX2 VM "
          "was shared (load average 1.0–2.5; the end-to-end rows ran at 358699d, before a67bcd2, which changes "
          "only 16-row [K, N] matmuls): compare within a run. The AVX-512 build compiles but was not run."),
    Claim("OpenBLAS float32 GEMMs (`f32_gemm`) against XLA's dot: SmolLM2-135M-Instruct float32, 64 requests",
          ("results/cpu_blas/results.json",), gemm_ab,
          "One process, the two variants alternating round by round (3 rounds; engines differ only in the matmul "
          "route), on the idle 2-core AVX2 VM (load average 1.8–2.2), jax 0.10.2; OpenBLAS (scipy-openblas32) on one "
          "thread, N split over XLA's pool. OpenBLAS was faster in every round: 1.12× by the medians."),
    Claim("bf16 GEMMs on AMX tiles (`bf16_gemm`) against the streaming kernel and XLA's dot: SmolLM2-135M-Instruct "
          "bfloat16, end to end", (CPU_AMX,), functools.partial(gemm_ab, CPU_AMX, "bf16 GEMMs"),
          "`benchmarks/cpu_blas_ab.py --dtype bfloat16 --workloads batch64,batch1,prefill --variants amx,noamx --rounds "
          "3`: one process, the two engines alternating round by round, on the idle 2-core Intel Xeon VM (AMX; load "
          "average ~1.8), jax 0.10.2, 1 GiB of KV cache. `amx`: the tied head from 2 rows and Dense layers from 8 on AMX "
          "tiles; `noamx` (`JAXSERVE_CPU_AMX=0`): `bf16_matmul` up to 16 rows, XLA's dot above. batch64: 64 requests "
          "64 → 128 tokens; batch1: one; prefill: 16 requests 512 → 4. Batch 1 runs the same programs but the first "
          "step's prefill (1.02×, noise). The tied head at 64 rows takes 5.2 ms on the tiles against 28 ms by XLA's "
          "dot; [K, N] Dense layers at 64 rows only match XLA's dot, because each call first packs the weights into "
          "tile pairs (`benchmarks/cpu_matmul.py`, `jaxserve.layers._CPU_AMX_MIN_ROWS`). Only 0.66 of the batch-64 "
          "requests agree on their first 8 tokens: the two paths round bf16 activations after different summation "
          "orders, and these random-token prompts have many near-ties (batch 1 and prefill agree)."),
    Claim("bf16 Dense kernels packed once for AMX tiles against as stored: SmolLM2-135M-Instruct bfloat16, end to end",
          (WEIGHT_LAYOUT,), weight_layout_ab,
          "`benchmarks/peers/compare.py --model smollm2-135m-instruct --backends "
          "jaxserve,jaxserve@engine.weight_layout=as_stored --workloads batch1,batch64,sharegpt --rounds 3 --threads 2 "
          "--dtype bfloat16` at 36af0d6: two engines in one process, rounds rotating them, every run from an empty "
          "prefix cache, on the idle 2-core Intel Xeon VM (AMX), jax 0.10.2. `auto` (the default on a CPU with AMX "
          "tiles): the runner packs every Dense kernel once into the B-tile layout (`jaxserve.kernels.cpu.packed`) and "
          "every matmul, one row or 64, runs one AMX GEMM (`bf16_gemm_packed`, no per-call packing); `as_stored`: "
          "[K, N] kernels, `bf16_matmul` (vdpbf16ps) below 8 rows and `bf16_gemm` (packing per call) from 8. The tied "
          "head runs the AMX [N, K] GEMM from one row in both. Per matmul, 2 threads, weights from memory "
          "(`benchmarks/cpu_matmul.py --paths kernel_bf16,amx_bf16,amxpacked`): at 64 rows q/o 132 vs 146 µs, k/v 93 vs "
          "139 (the packed GEMM gives each thread 3 of k/v's 6 column groups), gate/up 196 vs 222, down 234 vs 278; at "
          "one row the packed GEMM is no faster than the streaming kernel (gate/up 76–85 vs 57–68 µs; q/o 36–40 vs "
          "44), yet end to end batch 1 gains too (the head at one row on tiles, fewer kinds of call). A row's matmul "
          "bits no longer depend on the batch (tested). A prompt decoded alone then still drifted from itself beside "
          "another (log-probs from its 33rd–37th token): XLA compiled a one-row KV write as a dynamic update slice "
          "that rounded k differently; since d1cf858 `KVLayer.write` writes a lone row twice, and alone == in a batch "
          "bit for bit (a slow test, under the users' XLA flags). Greedy suffix speculation still differs from the "
          "plain engine on 2 of 4 chat prompts (as stored: 4 of 4 on that set, by chance): another step shape rounds "
          "differently, not found yet."),
    Claim("A bf16 model's KV pool as bf16 bits against float32 on CPU: SmolLM2-135M-Instruct bfloat16, end to end",
          (CPU_BF16_KV,), functools.partial(gemm_ab, CPU_BF16_KV, "KV pool"),
          "`benchmarks/cpu_blas_ab.py --dtype bfloat16 --workloads batch64,batch1,prefill --variants bf16kv,f32kv "
          "--rounds 3` at 029c3ad: one process, the two engines alternating round by round, on the idle 2-core Intel "
          "Xeon VM, jax 0.10.2, 1 GiB of KV cache (the float32 pool fits the 64 sequences too, so only the bytes "
          "attention reads differ). `bf16kv`: the pool holds bf16 bits as uint16, written and block-copied as "
          "integers, read by the C++ attention kernel, which widens each element; `f32kv`: a float32 pool of the same "
          "values. The outputs agree (bit for bit, as tested); half the memory buys twice the blocks. A first version "
          "(d211828) kept the pool as bf16 and wrote it through a bit-cast, which XLA:CPU materialises as a copy of the "
          "whole pool: batch 1 fell to 5.6 tok/s, batch 64 to 171."),
    Claim("CPU paged attention kernel: pages one at a time against groups of 128 keys (SmolLM2 decode, bf16 pools)",
          ATTENTION_POOL, cpu_attention_pool,
          "`benchmarks/cpu_attention_pool.py --engine-rounds 3`, run on each kernel source (the older checked out "
          "from the commit before it, the record naming each source's hash), one after the other on the idle 2-core "
          "Intel Xeon VM, jax 0.10.2, 2 threads. One layer: 64 sequences of 64–192 tokens, 9 query heads, 3 kv heads, "
          "head dim 64, pages of 16, best of 5 rounds of 60 calls; the small pool stays in cache, the large one "
          "spreads 30 layers' tables over 1.5 GiB so that every call reads from memory. The new kernel scores four "
          "pages at once (independent FMA chains), folds 128 keys into the softmax at a time, keeps V's "
          "accumulators in registers across a group and prefetches one score call ahead. In cache and from memory it is ~1.1x; "
          "end to end, where attention is about a quarter of a batch-64 step and waits on memory, the gain is "
          "within the runs' spread (an ad-hoc A/B, two runs of three each per kernel, gave ~833 against ~865 tok/s)."),
    Claim("CPU paged attention: the C++ kernel against the XLA loop, SmolLM2-135M-Instruct's shapes",
          (CPU_ATTENTION,), cpu_attention,
          "One process pinned to one core (`taskset -c 0`, `JAXSERVE_CPU_KERNEL_THREADS=1`), the two paths alternating "
          "round by round (3 rounds), on the 2-core AVX-512 VM shared with another engineer's work (load average "
          "2.1–3.1), jax 0.10.2. One layer: 9 query heads, 3 kv heads, head dim 64, pages of 16, float32 pools, "
          "contexts 150–250 (mixed: a 256-token prefill chunk on a 64-token prefix beside 63 decodes; verify: 64 "
          "sequences × 5 tokens), the XLA path as the engine calls it. Engine rows: 64-token prompts, greedy, output "
          "tok/s including the prefill; both dtypes keep the pool in float32. Outputs: the share of requests whose first "
          "8 greedy tokens are equal on both paths. Under bfloat16 activations 11 of the 64 batch-64 requests differ "
          "there: the kernel sums in another order and bf16 rounding breaks near-ties either way (float32: all agree; "
          "`tests/kernels/test_cpu_kernels_in_models.py` compares tokens and log-probs)."),
    Claim("Medusa-1 heads on the frozen zoo target (600 steps)", ("results/medusa_heads/results.json",), medusa_heads,
          "Their speedup is in the speculative-decoding grids above (proposer `medusa`)."),
    Claim("Medusa-1 heads on SmolLM2-135M-Instruct, trained on its own chat answers, in the engine (float32, "
          "repetitive chat prompts)", MEDUSA_SMOLLM2, medusa_smollm2,
          "3 heads trained 78 steps (20 min, 1 epoch of a 41,560-token on-policy stream: the target's answers to "
          "chat prompts, `scripts/onpolicy_chat.py`); agreement = top-1 agreement with the target's argmax on held-out "
          "windows. Engine rows: `LLM.generate` with one Medusa round per step against a plain engine timed "
          "alongside, 48 tokens per request, EOS ignored, the `chat_repetitive` prompts of the SmolLM2 grid above. "
          "The Medusa paper reports 2.2–3.6× (Vicuna-7B/13B/33B, GPU). The spec run was stopped after 3 of its 4 "
          "points (batch 4 at T = 1 not run): its rows are what they saved (`engine_progress`). The 2-core VM was "
          "shared with another engineer's test run (load average 4–6 during both runs): speedups ±30%; α, length "
          "and calls/token are not timing."),
)


def _runs(sources: tuple[str, ...]) -> str:
    """The runs table: one row per source, or one row for a folder of repeated runs of one command."""
    groups: dict[str, list[str]] = {}
    for rel in sources:
        parent = pathlib.PurePosixPath(rel).parent
        key = str(parent.parent) + "/run*" if parent.name in RUNS else str(parent)
        groups.setdefault(key, []).append(rel)
    rows = []
    for folder, rels in groups.items():
        metas = [load(rel)["meta"] for rel in rels]
        first = metas[0]
        command = first["command"]
        if len(rels) > 1:
            command = command.replace(str(pathlib.PurePosixPath(rels[0]).parent), folder.replace("run*", "run$k"))
        dates = sorted({m["date"] for m in metas})
        date = dates[0] if len(dates) == 1 else f"{dates[0]} – {dates[-1][-9:]}"
        commits = sorted({m["git_commit"][:7] + ("+dirty" if m["git_commit"].endswith("+dirty") else "") for m in metas})
        link = folder if len(rels) > 1 else str(pathlib.PurePosixPath(rels[0]).parent)
        rows.append([f"[`{link}`](../{link.replace('/run*', '')})" + (f" ({len(rels)} runs)" if len(rels) > 1 else ""),
                     f"`{command}`", date, first["machine"], ", ".join(commits)])
    return md(["results", "command", "date", "machine", "commit"], rows)


HEADER = """# Benchmark and experiment results

Generated by `python scripts/results_tables.py` from the committed `results/*/results.json` files; do not
edit by hand (`tests/scripts/test_results_tables.py` fails when this file and the script's output differ).
One table per claim, each from the latest run that measured it; superseded runs are in git history.
Figures from a shared 2-core CPU VM: compare the ratios measured within one run, not absolute times across
runs. The papers' numbers beside ours: `experiments/README.md`.
"""


def render() -> str:
    parts = [HEADER.strip()]
    for claim in CLAIMS:
        headers, rows = claim.figures()
        parts += [f"## {claim.title}", md(headers, rows)]
        if claim.notes:
            parts.append(claim.notes)
        if claim.sources:
            parts.append(_runs(claim.sources))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(REPO)} is stale: run python scripts/results_tables.py", file=sys.stderr)
            return 1
        return 0
    if argv:
        raise SystemExit(f"usage: python scripts/results_tables.py [--check] (got {argv})")
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
