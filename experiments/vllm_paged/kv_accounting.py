"""Where the KV memory goes at one moment (host, no JAX): the vLLM paper's Figure 2 categories.

Every KV slot of the memory the scheduler may use falls in exactly one category:

- ``token_states``: holds the K/V of a token of a running sequence (a slot shared by several
  sequences counts once);
- ``reserved``: reserved for tokens the request has still to produce (contiguous policies only);
- ``internal``: allocated or reserved but never to be filled: the unfilled tail of a sequence's
  last block (paged), the over-reservation past the request's real length (Orca);
- ``external``: free, but outside the largest free contiguous range, so no request larger than
  that range can use it (contiguous policies only; any free block serves a paged sequence);
- ``free``: the rest (paged: free blocks; contiguous: the largest free range).

Read it between steps (after ``update``), when every running sequence's slots are computed.
``block_sharing`` counts blocks with and without sharing (parallel samples, beams, prefixes).
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxserve.cache.reservation import ContiguousReservations


@dataclass(frozen=True)
class KVBreakdown:
    capacity: int  # KV slots of the memory under management
    token_states: int
    reserved: int
    internal: int
    external: int
    free: int

    def __post_init__(self):
        parts = self.token_states + self.reserved + self.internal + self.external + self.free
        if parts != self.capacity or min(self.token_states, self.reserved, self.internal, self.external,
                                         self.free) < 0:
            raise ValueError(f"KV categories do not partition the capacity: {self}")

    def fractions(self) -> dict[str, float]:
        names = ("token_states", "reserved", "internal", "external", "free")
        return {k: getattr(self, k) / self.capacity for k in names}


def kv_breakdown(scheduler) -> KVBreakdown:
    """The breakdown of ``scheduler``'s KV memory now (a ``jaxserve.engine.scheduler.Scheduler``)."""
    if isinstance(scheduler.admission, ContiguousReservations):
        return _contiguous(scheduler)
    return _paged(scheduler)


def _paged(sched) -> KVBreakdown:
    bm, bs = sched.bm, sched.bm.block_size
    filled: dict[int, int] = {}  # physical block -> slots holding tokens (max over its sharers)
    for seq in sched.running:
        computed = seq.num_computed_tokens
        for i, b in enumerate(bm.get_block_table(seq.seq_id)):
            filled[b] = max(filled.get(b, 0), min(bs, computed - i * bs))
    tokens = sum(filled.values())
    allocated = bm.num_used * bs
    return KVBreakdown(bm.num_blocks * bs, tokens, 0, allocated - tokens, 0, bm.num_free * bs)


def _contiguous(sched) -> KVBreakdown:
    res = sched.admission
    tokens = reserved = internal = 0
    for request_id, r in res.held.items():
        req = sched.requests.get(request_id)
        stored = sum(s.num_computed_tokens for s in req.seqs if not s.is_finished) if req else 0
        tokens += stored
        reserved += max(r.needed - stored, 0)
        internal += r.slots - max(r.needed, stored)
    largest = res.space.largest_hole()
    return KVBreakdown(res.space.capacity, tokens, reserved, internal, res.space.free - largest, largest)


def block_sharing(scheduler) -> tuple[int, int]:
    """(physical blocks in use, blocks the running sequences would hold with no sharing)."""
    bm = scheduler.bm
    return bm.num_used, sum(len(bm.get_block_table(s.seq_id)) for s in scheduler.running)
