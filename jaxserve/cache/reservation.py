"""Contiguous KV reservation (host, no JAX): the Orca-style baselines of the vLLM paper.

Before PagedAttention, a serving system stored each request's KV cache in one contiguous
chunk reserved when the request was admitted, sized by a guess at its final length
(Kwon et al., SOSP 2023, §3 and §6.1):

- ``orca_max``: ``max_model_len`` slots, the most any request can need;
- ``orca_pow2``: the next power of two of the slots the request really needs (at most
  ``max_model_len``), i.e. an over-reservation of up to 2x;
- ``orca_oracle``: exactly the slots it really needs (an oracle knows the output length).

A request with ``L`` final tokens needs ``L - 1`` KV slots (its last token is sampled, never
run); with ``n`` samples and no sharing it needs ``n`` times that. The jaxserve engine still
stores K/V in its paged pool; ``ContiguousReservations`` only decides admission: a request
is admitted when its reservation fits in a free contiguous range of a simulated address
space of ``capacity`` token slots, placed first-fit. Freed ranges leave holes, so external
fragmentation is real: memory can be free in total yet too scattered for the next request.

``paged`` (vLLM) reserves nothing: blocks are taken on demand, so it has no entry here.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Hashable

CONTIGUOUS_POLICIES = ("orca_max", "orca_pow2", "orca_oracle")  # EngineConfig.kv_allocation besides "paged"


def reservation_slots(policy: str, needed_slots: int, max_model_len: int) -> int:
    """KV slots a contiguous ``policy`` reserves for a sequence that will store ``needed_slots``."""
    if needed_slots < 1:
        raise ValueError(f"needed_slots must be >= 1, got {needed_slots}")
    if policy == "orca_max":
        return max(max_model_len, needed_slots)
    if policy == "orca_pow2":
        return max(min(1 << (needed_slots - 1).bit_length(), max_model_len), needed_slots)
    if policy == "orca_oracle":
        return needed_slots
    raise ValueError(f"unknown contiguous KV policy {policy!r}; choose one of {CONTIGUOUS_POLICIES}")


class FirstFitAllocator:
    """A contiguous address space ``[0, capacity)`` handed out first-fit in variable-size ranges."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ranges: dict[Hashable, tuple[int, int]] = {}  # key -> (start, size)
        self._starts: list[int] = []  # sorted starts of the live ranges
        self._sizes: dict[int, int] = {}  # start -> size

    @property
    def reserved(self) -> int:
        return sum(self._sizes.values())

    @property
    def free(self) -> int:
        return self.capacity - self.reserved

    def holes(self) -> list[tuple[int, int]]:
        """Free ranges as ``(start, size)``, in address order."""
        out, pos = [], 0
        for s in self._starts:
            if s > pos:
                out.append((pos, s - pos))
            pos = s + self._sizes[s]
        if pos < self.capacity:
            out.append((pos, self.capacity - pos))
        return out

    def largest_hole(self) -> int:
        return max((size for _, size in self.holes()), default=0)

    def range_of(self, key: Hashable) -> tuple[int, int]:
        return self._ranges[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._ranges

    def allocate(self, key: Hashable, size: int) -> int | None:
        """Start of a new range of ``size`` for ``key`` at the lowest fitting address, or None."""
        if key in self._ranges:
            raise ValueError(f"{key!r} already holds a range")
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        start = next((s for s, free in self.holes() if free >= size), None)
        if start is None:
            return None
        bisect.insort(self._starts, start)
        self._sizes[start] = size
        self._ranges[key] = (start, size)
        return start

    def release(self, key: Hashable) -> None:
        start, _ = self._ranges.pop(key)
        self._starts.remove(start)
        del self._sizes[start]

    def check_invariants(self) -> None:
        """Asserts ranges are in bounds, disjoint, and agree with the free count."""
        assert self._starts == sorted(self._sizes) == sorted(s for s, _ in self._ranges.values())
        end = 0
        for s in self._starts:
            assert s >= end, f"range at {s} overlaps the previous one (ends at {end})"
            end = s + self._sizes[s]
        assert end <= self.capacity, f"range ends at {end} > capacity {self.capacity}"
        assert sum(size for _, size in self.holes()) == self.free


@dataclass(frozen=True)
class Reservation:
    slots: int  # reserved (contiguous) KV slots
    needed: int  # slots the request will really fill, n samples together


class ContiguousReservations:
    """Per-request contiguous reservations under one of ``CONTIGUOUS_POLICIES``.

    An ``Admission`` policy of the scheduler: ``check`` rejects requests that could never fit,
    ``try_admit`` reserves on admission and ``release`` frees the reservation when the request ends.
    """

    def __init__(self, policy: str, capacity: int, max_model_len: int):
        reservation_slots(policy, 1, max_model_len)  # validates the policy name
        self.policy = policy
        self.max_model_len = max_model_len
        self.space = FirstFitAllocator(capacity)
        self.held: dict[str, Reservation] = {}

    def size(self, final_len: int, n: int = 1) -> Reservation:
        """What a request of ``final_len`` tokens per sample (``n`` samples) reserves and fills."""
        needed = max(final_len - 1, 1)
        return Reservation(n * reservation_slots(self.policy, needed, self.max_model_len), n * needed)

    def check(self, who: str, final_len: int, n: int = 1) -> None:
        slots = self.size(final_len, n).slots
        if slots > self.space.capacity:
            raise ValueError(f"{who}: {self.policy} reserves {slots} KV slots, more than the "
                             f"{self.space.capacity} there are")

    def try_admit(self, request_id: str, final_len: int, n: int = 1) -> bool:
        """Reserves for the request (once; True if it already holds one); False if nothing fits."""
        if request_id in self.held:
            return True
        r = self.size(final_len, n)
        if self.space.allocate(request_id, r.slots) is None:
            return False
        self.held[request_id] = r
        return True

    def release(self, request_id: str) -> None:
        if self.held.pop(request_id, None) is not None:
            self.space.release(request_id)
