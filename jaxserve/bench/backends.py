"""The backends ``jaxserve bench throughput`` / ``latency`` time on one workload and one set of weights.

``jaxserve`` and ``hf`` (transformers ``generate``, batched, CPU) run in this process; the peers (``vllm``,
``llama.cpp``) run in their own venvs as driver subprocesses (``jaxserve.bench.peers``), fed the same
weights exported from the params this process loaded (an HF directory, or a GGUF file of the chosen
storage type) and the same workload file. Every backend answers ``run(requests, workload_path)`` with
``{"elapsed_s", "output_tokens", "output_ids_head", ...}``: greedy, EOS ignored, each request exactly its
``output_len`` tokens, model load and compilation outside the timed span.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time

import jax
import jax.numpy as jnp

from jaxserve.bench.peers import PEERS, DriverProcess
from jaxserve.bench.workload import BenchRequest

BACKENDS = ("jaxserve", "hf", *PEERS)
HEAD = 8  # output ids kept per request to check that backends agree
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16"}


@dataclasses.dataclass
class BenchOptions:
    dtype: str = "float32"
    max_num_seqs: int = 64  # jaxserve engine.max_num_seqs, vLLM max_num_seqs, llama.cpp slots, HF batch size
    max_model_len: int = 1024
    threads: int = 2  # torch, llama.cpp and vLLM's OpenMP threads (XLA:CPU uses every core)
    # The KV cache's memory, the same for the engines that take a budget: jaxserve's engine.kv_cache_bytes, vLLM's
    # VLLM_CPU_KVCACHE_SPACE (whole GiB). (llama.cpp allocates max_num_seqs x max_model_len tokens; HF pads a batch.)
    kv_cache_gib: int = 1
    overrides: tuple[str, ...] = ()  # jaxserve engine overrides
    speculative: object = None  # a SpeculativeConfig (jaxserve)
    gguf_type: str | None = None  # llama.cpp's weight storage (F32, F16, BF16, Q8_0, Q4_0, ...); None: from dtype
    gguf_file: str | None = None  # a GGUF file for llama.cpp instead of an export (e.g. the model's own)


class BenchModel:
    """``(config, params, tokenizer)`` in float32 and their exports, written once into ``workdir``."""

    def __init__(self, name: str, config, params, tokenizer, workdir: str | pathlib.Path):
        self.name, self.config, self.params, self.tokenizer = name, config, params, tokenizer
        self.workdir = pathlib.Path(workdir)
        self._exports: dict[str, pathlib.Path] = {}

    def hf_dir(self) -> pathlib.Path:
        if "hf" not in self._exports:
            from jaxserve.models.hf_export import save_hf
            self._exports["hf"] = save_hf(self.workdir / "hf", self.config, self.params)
        return self._exports["hf"]

    def gguf(self, qtype: str) -> pathlib.Path:
        if qtype not in self._exports:
            from jaxserve.models.gguf_export import placeholder_tokenizer, save_gguf
            # Prompts are token ids, so any vocabulary of the right size serves; llama.cpp refuses a BPE one
            # without merges, hence one (harmless) merge of two byte symbols.
            vocab = placeholder_tokenizer(self.config.vocab_size, self.config.eos_token_id)
            vocab["tokenizer.ggml.merges"] = [f"{vocab['tokenizer.ggml.tokens'][0]} {vocab['tokenizer.ggml.tokens'][1]}"]
            self._exports[qtype] = save_gguf(self.workdir / f"model-{qtype}.gguf", self.config, self.params,
                                             qtype=qtype, tokenizer=vocab)
        return self._exports[qtype]


def _heads(outputs) -> list[list[int]]:
    return [list(map(int, o[:HEAD])) for o in outputs]


class JaxserveBackend:
    name = "jaxserve"

    def __init__(self, model: BenchModel, opts: BenchOptions):
        from jaxserve.config import engine_kwargs
        from jaxserve.engine.llm import LLM
        config, params = model.config, model.params
        if opts.dtype != config.dtype:
            config = config.replace(dtype=opts.dtype)
            params = jax.tree.map(lambda x: x.astype(jnp.dtype(opts.dtype)), params)
        # the options every backend shares win over the engine.* overrides' defaults
        # (the KV budget too, unless an override sizes the cache itself)
        sized = any(o.split("=")[0].strip() in ("engine.kv_cache_bytes", "engine.num_kv_blocks")
                    for o in opts.overrides)
        self.engine_kwargs = {**engine_kwargs(list(opts.overrides)), "max_num_seqs": opts.max_num_seqs,
                              "max_model_len": opts.max_model_len,
                              **({} if sized else {"kv_cache_bytes": opts.kv_cache_gib * 2**30})}
        self.llm = LLM.from_params(config, params, model.tokenizer, speculative=opts.speculative,
                                   **self.engine_kwargs)
        # Warm-up compiles every shape bucket (a speculative engine: its fill, round and copy programs), so
        # runs measure serving, not compilation; compilations after it are reported (should be 0).
        start = time.perf_counter()
        self.llm.warmup()
        self.info = {"version": _version("jaxserve"), "jax": jax.__version__, "warmup_s": time.perf_counter() - start,
                     "prefix_cache_reset_each_run": True,
                     "engine": self.engine_kwargs,  # the bytes a decode step reads once: every weight as served
                     "weight_bytes": sum(x.nbytes for x in jax.tree.leaves(self.llm.engine.runner.params))}
        self._compiles_after_warmup = self.llm.stats()["compilations"]

    def run(self, requests: list[BenchRequest], workload_path=None) -> dict:
        from jaxserve.sampling_params import SamplingParams
        engine = self.llm.engine
        before = self.llm.stats()
        if engine.spec_stats is not None:
            engine.spec_stats.reset()  # acceptance counted over this run only
        if not self.llm.reset_prefix_cache():  # every run from a cold cache: the prompts repeat across runs
            raise RuntimeError("jaxserve: requests are still in flight; the prefix cache cannot be reset")
        ids = [engine.add_request(r.prompt_token_ids, SamplingParams(max_tokens=r.output_len, temperature=0,
                                                                     ignore_eos=True)) for r in requests]
        peak_used, steps = 0, 0
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            steps += 1
            peak_used = max(peak_used, engine.block_manager.num_used)
        elapsed = time.perf_counter() - start
        outputs = [engine.finished.pop(i).outputs[0].token_ids for i in ids]
        stats = self.llm.stats()
        spec = {k: v for k, v in stats.items() if k.startswith("spec_")}
        return {"elapsed_s": elapsed, "output_tokens": sum(len(o) for o in outputs), "output_ids_head": _heads(outputs),
                "steps": steps, **spec, "kv_blocks_total": stats["kv_blocks_total"],
                "kv_peak_utilisation": peak_used / stats["kv_blocks_total"],
                "preemptions": stats["num_preemptions"] - before["num_preemptions"],
                "compilations_after_warmup": stats["compilations"] - self._compiles_after_warmup,
                "buckets": stats["buckets"]}

    def close(self) -> None:
        pass


class HFBackend:
    """transformers ``generate``: static batches of ``max_num_seqs`` requests sorted by prompt length, left
    padded, each batch generating its longest ``output_len`` (the tokens counted are the requested ones)."""
    name = "hf"

    def __init__(self, model: BenchModel, opts: BenchOptions):
        import torch
        import transformers
        torch.set_num_threads(opts.threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model.hf_dir(), dtype=getattr(torch, opts.dtype)).eval()
        self.batch = opts.max_num_seqs
        self.info = {"version": transformers.__version__, "torch": torch.__version__, "hf_max_batch_size": self.batch}

    def run(self, requests: list[BenchRequest], workload_path=None) -> dict:
        torch = self.torch
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_token_ids))
        outputs: list = [None] * len(requests)
        start = time.perf_counter()
        for lo in range(0, len(order), self.batch):
            idx = order[lo:lo + self.batch]
            batch = [requests[i] for i in idx]
            width = max(len(r.prompt_token_ids) for r in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(batch):  # left padding, as decoder-only generation needs
                ids[j, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
                mask[j, width - len(r.prompt_token_ids):] = 1
            new = max(r.output_len for r in batch)
            with torch.no_grad():
                out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                          do_sample=False, pad_token_id=0)
            for j, i in enumerate(idx):
                outputs[i] = out[j, width:width + requests[i].output_len].tolist()
        elapsed = time.perf_counter() - start
        return {"elapsed_s": elapsed, "output_tokens": sum(len(o) for o in outputs), "output_ids_head": _heads(outputs)}

    def close(self) -> None:
        pass


class PeerBackend:
    def __init__(self, name: str, model: BenchModel, opts: BenchOptions):
        self.name = name
        if PEERS[name].weights == "hf":
            path = model.hf_dir()
        else:
            path = opts.gguf_file or model.gguf(opts.gguf_type or GGUF_TYPES[opts.dtype])
        self.driver = DriverProcess(name, path, threads=opts.threads, max_num_seqs=opts.max_num_seqs,
                                    max_model_len=opts.max_model_len, dtype=opts.dtype,
                                    log_path=model.workdir / f"{name}.log",
                                    env={"VLLM_CPU_KVCACHE_SPACE": str(opts.kv_cache_gib)} if name == "vllm" else None)
        self.info = {k: v for k, v in self.driver.info.items() if k != "ready"} | {"weights": str(path)}
        if PEERS[name].weights != "hf":
            self.info["weight_bytes"] = pathlib.Path(path).stat().st_size  # the GGUF: its tensors, ~all of it

    def run(self, requests: list[BenchRequest], workload_path) -> dict:
        return self.driver.run(workload_path)

    def close(self) -> None:
        self.driver.close()


def make_backend(name: str, model: BenchModel, opts: BenchOptions):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if opts.speculative is not None and name != "jaxserve":
        raise ValueError("--speculative-config is for the jaxserve backend")
    if name == "jaxserve":
        return JaxserveBackend(model, opts)
    if name == "hf":
        return HFBackend(model, opts)
    return PeerBackend(name, model, opts)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"
