"""Measures the zoo models and writes the figures into their MODEL_CARD.md (and eval.json).

    python scripts/eval_zoo.py [name ...]        # default: every zoo model

Validation perplexity over fixed windows of the pycode-v1 validation split, forward-pass wall
time and FLOPs on CPU (and, for models other than tiny-code, their ratio to tiny-code's); for an MoE
model its expert-load MaxVio; for a draft model its speculative-decoding α with its target.
"""
from __future__ import annotations

import json
import os
import sys

import jax

from jaxserve.models.checkpoint import load_model
from jaxserve.tokenizer import load_tokenizer
from jaxserve.train import zoo
from jaxserve.train.data import encode_split
from jaxserve.zoo import trained_models, zoo_path

DESCRIPTIONS = {
    "tiny-code": "The target model of jaxserve's demos: a small Llama-style model of Python source, "
                 "trained from scratch on the CPython standard library (pycode-v1 corpus).",
    "tiny-code-draft": "The draft model for speculative decoding with tiny-code: same tokenizer and data, "
                       "a forward pass meant to cost at most 1/8 of tiny-code's in wall time on CPU (measured ratios "
                       "below; two 32-wide attention heads rather than four 16-wide ones for that), distilled from "
                       "tiny-code, last on tiny-code's own continuations (on-policy data, as in DistillSpec).",
    "tiny-code-moe": "A small mixture-of-experts model (8 routed experts, top-2, one shared expert) for the MoE "
                     "and expert-parallel demos, trained with auxiliary-loss-free load balancing on the same "
                     "corpus and tokenizer.",
}
DRAFTS = {"tiny-code-draft": "tiny-code"}  # draft -> target: the card reports their speculative-decoding α
REFERENCE = "tiny-code"


def measure(name: str) -> dict:
    config, params, router_state = zoo.load_zoo_model(name)
    tok = load_tokenizer(zoo_path(name))
    ev = {"platform": jax.devices()[0].platform, "train_tokens": int(len(encode_split(tok, None, "train"))),
          "val": zoo.measure_perplexity(name, zoo.EVAL_WINDOWS),
          "slice": zoo.measure_perplexity(name, zoo.SLICE_WINDOWS),
          "gflops": zoo.forward_flops(config, params, 8, 256) / 1e9,
          "sample": zoo.greedy_sample(config, params, tok, "def fibonacci(n):", router_state=router_state)}
    if router_state is not None:
        ev["balance"] = zoo.measure_balance(name, zoo.EVAL_WINDOWS)
        ev["val_zero_bias"] = zoo.measure_perplexity(name, zoo.EVAL_WINDOWS, use_router_state=False)
    if name in DRAFTS and DRAFTS[name] in trained_models():
        ev["alpha"] = zoo.acceptance_alpha(DRAFTS[name], name)
    models = {name: (config, params)}
    if name != REFERENCE and REFERENCE in trained_models():
        models[REFERENCE] = load_model(zoo_path(REFERENCE))
    shapes = [(8, 256), (4, 64)]
    ev["loadavg"] = os.getloadavg()  # the card states it: wall-time ratios drift under load
    times = [zoo.forward_seconds(models, b, length) for b, length in shapes]
    ev["fwd_ms"] = [t[name] * 1e3 for t in times]
    if len(models) > 1:
        ev["ratio"] = [t[name] / t[REFERENCE] for t in times]
        ev["flops_ratio"] = ev["gflops"] * 1e9 / zoo.forward_flops(*models[REFERENCE], 8, 256)
    return ev


def main(names: list[str]) -> None:
    for name in names or trained_models():
        ev = measure(name)
        (zoo_path(name) / zoo.EVAL_FILE).write_text(json.dumps(ev, indent=2))
        (zoo_path(name) / "MODEL_CARD.md").write_text(zoo.render_card(name, DESCRIPTIONS.get(name, ""), ev))
        print(name, json.dumps(ev))


if __name__ == "__main__":
    main(sys.argv[1:])
