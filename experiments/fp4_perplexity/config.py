"""Configuration of the FP4 perplexity experiment (override with key=value arguments)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class PerplexityConfig:
    # zoo names or jaxserve checkpoint directories (each needs tokenizer.json); one table pair per model
    models: tuple = ("jaxserve/tiny-code", "jaxserve/tiny-code-draft")
    seq_len: int = 256                 # validation windows of seq_len + 1 tokens (the zoo's EVAL_SEQ_LEN)
    num_windows: int = 128             # the first num_windows validation windows (0: all; the zoo cards use 128)
    batch_size: int = 8
    impl: str = "reference"            # quantized matmul: "reference" (dequantize + f32 dot), "pallas", "auto"
    # pallas_kernels.fp4.quant_error.VARIANTS keys; a "_w4a4" suffix also fake-quantizes activations
    variants: tuple = ("nvfp4", "nvfp4_w4a4", "mxfp4_floor", "mxfp4_floor_w4a4", "mxfp4_ceil",
                       "mxfp4_ceil_w4a4", "fp8_tensor", "fp8_channel", "int4_g128")
    baselines: tuple = ("float32", "bfloat16")  # unquantized compute dtypes; the first is the reference row


CONFIG = PerplexityConfig()
SMOKE = ("models=[jaxserve/tiny-code-draft]", "seq_len=32", "num_windows=2", "batch_size=2",
         "variants=[nvfp4_w4a4]", "baselines=[float32]")  # W4A4 runs the weight quantization path too
