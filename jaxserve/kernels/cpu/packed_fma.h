// The packed bf16 GEMM (packed.py's layout, packed_gemm.h's epilogues and norm) without AMX tiles: float32 FMAs in
// k order, on AVX-512F or AVX2 + FMA (GCC/Clang vector extensions of 16 lanes, as attention.cc). amx.cc's handler
// runs it where the CPU has no AMX-BF16 (Ice Lake, Cascade Lake, Skylake-X, Zen 2-4) or Linux refused the tiles.
//
// y[m, n] sums bf16(x[m, k]) * w[k, n] over k = 0, 1, .., K - 1 in that order into float32 from 0, each product exact
// (a product of two bf16 values fits a float32) and each addition rounded to nearest even: a float32 loop over k, bit
// for bit, whatever M, the blocking or the threads. (AMX's tiles sum in their own order: the two implementations agree
// to float32 rounding, not bits; each gives a row the same bits alone or in a batch.) Every bf16 rounding is XLA's
// convert's: nearest even, NaN a quiet NaN.
//
// A packed B tile row p holds 16 (w[2p, n], w[2p + 1, n]) pairs: read as u32 lanes, w[2p, n] is a lane << 16 and
// w[2p + 1, n] a lane & 0xFFFF0000, two integer ops a register of pairs. Each thread widens x to float32 once per call
// (rows_f32: bf16-rounded, normed); blocks of up to kRows rows, of equal size, then pass over a 32-column group with
// kRows x kVecs accumulators in registers. Threads take chunks of contiguous groups (parallel.h's group_chunks: one
// range a thread up to 4 rows, else several, claimed as they come free), every row block passing over a group before
// the next (the group in L1/L2).
#ifndef JAXSERVE_KERNELS_CPU_PACKED_FMA_H_
#define JAXSERVE_KERNELS_CPU_PACKED_FMA_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include <immintrin.h>

#include "packed_gemm.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace jaxserve::packed_fma {

constexpr int kLanes = 16;
using vf = float __attribute__((vector_size(4 * kLanes)));
using vu = uint32_t __attribute__((vector_size(4 * kLanes)));
using vi = int32_t __attribute__((vector_size(4 * kLanes)));
using vh = uint16_t __attribute__((vector_size(2 * kLanes)));

// The block GEMM's vectors: a register's float32 lanes (16 with AVX-512, 8 with AVX2), kVecs of them for 32 columns.
#if defined(__AVX512F__)
constexpr int kNative = 16;
constexpr int kRows = 12;  // 24 accumulators, 2 widened weight vectors and 2 broadcasts: 28 of the 32 zmm registers
#else
constexpr int kNative = 8;
constexpr int kRows = 2;   // 8 accumulators, 2 weight vectors and 2 broadcasts: 12 of AVX2's 16 ymm registers
#endif
constexpr int kVecs = 32 / kNative;
using vn = float __attribute__((vector_size(4 * kNative)));
using vnu = uint32_t __attribute__((vector_size(4 * kNative)));
constexpr int64_t kTileK = 32;       // k a packed block holds (two B tiles of 16 pairs per 16 columns)
constexpr int64_t kBlockElems = 1024;  // bf16 a k block of a group holds: 2 tiles x 16 rows x 32
constexpr int64_t kPrefetchAhead = 32 * 1024;  // bytes of a group's stream asked for ahead (first row block only)

// a * b + c with one rounding, b and c vectors of kNative lanes (a vfmadd231ps).
inline vn fmadd(float a, vn b, vn c) {
#if defined(__AVX512F__)
  return (vn)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)b, (__m512)c);
#else
  return (vn)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)b, (__m256)c);
#endif
}

inline vf load_f(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_f(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

// The float32 value of x rounded to bf16: nearest even, as XLA's convert (NaN stays NaN, made quiet).
inline vf round_bf16(vf x) {
  const vu u = (vu)x;
  const vu rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  const vu quiet_nan = (u | 0x00400000u) & 0xFFFF0000u;
  return (vf)((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}
// A float32 holding a bf16 value -> its bits, and bf16 bits -> the float32 they hold (both exact).
inline vh bf16_bits(vf x) { return __builtin_convertvector((vu)x >> 16, vh); }
inline vf widen(vh h) { return (vf)(__builtin_convertvector(h, vu) << 16); }

// `n` (<= 16) bf16 values at p widened, zeros past them.
inline vf load_bf16(const uint16_t* p, int64_t n) {
  vh h = {};
  std::memcpy(&h, p, std::clamp<int64_t>(n, 0, kLanes) * 2);
  return widen(h);
}
inline void store_bf16(uint16_t* p, vf rounded, int64_t n) {
  const vh h = bf16_bits(rounded);
  std::memcpy(p, &h, std::clamp<int64_t>(n, 0, kLanes) * 2);
}

constexpr int kFmaRows = 16;  // rows_f32's scratch slot (amx.cc's Slot numbers its own below it)

// x [M, K] as the GEMM multiplies it: float32 rows Kp apart holding bf16 values (float32 x rounded, bf16 x as is,
// or normed: bf16(bf16(x * inv_rms) * scale)), zeros from K to Kp.
inline const float* rows_f32(const XRows& x, int64_t M, int64_t K, int64_t Kp) {
  float* out = scratch<float, kFmaRows>(M * Kp);
  const float* xf = static_cast<const float*>(x.data);
  const uint16_t* xh = static_cast<const uint16_t*>(x.data);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < Kp; k += kLanes) {
      const int64_t n = K - k;  // lanes holding x (<= 0: none)
      vf v;
      if (x.f32) {
        alignas(64) float part[kLanes] = {};
        std::memcpy(part, xf + m * K + k, std::clamp<int64_t>(n, 0, kLanes) * 4);
        v = round_bf16(load_f(part));
      } else if (x.inv_rms != nullptr) {
        v = round_bf16(round_bf16(load_bf16(xh + m * K + k, n) * x.inv_rms[m]) * load_bf16(x.scale + k, n));
        const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        v = lane < int32_t(std::min<int64_t>(n, kLanes)) ? v : vf{};  // (inv_rms may be inf: 0 * inf is NaN)
      } else {
        v = load_bf16(xh + m * K + k, n);
      }
      store_f(out + m * Kp + k, v);
    }
  return out;
}

// Rows a block takes: blocks of equal size, at most kRows (64 rows: 6 of 11 or fewer, not 5 of 12 and one of 4).
inline int64_t row_step(int64_t M) {
  const int64_t blocks = std::max<int64_t>(1, (M + kRows - 1) / kRows);
  return (M + blocks - 1) / blocks;
}

// c [R][32] = R rows of x (float32, Kp apart) times the 32 columns of one packed group, each sum over k in order.
// kPrefetch: each k block also asks for the stream kPrefetchAhead bytes on into L2 (a group's first row block, which
// reads it from memory, keeps the next group coming).
template <int R, bool kPrefetch>
void block_sums(const float* x, int64_t Kp, const uint16_t* group, float* c) {
  vn acc[R][kVecs];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = vn{};
  for (int64_t kb = 0; kb < Kp / kTileK; ++kb) {
    const uint16_t* tile = group + kb * kBlockElems;  // columns 0-15 at tile, 16-31 at tile + 512: row p of each
    const float* xk = x + kb * kTileK;
    if (kPrefetch)
      for (int64_t line = 0; line < kBlockElems * 2; line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(tile) + kPrefetchAhead + line, 0, 2);
    for (int p = 0; p < 16; ++p) {  // (the loops inside unrolled, so that acc stays in registers)
      // the pairs of columns v * kNative .. as float32 weights of k = 2p (even) and 2p + 1 (odd)
      vn even[kVecs], odd[kVecs];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) {
        vnu pairs;
        std::memcpy(&pairs, tile + (v * kNative / 16) * 512 + p * 32 + (v * kNative % 16) * 2, sizeof pairs);
        even[v] = (vn)(pairs << 16);
        odd[v] = (vn)(pairs & 0xFFFF0000u);
      }
      // k = 2p, then 2p + 1 into each accumulator: products exact, so contracted into FMAs or not, the same sums.
      // AVX-512: a row's two broadcasts serve both vectors; AVX2 (4 vectors): one vector at a time, in registers.
#pragma GCC unroll 4
      for (int v0 = 0; v0 < kVecs; v0 += kVecs / 2 == 1 ? kVecs : 1)
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const float a = xk[r * Kp + 2 * p], b = xk[r * Kp + 2 * p + 1];
#pragma GCC unroll 4
          for (int v = v0; v < (kVecs == 2 ? kVecs : v0 + 1); ++v) {
            acc[r][v] += a * even[v];
            acc[r][v] += b * odd[v];
          }
        }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) std::memcpy(c + r * 32 + v * kNative, &acc[r][v], sizeof acc[r][v]);
}

using BlockSums = void (*)(const float*, int64_t, const uint16_t*, float*);
template <bool kPrefetch, int... R>
constexpr std::array<BlockSums, sizeof...(R)> sums_table(std::integer_sequence<int, R...>) {
  return {block_sums<R + 1, kPrefetch>...};
}
// block_sums for `rows` (1 .. kRows) rows.
inline void sums(int64_t rows, bool prefetch, const float* x, int64_t Kp, const uint16_t* group, float* c) {
  static constexpr auto plain = sums_table<false>(std::make_integer_sequence<int, kRows>{});
  static constexpr auto ahead = sums_table<true>(std::make_integer_sequence<int, kRows>{});
  (prefetch ? ahead : plain)[rows - 1](x, Kp, group, c);
}

// The epilogues of rows [0, rows) of a [.][32] float32 block c, columns n0 .. min(n0 + 32, N) of rows m0 .. of y.
inline void put_f32(const float* c, int64_t rows, float* y, int64_t N, int64_t m0, int64_t n0) {
  const int64_t cols = std::min<int64_t>(32, N - n0);
  for (int64_t i = 0; i < rows; ++i) std::memcpy(y + (m0 + i) * N + n0, c + i * 32, cols * 4);
}

// bf16(c), or with a residual r (bf16 [M, N]) bf16(r + bf16(c)).
inline void put_bf16(const float* c, int64_t rows, uint16_t* y, int64_t N, int64_t m0, int64_t n0,
                     const uint16_t* r) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < 32; h += kLanes) {
      const int64_t cols = N - n0 - h, at = (m0 + i) * N + n0 + h;
      vf v = round_bf16(load_f(c + i * 32 + h));
      if (r != nullptr) v = round_bf16(load_bf16(r + at, cols) + v);
      store_bf16(y + at, v, cols);
    }
}

// bf16(act[bf16(gate)] * bf16(up)) into y bf16 [., I] (I a multiple of 32: no ragged groups).
inline void put_gated(const float* gate, const float* up, int64_t rows, const float* act, uint16_t* y, int64_t I,
                      int64_t m0, int64_t n0) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t h = 0; h < 32; h += kLanes) {
      const vh g = bf16_bits(round_bf16(load_f(gate + i * 32 + h)));  // the table's index
      vf a;
      for (int l = 0; l < kLanes; ++l) a[l] = act[g[l]];
      store_bf16(y + (m0 + i) * I + n0 + h, round_bf16(a * round_bf16(load_f(up + i * 32 + h))), kLanes);
    }
}

// bf16(c) folded into each row's 16 lanes of (largest value, first column) (amx.cc's put_argmax: a lane keeps the
// first column of its largest value; NaN is never greater).
inline void put_argmax(const float* c, int64_t rows, int64_t N, int64_t m0, int64_t n0, float* best, int32_t* at) {
  const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t i = 0; i < rows; ++i) {
    vf b = load_f(best + (m0 + i) * 16);
    vi a;
    std::memcpy(&a, at + (m0 + i) * 16, sizeof a);
    for (int64_t h = 0; h < 32; h += kLanes) {
      const vf v = round_bf16(load_f(c + i * 32 + h));
      const vi col = lane + int32_t(n0 + h);
      const vi gt = (col < int32_t(N)) & (v > b);
      b = gt ? v : b;
      a = gt ? col : a;
    }
    store_f(best + (m0 + i) * 16, b);
    std::memcpy(at + (m0 + i) * 16, &a, sizeof a);
  }
}

// y = x @ w, w packed (bf16[ceil(N / 32), Kp * 32]), as the epilogue says (amx.cc's gemm_packed_bf16x's contract).
inline void gemm_packed(xla::ffi::ThreadPool& pool, XRows x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                        void* out, Epilogue epilogue, const void* aux, int64_t threads) {
  const int64_t Kp = (K + kTileK - 1) / kTileK * kTileK, group_elems = Kp * 32;
  const bool gated = epilogue == kGatedBf16, argmax = epilogue == kArgmaxBf16;
  const int64_t G = gated ? N / 64 : (N + 31) / 32, up = N / 64;  // output groups; the up half's first group
  const float* act = static_cast<const float*>(aux);
  const uint16_t* residual = epilogue == kResidualBf16 ? static_cast<const uint16_t*>(aux) : nullptr;
  const int64_t t = std::max<int64_t>(1, std::min(threads, G)), n = group_chunks(G, t, M);
  const int64_t step = row_step(M);
  ArgmaxLanes lanes(argmax ? n : 0, M);
  auto prepare = [&] { return rows_f32(x, M, K, Kp); };  // each thread's own float32 rows, once a call
  parallel_chunks(pool, n, t, prepare, [&](const float* xf, int64_t c) {
    alignas(64) float block[kRows * 32], block2[kRows * 32];
    auto group = [&](int64_t g) { return packed + g * group_elems; };
    for (int64_t g = c * G / n; g < (c + 1) * G / n; ++g)
      for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t rows = std::min<int64_t>(step, M - m0);
        sums(rows, m0 == 0, xf + m0 * Kp, Kp, group(g), block);
        switch (epilogue) {
          case kF32: put_f32(block, rows, static_cast<float*>(out), N, m0, g * 32); break;
          case kGatedBf16:
            sums(rows, m0 == 0, xf + m0 * Kp, Kp, group(up + g), block2);
            put_gated(block, block2, rows, act, static_cast<uint16_t*>(out), N / 2, m0, g * 32);
            break;
          case kArgmaxBf16: put_argmax(block, rows, N, m0, g * 32, lanes.best(c), lanes.at(c)); break;
          default: put_bf16(block, rows, static_cast<uint16_t*>(out), N, m0, g * 32, residual); break;
        }
      }
  });
  if (argmax) lanes.reduce(static_cast<int32_t*>(out));
}

// --- float32 weights (packed.py's PackedF32: f32[ceil(N / 32), K * 32], row g holding for each k in order the 32
// columns [32 g, 32 g + 32), zeros past N): y[m, n] = x[m, k] * w[k, n] fused-multiply-added over k = 0, 1, ..,
// K - 1 in that order into float32 from 0 (one rounding a k), whatever M, the blocking or the threads: a row's bits
// alone or in a batch. x is read as it is, float32 rows K apart.

// c [R][32] = R rows of x (K apart) times one group's 32 columns. kPrefetch as block_sums'.
template <int R, bool kPrefetch>
void block_sums_f32(const float* x, int64_t K, const float* group, float* c) {
  vn acc[R][kVecs];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = vn{};
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = group + k * 32;
    if (kPrefetch)  // a k's 128 bytes: two lines
      for (int line = 0; line < 128; line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(wk) + kPrefetchAhead + line, 0, 2);
    vn w[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) std::memcpy(&w[v], wk + v * kNative, sizeof w[v]);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float a = x[r * K + k];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] = fmadd(a, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) std::memcpy(c + r * 32 + v * kNative, &acc[r][v], sizeof acc[r][v]);
}

using BlockSumsF32 = void (*)(const float*, int64_t, const float*, float*);
template <bool kPrefetch, int... R>
constexpr std::array<BlockSumsF32, sizeof...(R)> sums_table_f32(std::integer_sequence<int, R...>) {
  return {block_sums_f32<R + 1, kPrefetch>...};
}

// y f32[M, N] = x f32[M, K] @ w, w packed as PackedF32; the groups split into chunks and rows block as gemm_packed's.
inline void gemm_packed_f32(xla::ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const float* packed,
                            int64_t N, float* y, int64_t threads) {
  static constexpr auto plain = sums_table_f32<false>(std::make_integer_sequence<int, kRows>{});
  static constexpr auto ahead = sums_table_f32<true>(std::make_integer_sequence<int, kRows>{});
  const int64_t G = (N + 31) / 32, t = std::max<int64_t>(1, std::min(threads, G)), n = group_chunks(G, t, M);
  const int64_t step = row_step(M);
  parallel_chunks(pool, n, t, [&](int64_t c) {
    alignas(64) float block[kRows * 32];
    for (int64_t g = c * G / n; g < (c + 1) * G / n; ++g)
      for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int64_t rows = std::min<int64_t>(step, M - m0);
        (m0 == 0 ? ahead : plain)[rows - 1](x + m0 * K, K, packed + g * K * 32, block);
        put_f32(block, rows, y, N, m0, g * 32);
      }
  });
}

}  // namespace jaxserve::packed_fma

#endif  // JAXSERVE_KERNELS_CPU_PACKED_FMA_H_
