"""llama.cpp as a benchmark peer: batched greedy decode through llama-cpp-python's low-level API.

Runs in the venv ``setup_llamacpp.sh`` makes, ``libllama`` found through ``LLAMA_CPP_LIB_PATH``; the
protocol is ``peer_protocol.py``'s. The loop is continuous batching as a llama.cpp server does it: one
sequence id per slot (``--max-num-seqs`` slots, one unified KV cache), each ``llama_decode`` carries one
token for every running sequence plus whole prompts of waiting requests while the token budget
(``n_batch``) allows; logits are requested only where a token is sampled, greedy by argmax over the
rows ``llama_get_logits`` returns, and a sequence that reaches its ``output_len`` leaves the batch at
once (``llama_memory_seq_rm``) and frees its slot for the next request.
"""
from __future__ import annotations

import collections
import os

import numpy as np

import peer_protocol

N_BATCH = 2048  # tokens per llama_decode: llama.cpp's default logical batch


def load(args):
    import llama_cpp as L
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    # JAXSERVE_LLAMACPP_EXTRA_BUFTS=0: no repacked (AMX, CPU_REPACK) weight buffers; the vendored 0.3.36 build
    # segfaults in its AMX Q4_0 path on a Sapphire-Rapids-class Xeon (2026-12-04)
    mparams.use_extra_bufts = os.environ.get("JAXSERVE_LLAMACPP_EXTRA_BUFTS", "1") != "0"
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {args.model}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    slots = args.max_num_seqs
    cparams = L.llama_context_default_params()
    cparams.n_ctx = slots * args.max_model_len
    cparams.n_batch = cparams.n_ubatch = N_BATCH
    cparams.n_seq_max = slots
    cparams.kv_unified = True
    cparams.n_threads = cparams.n_threads_batch = args.threads
    cparams.no_perf = True
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(N_BATCH, 0, 1)

    def decode(entries):
        """entries: (token, pos, seq, wants_logits); returns the logits rows of the wanted entries."""
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, want
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(entries)
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        n_out = sum(1 for e in entries if e[3])
        return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n_out, n_vocab))

    def run(requests):
        L.llama_memory_clear(mem, True)
        waiting = collections.deque(range(len(requests)))
        free = list(range(slots))[::-1]
        running: dict[int, int] = {}  # seq id -> request index
        outputs: list[list[int]] = [[] for _ in requests]
        while waiting or running:
            entries, owners = [], []  # owners: the request of each logits row, in order
            for seq, r in running.items():
                ids, out = requests[r][0], outputs[r]
                entries.append((out[-1], len(ids) + len(out) - 1, seq, True))
                owners.append(r)
            while waiting and free and len(entries) + len(requests[waiting[0]][0]) <= N_BATCH:
                r, seq = waiting.popleft(), free.pop()
                ids = requests[r][0]
                entries += [(t, p, seq, p == len(ids) - 1) for p, t in enumerate(ids)]
                running[seq] = r
                owners.append(r)
            if not entries:
                raise RuntimeError(f"a prompt of {len(requests[waiting[0]][0])} tokens exceeds n_batch {N_BATCH}")
            for r, tok in zip(owners, decode(entries).argmax(axis=1).tolist()):
                outputs[r].append(tok)
            for seq in [s for s, r in running.items() if len(outputs[r]) == requests[r][1]]:
                L.llama_memory_seq_rm(mem, seq, -1, -1)
                del running[seq]
                free.append(seq)
        return outputs

    info = {"version": L.__version__, "system_info": L.llama_print_system_info().decode().strip(),
            "n_ctx": cparams.n_ctx, "n_seq_max": slots, "n_threads": args.threads}
    return info, run


if __name__ == "__main__":
    raise SystemExit(peer_protocol.serve(load))
