"""vLLM (``vllm-cpu`` 0.32.0) as a benchmark peer: ``vllm.LLM.generate`` on token-id prompts.

Runs in the venv ``setup_vllm.sh`` makes; the protocol is ``peer_protocol.py``'s. The tuned CPU setting
of issue 28: ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``VLLM_CPU_OMP_THREADS_BIND`` over the first
``--threads`` cores, tcmalloc and the wheel's ``libiomp5`` preloaded (the driver re-executes itself
with ``LD_PRELOAD`` set, since a preload must be in place before the process starts), and the engine
core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so an idle driver costs no CPU.
The ``vllm`` CLI fails on the ``vllm-cpu`` package name, so the Python API is driven directly.
"""
from __future__ import annotations

import glob
import os
import sys
import sysconfig

import peer_protocol


def _preloads() -> list[str]:
    site = sysconfig.get_paths()["purelib"]  # the wheel puts libiomp5 in the venv's lib/
    found = (sorted(glob.glob(f"{sys.prefix}/lib/libiomp5.so")) + sorted(glob.glob(f"{site}/**/libiomp5.so",
                                                                                 recursive=True)))[:1]
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        tc = sorted(glob.glob(f"{d}/libtcmalloc_minimal.so*"))
        if tc:
            return tc[:1] + found
    return found


def _reexec_tuned(threads: int) -> None:
    if os.environ.get("JAXSERVE_PEER_TUNED") == "1":
        return
    env = dict(os.environ, JAXSERVE_PEER_TUNED="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}", OMP_NUM_THREADS=str(threads),
               VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    preload = [p for p in [*_preloads(), env.get("LD_PRELOAD", "")] if p]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def load(args):
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, seed=0)

    def run(requests):
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in requests]
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
                  for _, n in requests]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    info = {"version": vllm.__version__, "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"), "prefix_cache_reset_each_run": True}

    def prepare():  # each run from a cold prefix cache, as jaxserve's (the workload's prompts repeat every run)
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache")

    return info, run, prepare


if __name__ == "__main__":
    _reexec_tuned(peer_protocol.parse_args().threads)
    raise SystemExit(peer_protocol.serve(load))
