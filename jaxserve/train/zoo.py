"""Turning a finished training run into a zoo model, measuring it, and writing its model card.

Measurements are fixed so anyone can re-run them: validation windows of ``EVAL_SEQ_LEN + 1``
tokens cut from the corpus's validation split (documents joined by EOS, stride EVAL_SEQ_LEN);
``val_ppl`` over the first ``EVAL_WINDOWS`` windows and ``val_slice_ppl`` over the first
``SLICE_WINDOWS`` (the figure the tests re-measure).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxserve.models.checkpoint import load_config, load_model, save_model, write_manifest
from jaxserve.models import forward_full
from jaxserve.moe.router_state_file import ROUTER_STATE_FILE, load_router_state
from jaxserve.speculative.token_counts import COUNTS_FILE
from jaxserve.train.moe import evaluate_balance
from jaxserve.tokenizer import TOKENIZER_FILE, load_tokenizer
from jaxserve.train.data import encode_split, windows
from jaxserve.train.step import evaluate
from jaxserve.zoo import ZOO_DIR, zoo_path

EVAL_SEQ_LEN, EVAL_WINDOWS, SLICE_WINDOWS = 256, 128, 8
EVAL_FILE = "eval.json"


def export_run(run_dir: str | pathlib.Path, name: str, storage_dtype: str = "bfloat16", note: str = "") -> pathlib.Path:
    """Copies ``run_dir/final`` into ``jaxserve/zoo/<name>`` with params rounded to ``storage_dtype``.

    The config keeps its compute dtype; orbax casts the stored params back to it on load, so the
    zoo model is exactly the rounded weights. Metrics, curve and run config are copied alongside.
    """
    run_dir, dest = pathlib.Path(run_dir), ZOO_DIR / name
    config, params = load_model(run_dir / "final")
    if dest.exists():
        shutil.rmtree(dest)
    save_model(dest, config, jax.tree.map(lambda p: np.asarray(p.astype(jnp.dtype(storage_dtype))), params))
    for f in (TOKENIZER_FILE, "metrics.jsonl", "training_curve.png"):
        shutil.copy(run_dir / (f"final/{f}" if f == TOKENIZER_FILE else f), dest / f)
    for extra in (ROUTER_STATE_FILE, COUNTS_FILE):  # an MoE model's biases; a draft's head_vocab_size counts
        if (run_dir / "final" / extra).exists():
            shutil.copy(run_dir / "final" / extra, dest / extra)
    info = {"run_config": json.loads((run_dir / "run_config.json").read_text()), "storage_dtype": storage_dtype,
            "num_params": int(sum(np.size(p) for p in jax.tree.leaves(params))), "note": note}
    (dest / "train_info.json").write_text(json.dumps(info, indent=2))
    write_manifest(dest)  # now covering the tokenizer and router state too
    return dest


def validation_windows(tokenizer, seq_len: int = EVAL_SEQ_LEN, corpus: str | None = None) -> np.ndarray:
    return windows(encode_split(tokenizer, corpus, "val"), seq_len)


def load_zoo_model(name: str) -> tuple:
    """``(config, params, router_state)`` of zoo model ``name``; router_state is None for a dense model."""
    path = zoo_path(name)
    config, params = load_model(path)
    return config, params, load_router_state(path)


def measure_perplexity(name: str, num_windows: int | None = SLICE_WINDOWS, use_router_state: bool = True) -> dict:
    """Validation loss/perplexity of zoo model ``name`` over the first ``num_windows`` windows (None: all).

    An MoE model is run with its loss-free balancing biases unless ``use_router_state`` is False."""
    config, params, router_state = load_zoo_model(name)
    val = validation_windows(load_tokenizer(zoo_path(name)))
    return evaluate(params, config, val[:num_windows] if num_windows else val,
                    router_state=router_state if use_router_state else None)


def measure_balance(name: str, num_windows: int = EVAL_WINDOWS) -> dict:
    """MoE zoo model: MaxVio_global (expert loads summed over the first ``num_windows`` validation windows,
    mean over MoE layers) with its biases, and without them (as an engine that ignores them routes)."""
    config, params, router_state = load_zoo_model(name)
    val = validation_windows(load_tokenizer(zoo_path(name)))[:num_windows]
    zero = jax.tree.map(np.zeros_like, router_state)
    return {"max_vio_global": evaluate_balance(params, router_state, config, val, batch_size=8)["max_vio_global"],
            "max_vio_global_zero_bias": evaluate_balance(params, zero, config, val, batch_size=8)["max_vio_global"]}


def acceptance_alpha(target: str, draft: str, num_prompts: int = 4, prompt_len: int = 32, gamma: int = 3,
                     max_tokens: int = 48) -> dict:
    """Greedy speculative decoding of ``draft`` for ``target`` (batch 1, ``gamma`` drafts per round) on
    ``num_prompts`` prompts cut at evenly spaced offsets of the validation stream; ``summarize``'s
    figures (α = ``token_acceptance_prob``) over all prompts' rounds together."""
    from jaxserve.speculative import speculative_generate  # here: the spec package is only needed for this figure
    from jaxserve.speculative.metrics import summarize
    tcfg, tparams, _ = load_zoo_model(target)
    dcfg, dparams, _ = load_zoo_model(draft)
    stream = encode_split(load_tokenizer(zoo_path(target)), None, "val")
    starts = np.linspace(0, len(stream) - prompt_len - 1, num_prompts).astype(int)
    totals = None
    for s in starts:
        _, _, m = speculative_generate(tparams, tcfg, dparams, dcfg, stream[None, s:s + prompt_len],
                                       np.array([prompt_len]), gamma=gamma, max_tokens=max_tokens)
        totals = m if totals is None else jax.tree.map(lambda a, b: np.asarray(a) + np.asarray(b), totals, m)
    out = summarize(totals)
    return {k: out[k] for k in ("token_acceptance_prob", "acceptance_rate", "mean_acceptance_length",
                                "rounds", "accepted", "generated")} | {"gamma": gamma, "prompts": num_prompts,
                                                                       "prompt_len": prompt_len}


def forward_seconds(configs_params: dict, batch: int, length: int, reps: int = 7) -> dict:
    """Best-of-``reps`` wall time of one jitted ``forward_full`` on i32[batch, length], per model.

    Models are timed in interleaved rounds so that load from other processes hits them alike.
    """
    fns, times = {}, {k: [] for k in configs_params}
    tokens = jnp.zeros((batch, length), jnp.int32)
    for k, (config, params) in configs_params.items():
        fns[k] = jax.jit(lambda p, t, c=config: forward_full(p, c, t))
        fns[k](params, tokens).block_until_ready()
    for _ in range(reps):
        for k, (config, params) in configs_params.items():
            t0 = time.perf_counter()
            fns[k](params, tokens).block_until_ready()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def forward_flops(config, params, batch: int, length: int) -> float:
    """XLA's FLOP count for one ``forward_full`` on i32[batch, length] (independent of machine load)."""
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    compiled = jax.jit(lambda p, t: forward_full(p, config, t)).lower(params, tokens).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def greedy_sample(config, params, tokenizer, prompt: str, max_tokens: int = 48, width: int = 128,
                  router_state: dict | None = None) -> str:
    """Greedy continuation of ``prompt`` with the cache-free ``forward_full`` (for the model card)."""
    ids = tokenizer.encode(prompt)
    buf = np.zeros((1, width), np.int32)  # causal: padding after the last real token changes nothing
    buf[0, :len(ids)] = ids
    fn = jax.jit(lambda p, t: forward_full(p, config, t, router_state=router_state))
    n = len(ids)
    for _ in range(min(max_tokens, width - n)):
        nxt = int(jnp.argmax(fn(params, buf)[0, n - 1]))
        if nxt == tokenizer.eos_token_id:
            break
        buf[0, n], n = nxt, n + 1
    return tokenizer.decode(buf[0, :n].tolist())


def _moe_sentence(config) -> str:
    return (f" with mixture-of-experts MLPs: {config.num_experts} routed SwiGLU experts of width "
            f"{config.moe_intermediate_size}, top-{config.num_experts_per_tok} by a {config.router} router, plus "
            f"{config.num_shared_experts} shared expert(s) every token goes through")


def config_table(config) -> str:
    rows = "".join(f"| {f.name} | {getattr(config, f.name)} |\n" for f in dataclasses.fields(config))
    return "| field | value |\n|---|---|\n" + rows


def card_figure(card_text: str, key: str) -> float:
    """Reads the number in the ``| key ... | value |`` row of a model card's evaluation table."""
    m = re.search(rf"^\| `{re.escape(key)}`[^|]*\| ([0-9.eE+-]+) \|", card_text, re.M)
    if m is None:
        raise ValueError(f"model card has no `{key}` row")
    return float(m.group(1))


def _data_phrase(data: dict, tokens: int, split_tokens: int) -> str:
    if data.get("train_windows"):
        return (f"windows from `{data['train_windows']}`, written by `python -m jaxserve.train.onpolicy`: "
                "training-split prompts continued by the teacher, not corpus text")
    return f"about {tokens / split_tokens:.2f} epochs of the {split_tokens:,}-token training split"


def render_card(name: str, description: str, ev: dict) -> str:
    """MODEL_CARD.md text for zoo model ``name`` from its files and the measurements ``ev``."""
    path = zoo_path(name)
    info = json.loads((path / "train_info.json").read_text())
    rc, tr = info["run_config"], info["run_config"]["train"]
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "loss" in r][-1]
    lines = [
        f"# {name}", "", description, "",
        f"## Evaluation", "",
        f"Measured by `python scripts/eval_zoo.py {name}` on CPU ({ev['platform']}, jax {jax.__version__}). "
        f"Validation windows are {EVAL_SEQ_LEN + 1} tokens cut from the pycode-v1 validation split "
        f"(21 files never trained on, documents joined by `<|endoftext|>`, stride {EVAL_SEQ_LEN}).", "",
        "| metric | value |", "|---|---|",
        f"| `val_loss` (nats/token, first {EVAL_WINDOWS} windows, {ev['val']['val_tokens']:,} predicted tokens) "
        f"| {ev['val']['val_loss']:.4f} |",
        f"| `val_ppl` (same windows) | {ev['val']['val_ppl']:.3f} |",
        f"| `val_slice_ppl` (first {SLICE_WINDOWS} windows, {ev['slice']['val_tokens']:,} tokens; "
        f"re-measured by tests/train/test_zoo.py) | {ev['slice']['val_ppl']:.4f} |",
        f"| `forward_ms_b8_l256` (best of 7, jitted `forward_full`, i32[8, 256]) | {ev['fwd_ms'][0]:.1f} |",
        f"| `forward_ms_b4_l64` (best of 7, i32[4, 64]) | {ev['fwd_ms'][1]:.2f} |",
        f"| `forward_gflops_b8_l256` (XLA cost analysis) | {ev['gflops']:.3f} |",
    ]
    if "ratio" in ev:
        lines += [f"| `forward_time_ratio_vs_tiny-code` (wall time, i32[8, 256]) "
                  f"| {ev['ratio'][0]:.3f} |", f"| `forward_time_ratio_b4_l64` | {ev['ratio'][1]:.3f} |",
                  f"| `forward_flops_ratio_vs_tiny-code` | {ev['flops_ratio']:.3f} |"]
    if "balance" in ev:
        b = ev["balance"]
        lines += [f"| `max_vio_global` (expert load over the first {EVAL_WINDOWS} windows, with the trained "
                  f"selection biases; mean over MoE layers) | {b['max_vio_global']:.4f} |",
                  f"| `max_vio_global_zero_bias` (same, biases zeroed) | {b['max_vio_global_zero_bias']:.4f} |",
                  f"| `val_ppl_zero_bias` (first {EVAL_WINDOWS} windows, biases zeroed) "
                  f"| {ev['val_zero_bias']['val_ppl']:.3f} |"]
    if "alpha" in ev:
        a = ev["alpha"]
        lines += [f"| `spec_alpha_vs_tiny-code` (α, greedy speculative decoding, batch 1, γ={a['gamma']}, "
                  f"{a['prompts']} validation prompts of {a['prompt_len']} tokens, {a['generated']} tokens "
                  f"generated) | {a['token_acceptance_prob']:.4f} |",
                  f"| `spec_mean_acceptance_length` (tokens per target call) | {a['mean_acceptance_length']:.3f} |"]
    load = (f"with the machine's load average at {ev['loadavg'][0]:.1f} just before timing (2 cores; the "
            "measuring process itself counts ~1)" if "loadavg" in ev
            else "on a shared 2-core machine with other jobs running")
    lines += [
        "", f"Wall times were taken {load}; the FLOP ratio does not depend on load.", "",
        "## Model", "",
        f"Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention)"
        + (_moe_sentence(load_config(path)) if load_config(path).num_experts else "")
        + f", {info['num_params']:,} parameters, trained in float32; the params are stored rounded to "
        f"{info['storage_dtype']} and load as float32 (all figures above are for the stored weights). "
        "Tokenizer: byte-level BPE, 4096 tokens, trained on the pycode-v1 training split; id 0 is "
        "`<|endoftext|>` (EOS and document separator).", "", config_table(load_config(path)),
        "## Training", "",
        f"`python -m jaxserve.train model={name} train.out_dir=runs/{name} ...` (full config in "
        "`train_info.json`): AdamW (b1 {b1}, b2 {b2}, weight decay {wd} on matrices), linear warm-up "
        "{wu} steps then cosine to {mlr:.0%} of peak lr {lr}, gradient clipping at {gc}, batch {bs} x {sl} "
        "tokens, {steps} steps = {tok:,} training tokens ({data}), seed {seed}.".format(
            b1=tr["b1"], b2=tr["b2"], wd=tr["weight_decay"], wu=tr["warmup_steps"], mlr=tr["min_lr_ratio"],
            lr=tr["lr"], gc=tr["grad_clip"], bs=tr["batch_size"], sl=rc["data"]["seq_len"], steps=tr["steps"],
            tok=last["tokens"], data=_data_phrase(rc["data"], last["tokens"], ev["train_tokens"]), seed=tr["seed"]),
        f"Final training loss {last['loss']:.3f}; wall-clock {last['elapsed_s'] / 60:.0f} min on a shared 2-core "
        "CPU (alongside other jobs).", "",
    ]
    if tr.get("init_from"):
        lines += [f"Initialised from the weights of `{tr['init_from']}` (not from random); the step and token "
                  "counts above are this run's only.", ""]
    if tr.get("distill_from"):
        lines += [f"Distilled from `{tr['distill_from']}`: loss = {tr['distill_weight']} x KL(teacher || draft) "
                  f"+ {1 - tr['distill_weight']:.2g} x cross-entropy on the data, teacher logits computed on the "
                  "fly for each batch.", ""]
    if rc["model"].get("num_experts"):
        lines += [f"Expert balancing: {tr.get('balancing', 'loss_free')} (selection bias += "
                  f"{tr.get('bias_rate')} x sign(mean load - load) after every step, no auxiliary loss); the "
                  "biases are stored in `router_state.json`. The figures above use them; the serving engine "
                  "(`LLM(model=...)`) does not pass them to the model yet and routes with zero biases: the "
                  "`_zero_bias` rows measure that.", ""]
    if info.get("note"):
        lines += [info["note"], ""]
    if "sample" in ev:
        lines += ["Greedy continuation of `def fibonacci(n):` (48 tokens):", "", "```python", ev["sample"], "```", ""]
    lines += ["![training curve](training_curve.png)", "",
              "## Limitations", "",
              "A research fixture, not a useful code model: trained for about an hour on a shared CPU, on "
              + ("a 2.4M-token corpus and its teacher's continuations" if rc["data"].get("train_windows") else
                 f"{last['tokens'] / ev['train_tokens']:.2f} epochs of a 2.4M-token corpus")
              + ", it has picked up Python's "
              "indentation, keywords and common identifiers, not semantics, and greedy decoding soon repeats "
              "itself. Context is "
              f"{rc['data']['seq_len']} tokens in training (`max_position_embeddings` "
              f"{rc['model']['max_position_embeddings']}); quality degrades beyond it.", ""]
    return "\n".join(lines)

