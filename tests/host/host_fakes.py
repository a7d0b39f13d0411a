"""Fakes for host tests: a "KV pool" that stores token ids, and a model that reads it.

``FakeDevice`` plays the runner: it applies COW copies (gather then scatter, like
``cache.kv_pool.copy_blocks``), writes each scheduled token into its slot, then "attends" by
reading the whole context back through the block table. The next token is a hash of what it
read, so any wrong block table, missed copy or bad prefix hit changes the outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxserve.cache.block_manager import BlockManager
from jaxserve.engine.scheduler import Scheduler


@dataclass(frozen=True)
class Params:
    max_tokens: int = 8
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


def next_token(context: list[int], sample: int, vocab: int) -> int:
    h = 1469598103934665603 + 7919 * sample
    for t in context:
        h = ((h ^ (t + 1)) * 1099511628211) % (1 << 61)
    return int(h % vocab)


class FakeDevice:
    def __init__(self, num_blocks: int, block_size: int, vocab: int = 50):
        self.pool = np.full(num_blocks * block_size, -1, np.int64)  # i64[P*S]: token per slot
        self.block_size = block_size
        self.vocab = vocab

    def copy(self, copies):
        if copies:
            bs = self.block_size
            pages = self.pool.reshape(-1, bs)
            src, dst = map(list, zip(*copies))
            pages[dst] = pages[src]  # numpy reads the right side first: gather, then scatter

    def read(self, block_table: list[int], length: int) -> list[int]:
        bs = self.block_size
        return [int(self.pool[block_table[p // bs] * bs + p % bs]) for p in range(length)]

    def step(self, out) -> dict:
        self.copy(out.copies)
        for e in out.scheduled:
            self.pool[e.slot_mapping] = e.token_ids
        sampled = {}
        for e in out.scheduled:
            if e.num_lookahead:  # a multi-step decode: each drawn token is the next step's input
                sampled[e.seq_id] = self._steps(e)
            elif e.sample:
                ctx = self.read(e.block_table, e.context_len)
                toks = [next_token(ctx, j, self.vocab) for j in range(e.num_samples)]
                sampled[e.seq_id] = toks if e.num_samples > 1 else toks[0]
        return sampled

    def _steps(self, e) -> list[int]:
        """1 + num_lookahead decode steps of one sequence, its later tokens written to the slots its table holds."""
        bs, toks = self.block_size, []
        for k in range(1 + e.num_lookahead):
            if k:
                pos = e.context_len - 1 + k
                self.pool[e.block_table[pos // bs] * bs + pos % bs] = toks[-1]
            toks.append(next_token(self.read(e.block_table, e.context_len + k), 0, self.vocab))
        return toks


def make_scheduler(num_blocks, block_size=4, *, max_num_seqs=8, max_num_batched_tokens=32,
                   max_model_len=64, eos_token_id=0, prefix_caching=True, **kw):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     max_model_len=max_model_len, eos_token_id=eos_token_id, **kw)


def run_to_completion(sched: Scheduler, requests, vocab: int = 50, max_steps: int = 10_000,
                      on_step=None, device: FakeDevice | None = None):
    """Adds ``requests`` ((id, prompt, params)) and steps until done; returns outputs by id.

    Pass the previous run's ``device`` to keep its pool (and so the prefix cache's contents).

    Outputs are ``[(index, token_ids, finish_reason), ...]`` per request, sorted by index.
    """
    device = device or FakeDevice(sched.bm.num_blocks, sched.bm.block_size, vocab)
    for rid, prompt, params in requests:
        sched.add_request(rid, prompt, params)
    outputs = {}
    for _ in range(max_steps):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        assert out.scheduled, "scheduler stalled with unfinished requests"
        res = sched.update(out, device.step(out))
        sched.bm.check_invariants()
        if on_step:
            on_step(out, res)
        for req in res.finished:
            outputs[req.request_id] = sorted((s.index, list(s.output_token_ids), s.finish_reason)
                                             for s in req.seqs)
    assert not sched.has_unfinished(), "did not finish within max_steps"
    return outputs
