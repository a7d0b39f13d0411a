"""Block-scaled low-precision formats and the Pallas FP4 matmul.

    quantize(x, fmt, axis=-1, **opts) -> QuantizedTensor    fmt: nvfp4 | mxfp4 | fp8 | int4
    dequantize(qt) -> float32 array
    fp4_matmul(x, qt, interpret=None, w4a4=False)          Pallas kernel (nvfp4 / mxfp4 weights)
    fp4_matmul_reference(x, qt, w4a4=False)                dequantize, then jnp.dot
    fp4_matmul_mosaic(x, qt, interpret=None)               Mosaic GPU (Hopper) kernel for small M, bf16 products

Codecs (E2M1, E4M3, E8M0), nibble packing and the cuBLASLt 128x4 scale layout are exported too.
"""
from pallas_kernels.fp4.e2m1 import E2M1_VALUES, decode_e2m1, encode_e2m1, pack_nibbles, round_e2m1, unpack_nibbles
from pallas_kernels.fp4.formats import FORMATS, dequantize, quantize
from pallas_kernels.fp4.matmul import fp4_matmul, fp4_matmul_reference, pick_block_sizes
from pallas_kernels.fp4.mosaic import fp4_matmul_mosaic
from pallas_kernels.fp4.quantized_tensor import QuantizedTensor
from pallas_kernels.fp4.scale_codecs import decode_e4m3_bytes, decode_e8m0, encode_e8m0, round_e4m3
from pallas_kernels.fp4.swizzle import cublas_scale_layout, swizzle_scales_128x4, unswizzle_scales_128x4

__all__ = [
    "E2M1_VALUES", "FORMATS", "QuantizedTensor", "cublas_scale_layout", "decode_e2m1", "decode_e4m3_bytes",
    "decode_e8m0", "dequantize", "encode_e2m1", "encode_e8m0", "fp4_matmul", "fp4_matmul_mosaic", "fp4_matmul_reference",
    "pack_nibbles", "pick_block_sizes", "quantize", "round_e2m1", "round_e4m3", "swizzle_scales_128x4",
    "unpack_nibbles",
]
