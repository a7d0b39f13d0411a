"""Tables, figures and text of the live-server variant (from the rows ``run.py`` measured)."""
import math

from experiments.vllm_paged.report import POLICY_NAMES
from jaxserve.bench.rate_sweep import STATS, sustained_rate


def preamble(cfg, out):
    out.text(f"Time: wall-clock seconds. One `jaxserve serve {cfg.model}` process per KV policy "
             f"({'step programs compiled at start' if cfg.warmup else 'no warm-up: compiling is inside the timings'}), "
             f"`jaxserve bench serve` in the experiment's process sending streaming `/v1/completions` requests "
             f"(token-id prompts, greedy, ignore_eos) at Poisson rates. KV memory: {cfg.kv_slots} token slots, "
             f"block size {cfg.block_size}, max_model_len {cfg.max_model_len} (Orca-Max's reservation), "
             f"max_num_seqs {cfg.max_num_seqs}, chunked prefill budget {cfg.max_num_batched_tokens}, prefix "
             f"caching off. Workload: {cfg.num_requests} requests per rate, `jaxserve.bench.workload` "
             f"'{cfg.dataset}' log-normal lengths x {cfg.length_scale}. Normalized latency: a request's "
             f"end-to-end latency / its output tokens (the paper's Fig. 12 axis), mean and p99 over requests. "
             f"Client, server and three other engineers' work share 2 CPU cores: `load` is the 1-minute load "
             f"average after each point.")


def points(cfg, out, rows):
    out.table("points", rows, title="Every (policy, rate) point: throughput, TTFT, TPOT, normalized latency",
              columns={"policy": "policy", "rate": "rate (req/s)", "completed": "done", "failed": "failed",
                       "request_throughput": "req/s", "output_throughput": "out tok/s",
                       "p50_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms", "p50_tpot_ms": "TPOT p50 ms",
                       "p99_tpot_ms": "TPOT p99 ms", "mean_norm_latency_ms": "norm. lat. mean ms/tok",
                       "p99_norm_latency_ms": "norm. lat. p99 ms/tok", "load_1m": "load"},
              fmt={k: ".1f" for k in ("p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms",
                                      "mean_norm_latency_ms", "p99_norm_latency_ms", "load_1m")}
              | {"request_throughput": ".2f", "output_throughput": ".0f"})
    with out.figure("fig12_live", "Normalized latency (end-to-end / output tokens) vs Poisson request rate "
                    "against a live server, mean and p99 (wall clock); dotted: the target", ncols=2,
                    figsize=(11, 4)) as axes:
        targets = _targets(cfg, rows)
        for ax, stat in zip(axes, STATS):
            for p in cfg.policies:
                rs = _of(rows, p)
                ax.plot([r["rate"] for r in rs], [r[f"{stat}_norm_latency_ms"] / 1000 for r in rs], "o-",
                        label=POLICY_NAMES[p])
            ax.axhline(targets[stat], color="grey", linestyle=":")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{stat} normalized latency (s/token)")
            ax.set_yscale("log")
        axes[0].legend(fontsize=8)


def sustained(cfg, out, rows):
    targets, lowest = _targets(cfg, rows), min(r["rate"] for r in rows)
    summary = []
    for p in cfg.policies:
        rs = _of(rows, p)
        row = {"policy": p, "top_throughput": max(r["request_throughput"] for r in rs)}
        for stat in STATS:
            lat = [math.inf if r["failed"] else r[f"{stat}_norm_latency_ms"] / 1000 for r in rs]
            row[f"{stat}_rate"], row[f"{stat}_bound"] = sustained_rate([r["rate"] for r in rs], lat, targets[stat])
        summary.append(row)
    paged = next((s for s in summary if s["policy"] == "paged"), None)
    for s in summary:
        for stat in STATS:
            s[f"{stat}_paged_x"] = paged[f"{stat}_rate"] / s[f"{stat}_rate"] if paged else math.nan
    out.json("targets_s_per_token", targets)

    def rate(stat):
        return lambda r: ("" if r[f"{stat}_bound"] == "=" else r[f"{stat}_bound"]) + f"{r[f'{stat}_rate']:.3g}"

    def times(stat):  # the policy misses the target at the lowest rate: paged's ratio is a lower bound
        return lambda r: (">=" if r[f"{stat}_bound"] == "<" else "") + f"{r[f'{stat}_paged_x']:.2f}"
    out.table("sustained", summary, title=f"Sustained rate (req/s): where the normalized latency crosses "
              f"{cfg.latency_knee}x the best policy's at the lowest rate ({lowest:g} req/s): mean "
              f"{targets['mean']:.4f} s/token, p99 {targets['p99']:.4f} s/token (>=: never crossed on the grid, "
              "<: crossed at the lowest rate); paged x: paged's rate / the policy's",
              columns={"policy": "policy", "mean_rate": "sustained (mean)", "mean_paged_x": "paged x",
                       "p99_rate": "sustained (p99)", "p99_paged_x": "paged x",
                       "top_throughput": "highest throughput (req/s)"},
              fmt={"mean_rate": rate("mean"), "p99_rate": rate("p99"), "mean_paged_x": times("mean"),
                   "p99_paged_x": times("p99"),
                   "top_throughput": ".2f"})


def _of(rows, policy):
    return sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rate"])


def _targets(cfg, rows) -> dict:
    """Per statistic: latency_knee x the best policy's normalized latency (s/token) at the lowest rate."""
    lowest = min(r["rate"] for r in rows)
    return {s: cfg.latency_knee * min(r[f"{s}_norm_latency_ms"] for r in rows if r["rate"] == lowest) / 1000
            for s in STATS}
