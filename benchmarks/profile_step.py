"""Where a served step's time goes: one workload run under ``jax.profiler``, the XLA:CPU thunks summed by kind.

    python benchmarks/profile_step.py [--model smollm2-135m-instruct] [--dtype bfloat16] [--workload batch64]
                                      [--top 25] [--out profile.json] [engine.NAME=VALUE ...]

The engine (the same one ``benchmarks/peers/compare.py`` builds: 1 GiB of KV cache, greedy, EOS ignored) is warmed
up, runs the workload once untraced, then once inside a trace. The Perfetto trace's events are grouped by name with
the numbers stripped (``fusion.123`` and ``fusion.7`` count as ``fusion``; a custom call as its FFI target), and
reported as milliseconds per engine step, summed over threads (two threads each busy 1 ms count 2 ms), beside the
run's wall-clock step time; then the decode steps' custom calls by their place in a layer (SmolLM2 bf16 on AMX: the
fused q/k/v GEMM, attention, o, gate/up with its SiLU, down) and the LM head, with the other thunks inside those
steps (thunks nest: a ``cond`` counts the calls of its branch, e.g. the greedy head); last, the host's share of a
step (``host_share``: the time no program ran, and how much of it the jitted calls spent before their program
started; tracing slows the Python side, so these read high). Workloads as compare.py's: batch64 (64 requests
64 -> 128), batch1, sharegpt, prefill64 (batch64's prompts, one output token each: its prefill steps alone).
"""
import argparse
import bisect
import collections
import gzip
import json
import pathlib
import re
import sys
import tempfile
import time

import jax

from jaxserve.bench.backends import BenchOptions, JaxserveBackend
from jaxserve.bench.throughput import load_model
from jaxserve.bench.workload import make_workload

WORKLOADS = {"batch64": (64, 64, 128), "batch1": (1, 64, 128), "sharegpt": (64, None, None),  # requests, in, out
             "prefill64": (64, 64, 1)}


def thunk_kind(event: dict) -> str:
    """An event's name without its instance numbers; a custom call by its target when the trace names it."""
    name = event.get("name", "")
    target = (event.get("args") or {}).get("custom_call_target") or (event.get("args") or {}).get("target")
    if target:
        return f"custom-call:{target}"
    return re.sub(r"[._]\d+", "", name)


def trace_events(trace_dir: pathlib.Path) -> list[dict]:
    """The complete ("X") events of the Perfetto trace under ``trace_dir``, in time order."""
    path = next(trace_dir.rglob("perfetto_trace.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    return sorted((e for e in events if e.get("ph") == "X" and "dur" in e), key=lambda e: e["ts"])


def summarize(events: list[dict], steps: int) -> list[tuple[str, float, int]]:
    """[(kind, ms per step, events per step)], largest first."""
    totals, counts = collections.Counter(), collections.Counter()
    for e in events:
        kind = thunk_kind(e)
        totals[kind] += e["dur"] / 1e3
        counts[kind] += 1
    return [(k, ms / steps, counts[k] / steps) for k, ms in totals.most_common()]


def per_layer(events: list[dict], num_layers: int) -> tuple[int, dict]:
    """The decode steps' custom calls by their place in a layer: the program runs ``num_layers`` layers of k FFI
    calls each (GEMMs, attention) and one more (the LM head); steps with the most common count of calls are kept.
    -> (steps kept, {"call i of a layer" / "head" / other thunk kinds: ms per step, summed over the layers})."""
    starts = [e["ts"] for e in events]
    windows = []
    for step in (e for e in events if e["name"] == "ThunkExecutor::Execute (wait for completion)"):
        inside = [e for e in events[bisect.bisect_left(starts, step["ts"]):
                                    bisect.bisect_right(starts, step["ts"] + step["dur"])] if e is not step]
        windows.append((step, inside, [e for e in inside if e["name"].startswith("ffi_call")]))
    if not windows:
        return 0, {}
    common = collections.Counter(len(ffi) for _, _, ffi in windows).most_common(1)[0][0]
    if (common - 1) % num_layers:
        return 0, {}
    per, kept, totals = (common - 1) // num_layers, 0, collections.Counter()
    for step, inside, ffi in windows:
        if len(ffi) != common:
            continue
        kept += 1
        totals["step (traced)"] += step["dur"]
        for i, e in enumerate(ffi[:-1]):
            totals[f"call {i % per} of a layer"] += e["dur"]
        totals["head (last call)"] += ffi[-1]["dur"]
        for e in inside:
            if not e["name"].startswith(("ffi_call", "end:", "Thunk", "Threadpool", "$")):
                totals[thunk_kind(e)] += e["dur"]
    return kept, {k: v / kept / 1e3 for k, v in totals.most_common()}


def host_share(events: list[dict]) -> dict:
    """Per engine step, the milliseconds the device program was not running: the step's span (the engine's
    ``step`` Python event) less its programs' execution (XLA's "ThunkExecutor::Execute (wait for completion)"
    spans inside it), and the part of that spent in jitted calls before their program started (a ``PjitFunction``
    span up to the first execution inside it: dispatch, which runs on the host before the device starts)."""
    starts = [e["ts"] for e in events]
    inside = lambda span: events[bisect.bisect_left(starts, span["ts"]):  # noqa: E731
                                 bisect.bisect_right(starts, span["ts"] + span["dur"])]
    steps = [e for e in events if e["name"].startswith("$") and "llm_engine.py" in e["name"]
             and e["name"].endswith(" step")]
    if not steps:
        return {}
    host = dispatch = 0.0
    for step in steps:
        within = inside(step)
        runs = [e for e in within if e["name"] == "ThunkExecutor::Execute (wait for completion)"]
        host += step["dur"] - sum(e["dur"] for e in runs)
        for call in (e for e in within if e["name"].startswith("PjitFunction(")):
            first = next((e["ts"] for e in runs if e["ts"] >= call["ts"]), call["ts"] + call["dur"])
            dispatch += min(first, call["ts"] + call["dur"]) - call["ts"]
    return {"host ms a step (device program not running)": host / len(steps) / 1e3,
            "of which jitted calls before their program started": dispatch / len(steps) / 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--workload", default="batch64", choices=sorted(WORKLOADS))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sharegpt-scale", type=float, default=0.5, help="as compare.py's --sharegpt-scale")
    ap.add_argument("--out")
    ap.add_argument("--trace-dir", help="keep the trace here (default: a temporary directory)")
    ap.add_argument("overrides", nargs="*", help="jaxserve engine overrides, e.g. engine.max_num_batched_tokens=1024")
    args = ap.parse_args()
    n, prompt, output = WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(args.model, 0, tmp)
        backend = JaxserveBackend(model, BenchOptions(dtype=args.dtype, overrides=tuple(args.overrides)))
        requests = (make_workload("sharegpt", n, model.config.vocab_size, 1024, length_scale=args.sharegpt_scale)
                    if prompt is None else make_workload("fixed", n, model.config.vocab_size, 1024,
                                                         input_len=(prompt, prompt), output_len=(output, output)))
        plain = backend.run(requests)
        trace_dir = pathlib.Path(args.trace_dir or pathlib.Path(tmp) / "trace")
        with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
            start = time.perf_counter()
            traced = backend.run(requests)
            traced_s = time.perf_counter() - start
        events = trace_events(trace_dir)
        rows = summarize(events, traced["steps"])
        kept, layer_rows = per_layer(events, model.config.num_layers)
        host = host_share(events)
    step_ms = 1e3 * plain["elapsed_s"] / plain["steps"]
    print(f"{args.model} {args.dtype} {args.workload}: {plain['steps']} steps, {step_ms:.1f} ms a step untraced, "
          f"{1e3 * traced_s / traced['steps']:.1f} traced; {plain['output_tokens'] / plain['elapsed_s']:.0f} tok/s")
    print(f"{'kind':60s} {'ms/step':>8s} {'calls/step':>10s}")
    for kind, ms, calls in rows[:args.top]:
        print(f"{kind[:60]:60s} {ms:8.2f} {calls:10.1f}")
    print(f"\ndecode steps with the usual custom calls ({kept}), ms a step summed over the layers:")
    for kind, ms in list(layer_rows.items())[:args.top]:
        print(f"{kind[:60]:60s} {ms:8.2f}")
    print()
    for kind, ms in host.items():
        print(f"{kind[:60]:60s} {ms:8.2f}")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            {"command": "python benchmarks/profile_step.py " + " ".join(sys.argv[1:]), "step_ms": step_ms,
             "rows": [{"kind": k, "ms_per_step": ms, "calls_per_step": c} for k, ms, c in rows],
             "decode_steps_kept": kept, "per_layer_ms_per_step": layer_rows, "host_ms_per_step": host}, indent=1))


if __name__ == "__main__":
    main()
