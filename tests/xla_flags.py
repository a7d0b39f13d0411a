"""XLA flags for the tests' programs (no JAX import: scripts set XLA_FLAGS from it before importing jax).

Compiling is most of this suite's time on a CPU (tiny models whose programs run in milliseconds): LLVM's
optimizations off cut it by ~30% (tests/speculative/test_engine_spec.py's quantized test 53 s -> 34 s, the
SmolLM2 tests 227 s -> 171 s). On jaxlib 0.10, XLA:CPU's MLIR fusion emitters off (fusions emitted by its older
LLVM IR emitter) cut the backend compile time of tests/engine and tests/speculative by another 39% (427 s -> 262 s
summed over their tests; a mesh check 58 s -> 36 s); later jaxlibs have no such flag (an unknown flag is fatal).
XLA's HLO passes are unchanged, so what a program computes is the same; every comparison a test makes is between
programs compiled alike, or against a tolerance. Benchmarks and experiments do not use this: their figures are from
fully optimized programs.
"""
from importlib.metadata import version

_LLVM_OFF = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
TEST_JAXLIB = tuple(int(p) for p in version("jaxlib").split(".")[:2])
TEST_XLA_FLAGS = _LLVM_OFF + (" --xla_cpu_use_fusion_emitters=false" if TEST_JAXLIB < (0, 11) else "")


def with_devices(count: int) -> str:
    """XLA_FLAGS for a subprocess simulating ``count`` CPU devices, compiled as the tests compile."""
    return f"--xla_force_host_platform_device_count={count} {TEST_XLA_FLAGS}"
