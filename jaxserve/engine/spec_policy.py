"""When the speculative engine speculates: the per-step rule (host, no JAX).

A step's decoding sequences either get γ lookahead slots (one speculative round each) or run as a plain
decode (one token each; the runner still keeps the proposer's state in step, so a later round is exact).
Either way the output is the target's; only the time differs. Speculation trades target passes for a
bigger one: a round verifies γ + 1 positions per row and emits L tokens per row on average (L = 1 +
accepted drafts), a plain step 1. It pays when L exceeds the round's cost relative to a plain step, a ratio
that grows with the batch (at batch 1 the step reads the weights, ~free extra positions; at batch 16 the
verify's 16 x (γ + 1) rows are compute) and with the proposer's own cost.

Two rules, both off by default (as vLLM's):

- ``disable_by_batch_size = N``: while N or more sequences are running (decoding or still prefilling: vLLM's
  running-queue size, as its ``speculative_disable_by_batch_size`` counts), steps run without speculation:
  a decode beside running prefill chunks shares their step, so the chunks count. Sequences still waiting for
  admission do not. Deterministic, but N is a guess about one machine (on SmolLM2 at batch 16 the rounds
  that remain are the tail's, once fewer than N sequences are left: results/spec_decoding).
- ``adaptive``: per batch bucket (powers of two of the decoding sequences), the seconds of a round step and
  of a plain decode step, measured on this engine (the lower median of each one's last ``window`` times: a
  step that compiled a program or was descheduled on a shared machine is an outlier, not a trend), and a
  moving average of L over all rounds; a step speculates iff ``L * t_plain(b) > t_round(b)``, i.e. iff rounds
  give more tokens per second. An arm not yet timed at a bucket is tried first (its first time is dropped: it
  compiled), and every ``probe_every`` steps of a bucket the rule runs the other arm once, so a changed α or
  load is seen.

The adaptive rule reads the wall clock, so which steps speculate varies from run to run: greedy outputs do
not change (exactness), seeded sampled ones may (same distribution), and several processes running one
scheduler in lock step (``jax.distributed``) would diverge; that is why it is an option, not the default.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


def batch_bucket(num_decodes: int) -> int:
    """The power of two >= ``num_decodes`` (the timings' key)."""
    return 1 << max(num_decodes - 1, 0).bit_length()


@dataclass
class _Timing:
    """One arm's latest step times at one bucket; ``seen`` counts samples (the first is dropped)."""
    window: int
    seen: int = 0
    recent: deque = None

    def __post_init__(self):
        self.recent = deque(maxlen=self.window)

    @property
    def seconds(self) -> float | None:
        return statistics.median_low(self.recent) if self.recent else None


@dataclass
class SpeculationPolicy:
    gamma: int
    disable_by_batch_size: int | None = None
    adaptive: bool = False
    probe_every: int = 16  # adaptive: run the arm not chosen once every this many steps of a bucket
    window: int = 9  # step times per (arm, bucket) whose lower median is the arm's time
    smoothing: float = 0.2  # weight of a new round's L in its moving average
    tokens_per_round: float | None = None  # moving average of L = 1 + accepted per round row
    _times: dict = field(default_factory=dict)  # (speculated, bucket) -> _Timing
    _steps: dict = field(default_factory=dict)  # bucket -> decisions made there
    counts: dict = field(default_factory=lambda: {"speculative_steps": 0, "plain_steps": 0})

    @property
    def may_disable(self) -> bool:
        return self.adaptive or self.disable_by_batch_size is not None

    def speculate(self, num_decodes: int, num_running: int | None = None) -> bool:
        """Whether a step with ``num_decodes`` decoding sequences gives them lookahead slots (counted);
        ``num_running`` (default ``num_decodes``) counts every running sequence, prefilling ones too."""
        choice = self._choose(num_decodes, num_decodes if num_running is None else num_running)
        self.counts["speculative_steps" if choice else "plain_steps"] += 1
        return choice

    def _choose(self, num_decodes: int, num_running: int) -> bool:
        if self.disable_by_batch_size is not None and num_running >= self.disable_by_batch_size:
            return False
        if not self.adaptive:
            return True
        b = batch_bucket(num_decodes)
        step = self._steps[b] = self._steps.get(b, 0) + 1
        t_round, t_plain = self.seconds(True, b), self.seconds(False, b)
        if t_round is None or self.tokens_per_round is None:
            return True
        if t_plain is None:
            return False
        best = self.tokens_per_round * t_plain > t_round
        return (not best) if step % self.probe_every == 0 else best

    def seconds(self, speculated: bool, bucket: int) -> float | None:
        t = self._times.get((speculated, bucket))
        return None if t is None else t.seconds

    def record(self, speculated: bool, num_decodes: int, seconds: float, tokens_per_row: float | None = None) -> None:
        """A decode-only step's wall-clock ``seconds``; a round's mean tokens emitted per row (1 + accepted)."""
        if speculated and tokens_per_row is not None:
            self.tokens_per_round = self._average(self.tokens_per_round, tokens_per_row)
        t = self._times.setdefault((speculated, batch_bucket(num_decodes)), _Timing(self.window))
        t.seen += 1
        if t.seen > 1:  # the first compiled its program
            t.recent.append(seconds)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new
