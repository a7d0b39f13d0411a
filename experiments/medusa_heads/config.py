"""Configuration of Medusa-1 head training on a frozen target (override with key=value arguments).

SmolLM2-135M-Instruct (on-policy: the target's own chat answers, written by scripts/onpolicy_chat.py):

    python scripts/onpolicy_chat.py target=smollm2-135m-instruct out=runs/onpolicy/smollm2_medusa budget_s=660 \
        plain_fraction=0.15 seed=1
    python -m experiments.medusa_heads target=smollm2-135m-instruct windows=runs/onpolicy/smollm2_medusa.npy \
        num_heads=3 seq_len=256 batch_size=2 steps=160 warmup=10 max_minutes=20 eval_windows=8 eval_chunk=4 \
        eval_every=20 heads_dir=runs/medusa_heads/smollm2 out_dir=results/medusa_heads/smollm2

(results/medusa_heads/smollm2/RESULTS.md: what it took and what the heads reach.)
"""
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
    # the training text. null: random windows of the pycode corpus (train split; val split for the accuracy
    # table). A path (relative to the repo) to a token stream i32[N] (.npy), e.g. scripts/onpolicy_chat.py's
    # ``<out>.npy`` (chat prompts and the target's own answers: on-policy): cut into windows of seq_len + K + 1
    # tokens at stride seq_len (every position trained once per epoch), the last eval_windows held out
    windows: Optional[str] = None
    # run the frozen target once over every training window and keep its hidden states f32[W, seq_len, E] and
    # labels, then train the heads alone (windows are revisited as epochs); false: a target forward every step
    precompute: bool = True
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
    eval_chunk: int = 8               # windows per evaluation / precompute call (its logits are [chunk, T, K, V])
    eval_every: int = 100
    seed: int = 0
    # where the trained heads go (relative to the repo; runs/ is git-ignored); null: <out_dir>/heads
    heads_dir: Optional[str] = "runs/medusa_heads/tiny-code"


CONFIG = MedusaHeadsConfig()
SMOKE = ("target=preset:tiny-llama", "num_heads=2", "seq_len=16", "batch_size=2", "steps=3", "warmup=1",
         "eval_windows=2", "eval_every=2", "heads_dir=null")
