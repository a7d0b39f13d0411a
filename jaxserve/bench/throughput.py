"""``jaxserve bench throughput``: offline throughput in the style of ``vllm bench throughput``.

Runs N requests (a workload file, or lengths from a named distribution; ``ignore_eos`` so every request
produces its requested number of tokens) through one backend (``jaxserve``, ``hf`` transformers, or a
peer: ``vllm`` CPU, ``llama.cpp``; ``jaxserve.bench.backends``) on the same weights, and reports one JSON
record (``make_record``'s schema, shared with ``jaxserve bench latency``): requests/s, output tokens/s,
the runs' times, and the backend's own figures (jaxserve: KV utilisation, compilations after warm-up).
Before the timed runs every backend serves an untimed slice of the workload (its first two requests,
at most 8 tokens each), so a peer's first-call costs are not timed; jaxserve also compiles every bucket.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import tempfile

import jax

from jaxserve.bench.backends import BACKENDS, GGUF_TYPES, BenchModel, BenchOptions, make_backend
from jaxserve.bench.workload import BenchRequest, load_workload, make_workload, save_workload

SCHEMA = "jaxserve-bench/1"
RECORD_KEYS = ("schema", "benchmark", "backend", "backend_info", "model", "dtype", "dataset", "num_prompts",
               "input_tokens", "output_tokens", "elapsed_s", "runs_elapsed_s", "requests_per_s",
               "output_tokens_per_s", "options", "output_ids_head", "date", "machine", "argv")


def common_parser(prog: str) -> argparse.ArgumentParser:
    """The options every ``jaxserve bench`` timing of a backend takes (model, backend, weights, engine)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--model", default="random:small-llama",
                   help="zoo name, checkpoint dir, HF dir, .gguf file, or random:<preset> (random weights)")
    p.add_argument("--backend", choices=BACKENDS, default="jaxserve")
    p.add_argument("--dtype", choices=sorted(GGUF_TYPES), default="float32",
                   help="weights and activations, in every backend (llama.cpp: the GGUF's storage type)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most sequences in a batch, every backend (HF: its static batch size); default: "
                        "engine.max_num_seqs of the overrides (64)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch, llama.cpp and vLLM")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="the KV cache's memory for jaxserve and vLLM (an "
                   "engine.kv_cache_bytes or engine.num_kv_blocks override wins for jaxserve)")
    p.add_argument("--gguf-type", default=None, help="llama.cpp weights: F32, F16, BF16, Q8_0, Q4_0, ... "
                                                    "(default: from --dtype)")
    p.add_argument("--gguf-file", default=None, help="llama.cpp: this GGUF file instead of an export")
    p.add_argument("--workdir", default=None, help="where exported weights and peer logs go (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "draft_model", "draft_model": '
                        '"jaxserve/tiny-code-draft", "num_speculative_tokens": 3}\' (jaxserve backend)')
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("overrides", nargs="*", help="jaxserve engine overrides, e.g. engine.max_num_batched_tokens=512")
    return p


def _parser() -> argparse.ArgumentParser:
    p = common_parser("jaxserve bench throughput")
    p.add_argument("--dataset", choices=["fixed", "random", "sharegpt", "alpaca"], default="random")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=(32, 96), metavar=("LO", "HI"),
                   help="random: the range; fixed: LO")
    p.add_argument("--output-len", type=int, nargs=2, default=(64, 192), metavar=("LO", "HI"))
    p.add_argument("--length-scale", type=float, default=1.0, help="sharegpt/alpaca: scales the mean lengths")
    p.add_argument("--workload", default=None, help="a workload file (jaxserve.bench.workload) instead of --dataset")
    p.add_argument("--save-workload", default=None, help="also write the workload to this file")
    p.add_argument("--num-iters", type=int, default=1, help="timed runs of the workload (the record: their median)")
    return p


def options(args) -> BenchOptions:
    """Checks what can be checked before any model loads; raises ValueError naming the option."""
    from jaxserve.config import engine_kwargs
    if args.max_num_seqs is None:  # --max-num-seqs wins over an engine.max_num_seqs override
        args.max_num_seqs = engine_kwargs(args.overrides)["max_num_seqs"]
    for name in ("max_num_seqs", "max_model_len", "threads", "num_iters", "kv_cache_gib"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    speculative = None
    if args.speculative_config is not None:
        from jaxserve.speculative.config import SpeculativeConfig
        if args.backend != "jaxserve":
            raise ValueError("--speculative-config is for the jaxserve backend")
        speculative = SpeculativeConfig.from_json(args.speculative_config)
    if (args.gguf_type or args.gguf_file) and args.backend != "llama.cpp":
        raise ValueError("--gguf-type and --gguf-file are for the llama.cpp backend")
    if args.gguf_type:
        import gguf
        if args.gguf_type not in gguf.GGMLQuantizationType.__members__:
            raise ValueError(f"--gguf-type {args.gguf_type!r} is not a GGML type (F32, F16, BF16, Q8_0, Q4_0, ...)")
    if args.gguf_file and not pathlib.Path(args.gguf_file).is_file():
        raise ValueError(f"--gguf-file {args.gguf_file!r} is not a file")
    return BenchOptions(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        kv_cache_gib=args.kv_cache_gib,
                        threads=args.threads, overrides=tuple(args.overrides), speculative=speculative,
                        gguf_type=args.gguf_type, gguf_file=args.gguf_file)


def load_model(model: str, seed: int, workdir) -> BenchModel:
    """float32 ``(config, params, tokenizer)``: random weights for ``random:<preset>``, else ``resolve_model``."""
    from jaxserve.models import get_preset, init_params
    from jaxserve.models.loading import resolve_model
    if model.startswith("random:"):
        config = get_preset(model.split(":", 1)[1])
        return BenchModel(model, config, init_params(config, jax.random.key(seed)), None, workdir)
    return BenchModel(model, *resolve_model(model), workdir)


def warmup_slice(requests: list[BenchRequest]) -> list[BenchRequest]:
    return [BenchRequest(r.prompt_token_ids, min(r.output_len, 8)) for r in requests[:2]]


def machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs ({jax.default_backend()})"


def git_commit(repo: str | os.PathLike) -> str:
    """The checkout's short commit, "+dirty" when tracked files differ from it ("" outside a git checkout)."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=repo).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD")
    return commit + ("+dirty" if commit and git("status", "--porcelain", "--untracked-files=no") else "")


def write_results(out: str | os.PathLike, script: str, argv: list[str], tables: dict) -> None:
    """A benchmark script's ``results.json`` at ``out``: its ``tables`` beside the run's meta (command, UTC date,
    machine, commit, load average), the layout ``scripts/results_tables.py`` reads."""
    meta = {"command": f"python {script} " + " ".join(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "git_commit": git_commit(pathlib.Path(__file__).parent),
            "load_average": f"{os.getloadavg()[0]:.1f} at the end"}
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "tables": tables}, indent=1))


def make_record(benchmark: str, backend, model: BenchModel, opts: BenchOptions, dataset: str,
                requests: list[BenchRequest], runs: list[dict], argv) -> dict:
    """The one JSON schema of ``jaxserve bench throughput`` and ``latency`` (``RECORD_KEYS``, then the last
    run's backend-specific figures). ``elapsed_s`` is the median of the runs."""
    wanted = sum(r.output_len for r in requests)
    for run in runs:
        if run["output_tokens"] != wanted:
            raise RuntimeError(f"{backend.name} produced {run['output_tokens']} output tokens, the workload asks {wanted}")
    times = [run["elapsed_s"] for run in runs]
    elapsed = statistics.median(times)
    last = {k: v for k, v in runs[-1].items() if k not in ("elapsed_s", "output_tokens", "output_ids_head")}
    return {"schema": SCHEMA, "benchmark": benchmark, "backend": backend.name, "backend_info": backend.info,
            "model": model.name, "dtype": opts.dtype, "dataset": dataset, "num_prompts": len(requests),
            "input_tokens": sum(len(r.prompt_token_ids) for r in requests), "output_tokens": wanted,
            "elapsed_s": elapsed, "runs_elapsed_s": times, "requests_per_s": len(requests) / elapsed,
            "output_tokens_per_s": wanted / elapsed,
            "options": {"max_num_seqs": opts.max_num_seqs, "max_model_len": opts.max_model_len,
                        "threads": opts.threads, "gguf_type": opts.gguf_type, "gguf_file": opts.gguf_file},
            "output_ids_head": runs[-1]["output_ids_head"],
            "speculative_config": None if opts.speculative is None else dataclasses.asdict(opts.speculative),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "argv": argv, **last}


def check_record(record: dict) -> dict:
    """``record`` if it has the schema's keys and consistent figures; else ValueError naming the key."""
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing or record["schema"] != SCHEMA:
        raise ValueError(f"not a {SCHEMA} record: missing {missing}, schema {record.get('schema')!r}")
    if abs(record["output_tokens_per_s"] * record["elapsed_s"] - record["output_tokens"]) > 1e-6 * record["output_tokens"]:
        raise ValueError("output_tokens_per_s * elapsed_s != output_tokens")
    if len(record["output_ids_head"]) != record["num_prompts"]:
        raise ValueError(f"output_ids_head has {len(record['output_ids_head'])} rows for {record['num_prompts']} prompts")
    return record


def timed_runs(backend, requests: list[BenchRequest], workdir: pathlib.Path, iters: int, tag: str = "w") -> list[dict]:
    """One untimed warm-up slice, then ``iters`` timed runs of ``requests`` (written as a workload file for peers)."""
    path, warm = workdir / f"{tag}.json", workdir / f"{tag}-warmup.json"
    save_workload(path, requests, name=tag, vocab_size=0)
    save_workload(warm, warmup_slice(requests), name=f"{tag}-warmup", vocab_size=0)
    backend.run(warmup_slice(requests), warm)
    return [backend.run(requests, path) for _ in range(iters)]


def emit(record: dict, out: str | None) -> None:
    text = json.dumps(check_record(record), indent=2)
    print(text)
    if out:
        pathlib.Path(out).write_text(text + "\n")


def run_benchmark(args, argv, benchmark: str, build_requests) -> dict:
    """Loads the model, builds the workload (``build_requests(config) -> (dataset name, requests)``), runs the
    backend's warm-up and timed runs, and returns the record; the work dir is a temp dir unless ``--workdir``."""
    opts = options(args)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        model = load_model(args.model, args.seed, workdir)
        dataset, requests = build_requests(model.config)
        backend = make_backend(args.backend, model, opts)
        try:
            runs = timed_runs(backend, requests, workdir, args.num_iters)
        finally:
            backend.close()
        return make_record(benchmark, backend, model, opts, dataset, requests, runs, argv)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def build(config):
        if args.workload:
            return load_workload(args.workload, config.vocab_size)
        requests = make_workload(args.dataset, args.num_prompts, config.vocab_size, args.max_model_len, args.seed,
                                 input_len=tuple(args.input_len), output_len=tuple(args.output_len),
                                 length_scale=args.length_scale)
        if args.save_workload:
            save_workload(args.save_workload, requests, name=args.dataset, vocab_size=config.vocab_size)
        return args.dataset, requests

    emit(run_benchmark(args, argv, "throughput", build), args.out)
    return 0
