"""Configuration of Medusa-1 head training on the frozen zoo target (override with key=value arguments)."""
import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class MedusaHeadsConfig:
    # "jaxserve/<zoo name>", a checkpoint or HF directory, or "preset:<name>" (random weights and
    # random token windows: smoke only)
    target: str = "jaxserve/tiny-code"
    num_heads: int = 4                # K: head k predicts token t+1+k
    num_layers: int = 1               # residual blocks per head (Medusa-1: 1)
    seq_len: int = 64                 # positions per window (each window holds seq_len + K + 1 tokens)
    batch_size: int = 8               # windows per step
    steps: int = 600                  # max_minutes stops it earlier on a loaded machine (RESULTS.md says where)
    max_minutes: float = 10.0         # stop early (and say so) if the wall clock runs past this
    learning_rate: float = 1e-3
    warmup: int = 30
    decay: float = 0.8                # loss weight of head k is decay**k (Medusa-1)
    # "target": the target's own argmax for token t+1+k given the true prefix (self-distillation, what
    # greedy verification accepts); "corpus": the corpus token t+1+k (Medusa-1 on its data)
    labels: str = "target"
    eval_windows: int = 64            # val-split windows for the per-head accuracy table
    eval_every: int = 100
    seed: int = 0
    # where the trained heads go (relative to the repo; runs/ is git-ignored); null: <out_dir>/heads
    heads_dir: Optional[str] = "runs/medusa_heads/tiny-code"


CONFIG = MedusaHeadsConfig()
SMOKE = ("target=preset:tiny-llama", "num_heads=2", "seq_len=16", "batch_size=2", "steps=3", "warmup=1",
         "eval_windows=2", "eval_every=2", "heads_dir=null")
