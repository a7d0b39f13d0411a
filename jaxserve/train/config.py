"""Configuration of a training run, and its command-line parsing.

``python -m jaxserve.train model=tiny-code train.steps=2000 data.seq_len=256`` : ``model=<preset>``
picks a preset from ``jaxserve.models.PRESETS``; every other ``a.b=value`` is a dotted override
of ``TrainRunConfig`` (unknown keys raise ``ValueError``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxserve.config import ModelConfig, apply_overrides
from jaxserve.models import get_preset


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 16  # sequences per optimizer step, over all devices and micro-batches
    grad_accum: int = 1  # micro-batches per step; batch_size must be a multiple
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at `steps`
    warmup_steps: int = 100
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0  # params init and data order
    eval_every: int = 200
    eval_windows: int = 64  # validation windows per evaluation (0: all)
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    out_dir: str = "runs/train"
    balancing: str = "loss_free"  # MoE models only: "loss_free" (selection-bias updates) or "none"
    bias_rate: float = 1e-3  # loss-free balancing: bias += bias_rate * sign(mean load - load) per step
    init_from: str = ""  # jaxserve checkpoint whose params start a fresh run (same architecture); "": random init
    distill_from: str = ""  # teacher checkpoint (same vocabulary): train on its soft next-token distribution
    distill_weight: float = 1.0  # loss = w * KL(teacher || model) + (1 - w) * cross-entropy on the data
    # a draft's loss (jaxserve.train.loss_focus): "answers" counts only the assistant turns of chat windows
    # (data.train_windows from scripts/onpolicy_chat.py); head_vocab_size N > 0 puts the softmax over the N
    # most frequent counted targets only, and exports their counts for SpeculativeConfig.draft_vocab_size
    loss_on: str = "all"
    head_vocab_size: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "eval_every", "checkpoint_every", "keep_checkpoints",
                     "log_every"):
            _require(getattr(self, name) > 0, f"TrainConfig.{name} must be > 0, got {getattr(self, name)}")
        _require(self.batch_size % self.grad_accum == 0,
                 f"TrainConfig.batch_size={self.batch_size} must be a multiple of grad_accum={self.grad_accum}")
        _require(self.lr > 0 and 0 <= self.min_lr_ratio <= 1, f"bad learning rate {self.lr} / {self.min_lr_ratio}")
        _require(self.balancing in ("loss_free", "none"),
                 f"TrainConfig.balancing must be 'loss_free' or 'none', got {self.balancing!r}")
        _require(0 <= self.distill_weight <= 1, f"TrainConfig.distill_weight must be in [0, 1], got {self.distill_weight}")
        _require(self.warmup_steps >= 0, f"TrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        _require(self.loss_on in ("all", "answers"),
                 f"TrainConfig.loss_on must be 'all' or 'answers', got {self.loss_on!r}")
        _require(isinstance(self.head_vocab_size, int) and self.head_vocab_size >= 0,
                 f"TrainConfig.head_vocab_size must be an int >= 0, got {self.head_vocab_size!r}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    corpus: str = ""  # .jsonl.xz snapshot; "" is the committed data/pycode-v1.jsonl.xz
    tokenizer: str = ""  # tokenizer.json to use; "" trains one on the corpus (saved in out_dir)
    seq_len: int = 256  # tokens per training window (the model sees seq_len, predicts seq_len)
    max_train_tokens: int = 0  # 0: the whole training split (tests use a few hundred)
    max_val_tokens: int = 0  # 0: the whole validation split
    # .npy of windows i32[W, seq_len + 1] to train on instead of the corpus's training split (e.g. the
    # teacher's own continuations from ``python -m jaxserve.train.onpolicy``; several files: joined by commas);
    # validation stays the corpus's
    train_windows: str = ""

    def __post_init__(self):
        _require(self.seq_len > 0, f"DataConfig.seq_len must be > 0, got {self.seq_len}")
        _require(self.max_train_tokens >= 0 and self.max_val_tokens >= 0, "max_*_tokens must be >= 0")


@dataclasses.dataclass(frozen=True)
class TrainRunConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)

    def __post_init__(self):
        _require(self.data.seq_len <= self.model.max_position_embeddings,
                 f"data.seq_len={self.data.seq_len} exceeds model.max_position_embeddings="
                 f"{self.model.max_position_embeddings}")


def parse_run_config(args: Sequence[str], base: TrainRunConfig | None = None) -> TrainRunConfig:
    """``["model=tiny-code", "train.steps=10", ...]`` -> ``TrainRunConfig``; bad input raises ValueError."""
    base = base or TrainRunConfig()
    rest = []
    for item in args:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"argument {item!r} is not of the form key=value")
        if key == "model":
            base = dataclasses.replace(base, model=get_preset(value))
        else:
            rest.append(item)
    return apply_overrides(base, rest)
