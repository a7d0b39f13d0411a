"""CPU kernels as XLA FFI custom calls, compiled on first use by ``build``: weight-only matmuls (``matmul.cc``), bf16 GEMMs on AMX tiles or float32 FMAs (``amx.cc``, ``packed_fma.h``) and
paged attention (``attention.cc``, in ``jaxserve.kernels.cpu.attention``) and integer-dot kernels on AVX-512 VNNI (``vnni.cc``: W4A8 FP4 matmuls, an int8 LM head)."""
from jaxserve.kernels.cpu.matmul import (MAX_ROWS, amx_usable, bf16_gemm, bf16_matmul, bf16_matmul_reference, blas_usable, enabled,
                                         f32_gemm, f32_matmul, fp4_matmul_cpu, fp4_w4a8_matmul_cpu, packed_impl, usable,
                                         vnni_usable)

__all__ = ["MAX_ROWS", "amx_usable", "bf16_gemm", "bf16_matmul", "bf16_matmul_reference", "blas_usable", "enabled", "f32_gemm", "f32_matmul",
           "fp4_matmul_cpu", "fp4_w4a8_matmul_cpu", "packed_impl", "usable", "vnni_usable"]
