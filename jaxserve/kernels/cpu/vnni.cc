// Integer dot products on AVX-512 VNNI (vpdpbusd), for decoding (few rows): weights times activations quantized to
// int8, as XLA FFI handlers.
//
//   jaxserve_int8_head_matmul:    an LM head in int8 (W8A8), see its section below and jaxserve/kernels/cpu/int8_head.py
//   jaxserve_fp4_w4a8_matmul_kn:  y f32[M, N] = quant8(x) @ dequant(w)
//       x f32[M, K]; codes u8[K/2, N] (element 2i in the low nibble of row i, 2i+1 in the high one), scales [K/bs, N]
//       as stored (u8 E8M0 bytes: scale_kind 1; float8_e4m3fn or u8 E4M3 bytes: 0), tensor_scale f32[]; bs % 4 == 0.
//
// quant8 is llama.cpp's Q8 activations on the weight's blocks: per row m and block b of bs k, d = amax / 127 and
// q = rint(x * (127 / amax)) in [-127, 127] (float32 ops, ties to even; a block of zeros: d = 0, q = 0; a block with
// a NaN or an infinity: d = NaN), so quant8(x) = q * d, what jaxserve.kernels.cpu.q8.quantize_activations computes.
// y[m, n] = sum_b d[m, b] * s[b, n] * sum_k q[m, k] * e2m1(w[k, n]): the inner sums are exact integers (vpdpbusd),
// only the float32 sums over blocks round. Why: the bf16 weight-only kernel (matmul.cc) spends its time decoding
// E2M1 to bf16 pairs, 12 shuffles a 128 weights; here 5 (the codes looked up as int8, 4 k a 32-bit lane).
//
// vpdpbusd multiplies unsigned by signed bytes: the weights are looked up as 2 * e2m1 + 12 (0 .. 24, E2M1's values
// times 2 are the integers -12 .. 12), q is the signed side, and 12 * sum_k q per block (precomputed with q) comes off
// each block's sum. Two code rows (4 k of 64 columns) unpack to the 4 k of a column in a 32-bit lane in the order
// (k 4p, 4p + 2, 4p + 1, 4p + 3); q is laid out in that order once. The lanes hold matmul.cc's fp4_pairs64 column
// order (vector j, dword 4 l + q: column 16 l + 4 j + q), so the scales are permuted and the sums transposed alike.
//
// Work: chunks of up to 8 strips of 64 columns (a strip: one 64-byte line of each codes row) on XLA's intra-op pool
// (parallel_chunks); a chunk walks the blocks in order, the strips within each (the codes read row by row, as
// stored): up to 4 rows of x with the weights decoded into registers; more rows (a prefill) decode each block of
// each strip once into L1 and multiply it with up to 64 rows, 4 at a time.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "fp4_scales.h"
#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr bool kHaveVnni = true;
constexpr int64_t kStrip = 64;       // columns per strip
constexpr int64_t kRowsAhead = 64;   // codes rows prefetched ahead (16 or 32: alike, one matmul in L3)
constexpr int64_t kBlocksAhead = 4;  // scale rows prefetched ahead
constexpr int kGroup = 4;            // rows of x per pass over a chunk (their integer sums: 16 registers)
constexpr int64_t kMaxStrips = 8;    // strips per chunk at most (its float32 sums: 8 KB)
constexpr int64_t kRowsPerPass = 64;  // rows of x per decoding of the weights (more rows: prefill)
constexpr int64_t kMaxBlock = 64;     // block sizes up to this (nvfp4 16, mxfp4 32)

// x quantized per block: q as 32-bit words of 4 int8, [M][Kp/4] (Kp: K rounded up to the block, zeros past K);
// per block, its scale d times `d_factor`, and `weight_offset` * sum q, [M][Kp/bs]. `fp4_order`: a word holds
// k (4p, 4p + 2, 4p + 1, 4p + 3), as unsigned_weights unpacks two codes rows; else k 4p .. 4p + 3.
struct Activations {
  std::vector<uint32_t> q;
  std::vector<float> d;
  std::vector<int32_t> offset;
};

Activations quantize_x(const float* x, int64_t M, int64_t K, int64_t bs, int32_t weight_offset, float d_factor,
                       bool fp4_order) {
  const int64_t nb = (K + bs - 1) / bs, Kp = nb * bs;
  Activations a{std::vector<uint32_t>(M * Kp / 4), std::vector<float>(M * nb), std::vector<int32_t>(M * nb)};
  std::vector<float> xb(bs);
  std::vector<int8_t> q(bs);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.f;
      bool finite = true;
      for (int64_t k = 0; k < bs; ++k) {
        xb[k] = b * bs + k < K ? x[m * K + b * bs + k] : 0.f;
        finite &= std::isfinite(xb[k]);
        amax = std::max(amax, std::fabs(xb[k]));
      }
      const float inv = finite && amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t k = 0; k < bs; ++k) {
        q[k] = int8_t(std::clamp(std::nearbyint(xb[k] * inv), -127.f, 127.f));  // default rounding: ties to even
        sum += q[k];
      }
      a.d[m * nb + b] = finite ? amax / 127.f * d_factor : NAN;
      a.offset[m * nb + b] = weight_offset * sum;
      for (int64_t p = 0; p < bs / 4; ++p) {
        const uint8_t* v = reinterpret_cast<const uint8_t*>(q.data() + 4 * p);
        a.q[(m * Kp + b * bs) / 4 + p] = fp4_order ? uint32_t(v[0]) | uint32_t(v[2]) << 8 | uint32_t(v[1]) << 16 |
                                                         uint32_t(v[3]) << 24
                                                   : uint32_t(v[0]) | uint32_t(v[1]) << 8 | uint32_t(v[2]) << 16 |
                                                         uint32_t(v[3]) << 24;
      }
    }
  }
  return a;
}

inline __mmask16 tail_mask16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(left, 0)) - 1);
}

inline __mmask64 tail_mask64(int64_t left) {
  return left >= 64 ? __mmask64(~0ull) : __mmask64((1ull << std::max<int64_t>(left, 0)) - 1);
}

// 2 * e2m1(code) + 12 for codes 0-15, in each 128-bit lane (a vpshufb table).
__m512i weight_table() {
  static const int8_t kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  alignas(64) uint8_t t[64];
  for (int i = 0; i < 64; ++i) t[i] = uint8_t(kTwiceE2M1[i % 16] + 12);
  return _mm512_load_si512(t);
}

// Codes rows 2p and 2p + 1 of 64 columns -> 4 vectors of 16 lanes, each lane the unsigned weights of one column at
// k (4p, 4p + 2, 4p + 1, 4p + 3); vector j, dword 4 l + q: column 16 l + 4 j + q.
inline void unsigned_weights(__m512i r0, __m512i r1, __m512i table, __m512i (&w)[4]) {
  const __m512i nib = _mm512_set1_epi8(15);
  const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);  // words (r0[c], r1[c])
  const __m512i la = _mm512_shuffle_epi8(table, _mm512_and_si512(a, nib));           // (k 4p, 4p + 2)
  const __m512i ha = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(a, 4), nib));  // (4p+1, 4p+3)
  const __m512i lb = _mm512_shuffle_epi8(table, _mm512_and_si512(b, nib));
  const __m512i hb = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(b, 4), nib));
  w[0] = _mm512_unpacklo_epi16(la, ha);
  w[1] = _mm512_unpackhi_epi16(la, ha);
  w[2] = _mm512_unpacklo_epi16(lb, hb);
  w[3] = _mm512_unpackhi_epi16(lb, hb);
}

// 64 E4M3 scale bytes -> 4 x 16 floats, decode_e4m3(b) / 256 (NaN where decode_e4m3 gives NaN). The magnitude's 7 bits
// at bits 13..7 of a float16 are E4M3's exponent and mantissa as float16's, with float16's bias (15, not 7: hence
// the 1/256) and E4M3's subnormals float16's; vcvtph2ps widens them. 7 operations a 16 scales, fp4_scales16's 14.
inline void e4m3_scales64(__m512i bytes, __m512 (&s)[4]) {
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
  for (int h = 0; h < 2; ++h) {
    const __m512i w = _mm512_cvtepu8_epi16(h ? _mm512_extracti64x4_epi64(bytes, 1) : _mm512_castsi512_si256(bytes));
    // b << 8, then an arithmetic shift by 1: the sign at bits 15 and 14, the magnitude at 13..7; bit 14 cleared
    const __m512i f16 = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1),
                                         _mm512_set1_epi16(int16_t(0xBF80)));
    const __mmask32 is_nan =
        _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, _mm512_set1_epi16(0x7F)), _mm512_set1_epi16(0x7F));
    s[2 * h] = _mm512_mask_mov_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(f16)), __mmask16(is_nan), nan);
    s[2 * h + 1] =
        _mm512_mask_mov_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(f16, 1)), __mmask16(is_nan >> 16), nan);
  }
}

// Block b's scales for the strip at column c (64 columns, `mask` of them in the weight): 4 x 16 floats in
// unsigned_weights' column order, without the tensor scale, E4M3's divided by 256 (e4m3_scales64).
template <int kKind>
inline void strip_scales(const uint8_t* srow, __mmask64 mask, __m512 (&s)[4]) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // Past the strip: E4M3 0 or E8M0 127 (1.0), not E8M0's 0 (matmul.cc's fp4_block_scales says why).
  const __m512i bytes =
      _mm512_permutexvar_epi32(order, _mm512_mask_loadu_epi8(_mm512_set1_epi8(kKind ? 127 : 0), mask, srow));
  if (kKind == 0) {
    e4m3_scales64(bytes, s);
  } else {
    for (int j = 0; j < 4; ++j)
      s[j] = jaxserve::fp4_scales16<1>(_mm512_castsi512_si128(_mm512_alignr_epi32(bytes, bytes, 4 * j)),
                                       _mm512_set1_ps(1.f));
  }
}

// A strip's 64 float32 sums (unsigned_weights' column order) to y[0 .. left): a 4 x 4 transpose of 128-bit lanes.
inline void store_strip(const float* sums, float* y, int64_t left) {
  const __m512 o[4] = {_mm512_load_ps(sums), _mm512_load_ps(sums + 16), _mm512_load_ps(sums + 32),
                       _mm512_load_ps(sums + 48)};
  const __m512 p = _mm512_shuffle_f32x4(o[0], o[1], 0x44), q = _mm512_shuffle_f32x4(o[2], o[3], 0x44),
               u = _mm512_shuffle_f32x4(o[0], o[1], 0xEE), v = _mm512_shuffle_f32x4(o[2], o[3], 0xEE);
  const __m512 out[4] = {_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD),
                         _mm512_shuffle_f32x4(u, v, 0x88), _mm512_shuffle_f32x4(u, v, 0xDD)};
  for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(y + 16 * j, tail_mask16(left - 16 * j), out[j]);
}

// Columns [n0, n0 + width) (width <= kMaxStrips * 64) for rows [m0, m0 + G) of x: block by block, strip by strip
// within a block (the codes read row by row, as stored), each strip's integer sums in registers and its float32 sums
// in `sums` (G x strips x 64, L1).
template <int kKind, int G>
void chunk(const Activations& a, int64_t m0, int64_t K, int64_t bs, const uint8_t* codes, const uint8_t* scales,
           int64_t N, int64_t n0, int64_t width, float ts, __m512i table, float* sums, float* y) {
  // the scales come without the tensor scale (and E4M3's / 256): both go into each block's multiplier of x's scale
  const float multiplier = kKind == 0 ? ts * 256.f : ts;
  const int64_t nb = K / bs, pairs = bs / 4, strips = (width + kStrip - 1) / kStrip, row = strips * kStrip;
  std::fill_n(sums, G * row, 0.f);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t st = 0; st < strips; ++st) {
      const int64_t c = n0 + st * kStrip;
      const __mmask64 mask = tail_mask64(width - st * kStrip);
      _mm_prefetch(reinterpret_cast<const char*>(scales + (b + kBlocksAhead) * N + c), _MM_HINT_T0);
      __m512 s[4];
      strip_scales<kKind>(scales + b * N + c, mask, s);
      __m512i isum[G][4];
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < 4; ++j) isum[g][j] = _mm512_setzero_si512();
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* r = codes + 2 * (b * pairs + p) * N + c;
        _mm_prefetch(reinterpret_cast<const char*>(r + kRowsAhead * N), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(r + (kRowsAhead + 1) * N), _MM_HINT_T0);
        __m512i w[4];
        unsigned_weights(_mm512_maskz_loadu_epi8(mask, r), _mm512_maskz_loadu_epi8(mask, r + N), table, w);
        for (int g = 0; g < G; ++g) {
          const __m512i xq = _mm512_set1_epi32(int(a.q[(m0 + g) * K / 4 + b * pairs + p]));
          for (int j = 0; j < 4; ++j) isum[g][j] = _mm512_dpbusd_epi32(isum[g][j], w[j], xq);
        }
      }
      for (int g = 0; g < G; ++g) {
        const __m512i offset = _mm512_set1_epi32(a.offset[(m0 + g) * nb + b]);
        const __m512 half_d = _mm512_set1_ps(a.d[(m0 + g) * nb + b] * multiplier);
        float* sg = sums + g * row + st * kStrip;
        for (int j = 0; j < 4; ++j)
          _mm512_store_ps(sg + 16 * j, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[g][j], offset)),
                                                       _mm512_mul_ps(s[j], half_d), _mm512_load_ps(sg + 16 * j)));
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int64_t st = 0; st < strips; ++st)
      store_strip(sums + g * row + st * kStrip, y + (m0 + g) * N + n0 + st * kStrip, width - st * kStrip);
}

// Many rows of x: each block of each strip decoded once (into L1), then multiplied with the rows 4 at a time.
template <int G>
inline void block_rows(const Activations& a, int64_t m0, int64_t K, int64_t nb, int64_t b, int64_t pairs,
                       const __m512i (*w)[4], const __m512 (&s)[4], float multiplier, float* sums, int64_t row) {
  __m512i isum[G][4];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 4; ++j) isum[g][j] = _mm512_setzero_si512();
  for (int64_t p = 0; p < pairs; ++p) {
    for (int g = 0; g < G; ++g) {
      const __m512i xq = _mm512_set1_epi32(int(a.q[(m0 + g) * K / 4 + b * pairs + p]));
      for (int j = 0; j < 4; ++j) isum[g][j] = _mm512_dpbusd_epi32(isum[g][j], w[p][j], xq);
    }
  }
  for (int g = 0; g < G; ++g) {
    const __m512i offset = _mm512_set1_epi32(a.offset[(m0 + g) * nb + b]);
    const __m512 d = _mm512_set1_ps(a.d[(m0 + g) * nb + b] * multiplier);
    float* sg = sums + g * row;
    for (int j = 0; j < 4; ++j)
      _mm512_store_ps(sg + 16 * j, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[g][j], offset)),
                                                   _mm512_mul_ps(s[j], d), _mm512_load_ps(sg + 16 * j)));
  }
}

// Rows [m0, m0 + rows) of x over columns [n0, n0 + width): the blocks in order, the strips within each.
template <int kKind>
void chunk_many(const Activations& a, int64_t m0, int64_t rows, int64_t K, int64_t bs, const uint8_t* codes,
                const uint8_t* scales, int64_t N, int64_t n0, int64_t width, float ts, __m512i table, float* sums,
                float* y) {
  const float multiplier = kKind == 0 ? ts * 256.f : ts;
  const int64_t nb = K / bs, pairs = bs / 4, strips = (width + kStrip - 1) / kStrip, row = strips * kStrip;
  std::fill_n(sums, rows * row, 0.f);
  __m512i w[kMaxBlock / 4][4];
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t st = 0; st < strips; ++st) {
      const int64_t c = n0 + st * kStrip;
      const __mmask64 mask = tail_mask64(width - st * kStrip);
      __m512 s[4];
      strip_scales<kKind>(scales + b * N + c, mask, s);
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t* r = codes + 2 * (b * pairs + p) * N + c;
        _mm_prefetch(reinterpret_cast<const char*>(r + bs * N), _MM_HINT_T0);  // the next block's rows
        _mm_prefetch(reinterpret_cast<const char*>(r + (bs + 1) * N), _MM_HINT_T0);
        unsigned_weights(_mm512_maskz_loadu_epi8(mask, r), _mm512_maskz_loadu_epi8(mask, r + N), table, w[p]);
      }
      for (int64_t g = 0; g < rows; g += kGroup) {
        float* sg = sums + g * row + st * kStrip;
        switch (std::min<int64_t>(kGroup, rows - g)) {
          case 1: block_rows<1>(a, m0 + g, K, nb, b, pairs, w, s, multiplier, sg, row); break;
          case 2: block_rows<2>(a, m0 + g, K, nb, b, pairs, w, s, multiplier, sg, row); break;
          case 3: block_rows<3>(a, m0 + g, K, nb, b, pairs, w, s, multiplier, sg, row); break;
          default: block_rows<4>(a, m0 + g, K, nb, b, pairs, w, s, multiplier, sg, row); break;
        }
      }
    }
  }
  for (int64_t g = 0; g < rows; ++g)
    for (int64_t st = 0; st < strips; ++st)
      store_strip(sums + g * row + st * kStrip, y + (m0 + g) * N + n0 + st * kStrip, width - st * kStrip);
}

template <int kKind>
void w4a8_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint8_t* codes,
             const uint8_t* scales, int64_t bs, float ts, int64_t N, float* y, int64_t threads) {
  if (M == 0 || N == 0) return;
  const Activations a = quantize_x(x, M, K, bs, 12, 0.5f, true);  // weights 2 e2m1 + 12
  const __m512i table = weight_table();
  // Chunks of whole strips, their count a multiple of the threads, at most kMaxStrips strips each.
  const int64_t t = std::max<int64_t>(threads, 1), all = (N + kStrip - 1) / kStrip;
  const int64_t count = (all + t * kMaxStrips - 1) / (t * kMaxStrips) * t;
  const int64_t per = (all + count - 1) / count;
  jaxserve::parallel_chunks(pool, (all + per - 1) / per, threads, [&](int64_t c) {
    const int64_t n0 = c * per * kStrip, width = std::min(per * kStrip, N - n0);
    if (M > kGroup) {  // each block decoded once for up to kRowsPerPass rows
      std::vector<float> sums(std::min(M, kRowsPerPass) * per * kStrip + 16);
      float* aligned = sums.data() + (16 - reinterpret_cast<uintptr_t>(sums.data()) / 4 % 16) % 16;
      for (int64_t m = 0; m < M; m += kRowsPerPass)
        chunk_many<kKind>(a, m, std::min(kRowsPerPass, M - m), K, bs, codes, scales, N, n0, width, ts, table, aligned,
                          y);
      return;
    }
    alignas(64) float sums[kGroup * kMaxStrips * kStrip];
    const auto run = [&](auto g) {
      chunk<kKind, decltype(g)::value>(a, 0, K, bs, codes, scales, N, n0, width, ts, table, sums, y);
    };
    switch (M) {
      case 1: run(std::integral_constant<int, 1>()); break;
      case 2: run(std::integral_constant<int, 2>()); break;
      case 3: run(std::integral_constant<int, 3>()); break;
      default: run(std::integral_constant<int, 4>()); break;
    }
  });
}

// ---- W8A8: an LM head's int8 weights (per output row scales) times x quantized to int8 in blocks of 32 ----
// panels u8[ceil(N/16), Kp/4 * 64]: panel p holds columns 16 p .. 16 p + 15, k-group j (k 4j .. 4j + 3) at bytes
// 64 j + 4 c + i: w[16 p + c, 4 j + i] + 128 (unsigned; zeros past N and K stored as 128). scales f32[N].
// y[m, n] = scale[n] * sum_b d[m, b] * (sum_{k in b} (w + 128) q - 128 sum_{k in b} q): exact integer block sums.
constexpr int64_t kHeadBlock = 32;    // k per scale of x
constexpr int kHeadGroup = 2;         // rows of x per pass (integer and float sums in registers: 16)
constexpr int64_t kHeadPanels = 4;    // panels per pass (64 columns)
constexpr int64_t kHeadChunk = 16;    // passes per work chunk (1024 columns)

template <int G>
void head_pass(const Activations& a, int64_t m0, int64_t Kp, const uint8_t* panels, const float* scale, int64_t N,
               int64_t p0, float* y) {
  const int64_t nb = Kp / kHeadBlock, groups = Kp / 4;
  __m512 sums[G][kHeadPanels];
  for (int g = 0; g < G; ++g)
    for (int p = 0; p < kHeadPanels; ++p) sums[g][p] = _mm512_setzero_ps();
  const uint8_t* base = panels + p0 * groups * 64;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum[G][kHeadPanels];
    for (int g = 0; g < G; ++g)
      for (int p = 0; p < kHeadPanels; ++p) isum[g][p] = _mm512_setzero_si512();
    for (int64_t j = b * kHeadBlock / 4; j < (b + 1) * kHeadBlock / 4; ++j) {
      for (int p = 0; p < kHeadPanels; ++p) {
        const uint8_t* w = base + (p * groups + j) * 64;
        _mm_prefetch(reinterpret_cast<const char*>(w + 8 * 64), _MM_HINT_T0);
        const __m512i wv = _mm512_loadu_si512(w);
        for (int g = 0; g < G; ++g)
          isum[g][p] = _mm512_dpbusd_epi32(isum[g][p], wv, _mm512_set1_epi32(int(a.q[(m0 + g) * groups + j])));
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512i offset = _mm512_set1_epi32(a.offset[(m0 + g) * nb + b]);
      const __m512 d = _mm512_set1_ps(a.d[(m0 + g) * nb + b]);
      for (int p = 0; p < kHeadPanels; ++p)
        sums[g][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[g][p], offset)), d, sums[g][p]);
    }
  }
  for (int p = 0; p < kHeadPanels; ++p) {
    const int64_t n0 = (p0 + p) * 16;
    const __mmask16 mask = tail_mask16(N - n0);
    const __m512 s = _mm512_maskz_loadu_ps(mask, scale + n0);
    for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(y + (m0 + g) * N + n0, mask, _mm512_mul_ps(sums[g][p], s));
  }
}

void int8_head(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint8_t* panels, const float* scale,
               int64_t N, float* y, int64_t threads) {
  if (M == 0 || N == 0) return;
  const Activations a = quantize_x(x, M, K, kHeadBlock, 128, 1.f, false);  // weights w + 128
  const int64_t Kp = (K + kHeadBlock - 1) / kHeadBlock * kHeadBlock, npanels = (N + 15) / 16;
  const int64_t passes = (npanels + kHeadPanels - 1) / kHeadPanels;  // panels are padded to whole passes
  jaxserve::parallel_chunks(pool, (passes + kHeadChunk - 1) / kHeadChunk, threads, [&](int64_t c) {
    for (int64_t pass = c * kHeadChunk; pass < std::min(passes, (c + 1) * kHeadChunk); ++pass) {
      for (int64_t m = 0; m < M; m += kHeadGroup) {
        if (M - m >= 2) head_pass<2>(a, m, Kp, panels, scale, N, pass * kHeadPanels, y);
        else head_pass<1>(a, m, Kp, panels, scale, N, pass * kHeadPanels, y);
      }
    }
  });
}
#else
constexpr bool kHaveVnni = false;
#endif

ffi::Error Fp4W4a8Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::U8, 2> codes,
                         ffi::AnyBuffer scales, ffi::Buffer<ffi::F32, 0> tensor_scale, ffi::ResultBuffer<ffi::F32, 2> y,
                         int64_t block_size, int64_t scale_kind, int64_t threads) {
  if (!kHaveVnni)
    return ffi::Error(ffi::ErrorCode::kUnimplemented, "fp4_w4a8_matmul_kn: built without AVX-512 VNNI");
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = codes.dimensions()[1];
  if (scales.dimensions().size() != 2 ||
      (scales.element_type() != ffi::DataType::U8 && scales.element_type() != ffi::DataType::F8E4M3FN))
    return ffi::Error::InvalidArgument("fp4_w4a8_matmul_kn: scales must be a 2-D u8 or float8_e4m3fn buffer");
  if (block_size < 4 || block_size % 4 || block_size > 64 || K % block_size || codes.dimensions()[0] * 2 != K ||
      scales.dimensions()[0] * block_size != K || scales.dimensions()[1] != N || (scale_kind != 0 && scale_kind != 1))
    return ffi::Error::InvalidArgument("fp4_w4a8_matmul_kn: shapes do not fit the block size");
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  const auto* sp = static_cast<const uint8_t*>(scales.untyped_data());
  (scale_kind == 0 ? w4a8_kn<0> : w4a8_kn<1>)(pool, x.typed_data(), M, K, codes.typed_data(), sp, block_size,
                                              *tensor_scale.typed_data(), N, y->typed_data(), threads);
#endif
  return ffi::Error::Success();
}

ffi::Error Int8HeadMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::U8, 2> panels,
                          ffi::Buffer<ffi::F32, 1> scale, ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  if (!kHaveVnni)
    return ffi::Error(ffi::ErrorCode::kUnimplemented, "int8_head_matmul: built without AVX-512 VNNI");
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = scale.dimensions()[0];
  const int64_t Kp = (K + 31) / 32 * 32, passes = ((N + 15) / 16 + 3) / 4;
  if (panels.dimensions()[0] != passes * 4 || panels.dimensions()[1] != Kp * 16 || y->dimensions()[1] != N)
    return ffi::Error::InvalidArgument("int8_head_matmul: panels must be u8[ceil(N / 64) * 4, round_up(K, 32) * 16]");
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  int8_head(pool, x.typed_data(), M, K, panels.typed_data(), scale.typed_data(), N, y->typed_data(), threads);
#endif
  return ffi::Error::Success();
}

}  // namespace

// Whether this build has the VNNI kernels (AVX-512 F + BW + VNNI); their handlers fail without them.
extern "C" int jaxserve_vnni_available() { return kHaveVnni ? 1 : 0; }

// Aliases: the handler macro cannot take template arguments with commas.
using W4a8F32Matrix = ffi::Buffer<ffi::F32, 2>;
using W4a8U8Matrix = ffi::Buffer<ffi::U8, 2>;
using W4a8F32Scalar = ffi::Buffer<ffi::F32, 0>;
using W4a8F32Vector = ffi::Buffer<ffi::F32, 1>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_int8_head_matmul, Int8HeadMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<W4a8F32Matrix>()
                                  .Arg<W4a8U8Matrix>()
                                  .Arg<W4a8F32Vector>()
                                  .Ret<W4a8F32Matrix>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_fp4_w4a8_matmul_kn, Fp4W4a8Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<W4a8F32Matrix>()
                                  .Arg<W4a8U8Matrix>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<W4a8F32Scalar>()
                                  .Ret<W4a8F32Matrix>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("scale_kind")
                                  .Attr<int64_t>("threads"));
