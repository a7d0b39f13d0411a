// Weight-only CPU matmuls for decoding (few rows), as XLA FFI handlers: AVX-512, float32 sums.
//
//   jaxserve_bf16_matmul_kn:  y f32[M, N] = x f32[M, K] @ w bf16[K, N]          (a Dense kernel)
//   jaxserve_bf16_matmul_nk:  y f32[M, N] = x f32[M, K] @ e bf16[N, K]^T        (a tied embedding)
//   jaxserve_fp4_matmul_kn:   y f32[M, N] = x f32[M, K] @ dequant(w)             (nvfp4 / mxfp4)
//       codes u8[K/2, N] (element 2i in the low nibble of row i, 2i+1 in the high one),
//       scales u8[K/bs, N] (E4M3 bytes: scale_kind 0, E8M0 bytes: scale_kind 1), tensor_scale f32[];
//       x_bf16 = 1: x holds bf16 values (vdpbf16ps products), else float32 FMAs.
//
// The weights are read once, as stored (no float32 copy): bf16 is widened in registers
// (a 16-bit shift), FP4 codes are decoded with a 16-entry table (vpermps) and multiplied by
// their block scale times the tensor scale, exactly the float32 weight the jnp reference
// dequantizes to; only the summation order differs from XLA's dot.
//
// Work is split into column chunks (rows of e for _nk) claimed from an atomic counter by the
// calling thread and by helpers scheduled on XLA's intra-op thread pool. The caller only waits
// for chunks a helper has claimed, so a helper that never runs cannot block it.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Progress {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// Runs body(chunk) for chunk in [0, n) on the caller and up to threads - 1 pool helpers.
template <class Body>
void parallel_chunks(ffi::ThreadPool& pool, int64_t n, int64_t threads, const Body& body) {
  if (threads <= 1 || n <= 1) {
    for (int64_t c = 0; c < n; ++c) body(c);
    return;
  }
  auto progress = std::make_shared<Progress>();
  // Helpers hold the shared counters; they touch body only after claiming a chunk, which
  // happens before the caller can return (it waits for every claimed chunk to finish).
  const Body* b = &body;
  for (int64_t t = 1; t < std::min(threads, n); ++t) {
    pool.Schedule([progress, b, n]() {
      for (int64_t c; (c = progress->next.fetch_add(1)) < n;) {
        (*b)(c);
        progress->done.fetch_add(1, std::memory_order_release);
      }
    });
  }
  for (int64_t c; (c = progress->next.fetch_add(1)) < n;) {
    body(c);
    progress->done.fetch_add(1, std::memory_order_release);
  }
  // A helper may have been descheduled mid-chunk (a busy machine): spin briefly, then give the core away.
  for (int spins = 0; progress->done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) _mm_pause();
    else std::this_thread::yield();
  }
}

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

// ---- block-scaled FP4: the E2M1 values and the scale byte decoders ----
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

// [K, N] layout: rows 2p and 2p+1 interleaved (vpunpck{l,h}wd) into bf16 pairs; the accumulators of
// one 32-column group hold columns {8L+r} (lo) and {8L+4+r} (hi), put back in order at the store.
template <int MT, int NG>
void bf16_kn_tile(const uint32_t* xp, int64_t Kp2, int64_t K, const uint16_t* w, int64_t N, float* y,
                  int64_t n0) {
  __m512 acc[MT][2 * NG];
  __mmask32 mask[NG];
  for (int g = 0; g < NG; ++g) mask[g] = tail_mask32(N - n0 - 32 * g);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < 2 * NG; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint16_t* wp = w + n0;
  const int64_t pairs = K / 2;
  for (int64_t p = 0; p < pairs; ++p, wp += 2 * N) {
    __m512bh lo[NG], hi[NG];
    for (int g = 0; g < NG; ++g) {
      const __m512i a = _mm512_maskz_loadu_epi16(mask[g], wp + 32 * g);
      const __m512i b = _mm512_maskz_loadu_epi16(mask[g], wp + N + 32 * g);
      // Rows 16 ahead (prefetching past the end of the buffer is harmless: prefetches never fault).
      _mm_prefetch(reinterpret_cast<const char*>(wp + 16 * N + 32 * g), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wp + 17 * N + 32 * g), _MM_HINT_T0);
      lo[g] = (__m512bh)_mm512_unpacklo_epi16(a, b);
      hi[g] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    for (int i = 0; i < MT; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[i * Kp2 + p]));
      for (int g = 0; g < NG; ++g) {
        acc[i][2 * g] = _mm512_dpbf16_ps(acc[i][2 * g], lo[g], xb);
        acc[i][2 * g + 1] = _mm512_dpbf16_ps(acc[i][2 * g + 1], hi[g], xb);
      }
    }
  }
  if (K % 2) {  // the last row pairs with zeros (x's pad is zero too)
    for (int g = 0; g < NG; ++g) {
      const __m512i a = _mm512_maskz_loadu_epi16(mask[g], wp + 32 * g), z = _mm512_setzero_si512();
      const __m512bh l = (__m512bh)_mm512_unpacklo_epi16(a, z), h = (__m512bh)_mm512_unpackhi_epi16(a, z);
      for (int i = 0; i < MT; ++i) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[i * Kp2 + pairs]));
        acc[i][2 * g] = _mm512_dpbf16_ps(acc[i][2 * g], l, xb);
        acc[i][2 * g + 1] = _mm512_dpbf16_ps(acc[i][2 * g + 1], h, xb);
      }
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < MT; ++i)
    for (int g = 0; g < NG; ++g) {
      float* out = y + i * N + n0 + 32 * g;
      _mm512_mask_storeu_ps(out, __mmask16(mask[g]), _mm512_permutex2var_ps(acc[i][2 * g], first, acc[i][2 * g + 1]));
      _mm512_mask_storeu_ps(out + 16, __mmask16(mask[g] >> 16),
                            _mm512_permutex2var_ps(acc[i][2 * g], second, acc[i][2 * g + 1]));
    }
}

constexpr int kNG = 2;            // groups of 32 columns per chunk
constexpr int64_t kChunk = 32 * kNG;

void bf16_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp,
             int64_t threads) {
  int64_t Kp;
  const std::vector<uint32_t> xb = x_bf16_pairs(x, M, K, &Kp);
  parallel_chunks(pool, (N + kChunk - 1) / kChunk, threads, [&](int64_t c) {
    rows_in_groups(M, [&](int64_t m, auto mt) {
      bf16_kn_tile<decltype(mt)::value, kNG>(xb.data() + m * Kp / 2, Kp / 2, K, wp, N, yp + m * N, c * kChunk);
    });
  });
}

// [N, K] layout (rows of a tied embedding): each row's pairs are adjacent already.
template <int MT, int VT>
void bf16_nk_tile(const uint32_t* xp, int64_t Kp2, int64_t K, const uint16_t* e, float* y, int64_t N,
                  int64_t v0) {
  __m512 acc[MT][VT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mk = tail_mask32(K - k);
    __m512bh ev[VT];
    for (int j = 0; j < VT; ++j) ev[j] = (__m512bh)_mm512_maskz_loadu_epi16(mk, e + (v0 + j) * K + k);
    // The rows 16 ahead: the hardware prefetcher alone left a single thread at ~8 GB/s, not ~20.
    for (int j = 0; j < VT; ++j) _mm_prefetch(reinterpret_cast<const char*>(e + (v0 + 16 + j) * K + k), _MM_HINT_T0);
    for (int i = 0; i < MT; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + i * Kp2 + k / 2);
      for (int j = 0; j < VT; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], ev[j], xv);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) y[i * N + v0 + j] = _mm512_reduce_add_ps(acc[i][j]);
}

void bf16_nk(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* ep, int64_t N, float* yp,
             int64_t threads) {
  int64_t Kp;
  const std::vector<uint32_t> xb = x_bf16_pairs(x, M, K, &Kp);
  nk_tiles<4, 4>(pool, M, N, threads, [&](int64_t m, int64_t v, auto mt, auto vt) {
    bf16_nk_tile<decltype(mt)::value, decltype(vt)::value>(xb.data() + m * Kp / 2, Kp / 2, K, ep, yp + m * N, N, v);
  });
}

template <int MT, int NW>
void fp4_kn_tile(const float* x, int64_t K, const uint8_t* codes, const uint8_t* scales, int64_t bs,
                 const float* scale_lut, int64_t N, float* y, int64_t n0) {
  const __m512 lut = _mm512_loadu_ps(kE2M1);
  const __m512i low4 = _mm512_set1_epi32(15);
  __m512 acc[MT][NW];
  __mmask16 mask[NW];
  for (int j = 0; j < NW; ++j) mask[j] = tail_mask(N - n0 - 16 * j);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / bs; ++b) {
    __m512 s[NW];
    for (int j = 0; j < NW; ++j) {
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[j], scales + b * N + n0 + 16 * j));
      s[j] = _mm512_i32gather_ps(idx, scale_lut, 4);
    }
    for (int64_t r = b * bs / 2; r < (b + 1) * bs / 2; ++r) {
      __m512 lo[NW], hi[NW];
      _mm_prefetch(reinterpret_cast<const char*>(codes + (r + 16) * N + n0), _MM_HINT_T0);
      for (int j = 0; j < NW; ++j) {
        const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[j], codes + r * N + n0 + 16 * j));
        lo[j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(c, low4), lut), s[j]);
        hi[j] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), lut), s[j]);
      }
      for (int i = 0; i < MT; ++i) {
        const __m512 x0 = _mm512_set1_ps(x[i * K + 2 * r]), x1 = _mm512_set1_ps(x[i * K + 2 * r + 1]);
        for (int j = 0; j < NW; ++j)
          acc[i][j] = _mm512_fmadd_ps(x1, hi[j], _mm512_fmadd_ps(x0, lo[j], acc[i][j]));
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) _mm512_mask_storeu_ps(y + i * N + n0 + 16 * j, mask[j], acc[i][j]);
}

// x as bf16 pairs (exact for bf16 activations): a packed row r holds the pair (2r, 2r+1) of each column, so
// one dword lane c | c << 12 indexes both nibbles' bf16 values with one vpermw (the word index reads 5
// bits: the table repeats its 16 entries). Products summed per block by vdpbf16ps, then scaled.
template <int MT, int NW>
void fp4_kn_tile_bf16(const uint32_t* xp, int64_t Kp2, int64_t K, const uint8_t* codes, const uint8_t* scales,
                      int64_t bs, const float* scale_lut, int64_t N, float* y, int64_t n0) {
  alignas(64) uint16_t table[32];
  for (int i = 0; i < 32; ++i) {
    uint32_t u;
    std::memcpy(&u, &kE2M1[i % 16], 4);
    table[i] = uint16_t(u >> 16);  // E2M1 values are exact in bf16
  }
  const __m512i lut = _mm512_load_si512(table);
  __m512 acc[MT][NW];
  __mmask16 mask[NW];
  for (int j = 0; j < NW; ++j) mask[j] = tail_mask(N - n0 - 16 * j);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < K / bs; ++b) {
    __m512 blk[MT][NW];
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < NW; ++j) blk[i][j] = _mm512_setzero_ps();
    for (int64_t r = b * bs / 2; r < (b + 1) * bs / 2; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (r + 16) * N + n0), _MM_HINT_T0);
      __m512bh w[NW];
      for (int j = 0; j < NW; ++j) {
        const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[j], codes + r * N + n0 + 16 * j));
        w[j] = (__m512bh)_mm512_permutexvar_epi16(_mm512_or_si512(c, _mm512_slli_epi32(c, 12)), lut);
      }
      for (int i = 0; i < MT; ++i) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[i * Kp2 + r]));
        for (int j = 0; j < NW; ++j) blk[i][j] = _mm512_dpbf16_ps(blk[i][j], w[j], xb);
      }
    }
    for (int j = 0; j < NW; ++j) {
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask[j], scales + b * N + n0 + 16 * j));
      const __m512 sc = _mm512_i32gather_ps(idx, scale_lut, 4);
      for (int i = 0; i < MT; ++i) acc[i][j] = _mm512_fmadd_ps(blk[i][j], sc, acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < NW; ++j) _mm512_mask_storeu_ps(y + i * N + n0 + 16 * j, mask[j], acc[i][j]);
}

void fp4_kn(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t block_size, const float* lut, int64_t N, float* yp, bool x_bf16, int64_t threads) {
  if (x_bf16) {
    int64_t Kp;
    const std::vector<uint32_t> xb = x_bf16_pairs(xp, M, K, &Kp);
    parallel_chunks(pool, (N + 63) / 64, threads, [&](int64_t c) {
      rows_in_groups<2>(M, [&](int64_t m, auto mt) {
        fp4_kn_tile_bf16<decltype(mt)::value, 4>(xb.data() + m * Kp / 2, Kp / 2, K, cp, sp, block_size, lut, N,
                                                 yp + m * N, c * 64);
      });
    });
    return;
  }
  parallel_chunks(pool, (N + 63) / 64, threads, [&](int64_t c) {
    rows_in_groups(M, [&](int64_t m, auto mt) {
      fp4_kn_tile<decltype(mt)::value, 4>(xp + m * K, K, cp, sp, block_size, lut, N, yp + m * N, c * 64);
    });
  });
}

#elif defined(__AVX2__) && defined(__FMA__)
// ======== AVX2 + FMA ========
// 8 float32 lanes. The register tiles (_nk, FP4) keep MT x kVecs accumulators plus the weight and x registers
// within the 16 ymm registers, so rows of x go in groups of up to 2 (rows_in_groups<2>) rather than 4.

constexpr int kVecs = 4;                 // 8-lane vectors per FP4 column chunk; rows of e per _nk tile
constexpr int64_t kChunk = 8 * kVecs;    // 32 columns per FP4 chunk (32 bytes of a codes row)

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

// Calls f(std::true_type()) when a tile's columns are all inside the matrix, else f(std::false_type()): full
// tiles compile without the tail checks of load8 / store8.
template <class F>
void full_or_tail(bool full, const F& f) {
  if (full) f(std::true_type());
  else f(std::false_type());
}

template <int MT>
void zero(__m256 (&acc)[MT][kVecs]) {
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < kVecs; ++j) acc[i][j] = _mm256_setzero_ps();
}

// acc[i][j] -> y[i, n0 + 8j ...], the columns below N only (left = N - n0).
template <int MT>
void store_tile(const __m256 (&acc)[MT][kVecs], float* y, int64_t N, int64_t n0, int64_t left) {
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < kVecs; ++j) store8(y + i * N + n0 + 8 * j, acc[i][j], left - 8 * j);
}

// ---- bf16 weights: x rounded to bf16 (kept as float32), products exact, float32 FMAs ----
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

// x f32[M, K] -> f32[M, Kp], rounded to bf16 and zero padded to Kp = K rounded up to 8, so that the _nk tile
// loads whole vectors of x.
std::vector<float> x_bf16_rounded(const float* x, int64_t M, int64_t K, int64_t* kp_out) {
  const int64_t Kp = (K + 7) / 8 * 8;
  std::vector<float> out(M * Kp, 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * Kp + k] = round_to_bf16(x[m * K + k]);
  *kp_out = Kp;
  return out;
}

// [K, N] layout. Tiles of 32 columns walking all K rows (one 64-byte line per row, rows 2 * N bytes apart, as the
// AVX-512 path does with 64 columns) reached only ~5-6 GB/s on a 2-core AMD EPYC VM: too few bytes per row for
// the prefetchers. Instead a chunk of up to kSpan columns streams its row segments, kPassRows rows per pass,
// accumulating all rows of x in a float32 buffer (L1): 9-14 GB/s there, and the weights are read once per call
// whatever M. Each y[m, n] is still sum over k in order of x[m, k] * w[k, n], whatever the chunking or threads.
constexpr int64_t kSpan = 512;     // columns per chunk at most (1 KB of each bf16 row)
constexpr int kPassRows = 8;       // rows of w per pass over a chunk
constexpr int64_t kAhead = 32;     // rows prefetched ahead
constexpr int64_t kMaxXRows = 16;  // rows of x per sweep of the chunk (sums: 16 x kSpan floats = 32 KB)

// Rows [k, k + R) of w's columns [n0, n0 + width) into acc[m][0, width) for the rows m < MX of x.
template <int R>
void bf16_kn_pass(const float* x, int64_t Kp, int64_t MX, const uint16_t* w, int64_t N, int64_t k, int64_t n0,
                  int64_t width, float (*acc)[kSpan]) {
  const uint16_t* wp = w + k * N + n0;
  const auto step = [&](int64_t c, int64_t left) {
    if (c % 32 == 0)  // one 64-byte line of each row kAhead rows on (past the end is harmless: no faults)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(wp + (kAhead + r) * N + c), _MM_HINT_T0);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = widen_bf16(load8<2>(wp + r * N + c, left));
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

void bf16_kn_chunk(const float* x, int64_t Kp, int64_t MX, int64_t K, const uint16_t* w, int64_t N, float* y,
                   int64_t n0, int64_t width) {
  alignas(32) float acc[kMaxXRows][kSpan];
  for (int64_t m = 0; m < MX; ++m) std::fill_n(acc[m], (width + 7) / 8 * 8, 0.f);
  int64_t k = 0;
  for (; k + kPassRows <= K; k += kPassRows) bf16_kn_pass<kPassRows>(x, Kp, MX, w, N, k, n0, width, acc);
  for (; k < K; ++k) bf16_kn_pass<1>(x, Kp, MX, w, N, k, n0, width, acc);
  for (int64_t m = 0; m < MX; ++m)
    for (int64_t c = 0; c < width; c += 8) store8(y + m * N + n0 + c, _mm256_load_ps(acc[m] + c), width - c);
}

void bf16_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp,
             int64_t threads) {
  int64_t Kp;
  const std::vector<float> xr = x_bf16_rounded(x, M, K, &Kp);
  // Chunks of equal width (a multiple of 8, at most kSpan), their count a multiple of the threads.
  const int64_t t = std::max<int64_t>(threads, 1);
  const int64_t chunks = std::max<int64_t>(1, ((N + kSpan - 1) / kSpan + t - 1) / t * t);
  const int64_t width = std::max<int64_t>(8, ((N + chunks - 1) / chunks + 7) / 8 * 8);
  parallel_chunks(pool, (N + width - 1) / width, threads, [&](int64_t c) {
    for (int64_t m = 0; m < M; m += kMaxXRows)
      bf16_kn_chunk(xr.data() + m * Kp, Kp, std::min(kMaxXRows, M - m), K, wp, N, yp + m * N, c * width,
                    std::min(width, N - c * width));
  });
}

// [N, K] layout (rows of a tied embedding): VT rows of e dotted with MT rows of x, 8 k per step, summed across
// lanes at the end.
template <int MT, int VT>
void bf16_nk_tile(const float* x, int64_t Kp, int64_t K, const uint16_t* e, float* y, int64_t N, int64_t v0) {
  __m256 acc[MT][VT];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) acc[i][j] = _mm256_setzero_ps();
  const auto step = [&](int64_t k, int64_t left) {  // left < 8 only at K's tail (x is zero padded there)
    __m256 ev[VT];
    for (int j = 0; j < VT; ++j) ev[j] = widen_bf16(load8<2>(e + (v0 + j) * K + k, left));
    if (k % 32 == 0)  // the rows 16 ahead, once per 64-byte line
      for (int j = 0; j < VT; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(e + (v0 + 16 + j) * K + k), _MM_HINT_T0);
    for (int i = 0; i < MT; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * Kp + k);
      for (int j = 0; j < VT; ++j) acc[i][j] = _mm256_fmadd_ps(xv, ev[j], acc[i][j]);
    }
  };
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) step(k, 8);
  if (k < K) step(k, K - k);
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < VT; ++j) y[i * N + v0 + j] = hsum(acc[i][j]);
}

void bf16_nk(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* ep, int64_t N, float* yp,
             int64_t threads) {
  int64_t Kp;
  const std::vector<float> xr = x_bf16_rounded(x, M, K, &Kp);
  nk_tiles<2, kVecs>(pool, M, N, threads, [&](int64_t m, int64_t v, auto mt, auto vt) {
    bf16_nk_tile<decltype(mt)::value, decltype(vt)::value>(xr.data() + m * Kp, Kp, K, ep, yp + m * N, N, v);
  });
}

// ---- block-scaled FP4 [K, N]: float32 x times the dequantized float32 weight ----
// The E2M1 values of the nibbles at bits [shift, shift + 4) of lanes c: codes 8-15 are codes 0-7 negated (8 is
// -0), so vpermps looks the magnitude up among kE2M1's first 8 entries by bits shift..shift+2 and bit shift+3
// sets the sign.
template <int kShift>
inline __m256 decode_e2m1(__m256i c, __m256 magnitudes) {
  const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, kShift ? _mm256_srli_epi32(c, kShift) : c);
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(c, 28 - kShift), _mm256_set1_epi32(INT32_MIN));
  return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
}

template <int MT, bool kFull>
void fp4_kn_tile(const float* x, int64_t K, const uint8_t* codes, const uint8_t* scales, int64_t bs,
                 const float* scale_lut, int64_t N, float* y, int64_t n0) {
  const __m256 magnitudes = _mm256_loadu_ps(kE2M1);
  const int64_t left = kFull ? kChunk : N - n0;
  __m256 acc[MT][kVecs];
  zero(acc);
  for (int64_t b = 0; b < K / bs; ++b) {
    __m256 s[kVecs];  // block scale x tensor scale per column
    for (int j = 0; j < kVecs; ++j) {
      const __m256i idx = _mm256_cvtepu8_epi32(load8<1>(scales + b * N + n0 + 8 * j, left - 8 * j));
      s[j] = _mm256_i32gather_ps(scale_lut, idx, 4);
    }
    for (int64_t r = b * bs / 2; r < (b + 1) * bs / 2; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + (r + 16) * N + n0), _MM_HINT_T0);
      for (int j = 0; j < kVecs; ++j) {
        const __m256i c = _mm256_cvtepu8_epi32(load8<1>(codes + r * N + n0 + 8 * j, left - 8 * j));
        const __m256 lo = _mm256_mul_ps(decode_e2m1<0>(c, magnitudes), s[j]);
        const __m256 hi = _mm256_mul_ps(decode_e2m1<4>(c, magnitudes), s[j]);
        for (int i = 0; i < MT; ++i) {
          const __m256 x0 = _mm256_broadcast_ss(x + i * K + 2 * r), x1 = _mm256_broadcast_ss(x + i * K + 2 * r + 1);
          acc[i][j] = _mm256_fmadd_ps(x1, hi, _mm256_fmadd_ps(x0, lo, acc[i][j]));
        }
      }
    }
  }
  store_tile(acc, y, N, n0, left);
}

// x_bf16 has no separate path here: without vdpbf16ps there is nothing to gain, and bf16 values are exact in
// float32, so the float32 path computes the same products as the reference.
void fp4_kn(ffi::ThreadPool& pool, const float* xp, int64_t M, int64_t K, const uint8_t* cp, const uint8_t* sp,
            int64_t block_size, const float* lut, int64_t N, float* yp, bool /*x_bf16*/, int64_t threads) {
  parallel_chunks(pool, (N + kChunk - 1) / kChunk, threads, [&](int64_t c) {
    full_or_tail(N - c * kChunk >= kChunk, [&](auto full) {
      rows_in_groups<2>(M, [&](int64_t m, auto mt) {
        fp4_kn_tile<decltype(mt)::value, decltype(full)::value>(xp + m * K, K, cp, sp, block_size, lut, N,
                                                                yp + m * N, c * kChunk);
      });
    });
  });
}

#else
#error "jaxserve CPU kernels need AVX-512 F+BW+BF16 or AVX2+FMA (-march=native on such a CPU)"
#endif

// ---- the FFI handlers: shape checks, then the implementation compiled above ----
// y = x @ w, w bf16[K, N]; kNK: y = x @ w^T, w bf16[N, K] (a tied embedding).
template <bool kNK>
ffi::Error Bf16Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::BF16, 2> w,
                      ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = w.dimensions()[kNK ? 0 : 1];
  if (w.dimensions()[kNK ? 1 : 0] != K)
    return ffi::Error::InvalidArgument(kNK ? "bf16_matmul_nk: K mismatch" : "bf16_matmul_kn: K mismatch");
  (kNK ? bf16_nk : bf16_kn)(pool, x.typed_data(), M, K, reinterpret_cast<const uint16_t*>(w.typed_data()), N,
                            y->typed_data(), threads);
  return ffi::Error::Success();
}

ffi::Error Fp4MatmulKn(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::U8, 2> codes,
                       ffi::Buffer<ffi::U8, 2> scales, ffi::Buffer<ffi::F32, 0> tensor_scale,
                       ffi::ResultBuffer<ffi::F32, 2> y, int64_t block_size, int64_t scale_kind,
                       int64_t x_bf16, int64_t threads) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = codes.dimensions()[1];
  if (block_size < 2 || block_size % 2 || K % block_size || codes.dimensions()[0] * 2 != K ||
      scales.dimensions()[0] * block_size != K || scales.dimensions()[1] != N)
    return ffi::Error::InvalidArgument("fp4_matmul_kn: shapes do not fit the block size");
  // Block scale times tensor scale, as the reference multiplies them before the values.
  float lut[256];
  const float ts = *tensor_scale.typed_data();
  for (int b = 0; b < 256; ++b) lut[b] = (scale_kind == 0 ? decode_e4m3(b) : decode_e8m0(b)) * ts;
  fp4_kn(pool, x.typed_data(), M, K, codes.typed_data(), scales.typed_data(), block_size, lut, N, y->typed_data(),
         x_bf16 != 0, threads);
  return ffi::Error::Success();
}

}  // namespace

// Aliases: the handler macros cannot take template arguments with commas.
using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using U8Matrix = ffi::Buffer<ffi::U8, 2>;
using F32Scalar = ffi::Buffer<ffi::F32, 0>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_bf16_matmul_kn, Bf16Matmul<false>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_bf16_matmul_nk, Bf16Matmul<true>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_fp4_matmul_kn, Fp4MatmulKn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<U8Matrix>()
                                  .Arg<U8Matrix>()
                                  .Arg<F32Scalar>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("scale_kind")
                                  .Attr<int64_t>("x_bf16")
                                  .Attr<int64_t>("threads"));
