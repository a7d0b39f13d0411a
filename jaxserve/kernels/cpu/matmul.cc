// Weight-only CPU matmuls for decoding (few rows), as XLA FFI handlers: AVX-512 or AVX2+FMA, float32 sums.
//
//   jaxserve_bf16_matmul_kn:  y f32[M, N] = x f32[M, K] @ w bf16[K, N]          (a Dense kernel)
//   jaxserve_bf16_matmul_nk:  y f32[M, N] = x f32[M, K] @ e bf16[N, K]^T        (a tied embedding)
//   jaxserve_f32_matmul_kn / _nk: the same with float32 weights (x as it is, float32 FMAs)
//   jaxserve_fp4_matmul_kn:   y f32[M, N] = x f32[M, K] @ dequant(w)             (nvfp4 / mxfp4)
//       codes u8[K/2, N] (element 2i in the low nibble of row i, 2i+1 in the high one),
//       scales u8[K/bs, N] (E4M3 bytes: scale_kind 0, E8M0 bytes: scale_kind 1), tensor_scale f32[];
//       x_bf16 = 1: x holds bf16 values (vdpbf16ps products), else float32 FMAs.
//   jaxserve_fp4_matmul_nk:   y f32[M, N] = x f32[M, K] @ dequant(e)^T, e [N, K] quantized along K (a tied
//       embedding as the LM head): codes u8[N, K/2] (k = 2i, 2i+1 in byte i), scales u8[N, K/bs], bs | 128.
//   jaxserve_f32_gemm_kn / _nk: the f32 layouts above for many rows (batched decode, prefill), by OpenBLAS's
//       cblas_sgemm, whose address Python hands over once (jaxserve_set_sgemm): no link-time dependency.
//
// The weights are read once, as stored (no float32 copy): bf16 is widened in registers
// (a 16-bit shift), float32 loaded as it is (the same loops, templated on the weight type); FP4 codes are decoded
// with 16-entry tables to their exact E2M1 values, scale bytes by integer ops to exactly decode_e4m3 / decode_e8m0
// times the tensor scale. The
// AVX-512 float32-x path multiplies each by its block scale times the tensor scale, exactly the
// float32 weight the jnp reference dequantizes to, so only the summation order differs from XLA's
// dot; its bf16-x path and the AVX2 kernel sum each block's unscaled products, then multiply the
// block sum by the scale (one more rounding per block; see the AVX2 FP4 section).
//
// Work is split into column chunks (rows of e for _nk) run on XLA's intra-op thread pool by
// parallel_chunks (parallel.h).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "fp4_scales.h"
#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

using jaxserve::parallel_chunks;
#if defined(__AVX512F__) && defined(__AVX512BW__)
using jaxserve::fp4_scales16;
#endif

// Rows of x in groups of up to 4 over one chunk (the chunk's weights stay in L1/L2 between groups).
template <int G = 4, class Tile>
void rows_in_groups(int64_t M, const Tile& tile) {
  static_assert(G == 2 || G == 4);
  int64_t m = 0;
  for (; m + G <= M; m += G) tile(m, std::integral_constant<int, G>());
  switch (M - m) {
    case 3: tile(m, std::integral_constant<int, 3>()); break;
    case 2: tile(m, std::integral_constant<int, 2>()); break;
    case 1: tile(m, std::integral_constant<int, 1>()); break;
    default: break;
  }
}

constexpr int64_t kRowsPerChunk = 64;  // rows of e per work chunk of the [N, K] (tied embedding) kernel

// The [N, K] kernel's work: chunks of kRowsPerChunk rows of e, VT rows at a time (then one at a time for the rest),
// each against the rows of x in groups of up to G: tile(m, v, mt, vt), mt and vt std::integral_constant<int, ...>.
template <int G, int VT, class Tile>
void nk_tiles(ffi::ThreadPool& pool, int64_t M, int64_t N, int64_t threads, const Tile& tile) {
  parallel_chunks(pool, (N + kRowsPerChunk - 1) / kRowsPerChunk, threads, [&](int64_t c) {
    const int64_t v_end = std::min(N, (c + 1) * kRowsPerChunk);
    int64_t v = c * kRowsPerChunk;
    for (; v + VT <= v_end; v += VT)
      rows_in_groups<G>(M, [&](int64_t m, auto mt) { tile(m, v, mt, std::integral_constant<int, VT>()); });
    for (; v < v_end; ++v)
      rows_in_groups<G>(M, [&](int64_t m, auto mt) { tile(m, v, mt, std::integral_constant<int, 1>()); });
  });
}

// x f32[M, K] -> f32[M, Kp], each element through f, zero padded to Kp = K rounded up to `multiple`: the _nk tiles
// load whole vectors of x, and the pad multiplies the zeros a masked load puts past a row of e.
template <class F>
std::vector<float> x_padded(const float* x, int64_t M, int64_t K, int64_t multiple, const F& f, int64_t* kp_out) {
  const int64_t Kp = (K + multiple - 1) / multiple * multiple;
  std::vector<float> out(M * Kp, 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * Kp + k] = f(x[m * K + k]);
  *kp_out = Kp;
  return out;
}

inline float as_is(float v) { return v; }

// ---- block-scaled FP4: the E2M1 values and the scale byte decoders (the kernels' vector decoders match these bit
// for bit: tests/kernels/cpu_matmul_guard_pages.cc) ----
const float kE2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

float decode_e4m3(int b) {
  const int exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return NAN;
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return (b & 128) ? -mag : mag;
}

float decode_e8m0(int b) { return b == 255 ? NAN : std::ldexp(1.0f, b - 127); }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
// ======== AVX-512 F+BW+BF16 ========

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(left, 0)) - 1);
}

inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// ---- bf16 weights: x rounded to bf16 pairs, products summed by vdpbf16ps ----
// x f32[M, K] -> u32[M, Kp/2]: bf16(x[2p]) | bf16(x[2p+1]) << 16 (round to nearest even), zero padded
// to Kp = K rounded up to 32. Those are the operands XLA's bf16 dot multiplies; the products are exact.
std::vector<uint32_t> x_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t* kp_out) {
  const int64_t Kp = (K + 31) / 32 * 32;
  std::vector<uint32_t> out(M * Kp / 2, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; k += 32) {
      const __mmask16 m0 = tail_mask(K - k), m1 = tail_mask(K - k - 16);
      const __m512 a = _mm512_maskz_loadu_ps(m0, x + m * K + k), b = _mm512_maskz_loadu_ps(m1, x + m * K + k + 16);
      _mm512_storeu_si512(out.data() + m * Kp / 2 + k / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  *kp_out = Kp;
  return out;
}

inline __mmask32 tail_mask32(int64_t left) {
  return left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1ull << std::max<int64_t>(left, 0)) - 1);
}

// Software prefetches go to L2 (prefetcht1): on a 2-core AMD EPYC (Zen 4) VM prefetcht0 into L1 left one thread at
// about half the bandwidth (the machine loaded: [K, N] 576x1536 streamed by rows 6.8 -> 9.8 GB/s, the [N, K] tied
// head 5.0 -> 8.9 GB/s), perhaps for L1's few miss buffers; the loads that follow find the lines in L2.
constexpr _mm_hint kPrefetchHint = _MM_HINT_T1;

// [K, N] layout, streamed by rows: a chunk of columns walks its row segments (the whole row when one chunk spans N),
// kPassPairs row pairs per pass, the sums of every row of x kept in L1 (bf16_kn_chunk's sums). Tiles of 64 columns
// walking all K rows (2 lines a row, rows 2 N bytes apart) streamed ~9.5 GB/s on one thread where this reaches
// ~20 (same VM, M = 1 and 2). Rows 2p and 2p+1 are interleaved (vpunpck{l,h}wd) into bf16 pairs; a 32-column group's
// sums lo and hi hold columns {8L+r} and {8L+4+r}, put back in order at the store. Each y[m, n] sums its row pairs
// in order, one vdpbf16ps a pair, whatever M, the chunking or the threads.
constexpr int kPassPairs = 4;        // row pairs of w per pass over a chunk
constexpr int64_t kKnAhead = 32;     // rows prefetched ahead
constexpr int64_t kSumFloats = 6144;  // the sums of a chunk (24 KB): width x rows of x, each row padded (kSumPad)
constexpr int64_t kSumPad = 16;      // floats after each row of sums: rows 4 KB apart would share L1 sets

// Row pairs [p, p + R) (pr of them complete: the last row of an odd K pairs with zeros) of the columns
// [n0, n0 + width) into sums[m * row + c] for the rows m < MX of x.
template <int R>
void bf16_kn_pass(const uint32_t* xp, int64_t Kp2, int64_t MX, const uint16_t* w, int64_t N, int64_t p, int pr,
                  int64_t n0, int64_t width, float* sums, int64_t row) {
  const uint16_t* wp = w + 2 * p * N + n0;
  for (int64_t c = 0; c < width; c += 32) {
    const __mmask32 mask = tail_mask32(width - c);
    __m512bh lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      // One line of each row kKnAhead rows on (prefetching past the end of the buffer is harmless: prefetches never
      // fault).
      _mm_prefetch(reinterpret_cast<const char*>(wp + (2 * r + kKnAhead) * N + c), kPrefetchHint);
      _mm_prefetch(reinterpret_cast<const char*>(wp + (2 * r + 1 + kKnAhead) * N + c), kPrefetchHint);
      const __m512i a = _mm512_maskz_loadu_epi16(mask, wp + 2 * r * N + c);
      const __m512i b = r < pr ? _mm512_maskz_loadu_epi16(mask, wp + (2 * r + 1) * N + c) : _mm512_setzero_si512();
      lo[r] = (__m512bh)_mm512_unpacklo_epi16(a, b);
      hi[r] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    for (int64_t m = 0; m < MX; ++m) {
      float* s = sums + m * row + c;
      __m512 l = _mm512_load_ps(s), h = _mm512_load_ps(s + 16);
      for (int r = 0; r < R; ++r) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[m * Kp2 + p + r]));
        l = _mm512_dpbf16_ps(l, lo[r], xb);
        h = _mm512_dpbf16_ps(h, hi[r], xb);
      }
      _mm512_store_ps(s, l);
      _mm512_store_ps(s + 16, h);
    }
  }
}

// y[m, n0 .. n0 + width) for the rows m < MX of x (MX x row floats of sums fit in kSumFloats).
void bf16_kn_chunk(const uint32_t* xp, int64_t Kp2, int64_t MX, int64_t K, const uint16_t* w, int64_t N, float* y,
                   int64_t n0, int64_t width) {
  alignas(64) float sums[kSumFloats];
  const int64_t row = (width + 31) / 32 * 32 + kSumPad;
  std::fill_n(sums, MX * row, 0.f);
  const int64_t pairs = K / 2;
  int64_t p = 0;
  for (; p + kPassPairs <= pairs; p += kPassPairs)
    bf16_kn_pass<kPassPairs>(xp, Kp2, MX, w, N, p, kPassPairs, n0, width, sums, row);
  for (; p < pairs; ++p) bf16_kn_pass<1>(xp, Kp2, MX, w, N, p, 1, n0, width, sums, row);
  if (K % 2) bf16_kn_pass<1>(xp, Kp2, MX, w, N, pairs, 0, n0, width, sums, row);  // x's pad is zero too
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t m = 0; m < MX; ++m)
    for (int64_t c = 0; c < width; c += 32) {
      const __mmask32 mask = tail_mask32(width - c);
      const __m512 l = _mm512_load_ps(sums + m * row + c), h = _mm512_load_ps(sums + m * row + c + 16);
      float* out = y + m * N + n0 + c;
      _mm512_mask_storeu_ps(out, __mmask16(mask), _mm512_permutex2var_ps(l, first, h));
      _mm512_mask_storeu_ps(out + 16, __mmask16(mask >> 16), _mm512_permutex2var_ps(l, second, h));
    }
}

void bf16_matmul_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N,
                    float* yp, int64_t threads) {
  if (M == 0 || N == 0) return;
  int64_t Kp;
  const std::vector<uint32_t> xb = x_bf16_pairs(x, M, K, &Kp);
  // Rows of x per sweep, and chunks of equal width (a multiple of 32 whose sums fit), their count a multiple of the
  // threads: one chunk a thread when they fit, so each streams whole row segments.
  const int64_t mx = std::min<int64_t>(M, 16), t = std::max<int64_t>(threads, 1);
  const int64_t span = (kSumFloats / mx - kSumPad) / 32 * 32;
  const int64_t chunks = ((N + span - 1) / span + t - 1) / t * t;
  const int64_t width = std::max<int64_t>(32, ((N + chunks - 1) / chunks + 31) / 32 * 32);
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    for (int64_t m = 0; m < M; m += mx)
      bf16_kn_chunk(xb.data() + m * Kp / 2, Kp / 2, std::min(mx, M - m), K, wp, N, yp + m * N, c * width,
                    std::min(width, N - c * width));
  });
}

// ---- float32 weights: x as it is, float32 FMAs (the products XLA's float32 dot sums) ----
// [K, N] layout: each row of the tile's 64 columns (4 vectors, 4 lines) times x[m, k] broadcast.
constexpr int64_t kChunk = 64;  // columns per work chunk of the float32 [K, N] kernel (a tile's width)

template <int MT>
void kn_tile(const float* x, int64_t Kp, int64_t K, const float* w, int64_t N, float* y, int64_t n0) {
  constexpr int NW = kChunk / 16;  // vectors of 16 columns
  __m512 acc[MT][NW];
  __mmask16 mask[NW];
  for (int j = 0; j < NW; ++j) mask[j] = tail_mask(N - n0 - 16 * j);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* wp = w + n0;
  for (int64_t k = 0; k < K; ++k, wp += N) {
    __m512 wv[NW];
    for (int j = 0; j < NW; ++j) {
      wv[j] = _mm512_maskz_loadu_ps(mask[j], wp + 16 * j);
      _mm_prefetch(reinterpret_cast<const char*>(wp + 16 * N + 16 * j), _MM_HINT_T0);  // the row 16 ahead
    }
    for (int i = 0; i < MT; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * Kp + k]);
      for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) _mm512_mask_storeu_ps(y + i * N + n0 + 16 * j, mask[j], acc[i][j]);
}

// How the [N, K] tile reads the weights as stored (W: uint16_t for bf16, float) and the x they multiply: kStep k
// per vector (one 64-byte line of a row of e either way); x_operands: x's rows, `stride` elements apart, zero
// padded to a whole vector; load: a vector of a row of e, zeros past the first `left` k; x_at: x's vector for k;
// madd: acc plus the products.
template <class W>
struct Weights;

template <>
struct Weights<uint16_t> {  // bf16: x rounded to bf16 pairs, products summed exactly by vdpbf16ps
  static constexpr int64_t kStep = 32;
  static std::vector<uint32_t> x_operands(const float* x, int64_t M, int64_t K, int64_t* stride) {
    int64_t Kp;
    std::vector<uint32_t> out = x_bf16_pairs(x, M, K, &Kp);
    *stride = Kp / 2;
    return out;
  }
  static __m512i load(const uint16_t* p, int64_t left) { return _mm512_maskz_loadu_epi16(tail_mask32(left), p); }
  static __m512i x_at(const uint32_t* row, int64_t k) { return _mm512_loadu_si512(row + k / 2); }
  static __m512 madd(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
};

template <>
struct Weights<float> {  // float32: x as it is, FMAs
  static constexpr int64_t kStep = 16;
  static std::vector<float> x_operands(const float* x, int64_t M, int64_t K, int64_t* stride) {
    return x_padded(x, M, K, 16, as_is, stride);
  }
  static __m512 load(const float* p, int64_t left) { return _mm512_maskz_loadu_ps(tail_mask(left), p); }
  static __m512 x_at(const float* row, int64_t k) { return _mm512_loadu_ps(row + k); }
  static __m512 madd(__m512 acc, __m512 w, __m512 x) { return _mm512_fmadd_ps(w, x, acc); }
};

template <class W>
void matmul_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* wp, int64_t N, float* yp,
               int64_t threads) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    bf16_matmul_kn(pool, x, M, K, wp, N, yp, threads);
  } else {
    int64_t stride;
    const auto xs = Weights<W>::x_operands(x, M, K, &stride);
    parallel_chunks(pool, (N + kChunk - 1) / kChunk, threads, [&](int64_t c) {
      rows_in_groups(M, [&](int64_t m, auto mt) {
        kn_tile<decltype(mt)::value>(xs.data() + m * stride, stride, K, wp, N, yp + m * N, c * kChunk);
      });
    });
  }
}

// [N, K] layout (rows of a tied embedding): VT rows of e against MT rows of x, summed across lanes at the end.
// (bf16: each row's pairs are adjacent already.)
template <class W, int MT, int VT, class X>
void nk_tile(const X* xp, int64_t stride, int64_t K, const W* e, float* y, int64_t N, int64_t v0) {
  using P = Weights<W>;
  __m512 acc[MT][VT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += P::kStep) {
    decltype(P::load(e, 0)) ev[VT];
    for (int j = 0; j < VT; ++j) ev[j] = P::load(e + (v0 + j) * K + k, K - k);
    // The rows 16 ahead: the hardware prefetcher alone left a single thread at ~8 GB/s, not ~20 (bf16).
    for (int j = 0; j < VT; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(e + (v0 + 16 + j) * K + k), kPrefetchHint);
    for (int i = 0; i < MT; ++i) {
      const auto xv = P::x_at(xp + i * stride, k);
      for (int j = 0; j < VT; ++j) acc[i][j] = P::madd(acc[i][j], ev[j], xv);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) y[i * N + v0 + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <class W>
void matmul_nk(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* ep, int64_t N, float* yp,
               int64_t threads) {
  int64_t stride;
  const auto xs = Weights<W>::x_operands(x, M, K, &stride);
  nk_tiles<4, 4>(pool, M, N, threads, [&](int64_t m, int64_t v, auto mt, auto vt) {
    nk_tile<W, decltype(mt)::value, decltype(vt)::value>(xs.data() + m * stride, stride, K, ep, yp + m * N, N, v);
  });
}

// ---- block-scaled FP4 [K, N]: streamed by rows, as bf16_kn_pass ----
// A chunk of columns walks its codes row segments (the whole row when one chunk spans N: a block's bs/2 rows are
// then one contiguous stretch), prefetching kFp4Ahead rows ahead into L2, the sums of every row of x in L1 buffers.
// Tiles of 64 columns walking all K/2 codes rows (one 64-byte line a row, rows N bytes apart, prefetched into L1)
// read ~4 GB/s of codes on one thread of the 2-core Zen 4 VM (q/o 576x576, M = 1: 45 us per matmul; see
// benchmarks/cpu_fp4_kn.cc). A block's scale bytes are decoded once per chunk into an L1 row of floats, by integer
// ops (fp4_scales16), not gathered from a table. Each y[m, n] sums in the order the tiles did, whatever M, the
// chunking or the threads:
// - float32 x: acc = fma(x[2r+1], e2m1 * s, fma(x[2r], e2m1 * s, acc)) a codes row r at a time, e2m1 * s the float32
//   dequantized weight (the jnp reference's);
// - bf16 x (x_bf16): per block, blk = vdpbf16ps(blk, (e2m1[2r], e2m1[2r+1]), (x[2r], x[2r+1])) from zero over the
//   block's rows, then acc = fma(blk, s, acc): exact products, one rounding per block more than the reference.
constexpr int64_t kFp4Ahead = 16;      // codes rows prefetched ahead (64 and more: slower on the 576-column layers)
constexpr int64_t kFp4ScaleAhead = 4;  // blocks of scale bytes prefetched ahead
constexpr int64_t kFp4Step = 64;       // columns per step of a pass: one 64-byte line of each codes row

// One chunk's L1 rows of floats, `row` apart: the block's scales [row], the sums acc [MX][row] and, for bf16 x, the
// block sums blk [MX][row]; and the chunk: columns [n0, n0 + width) of codes u8[K/2, N].
struct Fp4Chunk {
  float *scale, *acc, *blk;
  int64_t row;
  const uint8_t* codes;
  int64_t N, n0, width;
};

// 16 codes (columns c .. c + 16 of codes row r, zeros past the chunk) as 32-bit lanes.
inline __m512i fp4_codes16(const Fp4Chunk& ch, int64_t r, int64_t c) {
  return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(tail_mask(ch.width - c), ch.codes + r * ch.N + ch.n0 + c));
}

inline void fp4_prefetch_row(const Fp4Chunk& ch, int64_t r, int64_t c) {
  // (Past the end of the buffer is harmless: prefetches never fault.)
  _mm_prefetch(reinterpret_cast<const char*>(ch.codes + r * ch.N + ch.n0 + c), kPrefetchHint);
}

inline __mmask64 tail_mask64(int64_t left) {
  return left >= 64 ? __mmask64(~0ull) : __mmask64((1ull << std::max<int64_t>(left, 0)) - 1);
}

// Byte 0 (lo) and byte 1 (hi) of the bf16 E2M1 value of each code 0-15, in each 128-bit lane (vpshufb tables).
struct Fp4Bf16Tables {
  __m512i lo, hi;
};

Fp4Bf16Tables fp4_bf16_tables() {
  alignas(64) uint8_t lo[64], hi[64];
  for (int i = 0; i < 64; ++i) {
    uint32_t u;
    std::memcpy(&u, &kE2M1[i % 16], 4);  // E2M1 values are exact in bf16
    lo[i] = uint8_t(u >> 16);
    hi[i] = uint8_t(u >> 24);
  }
  return {_mm512_load_si512(lo), _mm512_load_si512(hi)};
}

// 64 codes (a line of a codes row: columns c .. c + 64) -> the bf16 pairs (E2M1 of the low nibble, of the high one)
// vdpbf16ps multiplies with (x[2r], x[2r+1]): 4 vpshufb look up both bytes of both nibbles' values, then vpunpck
// bytes to words, words to dwords. Within 128-bit lanes: w[j] holds columns {16 l + 4 j + q} at dword 4 l + q.
// (Measured alike, one core of the Zen 4 VM in L2: the old vpmovzxbd + vpermw a 16 columns, and vpermb (VBMI) spreading
// each code to a dword, vpsrlvw + vpternlogd making table indices, vpermb looking them up; vdpbf16ps alone, 4 a
// line, takes about half the time.)
inline void fp4_pairs64(__m512i code, const Fp4Bf16Tables& t, __m512bh (&w)[4]) {
  const __m512i nib = _mm512_set1_epi8(15);
  const __m512i lo = _mm512_and_si512(code, nib), hi = _mm512_and_si512(_mm512_srli_epi16(code, 4), nib);
  const __m512i l0 = _mm512_shuffle_epi8(t.lo, lo), h0 = _mm512_shuffle_epi8(t.hi, lo);
  const __m512i l1 = _mm512_shuffle_epi8(t.lo, hi), h1 = _mm512_shuffle_epi8(t.hi, hi);
  const __m512i a0 = _mm512_unpacklo_epi8(l0, h0), a1 = _mm512_unpackhi_epi8(l0, h0);  // low nibbles' bf16
  const __m512i b0 = _mm512_unpacklo_epi8(l1, h1), b1 = _mm512_unpackhi_epi8(l1, h1);  // high nibbles'
  w[0] = (__m512bh)_mm512_unpacklo_epi16(a0, b0);
  w[1] = (__m512bh)_mm512_unpackhi_epi16(a0, b0);
  w[2] = (__m512bh)_mm512_unpacklo_epi16(a1, b1);
  w[3] = (__m512bh)_mm512_unpackhi_epi16(a1, b1);
}

// bf16 x: codes rows [r, r + R) of the chunk into the block sums of x's rows m < MX (xp: bf16 pairs, Kp2 a row),
// in fp4_pairs64's column order. kFirst: the block's first rows (sums from zero); kLast: its last (acc += sums x the
// block's scales).
template <int R, bool kFirst, bool kLast>
void fp4_kn_pass_bf16(const uint32_t* xp, int64_t Kp2, int64_t MX, const Fp4Chunk& ch, int64_t r,
                      const Fp4Bf16Tables& t) {
  const uint8_t* cp = ch.codes + r * ch.N + ch.n0;
  for (int64_t c = 0; c < ch.width; c += kFp4Step) {
    const __mmask64 mask = tail_mask64(ch.width - c);
    __m512bh w[R][4];
    for (int i = 0; i < R; ++i) {
      fp4_prefetch_row(ch, r + i + kFp4Ahead, c);
      fp4_pairs64(_mm512_maskz_loadu_epi8(mask, cp + i * ch.N + c), t, w[i]);
    }
    for (int64_t m = 0; m < MX; ++m) {
      float* b = ch.blk + m * ch.row + c;
      __m512 v[4];
      for (int j = 0; j < 4; ++j) v[j] = kFirst ? _mm512_setzero_ps() : _mm512_load_ps(b + 16 * j);
      for (int i = 0; i < R; ++i) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[m * Kp2 + r + i]));
        for (int j = 0; j < 4; ++j) v[j] = _mm512_dpbf16_ps(v[j], w[i][j], xb);
      }
      float* a = ch.acc + m * ch.row + c;
      for (int j = 0; j < 4; ++j) {
        if (kLast) _mm512_store_ps(a + 16 * j, _mm512_fmadd_ps(v[j], _mm512_load_ps(ch.scale + c + 16 * j),
                                                              _mm512_load_ps(a + 16 * j)));
        else _mm512_store_ps(b + 16 * j, v[j]);
      }
    }
  }
}

// float32 x: codes rows [r, r + R) of the chunk, dequantized with the block's scales, into acc for x's rows m < MX,
// 32 columns a step (the prefetch of a line every other step).
template <int R>
void fp4_kn_pass_f32(const float* x, int64_t K, int64_t MX, const Fp4Chunk& ch, int64_t r) {
  const __m512 lut = _mm512_loadu_ps(kE2M1);
  for (int64_t c = 0; c < ch.width; c += 32) {
    __m512 lo[R][2], hi[R][2];
    const __m512 s[2] = {_mm512_load_ps(ch.scale + c), _mm512_load_ps(ch.scale + c + 16)};
    for (int i = 0; i < R; ++i) {
      if (c % kFp4Step == 0) fp4_prefetch_row(ch, r + i + kFp4Ahead, c);
      for (int j = 0; j < 2; ++j) {  // vpermps reads the low 4 bits of each index
        const __m512i code = fp4_codes16(ch, r + i, c + 16 * j);
        lo[i][j] = _mm512_mul_ps(_mm512_permutexvar_ps(code, lut), s[j]);
        hi[i][j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(code, 4), lut), s[j]);
      }
    }
    for (int64_t m = 0; m < MX; ++m) {
      float* a = ch.acc + m * ch.row + c;
      __m512 v[2] = {_mm512_load_ps(a), _mm512_load_ps(a + 16)};
      for (int i = 0; i < R; ++i) {
        const __m512 x0 = _mm512_set1_ps(x[m * K + 2 * (r + i)]), x1 = _mm512_set1_ps(x[m * K + 2 * (r + i) + 1]);
        for (int j = 0; j < 2; ++j) v[j] = _mm512_fmadd_ps(x1, hi[i][j], _mm512_fmadd_ps(x0, lo[i][j], v[j]));
      }
      _mm512_store_ps(a, v[0]);
      _mm512_store_ps(a + 16, v[1]);
    }
  }
}

// The bf16-x pass for rows [r, r + R) of a block of `rows` codes rows starting at r0.
template <int R>
void fp4_kn_pass_bf16_at(const uint32_t* xp, int64_t Kp2, int64_t MX, const Fp4Chunk& ch, int64_t r0, int64_t rows,
                         int64_t r, const Fp4Bf16Tables& tables) {
  const bool first = r == r0, last = r + R == r0 + rows;
  if (first && last) fp4_kn_pass_bf16<R, true, true>(xp, Kp2, MX, ch, r, tables);
  else if (first) fp4_kn_pass_bf16<R, true, false>(xp, Kp2, MX, ch, r, tables);
  else if (last) fp4_kn_pass_bf16<R, false, true>(xp, Kp2, MX, ch, r, tables);
  else fp4_kn_pass_bf16<R, false, false>(xp, Kp2, MX, ch, r, tables);
}

// The scales of block row srow (its chunk's columns) into ch.scale, in column order (float32 x) or in
// fp4_pairs64's (kPaired, bf16 x: dword 4 l + j of a line, 4 columns, goes to lane j, dword l of its 4 vectors).
template <int kKind, bool kPaired>
void fp4_block_scales(const uint8_t* srow, const Fp4Chunk& ch, __m512 ts) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (int64_t c = 0; c < ch.width; c += kFp4Step) {
    _mm_prefetch(reinterpret_cast<const char*>(srow + kFp4ScaleAhead * ch.N + c), kPrefetchHint);
    // Past the chunk: E4M3 0 or E8M0 127 (1.0), not E8M0's 0, the subnormal 2^-127: fp4_nk_scales says why.
    __m512i bytes = _mm512_mask_loadu_epi8(_mm512_set1_epi8(kKind ? 127 : 0), tail_mask64(ch.width - c), srow + c);
    if (kPaired) bytes = _mm512_permutexvar_epi32(order, bytes);
    float* out = ch.scale + c;
    _mm512_store_ps(out, fp4_scales16<kKind>(_mm512_castsi512_si128(bytes), ts));
    _mm512_store_ps(out + 16, fp4_scales16<kKind>(_mm512_extracti32x4_epi32(bytes, 1), ts));
    _mm512_store_ps(out + 32, fp4_scales16<kKind>(_mm512_extracti32x4_epi32(bytes, 2), ts));
    _mm512_store_ps(out + 48, fp4_scales16<kKind>(_mm512_extracti32x4_epi32(bytes, 3), ts));
  }
}

// Row m of the sums to y, in column order (kPaired: from fp4_pairs64's, a 4 x 4 transpose of 128-bit lanes).
template <bool kPaired>
void fp4_store_row(const Fp4Chunk& ch, const float* sums, float* y) {
  for (int64_t c = 0; c < ch.width; c += kFp4Step) {
    __m512 o[4];
    for (int j = 0; j < 4; ++j) o[j] = _mm512_load_ps(sums + c + 16 * j);
    if (kPaired) {
      const __m512 a = _mm512_shuffle_f32x4(o[0], o[1], 0x44), b = _mm512_shuffle_f32x4(o[2], o[3], 0x44),
                   d = _mm512_shuffle_f32x4(o[0], o[1], 0xEE), e = _mm512_shuffle_f32x4(o[2], o[3], 0xEE);
      o[0] = _mm512_shuffle_f32x4(a, b, 0x88);
      o[1] = _mm512_shuffle_f32x4(a, b, 0xDD);
      o[2] = _mm512_shuffle_f32x4(d, e, 0x88);
      o[3] = _mm512_shuffle_f32x4(d, e, 0xDD);
    }
    for (int j = 0; j < 4; ++j)
      _mm512_mask_storeu_ps(y + ch.n0 + c + 16 * j, tail_mask(ch.width - c - 16 * j), o[j]);
  }
}

// y[m, n0 .. n0 + width) for x's rows m < MX: x float32 [MX, K], or (xp non-null) bf16 pairs [MX, Kp2].
template <int kKind>
void fp4_kn_chunk(const float* x, const uint32_t* xp, int64_t Kp2, int64_t MX, int64_t K, const uint8_t* scales,
                  int64_t bs, float ts, float* y, Fp4Chunk ch, float* buffer) {
  ch.scale = buffer;
  ch.acc = buffer + ch.row;
  ch.blk = ch.acc + MX * ch.row;
  std::fill_n(ch.acc, MX * ch.row, 0.f);
  const Fp4Bf16Tables tables = fp4_bf16_tables();
  const __m512 vts = _mm512_set1_ps(ts);
  const int64_t rows = bs / 2;
  for (int64_t b = 0; b < K / bs; ++b) {
    const int64_t r0 = b * rows;
    int64_t r = r0;
    if (xp) {
      fp4_block_scales<kKind, true>(scales + b * ch.N + ch.n0, ch, vts);
      for (; r + 4 <= r0 + rows; r += 4) fp4_kn_pass_bf16_at<4>(xp, Kp2, MX, ch, r0, rows, r, tables);
      for (; r < r0 + rows; ++r) fp4_kn_pass_bf16_at<1>(xp, Kp2, MX, ch, r0, rows, r, tables);
    } else {
      fp4_block_scales<kKind, false>(scales + b * ch.N + ch.n0, ch, vts);
      for (; r + 4 <= r0 + rows; r += 4) fp4_kn_pass_f32<4>(x, K, MX, ch, r);
      for (; r < r0 + rows; ++r) fp4_kn_pass_f32<1>(x, K, MX, ch, r);
    }
  }
  for (int64_t m = 0; m < MX; ++m) {
    if (xp) fp4_store_row<true>(ch, ch.acc + m * ch.row, y + m * ch.N);
    else fp4_store_row<false>(ch, ch.acc + m * ch.row, y + m * ch.N);
  }
}

void fp4_kn(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t block_size, int64_t scale_kind, float ts, int64_t N, float* yp, bool x_bf16, int64_t threads) {
  if (M == 0 || N == 0) return;
  int64_t Kp = 0;
  const std::vector<uint32_t> xb = x_bf16 ? x_bf16_pairs(xp, M, K, &Kp) : std::vector<uint32_t>();
  // Rows of x per sweep, and chunks of equal width (a multiple of 32) whose L1 rows fit kSumFloats (the scales, and
  // one (float32 x) or two (bf16 x) rows of sums a row of x), their count a multiple of the threads.
  const int64_t mx = std::min<int64_t>(M, 16), t = std::max<int64_t>(threads, 1);
  const int64_t span = std::max<int64_t>(kFp4Step, (kSumFloats / (1 + mx * (x_bf16 ? 2 : 1)) - kSumPad) / kFp4Step *
                                                       kFp4Step);
  const int64_t chunks = ((N + span - 1) / span + t - 1) / t * t;
  const int64_t width = std::max<int64_t>(32, ((N + chunks - 1) / chunks + 31) / 32 * 32);
  const int64_t row = (width + kFp4Step - 1) / kFp4Step * kFp4Step + kSumPad;
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    alignas(64) float buffer[kSumFloats + 2 * kFp4Step];
    const Fp4Chunk ch{nullptr, nullptr, nullptr, row, cp, N, c * width, std::min(width, N - c * width)};
    for (int64_t m = 0; m < M; m += mx) {
      const auto run = [&](auto chunk) {
        chunk(xp + m * K, x_bf16 ? xb.data() + m * Kp / 2 : nullptr, Kp / 2, std::min(mx, M - m), K, sp, block_size,
              ts, yp + m * N, ch, buffer);
      };
      if (scale_kind == 0) run(fp4_kn_chunk<0>);
      else run(fp4_kn_chunk<1>);
    }
  });
}

// ---- block-scaled FP4 [N, K]: a tied embedding's rows e[v], quantized along K (the LM head) ----
// codes u8[N, K/2] (k = 2i, 2i+1 in byte i's low, high nibble), scales u8[N, K/bs], bs dividing 128 (16, 32).
// A row's 64-byte lines (128 k each) decode as the [K, N] kernel's (fp4_pairs64), so x is laid out once in that
// order (fp4_nk_x). y[m, v] sums, line by line in order, fma(block sums, block scale, acc) in 2 accumulators, then
// adds them across lanes: a lane's block sum chains its pairs of the line's vectors sharing that block (2 of 4 at
// bs = 16, all 4 at 32: fp4_nk_tile's GS), by vdpbf16ps from zero (bf16 x, exact products) or float32 FMAs; the
// same order whatever M, the chunking or the threads. (Scaling each vector's pair sums instead took twice the
// operations a row of x: the head at M = 16 22 ms, the bf16 one 14.)
constexpr int64_t kFp4NkAhead = 16;  // rows of e prefetched ahead

// x f32[M, K] -> per row of x, per line of 128 k, 4 vectors of 16 pairs in fp4_pairs64's order (pair 16 l + 4 j + q
// of the line at vector j, dword 4 l + q): bf16 pairs (x_bf16), else the even k's floats then the odd k's (8 vectors).
// Zero padded to whole lines. *line_words: 32-bit words per line (64 or 128).
std::vector<uint32_t> fp4_nk_x(const float* x, int64_t M, int64_t K, bool x_bf16, int64_t* lines_out) {
  const int64_t lines = (K + 127) / 128, per_line = x_bf16 ? 64 : 128;
  std::vector<uint32_t> out(M * lines * per_line, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t t = 0; t < lines; ++t)
      for (int p = 0; p < 64; ++p) {
        const int64_t k = 128 * t + 2 * p;
        const float a = k < K ? x[m * K + k] : 0.f, b = k + 1 < K ? x[m * K + k + 1] : 0.f;
        const int slot = 16 * ((p % 16) / 4) + 4 * (p / 16) + p % 4;  // vector j = (p % 16) / 4, dword 4 l + q
        uint32_t* line = out.data() + (m * lines + t) * per_line;
        if (x_bf16) {
          uint32_t ua, ub;
          std::memcpy(&ua, &a, 4);
          std::memcpy(&ub, &b, 4);
          line[slot] = (ua >> 16) | (ub & 0xFFFF0000u);  // x holds bf16 values: the truncation is exact
        } else {
          std::memcpy(&line[slot], &a, 4);
          std::memcpy(&line[64 + slot], &b, 4);
        }
      }
  *lines_out = lines;
  return out;
}

// Rows [v0, v0 + VT) of e against MT rows of x (xs: fp4_nk_x's, `xrow` words a row); sc: each row's decoded scales.
// GS = min(4, bs / 8) of a line's 4 pair vectors share their lanes' blocks: their pair sums are chained, then scaled.
template <bool kBf16X, int MT, int VT, int GS>
void fp4_nk_tile(const uint32_t* xs, int64_t xrow, int64_t K, const uint8_t* codes, const float* sc, int64_t scrow,
                 int64_t bs, const __m512i (&sidx)[4], float* y, int64_t N, int64_t v0, const Fp4Bf16Tables& t) {
  const int64_t rb = K / 2, lines = (K + 127) / 128;
  __m512 acc[MT][VT][2];
  for (int i = 0; i < MT; ++i)
    for (int u = 0; u < VT; ++u) acc[i][u][0] = acc[i][u][1] = _mm512_setzero_ps();
  for (int64_t l = 0; l < lines; ++l) {
    const __mmask64 mask = tail_mask64(rb - 64 * l);
    for (int u = 0; u < VT; ++u) {
      const uint8_t* row = codes + (v0 + u) * rb + 64 * l;
      _mm_prefetch(reinterpret_cast<const char*>(row + kFp4NkAhead * rb), kPrefetchHint);
      __m512bh w[4];
      fp4_pairs64(_mm512_maskz_loadu_epi8(mask, row), t, w);
      const __m512 blocks = _mm512_loadu_ps(sc + u * scrow + l * 128 / bs);
      __m512 s[4 / GS];
      for (int g = 0; g < 4 / GS; ++g) s[g] = _mm512_permutexvar_ps(sidx[g * GS], blocks);
      for (int i = 0; i < MT; ++i) {
        const uint32_t* xl = xs + i * xrow + l * (kBf16X ? 64 : 128);
        for (int g = 0; g < 4 / GS; ++g) {
          __m512 sum = _mm512_setzero_ps();
          for (int j = g * GS; j < (g + 1) * GS; ++j) {
            if (kBf16X) {
              sum = _mm512_dpbf16_ps(sum, w[j], (__m512bh)_mm512_loadu_si512(xl + 16 * j));
            } else {
              const __m512i wi = (__m512i)w[j];
              const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(wi, 16));
              const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(wi, _mm512_set1_epi32(int(0xFFFF0000u))));
              sum = _mm512_fmadd_ps(hi, _mm512_loadu_ps(reinterpret_cast<const float*>(xl + 64 + 16 * j)),
                                    _mm512_fmadd_ps(lo, _mm512_loadu_ps(reinterpret_cast<const float*>(xl + 16 * j)),
                                                    sum));
            }
          }
          acc[i][u][g % 2] = _mm512_fmadd_ps(sum, s[g], acc[i][u][g % 2]);
        }
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int u = 0; u < VT; ++u)
      y[i * N + v0 + u] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][u][0], acc[i][u][1]));
}

// Rows [v0, v0 + rows) of e's block scales, decoded, zeros past K / bs (the tile's last line loads 16 from its first
// block; a zero byte would decode to E8M0's subnormal 2^-127, and subnormal operands cost Zen 4 a microcode assist:
// the head 2.4 -> 6.4 ms at M = 1, mxfp4).
template <int kKind>
void fp4_nk_scales(const uint8_t* scales, int64_t nb, int64_t v0, int64_t rows, float ts, float* sc, int64_t scrow) {
  for (int64_t u = 0; u < rows; ++u)
    for (int64_t b = 0; b < scrow; b += 16) {
      const __mmask16 mask = tail_mask(nb - b);
      const __m512 s = fp4_scales16<kKind>(_mm_maskz_loadu_epi8(mask, scales + (v0 + u) * nb + b), _mm512_set1_ps(ts));
      _mm512_storeu_ps(sc + u * scrow + b, _mm512_maskz_mov_ps(mask, s));
    }
}

void fp4_nk(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t bs, int64_t scale_kind, float ts, int64_t N, float* yp, bool x_bf16, int64_t threads) {
  if (M == 0 || N == 0) return;
  int64_t lines;
  const std::vector<uint32_t> xs = fp4_nk_x(xp, M, K, x_bf16, &lines);
  const int64_t xrow = lines * (x_bf16 ? 64 : 128), nb = K / bs;
  const int64_t scrow = (nb + 16 + 15) / 16 * 16;  // a line's 16-float load from its first block stays inside
  __m512i sidx[4];  // the scale of pair 16 l + 4 j + q of a line: block (2 (16 l + 4 j + q)) / bs of the line's
  for (int j = 0; j < 4; ++j) {
    alignas(64) int32_t idx[16];
    for (int l = 0; l < 4; ++l)
      for (int q = 0; q < 4; ++q) idx[4 * l + q] = int32_t(2 * (16 * l + 4 * j + q) / bs);
    sidx[j] = _mm512_load_si512(idx);
  }
  const Fp4Bf16Tables t = fp4_bf16_tables();
  parallel_chunks(pool, (N + kRowsPerChunk - 1) / kRowsPerChunk, threads, [&](int64_t c) {
    const int64_t v0 = c * kRowsPerChunk, rows = std::min(kRowsPerChunk, N - v0);
    std::vector<float> sc(rows * scrow);  // the chunk's rows' scales, decoded once whatever M
    if (scale_kind == 0) fp4_nk_scales<0>(sp, nb, v0, rows, ts, sc.data(), scrow);
    else fp4_nk_scales<1>(sp, nb, v0, rows, ts, sc.data(), scrow);
    const auto run = [&](int64_t v, auto vt) {
      rows_in_groups<2>(M, [&](int64_t m, auto mt) {
        constexpr int MT = decltype(mt)::value, VT = decltype(vt)::value;
        const auto pick = [&](auto gs) {
          constexpr int GS = decltype(gs)::value;
          return x_bf16 ? fp4_nk_tile<true, MT, VT, GS> : fp4_nk_tile<false, MT, VT, GS>;
        };
        const auto tile = bs >= 32 ? pick(std::integral_constant<int, 4>())
                          : bs == 16 ? pick(std::integral_constant<int, 2>()) : pick(std::integral_constant<int, 1>());
        tile(xs.data() + m * xrow, xrow, K, cp, sc.data() + (v - v0) * scrow, scrow, bs, sidx, yp + m * N, N, v, t);
      });
    };
    int64_t v = v0;
    for (; v + 2 <= v0 + rows; v += 2) run(v, std::integral_constant<int, 2>());
    for (; v < v0 + rows; ++v) run(v, std::integral_constant<int, 1>());
  });
}

#elif defined(__AVX2__) && defined(__FMA__)
// ======== AVX2 + FMA ========
// 8 float32 lanes, 16 ymm registers. The _nk register tile keeps MT x kVecs accumulators plus the weight and x
// registers, so rows of x go in groups of up to 2 (rows_in_groups<2>) rather than 4. The _kn kernels (bf16, FP4)
// stream row segments into float32 sums in L1 instead (see kn_chunk). The bf16 and float32 kernels differ only in
// how a vector of weights is loaded (load_w8) and in x (x_operands); the FP4 kernel has its own loops below.

constexpr int kVecs = 4;  // rows of e per _nk tile

// Lanes [0, left) set, for vmaskmovps (left clamped to [0, 8]).
inline __m256i lane_mask(int64_t left) {
  const int n = int(std::clamp<int64_t>(left, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 elements of kBytes (1 or 2) bytes from p, zeros past the first `left`: one load when all 8 are there, else a
// copy of the valid ones only. AVX2 has no byte- or word-masked load, and a full load at a row's tail could read
// past the end of the buffer.
template <int kBytes>
inline __m128i load8(const void* p, int64_t left) {
  static_assert(kBytes == 1 || kBytes == 2);
  if (left >= 8)
    return kBytes == 2 ? _mm_loadu_si128(static_cast<const __m128i*>(p))
                       : _mm_loadl_epi64(static_cast<const __m128i*>(p));
  __m128i v = _mm_setzero_si128();
  if (left > 0) std::memcpy(&v, p, size_t(left) * kBytes);
  return v;
}

// The first `left` lanes of v to p (nothing when left <= 0).
inline void store8(float* p, __m256 v, int64_t left) {
  if (left >= 8) _mm256_storeu_ps(p, v);
  else if (left > 0) _mm256_maskstore_ps(p, lane_mask(left), v);
}

// 8 bf16 -> float32: zero-extend to 32 bits, shift into the high half.
inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 8 weights from p as float32, zeros past the first `left`: bf16 widened, float32 loaded (vmaskmovps at a tail: its
// masked-off lanes never fault).
inline __m256 load_w8(const uint16_t* p, int64_t left) { return widen_bf16(load8<2>(p, left)); }
inline __m256 load_w8(const float* p, int64_t left) {
  return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(left));
}

// ---- x: rounded to bf16 (kept as float32) for bf16 weights, products exact; as it is for float32 weights ----
// Round to the nearest bf16, ties to even (what XLA's f32 -> bf16 convert and vcvtne2ps2bf16 do; unlike the
// latter, bf16 subnormals are kept, as XLA keeps them). NaNs stay (quiet) NaNs.
inline float round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) u |= 0x00400000u;
  else u += 0x7FFFu + ((u >> 16) & 1);
  u &= 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// x f32[M, K] -> f32[M, Kp], Kp = K rounded up to 8: the operands of weights W (uint16_t: bf16, or float).
template <class W>
std::vector<float> x_operands(const float* x, int64_t M, int64_t K, int64_t* kp_out) {
  return x_padded(x, M, K, 8, std::is_same_v<W, uint16_t> ? round_to_bf16 : as_is, kp_out);
}

// [K, N] layout. Tiles of 32 columns walking all K rows (one 64-byte line per row, rows 2 * N bytes apart, as the
// AVX-512 path does with 64 columns) reached only ~5-6 GB/s on a 2-core AMD EPYC VM: too few bytes per row for
// the prefetchers. Instead a chunk of up to kSpan columns streams its row segments, kPassRows rows per pass,
// accumulating all rows of x in a float32 buffer (L1): 9-14 GB/s there, and the weights are read once per call
// whatever M. Each y[m, n] is still sum over k in order of x[m, k] * w[k, n], whatever the chunking or threads.
constexpr int64_t kSpan = 512;     // columns per chunk at most (1 KB of each bf16 row, 2 KB of a float32 one)
constexpr int kPassRows = 8;       // rows of w per pass over a chunk
constexpr int64_t kAhead = 32;     // rows prefetched ahead
constexpr int64_t kMaxXRows = 16;  // rows of x per sweep of the chunk (sums: 16 x kSpan floats = 32 KB)
// A row of sums holds kSpan floats and 16 more: with rows 2 KB apart, the sums of rows m and m + 2 shared their low
// 12 address bits, and 16 rows of x at float32 ran 5-25% slower (one thread, [576, 1536]: 580-720 -> 540 us).
constexpr int64_t kAccRow = kSpan + 16;

// Rows [k, k + R) of w's columns [n0, n0 + width) into acc[m][0, width) for the rows m < MX of x.
template <int R, class W>
void kn_pass(const float* x, int64_t Kp, int64_t MX, const W* w, int64_t N, int64_t k, int64_t n0, int64_t width,
             float (*acc)[kAccRow]) {
  const W* wp = w + k * N + n0;
  const auto step = [&](int64_t c, int64_t left) {
    if (c % (64 / sizeof(W)) == 0)  // one 64-byte line of each row kAhead rows on (past the end is harmless)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wp + (kAhead + r) * N + c), _MM_HINT_T0);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_w8(wp + r * N + c, left);
    for (int64_t m = 0; m < MX; ++m) {
      __m256 a = _mm256_load_ps(acc[m] + c);
      for (int r = 0; r < R; ++r) a = _mm256_fmadd_ps(_mm256_broadcast_ss(x + m * Kp + k + r), wv[r], a);
      _mm256_store_ps(acc[m] + c, a);
    }
  };
  int64_t c = 0;
  for (; c + 8 <= width; c += 8) step(c, 8);
  if (c < width) step(c, width - c);  // the buffer holds whole vectors: kSpan is a multiple of 8
}

template <class W>
void kn_chunk(const float* x, int64_t Kp, int64_t MX, int64_t K, const W* w, int64_t N, float* y, int64_t n0,
              int64_t width) {
  alignas(32) float acc[kMaxXRows][kAccRow];
  for (int64_t m = 0; m < MX; ++m) std::fill_n(acc[m], (width + 7) / 8 * 8, 0.f);
  int64_t k = 0;
  for (; k + kPassRows <= K; k += kPassRows) kn_pass<kPassRows>(x, Kp, MX, w, N, k, n0, width, acc);
  for (; k < K; ++k) kn_pass<1>(x, Kp, MX, w, N, k, n0, width, acc);
  for (int64_t m = 0; m < MX; ++m)
    for (int64_t c = 0; c < width; c += 8) store8(y + m * N + n0 + c, _mm256_load_ps(acc[m] + c), width - c);
}

template <class W>
void matmul_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* wp, int64_t N, float* yp,
               int64_t threads) {
  int64_t Kp;
  const std::vector<float> xr = x_operands<W>(x, M, K, &Kp);
  // Chunks of equal width (a multiple of 8, at most kSpan), their count a multiple of the threads.
  const int64_t t = std::max<int64_t>(threads, 1);
  const int64_t chunks = std::max<int64_t>(1, ((N + kSpan - 1) / kSpan + t - 1) / t * t);
  const int64_t width = std::max<int64_t>(8, ((N + chunks - 1) / chunks + 7) / 8 * 8);
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    for (int64_t m = 0; m < M; m += kMaxXRows)
      kn_chunk(xr.data() + m * Kp, Kp, std::min(kMaxXRows, M - m), K, wp, N, yp + m * N, c * width,
               std::min(width, N - c * width));
  });
}

// [N, K] layout (rows of a tied embedding): VT rows of e dotted with MT rows of x, 8 k per step, summed across
// lanes at the end.
template <int MT, int VT, class W>
void nk_tile(const float* x, int64_t Kp, int64_t K, const W* e, float* y, int64_t N, int64_t v0) {
  __m256 acc[MT][VT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) acc[i][j] = _mm256_setzero_ps();
  const auto step = [&](int64_t k, int64_t left) {  // left < 8 only at K's tail (x is zero padded there)
    __m256 ev[VT];
    for (int j = 0; j < VT; ++j) ev[j] = load_w8(e + (v0 + j) * K + k, left);
    if (k % (64 / sizeof(W)) == 0)  // the rows 16 ahead, once per 64-byte line
      for (int j = 0; j < VT; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(e + (v0 + 16 + j) * K + k), _MM_HINT_T0);
    for (int i = 0; i < MT; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * Kp + k);
      asm("" : "+x"(xv));  // one load of x, kept in a register: GCC otherwise folds it into each of the VT FMAs
      for (int j = 0; j < VT; ++j) acc[i][j] = _mm256_fmadd_ps(xv, ev[j], acc[i][j]);
    }
  };
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) step(k, 8);
  if (k < K) step(k, K - k);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) y[i * N + v0 + j] = hsum(acc[i][j]);
}

template <class W>
void matmul_nk(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* ep, int64_t N, float* yp,
               int64_t threads) {
  int64_t Kp;
  const std::vector<float> xr = x_operands<W>(x, M, K, &Kp);
  nk_tiles<2, kVecs>(pool, M, N, threads, [&](int64_t m, int64_t v, auto mt, auto vt) {
    nk_tile<decltype(mt)::value, decltype(vt)::value>(xr.data() + m * Kp, Kp, K, ep, yp + m * N, N, v);
  });
}

// ---- block-scaled FP4 [K, N]: float32 x times the dequantized float32 weight ----
// Decoding, not memory, bounds this kernel on AVX2: the first version (a code byte per 32-bit lane, vpermps +
// shifts + a sign xor per nibble, a multiply by the block scale per weight, scales gathered from a 256-entry table
// per 8 columns) streamed ~3 GB/s of packed weights on a 2-core AMD EPYC (Zen 3) VM, this one 7-8 GB/s (one
// thread, a C++ loop over weights beyond L3; benchmarks/cpu_matmul.py: ~2x). Per 32 columns of a codes row:
// - 32 nibbles per vpshufb: two 16-entry byte tables give the low and the high byte of each code's E2M1 value as
//   bf16 (exact: E2M1 values have 2 significant bits), vpunpck{l,h}bw joins them into bf16 words, and a shift
//   (even words) or a mask (odd words) makes float32 of them: no int -> float conversion, no per-weight
//   arithmetic. (A table of the float32's top byte alone cannot work, though all E2M1 values have 16 zero low
//   bits: that byte holds the sign and 7 of the 8 exponent bits only, so it reaches powers of 4; 1, 1.5, 3, 6
//   need the next byte too. fp16's top byte does hold them all, but vcvtph2ps was ~30% slower than the shifts.)
//   The shift and mask measured 5-8% faster than vpunpck{l,h}wd with zero. What is left is ~9 cycles per 64
//   weights, ~28 vector ops (13 shuffles and shifts, 8 FMAs, masks, loads); shifts done as vpmulld instead
//   changed nothing, so the op count, not one port, looks like the limit.
// - The block scale (x the tensor scale) is applied once per block and column: the products of x and the E2M1
//   values (exact inside the FMAs) are summed over the block, then acc = fma(block sum, scale, acc), one rounding.
//   The reference instead rounds each dequantized weight (E2M1 value x scale can need 25 bits) and sums x * weight:
//   K + K roundings against K + K / bs here, each <= 2^-24 of the sum of |products| so far. Same tolerance.
// - Block scales are decoded arithmetically, not gathered (a vgatherdps per 8 columns took ~1/3 of the time):
//   E4M3 bytes shifted into fp16 bit positions are the value times 2^-8 as an fp16, subnormals included, which
//   vcvtph2ps widens exactly; E8M0 bytes shifted into the float32 exponent, 0 and 255 patched. Both give
//   decode_e4m3(b) * ts and decode_e8m0(b) * ts bit for bit (tests/kernels/cpu_matmul_guard_pages.cc checks every
//   byte).
// - Column order: the unpacks work within 128-bit lanes, so a 32-column group's 4 float32 vectors hold columns
//   E0 = {0,2,4,6,16,18,20,22}, O0 = E0 + 1, E1 = E0 + 8, O1 = E0 + 9. The scale bytes are put in that order
//   (vpshufb + vpermd), the sums stay in it, and the store puts them back in column order once per call.
// - Streaming as matmul_kn: a chunk of up to kSpan columns is walked a block (bs/2 codes rows) at a time across all
//   of its columns, sums in a float32 L1 buffer, so the weights are read once per call, in long row segments.
//   Tiles of 64 columns for a single row of x (one prefetch per 64-byte line, half the per-tile work), else 32.
// y[m, n] = sum over blocks in order of scale x (sum over the block's k in order of x[m, k] * e2m1[k, n]), for
// any chunking or thread count.
constexpr int64_t kFp4Ahead = 32;  // codes rows prefetched ahead

struct Fp4Tables {
  __m256i lo, hi;  // byte 0 and byte 1 of the bf16 E2M1 value of each code 0-15, in both 128-bit lanes
};

Fp4Tables fp4_tables() {
  alignas(32) uint8_t lo[32], hi[32];
  for (int i = 0; i < 32; ++i) {
    uint32_t u;
    std::memcpy(&u, &kE2M1[i % 16], 4);  // the low 16 bits are zero: exact in bf16
    lo[i] = uint8_t(u >> 16);
    hi[i] = uint8_t(u >> 24);
  }
  return {_mm256_load_si256(reinterpret_cast<const __m256i*>(lo)),
          _mm256_load_si256(reinterpret_cast<const __m256i*>(hi))};
}

// 32 bytes at p, zeros past the first `left` (a copy of those only: a full load could read past the buffer).
template <bool kFull>
inline __m256i load32(const uint8_t* p, int64_t left) {
  if (kFull) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) uint8_t buf[32] = {};
  std::memcpy(buf, p, size_t(std::clamp<int64_t>(left, 0, 32)));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// 32 scale bytes (columns 0-31) -> block scale x tensor scale, float32, in the group order E0, O0, E1, O1.
// kind 0: E4M3, 1: E8M0 (the handler's scale_kind).
template <int kKind>
inline void fp4_scales(__m256i bytes, float ts, __m256 (&s)[4]) {
  // Within each lane, bytes to the order even columns 0-6, odd 1-7, even 8-14, odd 9-15, then the lanes' dwords
  // interleaved: 8-byte groups E0, O0, E1, O1.
  const __m256i in_lane = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,  //
                                           0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(bytes, in_lane),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m128i b01 = _mm256_castsi256_si128(b), b23 = _mm256_extracti128_si256(b, 1);
  const __m256 vts = _mm256_set1_ps(ts);
#ifdef __F16C__
  if (kKind == 0) {
    // b << 7 puts an E4M3 byte's exponent and mantissa in fp16's (bias 15 vs 7: the value times 2^-8, subnormals
    // too) and its sign at bit 14; adding bit 14 to itself moves the sign to bit 15. Magnitude 0x7F (NaN) gets
    // fp16 exponent 31. vcvtph2ps widens exactly; x 2^8 (exact) is decode_e4m3, then the tensor scale.
    const __m256i w[2] = {_mm256_cvtepu8_epi16(b01), _mm256_cvtepu8_epi16(b23)};
    for (int h = 0; h < 2; ++h) {
      const __m256i t = _mm256_slli_epi16(w[h], 7), mag = _mm256_and_si256(t, _mm256_set1_epi16(0x3F80));
      const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3F80)),
                                           _mm256_set1_epi16(0x7E00));
      const __m256i half = _mm256_or_si256(_mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000))), nan);
      const __m128i parts[2] = {_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1)};
      for (int p = 0; p < 2; ++p)
        s[2 * h + p] = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(parts[p]), _mm256_set1_ps(256.f)), vts);
    }
    return;
  }
#endif
  const __m128i q[4] = {b01, _mm_unpackhi_epi64(b01, b01), b23, _mm_unpackhi_epi64(b23, b23)};
  for (int j = 0; j < 4; ++j) {
    const __m256i d = _mm256_cvtepu8_epi32(q[j]);
    __m256i bits;
    if (kKind == 0) {
      // (No F16C: -march=native on a VM that hides it.) Normal E4M3 magnitudes are the byte's exponent and
      // mantissa in float32's, rebiased (+120); subnormals (exponent 0) are mantissa x 2^-9; 0x7F is NaN.
      const __m256i mag = _mm256_and_si256(d, _mm256_set1_epi32(0x7F));
      const __m256 normal =
          _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
      const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.f / 512));
      const __m256 v =
          _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
      const __m256i nan =
          _mm256_and_si256(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)), _mm256_set1_epi32(0x7FC00000));
      bits = _mm256_or_si256(_mm256_or_si256(_mm256_castps_si256(v), nan),
                             _mm256_slli_epi32(_mm256_and_si256(d, _mm256_set1_epi32(0x80)), 24));
    } else {
      // 2^(b - 127) is b in the float32 exponent field; b = 0 is the subnormal 2^-127 (0x00400000), b = 255 NaN.
      const __m256i odd = _mm256_or_si256(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()),
                                          _mm256_cmpeq_epi32(d, _mm256_set1_epi32(255)));
      bits = _mm256_or_si256(_mm256_slli_epi32(d, 23), _mm256_and_si256(odd, _mm256_set1_epi32(0x00400000)));
    }
    s[j] = _mm256_mul_ps(_mm256_castsi256_ps(bits), vts);
  }
}

// Rows [r0, r0 + rows) of codes (one block), G x 32 columns from n0 (`left` of them inside the matrix; below 32 only
// for a tail, G = 1), times MT rows of x: acc[i][0 .. 32 G) += scale x block sum, in group order. Each sum takes
// one FMA per codes row and 32-column group for each of x's 2 elements, k in order, in every tile shape: which tile
// a column lands in depends on M (pairs of rows, 64-column tiles at M = 1, tails), its sums must not. (A tile of
// MT = G = 1 once kept the even and odd k apart, two chains added at the end, for the FMA latency: a row's columns
// then summed differently alone and in a batch, on the CPUs that run this AVX2 kernel.)
template <int kKind, int MT, int G, bool kFull>
inline void fp4_block_rows(const float* x, int64_t K, const uint8_t* codes, const uint8_t* scale_row, float ts,
                           int64_t N, int64_t r0, int64_t rows, int64_t n0, int64_t left, bool prefetch,
                           const Fp4Tables& t, float* acc) {
  static_assert(MT * G <= 2 && (kFull || G == 1));
  constexpr int P = 1;  // chains per sum (see above)
  __m256 sum[MT][P][4 * G];
  for (int i = 0; i < MT; ++i)
    for (int p = 0; p < P; ++p)
      for (int q = 0; q < 4 * G; ++q) sum[i][p][q] = _mm256_setzero_ps();
  const uint8_t* cp = codes + r0 * N + n0;
  for (int64_t r = r0; r < r0 + rows; ++r, cp += N) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(cp + kFp4Ahead * N), _MM_HINT_T0);
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
      const __m256i c = load32<kFull>(cp + 32 * g, left);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // low nibbles: k = 2r, high: 2r + 1
        const __m256i idx = _mm256_and_si256(h ? _mm256_srli_epi16(c, 4) : c, _mm256_set1_epi8(15));
        const __m256i lo = _mm256_shuffle_epi8(t.lo, idx), hi = _mm256_shuffle_epi8(t.hi, idx);
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          const __m256i w = u ? _mm256_unpackhi_epi8(lo, hi) : _mm256_unpacklo_epi8(lo, hi);  // bf16 words
          const __m256 f[2] = {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                               _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xFFFF0000u))))};
#pragma GCC unroll 2
          for (int i = 0; i < MT; ++i) {
            const __m256 xv = _mm256_broadcast_ss(x + i * K + 2 * r + h);
#pragma GCC unroll 2
            for (int e = 0; e < 2; ++e)
              sum[i][h % P][4 * g + 2 * u + e] = _mm256_fmadd_ps(xv, f[e], sum[i][h % P][4 * g + 2 * u + e]);
          }
        }
      }
    }
  }
  // The scales only now: live across the loop, their registers pushed sums to the stack.
  for (int g = 0; g < G; ++g) {
    __m256 s[4];
    fp4_scales<kKind>(load32<kFull>(scale_row + n0 + 32 * g, left), ts, s);
    for (int i = 0; i < MT; ++i)
      for (int q = 0; q < 4; ++q) {
        float* a = acc + i * kSpan + 32 * g + 8 * q;
        const __m256 v = sum[i][0][4 * g + q];
        const __m256 bsum = P == 2 ? _mm256_add_ps(v, sum[i][P - 1][4 * g + q]) : v;
        _mm256_store_ps(a, _mm256_fmadd_ps(bsum, s[q], _mm256_load_ps(a)));
      }
  }
}

// Block b of G 32-column groups from n0: the rows of x one at a time when G = 2, else in pairs.
template <int kKind, int G, bool kFull>
inline void fp4_block_group(const float* x, int64_t K, int64_t MX, const uint8_t* codes, const uint8_t* scales,
                            int64_t bs, float ts, int64_t N, int64_t b, int64_t n0, int64_t left, bool prefetch,
                            const Fp4Tables& t, float (*acc)[kSpan]) {
  const int64_t r0 = b * bs / 2, rows = bs / 2;
  const uint8_t* scale_row = scales + b * N;
  int64_t m = 0;
  if (G == 1)
    for (; m + 2 <= MX; m += 2)
      fp4_block_rows<kKind, 2, 1, kFull>(x + m * K, K, codes, scale_row, ts, N, r0, rows, n0, left, prefetch, t,
                                         acc[m]);
  for (; m < MX; ++m)
    fp4_block_rows<kKind, 1, G, kFull>(x + m * K, K, codes, scale_row, ts, N, r0, rows, n0, left, prefetch, t,
                                       acc[m]);
}

template <int kKind>
void fp4_kn_chunk(const float* x, int64_t MX, int64_t K, const uint8_t* codes, const uint8_t* scales, int64_t bs,
                  float ts, int64_t N, float* y, int64_t n0, int64_t width, const Fp4Tables& t) {
  alignas(32) float acc[kMaxXRows][kSpan];
  const int64_t groups = (width + 31) / 32, full = width / 32;
  const auto at = [&](int64_t g) { return reinterpret_cast<float(*)[kSpan]>(&acc[0][32 * g]); };
  for (int64_t m = 0; m < MX; ++m) std::fill_n(acc[m], 32 * groups, 0.f);
  for (int64_t b = 0; b < K / bs; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(scales + (b + 2) * N + n0), _MM_HINT_T0);
    int64_t g = 0;
    if (MX == 1)  // 64 columns a tile: one prefetch per 64-byte line of each codes row
      for (; g + 2 <= full; g += 2)
        fp4_block_group<kKind, 2, true>(x, K, MX, codes, scales, bs, ts, N, b, n0 + 32 * g, 64, true, t, at(g));
    for (; g < full; ++g)
      fp4_block_group<kKind, 1, true>(x, K, MX, codes, scales, bs, ts, N, b, n0 + 32 * g, 32, g % 2 == 0, t, at(g));
    if (full < groups)
      fp4_block_group<kKind, 1, false>(x, K, MX, codes, scales, bs, ts, N, b, n0 + 32 * full, width - 32 * full,
                                       full % 2 == 0, t, at(full));
  }
  for (int64_t m = 0; m < MX; ++m)
    for (int64_t g = 0; g < groups; ++g) {
      const float* a = acc[m] + 32 * g;
      const __m256 e0 = _mm256_load_ps(a), o0 = _mm256_load_ps(a + 8), e1 = _mm256_load_ps(a + 16),
                   o1 = _mm256_load_ps(a + 24);
      // columns {0-3, 16-19}, {4-7, 20-23}, {8-11, 24-27}, {12-15, 28-31}
      const __m256 c0 = _mm256_unpacklo_ps(e0, o0), c1 = _mm256_unpackhi_ps(e0, o0),
                   c2 = _mm256_unpacklo_ps(e1, o1), c3 = _mm256_unpackhi_ps(e1, o1);
      const __m256 out[4] = {_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c2, c3, 0x20),
                             _mm256_permute2f128_ps(c0, c1, 0x31), _mm256_permute2f128_ps(c2, c3, 0x31)};
      for (int j = 0; j < 4; ++j) store8(y + m * N + n0 + 32 * g + 8 * j, out[j], width - 32 * g - 8 * j);
    }
}

// x_bf16 has no separate path here: without vdpbf16ps there is nothing to gain, and bf16 values are exact in
// float32, so the float32 path computes the same products as the reference.
void fp4_kn(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t block_size, int64_t scale_kind, float ts, int64_t N, float* yp, bool /*x_bf16*/,
            int64_t threads) {
  const Fp4Tables t = fp4_tables();
  // Chunks of equal width (a multiple of 32, at most kSpan), their count a multiple of the threads.
  const int64_t nt = std::max<int64_t>(threads, 1);
  const int64_t chunks = std::max<int64_t>(1, ((N + kSpan - 1) / kSpan + nt - 1) / nt * nt);
  const int64_t width = std::max<int64_t>(32, ((N + chunks - 1) / chunks + 31) / 32 * 32);
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    for (int64_t m = 0; m < M; m += kMaxXRows) {
      const auto run = [&](auto chunk) {
        chunk(xp + m * K, std::min(kMaxXRows, M - m), K, cp, sp, block_size, ts, N, yp + m * N, c * width,
              std::min(width, N - c * width), t);
      };
      if (scale_kind == 0) run(fp4_kn_chunk<0>);
      else run(fp4_kn_chunk<1>);
    }
  });
}

// ---- block-scaled FP4 [N, K] (a tied embedding's rows, quantized along K: the LM head) ----
// Row by row, 8 k a step (4 code bytes: vpsrlvd spreads their nibbles, vpermps looks up |E2M1|, the sign xored in),
// x's products summed per block, then acc = fma(block sum, scale, acc), lanes summed at the end: whatever M, the
// chunking or the threads. (A plain fallback: the AVX-512 kernel is the one tuned.)
void fp4_nk(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t bs, int64_t scale_kind, float ts, int64_t N, float* yp, bool /*x_bf16*/, int64_t threads) {
  const __m256 magnitude = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), low4 = _mm256_set1_epi32(15);
  const int64_t rb = K / 2, nb = K / bs;
  parallel_chunks(pool, (N + kRowsPerChunk - 1) / kRowsPerChunk, threads, [&](int64_t c) {
    for (int64_t v = c * kRowsPerChunk; v < std::min(N, (c + 1) * kRowsPerChunk); ++v)
      for (int64_t m = 0; m < M; ++m) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
          __m256 blk = _mm256_setzero_ps();
          for (int64_t k = b * bs; k < (b + 1) * bs; k += 8) {
            int32_t word;
            std::memcpy(&word, cp + v * rb + k / 2, 4);
            const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), low4);
            const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(nib, 3), 31));
            const __m256 w = _mm256_xor_ps(_mm256_permutevar8x32_ps(magnitude, nib), sign);
            blk = _mm256_fmadd_ps(_mm256_loadu_ps(xp + m * K + k), w, blk);
          }
          const int byte = sp[v * nb + b];
          const float s = (scale_kind == 0 ? decode_e4m3(byte) : decode_e8m0(byte)) * ts;
          acc = _mm256_fmadd_ps(blk, _mm256_set1_ps(s), acc);
        }
        yp[m * N + v] = hsum(acc);
      }
  });
}

#else
#error "jaxserve CPU kernels need AVX-512 F+BW+BF16 or AVX2+FMA (-march=native on such a CPU)"
#endif

// ---- the FFI handlers: shape checks, then the implementation compiled above ----
// y = x @ w, w bf16/f32[K, N]; kNK: y = x @ w^T, w bf16/f32[N, K] (a tied embedding).
template <ffi::DataType kDT, bool kNK>
ffi::Error WeightMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<kDT, 2> w,
                        ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  static_assert(kDT == ffi::BF16 || kDT == ffi::F32);
  using W = std::conditional_t<kDT == ffi::BF16, uint16_t, float>;  // bf16 as its bits
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = w.dimensions()[kNK ? 0 : 1];
  if (w.dimensions()[kNK ? 1 : 0] != K)
    return ffi::Error::InvalidArgument(std::string(kDT == ffi::BF16 ? "bf16" : "f32") + "_matmul_" +
                                       (kNK ? "nk" : "kn") + ": K mismatch");
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  if (kNK) matmul_nk(pool, x.typed_data(), M, K, wp, N, y->typed_data(), threads);
  else matmul_kn(pool, x.typed_data(), M, K, wp, N, y->typed_data(), threads);
  return ffi::Error::Success();
}

// y = x @ dequant(w): kNK false: codes u8[K/2, N], scales u8[K/bs, N]; kNK: w [N, K] quantized along K (a tied
// embedding read as the LM head), codes u8[N, K/2], scales u8[N, K/bs], bs a divisor of 128 from 8 up. The scales
// may also come as float8_e4m3fn, as NVFP4 stores them: the kernel reads their bytes (a bitcast to u8 in the graph
// would be a copy, a thunk per matmul: ~2 ms of a 15 ms SmolLM2 decode step).
template <bool kNK>
ffi::Error Fp4Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::U8, 2> codes,
                     ffi::AnyBuffer scales, ffi::Buffer<ffi::F32, 0> tensor_scale,
                     ffi::ResultBuffer<ffi::F32, 2> y, int64_t block_size, int64_t scale_kind, int64_t x_bf16,
                     int64_t threads) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = codes.dimensions()[kNK ? 0 : 1];
  const int kk = kNK ? 1 : 0;  // the axis of K in codes and scales
  if (scales.dimensions().size() != 2 ||
      (scales.element_type() != ffi::DataType::U8 && scales.element_type() != ffi::DataType::F8E4M3FN))
    return ffi::Error::InvalidArgument(std::string("fp4_matmul_") + (kNK ? "nk" : "kn") +
                                       ": scales must be a 2-D u8 or float8_e4m3fn buffer");
  if (block_size < 2 || block_size % 2 || K % block_size || codes.dimensions()[kk] * 2 != K ||
      scales.dimensions()[kk] * block_size != K || scales.dimensions()[1 - kk] != N ||
      (kNK && (block_size < 8 || 128 % block_size)))
    return ffi::Error::InvalidArgument(std::string("fp4_matmul_") + (kNK ? "nk" : "kn") +
                                       ": shapes do not fit the block size");
  // The kernels decode the scale bytes to block scale times tensor scale, as the reference multiplies them.
  (kNK ? fp4_nk : fp4_kn)(pool, x.typed_data(), M, K, codes.typed_data(),
                          static_cast<const uint8_t*>(scales.untyped_data()), block_size,
                          scale_kind, *tensor_scale.typed_data(), N, y->typed_data(), x_bf16 != 0, threads);
  return ffi::Error::Success();
}

// ---- float32 GEMM by OpenBLAS: y = x @ w (w [K, N]) or x @ w^T (kNK: w [N, K]) ----
// Many rows make the product compute-bound, where OpenBLAS's packed, register-blocked sgemm beats XLA:CPU's dot
// (see jaxserve/layers.py). The threads attribute splits N into that many column blocks run on XLA's intra-op pool,
// each a one-thread sgemm (build.load_blas sets OpenBLAS to one thread: a second pool would compete for the cores).
using Sgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc);
std::atomic<Sgemm> g_sgemm{nullptr};
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;  // the CBLAS enum values
constexpr int64_t kGemmAlign = 64;  // column block widths are multiples of this (whole micro-kernel panels)

template <bool kNK>
ffi::Error F32Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::F32, 2> w,
                   ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  const Sgemm sgemm = g_sgemm.load();
  if (sgemm == nullptr)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "f32_gemm: jaxserve_set_sgemm was not called");
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = w.dimensions()[kNK ? 0 : 1];
  if (w.dimensions()[kNK ? 1 : 0] != K)
    return ffi::Error::InvalidArgument(std::string("f32_gemm_") + (kNK ? "nk" : "kn") + ": K mismatch");
  if (std::max({M, K, N}) > INT32_MAX)
    return ffi::Error::InvalidArgument("f32_gemm: a dimension exceeds OpenBLAS's 32-bit int");
  float* yp = y->typed_data();
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {  // nothing to sum; BLAS may leave C as it is when K == 0
    std::fill(yp, yp + M * N, 0.f);
    return ffi::Error::Success();
  }
  const int64_t parts = std::max<int64_t>(threads, 1);
  const int64_t width = ((N + parts - 1) / parts + kGemmAlign - 1) / kGemmAlign * kGemmAlign;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    const int64_t n0 = c * width, n = std::min(N, n0 + width) - n0;
    sgemm(kCblasRowMajor, kCblasNoTrans, kNK ? kCblasTrans : kCblasNoTrans, int(M), int(n), int(K), 1.f, xp, int(K),
          kNK ? wp + n0 * K : wp + n0, int(kNK ? K : N), 0.f, yp + n0, int(N));
  });
  return ffi::Error::Success();
}

}  // namespace

// Aliases: the handler macros cannot take template arguments with commas.
using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using U8Matrix = ffi::Buffer<ffi::U8, 2>;
using F32Scalar = ffi::Buffer<ffi::F32, 0>;

// One handler per weight type and layout, all binding (x, w) -> y and the thread count.
#define JAXSERVE_WEIGHT_MATMUL(name, dtype, w_matrix, nk)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, (WeightMatmul<ffi::dtype, nk>),                              \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<F32Matrix>()                                              \
                                    .Arg<w_matrix>()                                               \
                                    .Ret<F32Matrix>()                                              \
                                    .Attr<int64_t>("threads"));

JAXSERVE_WEIGHT_MATMUL(jaxserve_bf16_matmul_kn, BF16, Bf16Matrix, false)
JAXSERVE_WEIGHT_MATMUL(jaxserve_bf16_matmul_nk, BF16, Bf16Matrix, true)
JAXSERVE_WEIGHT_MATMUL(jaxserve_f32_matmul_kn, F32, F32Matrix, false)
JAXSERVE_WEIGHT_MATMUL(jaxserve_f32_matmul_nk, F32, F32Matrix, true)

#define JAXSERVE_F32_GEMM(name, nk)                                                                \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, F32Gemm<nk>,                                                 \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<F32Matrix>()                                              \
                                    .Arg<F32Matrix>()                                              \
                                    .Ret<F32Matrix>()                                              \
                                    .Attr<int64_t>("threads"));

JAXSERVE_F32_GEMM(jaxserve_f32_gemm_kn, false)
JAXSERVE_F32_GEMM(jaxserve_f32_gemm_nk, true)

// OpenBLAS's cblas_sgemm (any symbol prefix), set once by build.load_blas before the gemm handlers run.
extern "C" void jaxserve_set_sgemm(void* fn) { g_sgemm.store(reinterpret_cast<Sgemm>(fn)); }

#define JAXSERVE_FP4_MATMUL(name, nk)                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Fp4Matmul<nk>,                                               \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<F32Matrix>()                                              \
                                    .Arg<U8Matrix>()                                               \
                                    .Arg<ffi::AnyBuffer>()                                         \
                                    .Arg<F32Scalar>()                                              \
                                    .Ret<F32Matrix>()                                              \
                                    .Attr<int64_t>("block_size")                                   \
                                    .Attr<int64_t>("scale_kind")                                   \
                                    .Attr<int64_t>("x_bf16")                                       \
                                    .Attr<int64_t>("threads"));

JAXSERVE_FP4_MATMUL(jaxserve_fp4_matmul_kn, false)
JAXSERVE_FP4_MATMUL(jaxserve_fp4_matmul_nk, true)
