"""Tables, figures and text of the vllm_paged experiment (from the rows ``run.py`` measured)."""
import math

from jaxserve.bench.rate_sweep import sustained_rate

POLICY_NAMES = {"paged": "vLLM (paged)", "orca_oracle": "Orca (Oracle)", "orca_pow2": "Orca (Pow2)",
                "orca_max": "Orca (Max)"}
KV_PARTS = ("token_states", "reserved", "internal", "external", "free")
PCT = "{:.1%}".format


def preamble(cfg, out):
    out.text(f"Time unit: the engine **step** (one iteration of continuous batching); request rates are "
             f"requests per step, latencies steps, normalized latency steps per output token. On a GPU a "
             f"decode step costs about the same for small and large batches (memory-bound), so steps stand "
             f"for time; on this shared CPU wall time is noise (the `model` section gives it). KV memory: "
             f"{cfg.kv_slots} token slots (OPT-13B on one A100-40GB in the paper: 15.7K), block size "
             f"{cfg.block_size}, max_model_len {cfg.max_model_len}, max_num_seqs {cfg.max_num_seqs}, "
             f"chunked prefill budget {cfg.max_num_batched_tokens}. Lengths: `jaxserve.bench.workload` "
             f"log-normals (ShareGPT: mean in 161 / out 338, sigma 1.0; Alpaca: mean in 19 / out 58, sigma "
             f"0.8) times {cfg.length_scale}, outputs forced with ignore_eos. All sections but `model` run the "
             f"real scheduler and block manager with the device replaced by `NullRunner`.")


def memory(cfg, out, rows, paper_fig2):
    out.table("serving", rows, title="Serving vs request rate (Fig. 12/13)",
              columns={"dataset": "dataset", "policy": "policy", "rate": "rate (req/step)",
                       "throughput_req_per_step": "throughput (req/step)", "normalized_latency": "norm. latency",
                       "mean_batch": "mean batch", "mean_batch_saturated": "mean batch (saturated)",
                       "max_batch": "max batch", "preemptions": "preemptions", "kv_token_states": "KV token states"},
              fmt={"throughput_req_per_step": ".4f", "normalized_latency": ".2f", "mean_batch": ".1f",
                   "mean_batch_saturated": ".1f", "kv_token_states": ".1%"})
    summary = []
    for ds in cfg.datasets:
        _fig12(cfg, out, ds, [r for r in rows if r["dataset"] == ds])
        by = {p: [r for r in rows if r["dataset"] == ds and r["policy"] == p] for p in cfg.policies}
        # one limit for all policies: latency_knee x the best normalized latency at the lowest rate
        limit = cfg.latency_knee * min(rs[0]["normalized_latency"] for rs in by.values())
        for p, rs in by.items():
            rate, bound = sustained_rate([r["rate"] for r in rs], [r["normalized_latency"] for r in rs], limit)
            summary.append({"dataset": ds, "policy": p, "sustained_rate": rate, "bound": bound,
                            "throughput_top": rs[-1]["throughput_req_per_step"],
                            "batch_top": rs[-1]["mean_batch_saturated"]})
    if "paged" in cfg.policies:
        for s in summary:
            ref = next(x for x in summary if x["dataset"] == s["dataset"] and x["policy"] == "paged")
            s["paged_rate_x"] = ref["sustained_rate"] / s["sustained_rate"]
            s["paged_throughput_x"] = ref["throughput_top"] / s["throughput_top"]
            s["paged_batch_x"] = ref["batch_top"] / s["batch_top"]
    out.table("sustained", summary, title=f"Sustained rate (mean normalized latency below {cfg.latency_knee}x "
              "the best one at the lowest rate; >=: never crossed on the grid, <: crossed at the lowest rate) "
              "and capacity at the highest rate; x: paged / policy",
              columns={"dataset": "dataset", "policy": "policy", "sustained_rate": "sustained rate",
                       "paged_rate_x": "paged x", "throughput_top": "throughput at top rate",
                       "paged_throughput_x": "paged x", "batch_top": "mean batch, saturated steps, top rate",
                       "paged_batch_x": "paged x"},
              fmt={"sustained_rate": lambda r: ("" if r["bound"] == "=" else r["bound"]) + f"{r['sustained_rate']:.4g}",
                   "paged_rate_x": ".2f", "throughput_top": ".4f", "paged_throughput_x": ".2f",
                   "batch_top": ".1f", "paged_batch_x": ".2f"})
    _fig2(cfg, out, rows, paper_fig2)


def _fig12(cfg, out, ds, rows):
    with out.figure(f"fig12_{ds}", f"{ds}: normalized latency, mean batched requests and throughput vs "
                    "Poisson request rate (steps as time)", ncols=3, figsize=(13, 3.8)) as axes:
        for p in cfg.policies:
            rs = [r for r in rows if r["policy"] == p]
            x = [r["rate"] for r in rs]
            for ax, key in zip(axes, ("normalized_latency", "mean_batch", "throughput_req_per_step")):
                ax.plot(x, [r[key] for r in rs], "o-", label=POLICY_NAMES[p])
        for ax, label in zip(axes, ("normalized latency (steps/token)", "mean batched requests",
                                    "throughput (req/step)")):
            ax.set_xlabel("request rate (req/step)")
            ax.set_ylabel(label)
            ax.set_xscale("log")
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)


def _fig2(cfg, out, rows, paper):
    ds = "sharegpt" if "sharegpt" in cfg.datasets else cfg.datasets[0]
    top = max(r["rate"] for r in rows if r["dataset"] == ds)
    fig2 = [{"policy": p, **{k: r[f"kv_{k}"] for k in KV_PARTS}, "paper_token_states": paper.get(p, math.nan)}
            for p in cfg.policies for r in rows if r["dataset"] == ds and r["policy"] == p and r["rate"] == top]
    out.table("fig2", fig2, title=f"Fig. 2: KV memory by use ({ds}, rate {top}/step, mean over steps with "
              "requests waiting; share of all KV slots)",
              columns={"policy": "policy", **{k: k.replace("_", " ") for k in KV_PARTS},
                       "paper_token_states": "paper: token states"},
              fmt={**{k: ".1%" for k in KV_PARTS}, "paper_token_states": ".1%"})
    with out.figure("fig2_memory", "Share of KV memory: token states, reserved, internal and external "
                    "fragmentation, free (saturated steps)") as ax:
        bottom = [0.0] * len(fig2)
        for k in KV_PARTS:
            vals = [r[k] for r in fig2]
            ax.bar([POLICY_NAMES[r["policy"]] for r in fig2], vals, bottom=bottom, label=k.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("share of KV slots")
        ax.legend(fontsize=8)


def sharing(cfg, out, rows):
    out.table("sharing", rows, title="Fig. 15: KV block memory saved by sharing (1 - physical / unshared "
              "blocks, over all steps); paper (OPT-13B): Alpaca 6.1-9.8% (parallel n=2..6), 37.6-55.2% "
              "(beam 2..6); ShareGPT 16.2-30.5% and 44.3-66.3%",
              columns={"dataset": "dataset", "mode": "mode", "width": "n / beam width", "saving": "memory saved",
                       "preemptions": "preemptions"},
              fmt={"saving": ".1%"})
    out.text(f"Parallel sampling: {cfg.sharing_requests} requests with n samples (Poisson, "
             f"{cfg.sharing_rate_sharegpt} / {cfg.sharing_rate_alpaca} req/step; prefix caching on, so a sample "
             "recomputed after a preemption shares its prompt's blocks again). Beam search: "
             f"{cfg.beam_prompts} prompts, one at a time, max_tokens = the sampled output length; the "
             "NullRunner's candidates are random, so which beams survive is random (a real model's beams "
             "share longer histories, which would save more).")


def prefix(cfg, out, rows):
    for r in rows:
        ref = next(x for x in rows if x["prefix_len"] == r["prefix_len"] and x["policy"] == "orca_oracle")
        r["vs_oracle_x"] = r["throughput_req_per_step"] / ref["throughput_req_per_step"]
    out.table("prefix", rows, title=f"Fig. 16: shared prefix (1-shot 80 / 5-shot 341 tokens) + a sentence "
              f"(mean {cfg.prefix_input_mean:g}) -> mean {cfg.prefix_output_mean:g} output tokens, "
              f"{cfg.prefix_requests} requests at {cfg.prefix_rate} req/step (overload). Paper (LLaMA-13B, "
              "WMT16): vLLM 1.67x (1-shot) and 3.58x (5-shot) Orca (Oracle)'s throughput",
              columns={"prefix_len": "prefix", "policy": "policy", "prefix_caching": "prefix caching",
                       "throughput_req_per_step": "throughput (req/step)", "vs_oracle_x": "x Orca (Oracle)",
                       "mean_batch": "mean batch", "sharing_saving": "blocks saved by sharing"},
              fmt={"throughput_req_per_step": ".4f", "vs_oracle_x": ".2f", "mean_batch": ".1f",
                   "sharing_saving": ".1%"})


def block_size(cfg, out, rows):
    out.table("block_size", rows, title="Fig. 18: block size sweep (paged); steps do not see the GPU kernel's "
              "cost of small blocks, only fragmentation and sharing granularity",
              columns={"dataset": "dataset", "block_size": "block size", "rate": "rate (req/step)",
                       "normalized_latency": "norm. latency", "throughput_req_per_step": "throughput (req/step)",
                       "mean_batch": "mean batch", "kv_token_states": "KV token states",
                       "kv_internal": "internal frag.", "preemptions": "preemptions"},
              fmt={"normalized_latency": ".2f", "throughput_req_per_step": ".4f", "mean_batch": ".1f",
                   "kv_token_states": ".1%", "kv_internal": ".1%"})
    with out.figure("fig18_block_size", "Normalized latency vs block size (paged), per dataset and rate") as ax:
        for ds in cfg.datasets:
            for rate in sorted({r["rate"] for r in rows if r["dataset"] == ds}):
                rs = [r for r in rows if r["dataset"] == ds and r["rate"] == rate]
                ax.plot([r["block_size"] for r in rs], [r["normalized_latency"] for r in rs], "o-",
                        label=f"{ds} @ {rate}/step")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel("normalized latency (steps/token)")
        ax.legend(fontsize=8)


def model(cfg, out, rows, config):
    out.table("model", rows, title=f"The real forward pass ({cfg.model}: {config.num_layers} layers, hidden "
              f"{config.hidden_size}) on the scaled setting ({cfg.model_dataset} x {cfg.model_length_scale}, "
              f"{cfg.model_kv_slots} KV slots, max_model_len {cfg.model_max_model_len}, {cfg.model_requests} "
              f"requests at {cfg.model_rate} req/step); "
              + ("timed run after a warm-up run that compiled" if cfg.model_warmup
                 else "no warm-up: wall includes compiling")
              + "; wall seconds are the sum of engine.step times on the shared CPU",
              columns={"policy": "policy", "steps": "steps", "wall_s": "wall s",
                       "throughput_req_per_s": "req/s (wall)", "throughput_req_per_step": "req/step",
                       "mean_batch": "mean batch", "compilations_timed_run": "compiles in timed run",
                       "same_schedule_as_null_runner": "same schedule as NullRunner"},
              fmt={"wall_s": ".1f", "throughput_req_per_s": ".2f", "throughput_req_per_step": ".4f",
                   "mean_batch": ".1f"})
