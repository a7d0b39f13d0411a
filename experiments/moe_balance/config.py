"""Configuration of the small-scale loss-free balancing experiment (override with key=value)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class BalanceConfig:
    # variants: "none", "aux:<alpha>", "loss_free:<u>"
    variants: tuple = ("none", "aux:0.001", "loss_free:0.0001", "loss_free:0.001", "loss_free:0.01")
    steps: int = 300
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 3e-3
    seed: int = 0
    val_windows: int = 128  # held-out windows of the corpus's val split for MaxVio_global and perplexity
    # the model: byte-level (vocab 256) on the pycode corpus, DeepSeek-style sigmoid router
    hidden_size: int = 64
    num_layers: int = 2
    num_experts: int = 16
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    log_every: int = 25  # RESULTS.md lists MaxVio_batch every 4 * log_every steps from step log_every


CONFIG = BalanceConfig()
SMOKE = ("variants=[loss_free:0.01]", "steps=8", "batch_size=4", "seq_len=32", "val_windows=16",
         "hidden_size=32", "num_layers=1", "num_experts=4", "moe_intermediate_size=32", "log_every=2")
