"""Configuration of the FP4 perplexity experiment (override with key=value arguments)."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class PerplexityConfig:
    # zoo names, "smollm2-135m-instruct", GGUF files or checkpoint directories; one table set per model
    models: tuple = ("smollm2-135m-instruct",)
    # held-out text: "pycode-val" (the zoo corpus' validation split, needs the zoo tokenizer), or a .txt file
    # or a folder of *.txt files (path relative to the repository), documents joined with EOS
    text: str = "tests/data/real_text"
    seq_len: int = 256                 # windows of seq_len + 1 tokens (stride seq_len)
    num_windows: int = 32              # how many windows (0: all)
    spread_windows: bool = True        # num_windows evenly spaced over the text (False: the first ones)
    batch_size: int = 8
    impl: str = "reference"            # quantized matmul: "reference" (dequantize + f32 dot), "pallas", "auto"
    lm_head: bool = False              # weights-only rows also quantize the LM head (a tied one: the embedding along E)
    int8_head: bool = False            # quantized rows read the LM head in int8 (lm_head_quantization="int8")
    # pallas_kernels.fp4.quant_error.VARIANTS keys; a "_w4a4" suffix also fake-quantizes activations to the weight's
    # format, "_w4a8" to int8 on its blocks (jaxserve.quant.w4a8)
    variants: tuple = ("nvfp4", "nvfp4_w4a4", "mxfp4_floor", "mxfp4_floor_w4a4", "mxfp4_ceil",
                       "mxfp4_ceil_w4a4", "fp8_tensor", "fp8_channel", "int4_g128")
    baselines: tuple = ("float32", "bfloat16")  # unquantized compute dtypes; the first is the reference row
    # the float tensors every row starts from: "float32" (the weights as loaded, e.g. dequantized from
    # GGUF Q4_1) and/or "bfloat16" / "float16" (those rounded to that dtype, i.e. a 16-bit export, computed in f32)
    weight_sources: tuple = ("float32", "bfloat16")
    # Pallas kernel (interpret mode off a GPU) vs the reference matmul on these Dense layers' real inputs
    kernel_check_layers: tuple = ("layers_0/attn/q_proj", "layers_0/mlp/down_proj", "layers_14/attn/o_proj",
                                  "layers_29/mlp/up_proj")
    kernel_check_tokens: int = 64      # of the first window (0: skip the check)


CONFIG = PerplexityConfig()
SMOKE = ("models=[jaxserve/tiny-code-draft]", "text=pycode-val", "seq_len=32", "num_windows=2", "batch_size=2",
         "variants=[nvfp4_w4a4]", "baselines=[float32]", "weight_sources=[float32,bfloat16]",
         "kernel_check_layers=[layers_1/mlp/down_proj]", "kernel_check_tokens=8")  # W4A4 runs the weights path too
