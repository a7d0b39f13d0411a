"""Property test: random allocate / append / fork / truncate / free / abort sequences.

After every operation the accounting invariants hold, and every live sequence reads back
exactly its own tokens through its block table from a fake pool that applies the manager's
COW copies: a missed copy, a bad prefix hit or a freed-but-used block shows up as a wrong
token. At the end, freeing everything returns the whole pool.
"""
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from host_fakes import FakeDevice
from jaxserve.cache.block_manager import BlockManager, NoFreeBlocksError

tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=12)  # few symbols: many hits


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(2, 14), block_size=st.sampled_from([1, 2, 4]),
                caching=st.booleans(), collide=st.booleans())
    def setup(self, num_blocks, block_size, caching, collide):
        kw = {"hash_fn": (lambda parent, toks: len(toks))} if collide else {}
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching, **kw)
        self.dev = FakeDevice(num_blocks, block_size)
        self.seqs: dict[int, list[int]] = {}  # seq id -> tokens written so far
        self.next_id = 0

    def _write(self, sid, new_tokens):
        """Reserves slots for ``new_tokens``; on success writes them like a device step."""
        toks = self.seqs[sid]
        start = self.bm.num_slots(sid)
        if not self.bm.can_append_slots(sid, len(new_tokens)):
            before = (self.bm.get_block_table(sid), self.bm.stats())
            with pytest.raises(NoFreeBlocksError):  # can_append_slots said no: append must refuse
                self.bm.append_slots(sid, len(new_tokens))
            assert (self.bm.get_block_table(sid), self.bm.stats()) == before
            return False
        self.dev.copy(self.bm.append_slots(sid, len(new_tokens)))
        for i, t in enumerate(new_tokens):
            self.dev.pool[self.bm.slot(sid, start + i)] = t
        toks[start:] = new_tokens
        self.bm.cache_blocks(sid, toks, len(toks))
        return True

    def _pick(self, data):
        return data.draw(st.sampled_from(sorted(self.seqs)))

    @rule(tokens=tokens_st)
    def new_sequence(self, tokens):
        sid, self.next_id = self.next_id, self.next_id + 1
        fits = self.bm.can_allocate(tokens)
        cached = self.bm.allocate(sid, tokens)
        assert cached % self.bm.block_size == 0 and cached < len(tokens)
        self.seqs[sid] = tokens[:cached]
        written = self._write(sid, tokens[cached:])
        assert written == fits
        if not written:
            self.bm.free(sid)
            del self.seqs[sid]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), tokens=tokens_st)
    def append(self, data, tokens):
        self._write(self._pick(data), tokens[:3])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = self._pick(data)
        child, self.next_id = self.next_id, self.next_id + 1
        self.bm.fork(parent, child)
        self.seqs[child] = list(self.seqs[parent])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), frac=st.floats(0, 1))
    def truncate(self, data, frac):
        sid = self._pick(data)
        n = int(len(self.seqs[sid]) * frac)
        self.bm.truncate(sid, n)
        del self.seqs[sid][n:]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        sid = self._pick(data)
        self.bm.free(sid)
        del self.seqs[sid]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), n=st.integers(1, 6))
    def abort_mid_step(self, data, n):
        """Slots reserved for a step that never ran, then the sequence is aborted."""
        sid = self._pick(data)
        if self.bm.can_append_slots(sid, n):
            self.bm.append_slots(sid, n)
            self.bm.check_invariants()
        self.bm.free(sid)
        del self.seqs[sid]

    @invariant()
    def accounting_and_contents(self):
        if not hasattr(self, "bm"):
            return
        self.bm.check_invariants()
        for sid, toks in self.seqs.items():
            assert self.bm.num_slots(sid) == len(toks)
            assert self.dev.read(self.bm.get_block_table(sid), len(toks)) == toks, f"seq {sid}"

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for sid in list(self.seqs):
            self.bm.free(sid)
        self.bm.check_invariants()
        assert self.bm.num_free == self.bm.num_blocks and self.bm.num_used == 0


BlockManagerMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow], derandomize=True)
TestBlockManagerMachine = BlockManagerMachine.TestCase
