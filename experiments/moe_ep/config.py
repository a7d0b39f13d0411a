"""Configuration of the expert-parallel all-to-all timing (override with key=value arguments)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class EPTimingConfig:
    meshes: tuple = ("expert=8", "data=2,expert=4")  # over the 8 simulated CPU devices __main__.py asks for
    tokens_per_device: tuple = (16, 64, 256)
    capacity_factors: tuple = (0.0, 1.25)  # 0: dropless worst-case capacity T_l * min(k, E_l)
    hidden_size: int = 256
    moe_intermediate_size: int = 512
    num_experts: int = 16
    num_experts_per_tok: int = 2
    repeats: int = 5  # timed calls per point after one warm-up; the table reports the median


CONFIG = EPTimingConfig()
SMOKE = ("meshes=[expert=8]", "tokens_per_device=[16]", "hidden_size=64", "moe_intermediate_size=64", "repeats=1")
