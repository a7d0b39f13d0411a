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

constexpr int kNG = 2;            // groups of 32 columns per chunk
constexpr int64_t kChunk = 32 * kNG;

ffi::Error Bf16MatmulKn(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::BF16, 2> w,
                        ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = w.dimensions()[1];
  if (w.dimensions()[0] != K) return ffi::Error::InvalidArgument("bf16_matmul_kn: K mismatch");
  int64_t Kp;
  const std::vector<uint32_t> xb = x_bf16_pairs(x.typed_data(), M, K, &Kp);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.typed_data());
  float* yp = y->typed_data();
  parallel_chunks(pool, (N + kChunk - 1) / kChunk, threads, [&](int64_t c) {
    rows_in_groups(M, [&](int64_t m, auto mt) {
      bf16_kn_tile<decltype(mt)::value, kNG>(xb.data() + m * Kp / 2, Kp / 2, K, wp, N, yp + m * N, c * kChunk);
    });
  });
  return ffi::Error::Success();
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

constexpr int64_t kRowsPerChunk = 64;  // rows of e per work chunk

ffi::Error Bf16MatmulNk(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::BF16, 2> e,
                        ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = e.dimensions()[0];
  if (e.dimensions()[1] != K) return ffi::Error::InvalidArgument("bf16_matmul_nk: K mismatch");
  int64_t Kp;
  const std::vector<uint32_t> xb = x_bf16_pairs(x.typed_data(), M, K, &Kp);
  const uint16_t* ep = reinterpret_cast<const uint16_t*>(e.typed_data());
  float* yp = y->typed_data();
  parallel_chunks(pool, (N + kRowsPerChunk - 1) / kRowsPerChunk, threads, [&](int64_t c) {
    const int64_t v_end = std::min(N, (c + 1) * kRowsPerChunk);
    int64_t v = c * kRowsPerChunk;
    for (; v + 4 <= v_end; v += 4)
      rows_in_groups(M, [&](int64_t m, auto mt) {
        bf16_nk_tile<decltype(mt)::value, 4>(xb.data() + m * Kp / 2, Kp / 2, K, ep, yp + m * N, N, v);
      });
    for (; v < v_end; ++v)
      rows_in_groups(M, [&](int64_t m, auto mt) {
        bf16_nk_tile<decltype(mt)::value, 1>(xb.data() + m * Kp / 2, Kp / 2, K, ep, yp + m * N, N, v);
      });
  });
  return ffi::Error::Success();
}

// ---- block-scaled FP4 [K, N] ----
const float kE2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

float decode_e4m3(int b) {
  const int exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return NAN;
  const float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return (b & 128) ? -mag : mag;
}

float decode_e8m0(int b) { return b == 255 ? NAN : std::ldexp(1.0f, b - 127); }

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
  const float* xp = x.typed_data();
  const uint8_t* cp = codes.typed_data();
  const uint8_t* sp = scales.typed_data();
  float* yp = y->typed_data();
  if (x_bf16) {
    int64_t Kp;
    const std::vector<uint32_t> xb = x_bf16_pairs(xp, M, K, &Kp);
    parallel_chunks(pool, (N + 63) / 64, threads, [&](int64_t c) {
      rows_in_groups<2>(M, [&](int64_t m, auto mt) {
        fp4_kn_tile_bf16<decltype(mt)::value, 4>(xb.data() + m * Kp / 2, Kp / 2, K, cp, sp, block_size, lut, N,
                                                 yp + m * N, c * 64);
      });
    });
    return ffi::Error::Success();
  }
  parallel_chunks(pool, (N + 63) / 64, threads, [&](int64_t c) {
    rows_in_groups(M, [&](int64_t m, auto mt) {
      fp4_kn_tile<decltype(mt)::value, 4>(xp + m * K, K, cp, sp, block_size, lut, N, yp + m * N, c * 64);
    });
  });
  return ffi::Error::Success();
}

}  // namespace

// Aliases: the handler macros cannot take template arguments with commas.
using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using U8Matrix = ffi::Buffer<ffi::U8, 2>;
using F32Scalar = ffi::Buffer<ffi::F32, 0>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_bf16_matmul_kn, Bf16MatmulKn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<Bf16Matrix>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_bf16_matmul_nk, Bf16MatmulNk,
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
