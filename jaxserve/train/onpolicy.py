"""On-policy distillation data for a speculative-decoding draft (DistillSpec, Zhou et al. 2024).

A draft's tokens are accepted where it agrees with the target on the target's *own* continuations,
so a draft distilled on corpus text learns the wrong distribution of contexts. This writes training
windows i32[W, seq_len + 1] that start with a prompt cut from the corpus's training split and go on
with the teacher's continuation (a share greedy, the rest sampled at temperature 1; EOS ignored, as
the speculative benchmarks ignore it), for ``data.train_windows`` of ``python -m jaxserve.train``.

    python -m jaxserve.train.onpolicy teacher=jaxserve/tiny-code out=runs/onpolicy/tiny-code.npy

Generation is ``target_only_generate`` (one jitted while-loop per batch), seeded per window.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys

import numpy as np
from tqdm import tqdm

from jaxserve.config import apply_overrides


@dataclasses.dataclass(frozen=True)
class OnPolicyConfig:
    teacher: str = "jaxserve/tiny-code"  # zoo name, checkpoint or HF directory
    out: str = "runs/onpolicy/tiny-code.npy"
    num_windows: int = 8192
    prompt_len: int = 64  # tokens of corpus text at the start of each window
    seq_len: int = 256  # windows hold seq_len + 1 tokens, as the corpus windows do
    greedy_fraction: float = 0.5  # windows continued greedily; the rest sample at temperature 1
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.prompt_len < self.seq_len + 1:
            raise ValueError(f"prompt_len must lie in [1, seq_len], got {self.prompt_len} (seq_len {self.seq_len})")
        if self.num_windows < 1 or self.batch_size < 1:
            raise ValueError(f"num_windows and batch_size must be >= 1, got {self.num_windows}, {self.batch_size}")
        if not 0 <= self.greedy_fraction <= 1:
            raise ValueError(f"greedy_fraction must lie in [0, 1], got {self.greedy_fraction}")


def sample_prompts(stream: np.ndarray, num: int, prompt_len: int, seed: int) -> np.ndarray:
    """``num`` prompts i32[num, prompt_len] cut at random offsets of a token stream."""
    if len(stream) <= prompt_len:
        raise ValueError(f"token stream of {len(stream)} tokens is too short for prompts of {prompt_len}")
    starts = np.random.default_rng(seed).integers(0, len(stream) - prompt_len, num)
    return stream[starts[:, None] + np.arange(prompt_len)[None, :]].astype(np.int32)


def generate_windows(params: dict, config, prompts: np.ndarray, seq_len: int, greedy_fraction: float,
                     batch_size: int, seed: int, progress: bool = True) -> np.ndarray:
    """Windows i32[W, seq_len + 1]: each prompt followed by the teacher's continuation.

    Window ``i`` is greedy if ``i < greedy_fraction * W``, else sampled at temperature 1 with seed
    ``seed + i`` (so the file is a pure function of its inputs)."""
    from jaxserve.speculative.generate import target_only_generate

    num, prompt_len = prompts.shape
    new = seq_len + 1 - prompt_len
    temperature = np.where(np.arange(num) < round(greedy_fraction * num), 0.0, 1.0).astype(np.float32)
    out = np.zeros((num, seq_len + 1), np.int32)
    out[:, :prompt_len] = prompts
    for lo in tqdm(range(0, num, batch_size), disable=not progress, file=sys.stderr, desc="on-policy windows"):
        hi = min(lo + batch_size, num)
        tokens, count, _ = target_only_generate(params, config, prompts[lo:hi], prompt_len, max_tokens=new,
                                                temperature=temperature[lo:hi], seeds=seed + np.arange(lo, hi))
        assert int(np.min(count)) == new, "EOS is ignored, so every row generates max_tokens"
        out[lo:hi, prompt_len:] = np.asarray(tokens)
    return out


def main(argv: list[str]) -> None:
    from jaxserve.models.loading import resolve_model
    from jaxserve.train.data import encode_split

    cfg = apply_overrides(OnPolicyConfig(), argv)
    config, params, tokenizer = resolve_model(cfg.teacher)
    if tokenizer is None:
        raise ValueError(f"teacher {cfg.teacher!r} has no tokenizer to encode the corpus with")
    prompts = sample_prompts(encode_split(tokenizer, None, "train"), cfg.num_windows, cfg.prompt_len, cfg.seed)
    windows = generate_windows(params, config, prompts, cfg.seq_len, cfg.greedy_fraction, cfg.batch_size, cfg.seed)
    out = pathlib.Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, windows)
    print(f"wrote {out}: {windows.shape[0]} windows of {windows.shape[1]} tokens from {cfg.teacher}")


if __name__ == "__main__":
    main(sys.argv[1:])
