// Decoding block-scaled FP4's scale bytes in AVX-512 registers; shared by matmul.cc and vnni.cc.
#ifndef JAXSERVE_KERNELS_CPU_FP4_SCALES_H_
#define JAXSERVE_KERNELS_CPU_FP4_SCALES_H_

#include <immintrin.h>

namespace jaxserve {

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 scale bytes -> block scale x tensor scale: decode_e4m3(b) * ts (kind 0) or decode_e8m0(b) * ts (1), bit for
// bit (tests/kernels/cpu_matmul_guard_pages.cc checks every byte).
template <int kKind>
inline __m512 fp4_scales16(__m128i bytes, __m512 ts) {
  const __m512i d = _mm512_cvtepu8_epi32(bytes);
  __m512 v;
  if (kKind == 0) {
    // Normal magnitudes: exponent and mantissa in float32's, rebiased (+120); subnormals (exponent 0): mantissa x
    // 2^-9; magnitude 0x7F: NaN (positive, as decode_e4m3's).
    const __m512i mag = _mm512_and_si512(d, _mm512_set1_epi32(0x7F));
    const __m512 normal =
        _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.f / 512));
    v = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), normal, sub);
    v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v),
                                            _mm512_slli_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0x80)), 24)));
    v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)),
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  } else {
    // 2^(b - 127) is b in the float32 exponent field; b = 0 is the subnormal 2^-127 (0x00400000), b = 255 NaN.
    const __m512i e = _mm512_slli_epi32(d, 23);
    const __mmask16 odd = _mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()) |
                          _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(255));
    v = _mm512_castsi512_ps(_mm512_mask_or_epi32(e, odd, e, _mm512_set1_epi32(0x00400000)));
  }
  return _mm512_mul_ps(v, ts);
}
#endif

}  // namespace jaxserve

#endif  // JAXSERVE_KERNELS_CPU_FP4_SCALES_H_
