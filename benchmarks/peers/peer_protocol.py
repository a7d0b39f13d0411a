"""The protocol between ``jaxserve bench`` and a peer's driver script, the driver's side.

A driver runs in its peer's own venv (no jaxserve there), so this module needs only the standard library.
``jaxserve.bench.peers.DriverProcess`` starts ``python <peer>_driver.py --model PATH --threads N
--max-num-seqs N --max-model-len N --dtype D --reply-fd FD``; the driver loads the model, writes one JSON
line ``{"ready": true, "version": ..., ...}`` to FD, then for each JSON line ``{"workload": PATH}`` on stdin
runs that workload file's requests (greedy, EOS ignored, each request exactly its ``output_len`` tokens)
and answers ``{"elapsed_s", "output_tokens", "output_ids_head"}`` (the first 8 ids of every request's
output, so the harness can check that the backends run the same weights); ``{"quit": true}`` ends it.
A failure answers ``{"error": "..."}``. Library logs go to stdout/stderr, which the harness keeps in a log.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

WORKLOAD_FORMAT = "jaxserve-workload/1"
HEAD = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="an HF directory or a GGUF file, as the peer loads it")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reply-fd", type=int, required=True)
    return p.parse_args(argv)


def read_workload(path: str) -> list[tuple[list[int], int]]:
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != WORKLOAD_FORMAT:
        raise ValueError(f"{path}: format must be {WORKLOAD_FORMAT!r}, got {doc.get('format')!r}")
    return [(r["prompt_token_ids"], r["output_len"]) for r in doc["requests"]]


def serve(load) -> int:
    """``load(args) -> (info dict, run)`` or ``(info, run, prepare)``; ``run(requests) -> list of output id lists``,
    timed; ``prepare()``, untimed before each run (vLLM: empty the prefix cache, so that no run reuses the prompts
    of the one before)."""
    args = parse_args()
    reply = os.fdopen(args.reply_fd, "w", buffering=1)

    def send(obj):
        reply.write(json.dumps(obj) + "\n")

    try:
        info, run, *prepare = load(args)
    except Exception as e:  # noqa: BLE001 - reported to the harness, which raises it
        send({"error": f"loading {args.model}: {type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 1
    send({"ready": True, **info})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        try:
            requests = read_workload(cmd["workload"])
            for step in prepare:
                step()
            start = time.perf_counter()
            outputs = run(requests)
            elapsed = time.perf_counter() - start
            short = [i for i, (o, (_, n)) in enumerate(zip(outputs, requests)) if len(o) != n]
            if short:
                raise RuntimeError(f"requests {short[:5]} did not produce their output_len tokens")
            send({"elapsed_s": elapsed, "output_tokens": sum(len(o) for o in outputs),
                  "output_ids_head": [list(map(int, o[:HEAD])) for o in outputs]})
        except Exception as e:  # noqa: BLE001
            send({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    return 0
