"""The one place that knows how the supported JAX versions (0.10.2 to 0.12) differ for our kernels.

- Backend choice: a ``pl.pallas_call`` without ``compiler_params`` lowers to Mosaic GPU on 0.10.2
  (``jax_pallas_use_mosaic_gpu`` defaults to True there) and to Triton from 0.11. Every call here
  passes explicit params, so the backend is chosen, never defaulted.
- Lowering for CUDA without a GPU: from 0.11 the Triton rules ask for the target GPU, which a CPU
  machine has none of; ``abstract_gpu()`` names one (an ``AbstractDevice`` on an abstract mesh),
  and works the same on 0.10.2.
- Mosaic GPU: ``plgpu.InterpretGPUParams`` is public from 0.11 (private module on 0.10.2);
  ``plgpu.transpose_ref`` is deprecated in 0.12 in favour of ``ref.transpose``, on every version.
"""
from __future__ import annotations

import contextlib

import jax

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3])

# The GPU the project's lowering tests and the GPU machine target (compute capability 9.0).
DEFAULT_GPU = "NVIDIA H200"

# Mosaic GPU's CPU interpreter runs a WGMMA whose B operand is a transposed ref (checked on 0.12;
# 0.10.2 fails on the TransposeTransform; 0.11 unchecked, so treated as 0.10.2).
MOSAIC_INTERPRETS_TRANSPOSED_WGMMA = JAX_VERSION >= (0, 12)
DEFAULT_GPU_CORES = 132


def triton_params(num_warps: int = 4, num_stages: int = 2):
    """Compiler params that select Pallas' Triton lowering (deprecated by JAX since 0.11)."""
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def mosaic_params(**kwargs):
    """Compiler params that select Mosaic GPU (``plgpu.CompilerParams``)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    return plgpu.CompilerParams(**kwargs)


def mosaic_interpret_params():
    """Params that run a ``plgpu.kernel`` in Mosaic GPU's CPU interpreter."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if hasattr(plgpu, "InterpretGPUParams"):
        return plgpu.InterpretGPUParams()
    from jax._src.pallas.mosaic_gpu.interpret import params  # jax 0.10.2
    return params.InterpretGPUParams()


def is_mosaic_interpret(interpret) -> bool:
    """Whether ``interpret`` (None, a bool or interpret params) asks for the CPU interpreter."""
    return interpret is not None and interpret is not False


def transpose_ref(ref, permutation):
    """A transposed view of a shared-memory ref (``plgpu.transpose_ref`` before 0.12)."""
    return ref.transpose(permutation)


@contextlib.contextmanager
def abstract_gpu(device_kind: str = DEFAULT_GPU, num_cores: int = DEFAULT_GPU_CORES):
    """Within this context, ``.lower(lowering_platforms=("cuda",))`` targets ``device_kind``
    without a GPU present (Triton and Mosaic GPU read the target from the abstract mesh)."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    device = AbstractDevice(device_kind=device_kind, num_cores=num_cores, platform="cuda")
    with use_abstract_mesh(AbstractMesh((1,), ("_gpu",), abstract_device=device)):
        yield


def is_hopper_gpu() -> bool:
    """Whether the default device is a compute-capability 9.x GPU (Mosaic GPU's WGMMA kernels need one)."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return False
    return str(getattr(device, "compute_capability", "")).startswith("9")


def mosaic_load(ref, layout):
    """A Mosaic GPU shared-memory ref loaded into registers in ``layout`` (0.10.2 takes an index tuple)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if JAX_VERSION < (0, 11):
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)
