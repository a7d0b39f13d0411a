"""Configuration of the quantization-error experiment (override with key=value arguments)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class QuantErrorConfig:
    rows: int = 2048                  # K: the quantized axis (axis 0, as for a [K, N] weight)
    cols: int = 2048                  # N
    seeds: tuple = (0, 1, 2)          # one matrix per seed and distribution; the table reports mean and spread
    # "gaussian" or "student_t<df>" (heavy-tailed; df 3..5 bracket LLM weight kurtosis)
    distributions: tuple = ("gaussian", "student_t3", "student_t4", "student_t5")
    variants: tuple = ("nvfp4", "mxfp4_floor", "mxfp4_ceil", "fp8_tensor", "fp8_channel", "int4_g128")


CONFIG = QuantErrorConfig()
SMOKE = ("rows=256", "cols=256", "seeds=[0]", "distributions=[gaussian,student_t3]")
