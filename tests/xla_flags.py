"""XLA flags for the tests' programs (no JAX import: scripts set XLA_FLAGS from it before importing jax).

Compiling is most of this suite's time on a CPU (tiny models whose programs run in milliseconds): LLVM's
optimizations off cut it by ~30% (tests/speculative/test_engine_spec.py's quantized test 53 s -> 34 s, the
SmolLM2 tests 227 s -> 171 s). XLA's HLO passes are unchanged, so what a program computes is the same; every
comparison a test makes is between programs compiled alike, or against a tolerance. Benchmarks and experiments
do not use this: their figures are from fully optimized programs.
"""
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def with_devices(count: int) -> str:
    """XLA_FLAGS for a subprocess simulating ``count`` CPU devices, compiled as the tests compile."""
    return f"--xla_force_host_platform_device_count={count} {TEST_XLA_FLAGS}"
