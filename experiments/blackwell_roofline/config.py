"""Configuration of the roofline experiment (override with key=value; lists as [a,b])."""
import dataclasses

from experiments.blackwell_roofline import perfmodel

DEVICES = ("cpu", "gpu", "none")


@dataclasses.dataclass(frozen=True)
class RooflineConfig:
    # --- predictions (experiments.blackwell_roofline.perfmodel; pure arithmetic, milliseconds) ---
    hardware: tuple[str, ...] = ("h100", "h200", "b200")  # keys of perfmodel.HARDWARE
    models: tuple[str, ...] = ("llama3-70b", "mixtral-8x7b", "deepseek-v3")  # keys of perfmodel.MODELS
    formats: tuple[str, ...] = ("bf16", "fp8", "nvfp4")  # weights and KV cache both; mxfp4 also known
    context: int = 4096  # tokens each sequence attends to in the decode step
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    # tensor-parallel degree per (GPU, model, format): the smallest power of two that holds the
    # weights plus this many requests of `context` tokens
    min_requests: int = 16
    memory_fraction: float = 0.9  # of each GPU's memory for weights + KV (vLLM's default)
    # --- validation: the model's predicted decode step vs jaxserve's measured one ---
    device: str = "cpu"  # cpu: this machine; gpu: needs JAX's GPU backend; none: skip
    val_model: str = "small-llama"  # a jaxserve preset, random weights in the preset's dtype
    val_num_layers: int = 0  # > 0: override the preset's depth (a smaller model on a GPU)
    val_batches: tuple[int, ...] = (1, 4, 16, 64)
    val_contexts: tuple[int, ...] = (128, 512)  # power-of-two multiples of the 16-token block
    val_iters: int = 10  # timed repetitions per measurement (median reported)
    val_attention: str = "auto"  # the runner's attention_impl ("auto": Pallas on GPU, XLA elsewhere)
    bw_bytes: int = 256 * 2 ** 20  # array size of the bandwidth microbenchmarks
    matmul_n: int = 1024  # n of the n x n x n matmul that measures FLOP/s
    seed: int = 0

    def __post_init__(self):
        for key, known in (("hardware", perfmodel.HARDWARE), ("models", perfmodel.MODELS),
                           ("formats", perfmodel.PRECISIONS)):
            unknown = [v for v in getattr(self, key) if v not in known]
            if unknown:
                raise ValueError(f"{key}: unknown {unknown}; known: {sorted(known)}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if min(self.batches + self.val_batches) < 1 or self.context < 1:
            raise ValueError(f"batches, val_batches and context must be >= 1, got {self.batches}, "
                             f"{self.val_batches}, {self.context}")


CONFIG = RooflineConfig()
SMOKE = ("batches=[1,8,64]", "val_model=tiny-llama", "val_batches=[4]", "val_contexts=[32]", "val_iters=2",
         "bw_bytes=16777216", "matmul_n=256")
# On the GPU machine (benchmarks/gpu_check.sh): a 4-layer Llama-3-8B in bf16, large enough that a
# step takes about a millisecond.
GPU = ("device=gpu", "val_model=llama3-8b", "val_num_layers=4", "val_batches=[1,16,128]", "val_contexts=[1024]",
       "bw_bytes=1073741824", "matmul_n=8192")
