// bf16 GEMMs on Intel AMX tiles (batched decode, verify rounds, prefill; packed weights: any rows), XLA FFI handlers:
//
//   jaxserve_bf16_gemm_kn: y f32[M, N] = bf16(x f32[M, K]) @ w bf16[K, N]     (a Dense kernel)
//   jaxserve_bf16_gemm_nk: y f32[M, N] = bf16(x f32[M, K]) @ e bf16[N, K]^T   (a tied embedding as the LM head)
//   jaxserve_bf16_gemm_packed: y = bf16(x f32/bf16[M, K]) @ w, w bf16[K, N] packed once into B tiles (packed.py);
//       y f32[M, N], bf16[M, N], a gated MLP's bf16 act(gate) * up, each row's argmax, or the product added to a
//       bf16 residual (the Epilogue below)
//   jaxserve_f32_gemm_packed: y f32[M, N] = x f32[M, K] @ w, w f32[K, N] packed once into 32-column groups
//       (packed.py's PackedF32): float32 FMAs in k order (packed_fma.h), a float32 model's Dense layers
//   jaxserve_amx_enable(): 1 when this build has the AMX kernels and Linux let the process use the tiles, else 0.
// The packed GEMM's attribute fma = 1 runs it with float32 FMAs instead (packed_fma.h: CPUs without AMX; any CPU the
// library was built for), the same epilogues and norm, its sums those of a float32 loop over k.
//
// TDPBF16PS multiplies a 16 x 32 bf16 tile A by a 32 x 16 one B, stored as 16 rows of 16 bf16 pairs (k = 2p, 2p + 1
// side by side: "VNNI"), into a 16 x 16 float32 tile C: C[i][j] += the 32 products A[i][k] B[k][j], in an order and
// with roundings of the hardware's own. Each C tile sees the k blocks in order, and an output's tile op does not depend
// on the other rows of its tile, so y[m, n] is the same whatever M, the blocking or the threads: a row alone or in a
// batch (tested). The sums are not those of float32 additions in any one order: on the Xeon VM a vdpbf16ps loop adding
// x[2p] w[2p] then x[2p+1] w[2p+1] to float32, round to nearest even (which matmul.cc's kernels do, odd product first),
// matched 22% of the outputs at K = 576; neither did one rounding per pair, per 32-k block, nor round-toward-zero.
// So bf16_matmul (few rows) and this GEMM agree to float32 rounding, not bits.
//
// Tiles (one configuration, every tile 16 rows x 64 bytes): C 0-3 (a 2 x 2 block of 32 x 32 outputs), A 4-5, B 6-7.
// _kn: A is x (converted once, rows padded to whole tiles), B the weights, packed per 256-column chunk into pairs
//      (vpermt2w of rows 2p and 2p + 1) in a buffer that stays in L2 while every row block of x passes over it.
// _packed: as _kn with w already in the packed layout (kn_block reads a group as a chunk of two tiles); blocks of up to
//      16 rows use C and A tiles of that many rows and two 32-column groups at once (C 0-3, A 4, B 5-7).
// _nk: the roles swap, so that the big operand is read as stored: A is e (16 rows of a tied embedding, 32 k, loaded
//      straight from memory), B is x transposed into pairs (built once); C holds y^T, transposed into y per work chunk.
// One 2 x 2 block of C loads 2 A and 2 B tiles for 4 TDPBF16PS. Work is split into column chunks (rows of e) over
// XLA's intra-op pool (parallel.h); every thread loads the tile configuration before its chunks and releases the
// tiles after (a thread holding tile state makes every context switch save 8 KB more).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "packed_fma.h"
#include "packed_gemm.h"
#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

using jaxserve::ArgmaxLanes;
using jaxserve::Epilogue;
using jaxserve::XRows;
using jaxserve::kArgmaxBf16, jaxserve::kBf16, jaxserve::kF32, jaxserve::kGatedBf16, jaxserve::kResidualBf16;

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
constexpr bool kBuiltWithAmx = true;

constexpr int64_t kTileRows = 16;    // rows of every tile
constexpr int64_t kTileK = 32;       // bf16 k per A row (64 bytes)
constexpr int64_t kKnChunk = 256;    // columns of w a _kn work chunk packs at once (K x 512 bytes: L2)
constexpr int64_t kNkChunk = 256;    // rows of e per _nk work chunk
constexpr int64_t kPackAhead = 16;   // rows of w prefetched ahead while packing

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
}

// The configuration for one block of `rows` (<= 16) rows of x: C 0-3 and A 4 hold `rows` rows, B 5-7 16.
void load_tile_config_rows(int64_t rows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = (t < 5) ? uint8_t(rows) : uint8_t(kTileRows);
  }
  _tile_loadconfig(&cfg);
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// This thread's buffers (packed_gemm.h's scratch; tile rows must not straddle cache lines: a tile loaded from
// malloc's 16-byte alignment took 3x as long per TDPBF16PS, 18 against 6 ns on the Xeon VM).
using jaxserve::scratch;
enum Slot { kXa, kXt, kPacked, kYt, kCopy };  // (packed_fma.h's rows: slot kFmaRows)

inline __mmask16 mask16(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << std::max<int64_t>(left, 0)) - 1);
}

inline __mmask32 mask32(int64_t left) {
  return left >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1ull << std::max<int64_t>(left, 0)) - 1);
}

// x f32[M, K] -> bf16 bits [Mp, Kp] (round to nearest even, as XLA's convert), zero padded to whole tiles:
// Mp = M rounded up to 16, Kp = K rounded up to 32. Row m is also row m's bf16 pairs (u32 p = k 2p, 2p + 1).
const uint16_t* x_to_bf16(const float* x, int64_t M, int64_t K, int64_t Mp, int64_t Kp) {
  uint16_t* out = scratch<uint16_t, kXa>(Mp * Kp);
  std::fill(out + M * Kp, out + Mp * Kp, uint16_t(0));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < Kp; k += 32) {
      const __m512 a = _mm512_maskz_loadu_ps(mask16(K - k), x + m * K + k);
      const __m512 b = _mm512_maskz_loadu_ps(mask16(K - k - 16), x + m * K + k + 16);
      _mm512_store_si512(out + m * Kp + k, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  return out;
}

// A stored C tile (16 x 16 float32, rows 64 bytes apart) -> y[r0 + i, c0 + j] for i < rows, j < cols, y's rows
// `ld` floats apart.
void put_tile(const float* tile, float* y, int64_t ld, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < std::min<int64_t>(rows, kTileRows); ++i)
    _mm512_mask_storeu_ps(y + (r0 + i) * ld + c0, mask16(cols), _mm512_load_ps(tile + i * 16));
}

// C tile T -> y (put_tile's arguments); whole tiles straight from the tile. (A macro: the tile intrinsics take the
// tile's number as a literal.)
#define STORE_C(T, y, ld, r0, c0, rows, cols)                     \
  do {                                                            \
    if ((rows) >= kTileRows && (cols) >= 16) {                    \
      _tile_stored(T, (y) + (r0) * (ld) + (c0), (ld) * 4);        \
    } else {                                                      \
      alignas(64) float tile_[kTileRows * 16];                    \
      _tile_stored(T, tile_, 64);                                 \
      put_tile(tile_, y, ld, r0, c0, rows, cols);                 \
    }                                                             \
  } while (0)

// ---- _kn: y = x @ w, w bf16[K, N] ----
// w's columns [n0, n0 + width) (width a multiple of 32) -> packed B tiles: for each k block kb and 16-column group g,
// 16 rows p of 16 (w[2p, n], w[2p + 1, n]) pairs at packed[((kb * groups + g) * 16 + p % 16) * 32]. Rows past K and
// columns past N are zeros. Rows of w are read as whole segments (one pair of rows at a time: the streams the
// hardware prefetcher follows).
void pack_w(const uint16_t* w, int64_t K, int64_t N, int64_t n0, int64_t width, int64_t Kp, uint16_t* packed) {
  const int64_t groups = width / 16;
  // vpermt2w indices: pairs (a[j], b[j]) for j in [0, 16) and [16, 32) (b's words are numbered from 32).
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (int64_t p = 0; p < Kp / 2; ++p) {
    const int64_t kb = p / 16, row = p % 16;
    for (int64_t c = 0; c < width; c += 32) {
      const __mmask32 cols = mask32(N - n0 - c);
      // (prefetches past the end of w are harmless: they never fault)
      _mm_prefetch(reinterpret_cast<const char*>(w + (2 * p + kPackAhead) * N + n0 + c), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w + (2 * p + 1 + kPackAhead) * N + n0 + c), _MM_HINT_T1);
      const __m512i a = 2 * p < K ? _mm512_maskz_loadu_epi16(cols, w + 2 * p * N + n0 + c) : _mm512_setzero_si512();
      const __m512i b =
          2 * p + 1 < K ? _mm512_maskz_loadu_epi16(cols, w + (2 * p + 1) * N + n0 + c) : _mm512_setzero_si512();
      uint16_t* dst = packed + ((kb * groups + c / 16) * 16 + row) * 32;
      _mm512_store_si512(dst, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_store_si512(dst + 16 * 32, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// C 0-1 (kTwo: and C 2-3) = one block of rows of x from m0 (kTwo: two 16-row tiles, C 2-3 the second; else one tile of
// the configured rows) times 32 packed columns: for each k block kb, the two B tiles at b0 + kb * kb_stride. Each C
// tile takes the k blocks in order, one TDPBF16PS each: the same bits whatever the blocking around it.
// kPrefetch: each k block also prefetches the 2 KB kPackedPrefetch bytes past its B tiles into L2 (the packed
// stream's next group, for a thread that streams the weights from memory).
constexpr int64_t kPackedPrefetch = 32 * 1024;
template <bool kTwo, bool kPrefetch = false>
void group_sums(const uint16_t* xa, int64_t Kp, int64_t m0, const uint16_t* b0, int64_t kb_stride) {
  _tile_zero(0);
  _tile_zero(1);
  if (kTwo) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t kb = 0; kb < Kp / kTileK; ++kb) {
    const uint16_t* b = b0 + kb * kb_stride;
    if (kPrefetch)
      for (int64_t line = 0; line < 2 * 1024; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(b) + kPackedPrefetch + line, _MM_HINT_T1);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 16 * 32, 64);
    _tile_loadd(4, xa + m0 * Kp + kb * kTileK, Kp * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (kTwo) {
      _tile_loadd(5, xa + (m0 + kTileRows) * Kp + kb * kTileK, Kp * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// One 32-row block of x (two tiles; kTwo false: the last block, one tile) times 32 packed columns (group g, g + 1).
template <bool kTwo>
void kn_block(const uint16_t* xa, int64_t Kp, int64_t m0, const uint16_t* packed, int64_t groups, int64_t g,
              float* y, int64_t M, int64_t N, int64_t n) {
  group_sums<kTwo>(xa, Kp, m0, packed + g * 16 * 32, groups * 16 * 32);
  STORE_C(0, y, N, m0, n, M - m0, N - n);
  STORE_C(1, y, N, m0, n + 16, M - m0, N - n - 16);
  if (kTwo) {
    STORE_C(2, y, N, m0 + kTileRows, n, M - m0 - kTileRows, N - n);
    STORE_C(3, y, N, m0 + kTileRows, n + 16, M - m0 - kTileRows, N - n - 16);
  }
}

// Chunks of kKnChunk columns over XLA's pool, each packed into this thread's buffer (L2) and then multiplied by
// every 32-row block of x. (Packing the next chunk between the blocks of this one, so that the weights stream while
// the tiles work, measured no faster in a one-thread harness: 284 against 259-316 us for gate/up at 64 rows.)
void gemm_kn(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t N, float* y,
             int64_t threads) {
  const int64_t Mp = round_up(M, kTileRows), Kp = round_up(K, kTileK);
  const uint16_t* xa = x_to_bf16(x, M, K, Mp, Kp);
  jaxserve::parallel_chunks(pool, (N + kKnChunk - 1) / kKnChunk, threads, [&](int64_t c) {
    const int64_t n0 = c * kKnChunk, groups = round_up(std::min(kKnChunk, N - n0), 32) / 16;
    uint16_t* packed = scratch<uint16_t, kPacked>(Kp * kKnChunk);
    pack_w(w, K, N, n0, groups * 16, Kp, packed);
    load_tile_config();
    int64_t m0 = 0;  // each 32-row block of x (in L1 while K <= 768) passes over the packed columns
    for (; m0 + 2 * kTileRows <= Mp; m0 += 2 * kTileRows)
      for (int64_t g = 0; g < groups; g += 2) kn_block<true>(xa, Kp, m0, packed, groups, g, y, M, N, n0 + g * 16);
    if (m0 < Mp)
      for (int64_t g = 0; g < groups; g += 2) kn_block<false>(xa, Kp, m0, packed, groups, g, y, M, N, n0 + g * 16);
    _tile_release();
  });
}

// ---- _packed: y = x @ w, w packed once (jaxserve.kernels.cpu.packed.pack_bf16) ----
// packed bf16[G, Kp * 32]: row g holds w's columns [32 g, 32 g + 32) as the two B tiles of every k block, in k order
// (for kb: the tile of columns 32 g .. 32 g + 15, then of 32 g + 16 .. 32 g + 31; each 16 rows p of 16
// (w[2p, n], w[2p + 1, n]) pairs). A 32-column group's whole K is one contiguous stream, read front to back whatever
// M: no packing per call, and few rows stream the weights straight into the tiles. (One group at a time and two B
// pairs alternating over the k blocks, or prefetches 8-32 KB ahead into L1 or L2: no faster at one row.)
constexpr int64_t kPackedChunkGroups = 8;  // 32-column groups a work chunk holds at most (256 columns: L2)

// What it writes: packed_gemm.h's Epilogue.

// C 0-3 = rows m0 .. m0 + 31 of x (C 0-1: the first 16, C 2-3: the next) times the 32 columns of packed group gp;
// prefetch: while reading the group from memory (its first row block), the stream ahead into L2.
inline void pair_sums(const uint16_t* xa, int64_t Kp, int64_t m0, const uint16_t* gp, bool prefetch = false) {
  if (prefetch) group_sums<true, true>(xa, Kp, m0, gp, 2 * 16 * 32);
  else group_sums<true>(xa, Kp, m0, gp, 2 * 16 * 32);
}

// One block of at most 16 rows of x (load_tile_config_rows: C and A tiles of that many rows) times two groups of 32
// packed columns at once (g0p: C 0-1, g1p: C 2-3), so that two streams of weights are in flight; the same tile ops
// per C tile as pair_sums.
void rest_sums(const uint16_t* xa, int64_t Kp, int64_t m0, const uint16_t* g0p, const uint16_t* g1p) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < Kp / kTileK; ++kb) {
    const int64_t off = kb * 2 * 16 * 32;
    _tile_loadd(4, xa + m0 * Kp + kb * kTileK, Kp * 2);
    _tile_loadd(6, g0p + off, 64);
    _tile_loadd(7, g0p + off + 16 * 32, 64);
    _tile_loadd(5, g1p + off, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, g1p + off + 16 * 32, 64);
    _tile_dpbf16ps(3, 4, 6);
  }
}

// The same for one group (C 0-1).
inline void rest_sum1(const uint16_t* xa, int64_t Kp, int64_t m0, const uint16_t* gp) {
  group_sums<false>(xa, Kp, m0, gp, 2 * 16 * 32);
}

// C 0-1 -> a [rows][32] float32 block at buf (rows 128 bytes apart), C 2-3 -> the block at buf2; pair blocks: C 0-3 ->
// one [32][32] block. (The stores write the tiles' configured rows.)
inline void store_two_blocks(float* buf, float* buf2) {
  _tile_stored(0, buf, 128);
  _tile_stored(1, buf + 16, 128);
  _tile_stored(2, buf2, 128);
  _tile_stored(3, buf2 + 16, 128);
}
inline void store_pair_block(float* buf) { store_two_blocks(buf, buf + kTileRows * 32); }

// 16 floats -> their bf16 bits, rounded to nearest even (XLA's convert); 16 bf16 bits -> the floats they hold, exactly.
inline __m256i bf16_bits(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// Rows [0, rows) of a [.][32] float32 block -> y bf16 rows m0 .., columns n0 .. min(n0 + 32, N), rounded to nearest
// even; with a residual r (bf16 [M, N]): bf16(r + that bf16 value), the float32 sum rounded once more.
void put_bf16(const float* buf, int64_t rows, uint16_t* y, int64_t N, int64_t m0, int64_t n0,
              const uint16_t* r = nullptr) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < 32; c += 16) {
      const __mmask16 cols = mask16(N - n0 - c);
      __m256i h = bf16_bits(_mm512_load_ps(buf + i * 32 + c));
      if (r != nullptr)
        h = bf16_bits(_mm512_add_ps(widen_bf16(_mm256_maskz_loadu_epi16(cols, r + (m0 + i) * N + n0 + c)), widen_bf16(h)));
      _mm256_mask_storeu_epi16(y + (m0 + i) * N + n0 + c, cols, h);
    }
}

// Rows [0, rows) of gate and up [.][32] float32 blocks -> y bf16 [., I] rows m0 .., columns n0 .. n0 + 32:
// bf16(act[bf16(gate)] * bf16(up)) (act: float32[65536] by bf16 bits).
void put_gated(const float* gate, const float* up, int64_t rows, const float* act, uint16_t* y, int64_t I, int64_t m0,
               int64_t n0) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < 32; c += 16) {
      const __m512i g = _mm512_cvtepu16_epi32(bf16_bits(_mm512_load_ps(gate + i * 32 + c)));  // the table's index
      const __m512 u = widen_bf16(bf16_bits(_mm512_load_ps(up + i * 32 + c)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + i) * I + n0 + c),
                          bf16_bits(_mm512_mul_ps(_mm512_i32gather_ps(g, act, 4), u)));
    }
}

// Rows [0, rows) of a [.][32] float32 block (columns n0 .. n0 + 32, those < N counted) rounded to bf16, folded into
// the rows' running maxima: 16 lanes of (value, column) per row at best / at (row m's at m * 16). A lane keeps the
// first column of its largest value (a later equal one is not greater), so lanes reduced by (largest value, then
// smallest column) give jnp.argmax's first maximal column.
void put_argmax(const float* buf, int64_t rows, int64_t N, int64_t m0, int64_t n0, float* best, int32_t* at) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t i = 0; i < rows; ++i) {
    __m512 b = _mm512_load_ps(best + (m0 + i) * 16);
    __m512i a = _mm512_load_si512(at + (m0 + i) * 16);
    for (int64_t c = 0; c < 32; c += 16) {
      const __m512 v = widen_bf16(bf16_bits(_mm512_load_ps(buf + i * 32 + c)));
      const __mmask16 gt = _mm512_mask_cmp_ps_mask(mask16(N - n0 - c), v, b, _CMP_GT_OQ);
      b = _mm512_mask_mov_ps(b, gt, v);
      a = _mm512_mask_mov_epi32(a, gt, _mm512_add_epi32(lane, _mm512_set1_epi32(int32_t(n0 + c))));
    }
    _mm512_store_ps(best + (m0 + i) * 16, b);
    _mm512_store_si512(at + (m0 + i) * 16, a);
  }
}

// x bf16[M, K] -> bf16 [Mp, Kp], zero padded to whole tiles (x_to_bf16's layout; rows in this thread's buffer, 64-byte
// aligned).
const uint16_t* x_bf16_padded(const uint16_t* x, int64_t M, int64_t K, int64_t Mp, int64_t Kp) {
  uint16_t* out = scratch<uint16_t, kXa>(Mp * Kp);
  for (int64_t m = 0; m < M; ++m) {
    std::memcpy(out + m * Kp, x + m * K, K * 2);
    std::fill(out + m * Kp + K, out + (m + 1) * Kp, uint16_t(0));
  }
  std::fill(out + M * Kp, out + Mp * Kp, uint16_t(0));
  return out;
}

// bf16 x [M, K] normed (XRows: bf16(bf16(x * inv_rms[m]) * scale[k])) -> bf16 [Mp, Kp], x_bf16_padded's layout.
// Products of float32 values rounded once each, as XLA's fusion of those multiplies computes them.
const uint16_t* x_normed_padded(const uint16_t* x, const float* inv_rms, const uint16_t* scale, int64_t M, int64_t K,
                                int64_t Mp, int64_t Kp) {
  uint16_t* out = scratch<uint16_t, kXa>(Mp * Kp);
  for (int64_t m = 0; m < M; ++m) {
    const __m512 r = _mm512_set1_ps(inv_rms[m]);
    for (int64_t k = 0; k < Kp; k += 16) {
      const __mmask16 cols = mask16(K - k);  // lanes past K stored as zeros, whatever inv_rms holds
      const __m512 xk = widen_bf16(_mm256_maskz_loadu_epi16(cols, x + m * K + k));
      const __m512 sk = widen_bf16(_mm256_maskz_loadu_epi16(cols, scale + k));
      const __m256i h = bf16_bits(_mm512_mul_ps(widen_bf16(bf16_bits(_mm512_mul_ps(xk, r))), sk));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + m * Kp + k), _mm256_maskz_mov_epi16(cols, h));
    }
  }
  std::fill(out + M * Kp, out + Mp * Kp, uint16_t(0));
  return out;
}

// x as this thread's padded bf16 tiles (x_to_bf16 / x_bf16_padded / x_normed_padded into its own scratch).
const uint16_t* padded_rows(XRows x, int64_t M, int64_t K, int64_t Mp, int64_t Kp) {
  if (x.inv_rms != nullptr)
    return x_normed_padded(static_cast<const uint16_t*>(x.data), x.inv_rms, x.scale, M, K, Mp, Kp);
  return x.f32 ? x_to_bf16(static_cast<const float*>(x.data), M, K, Mp, Kp)
               : x_bf16_padded(static_cast<const uint16_t*>(x.data), M, K, Mp, Kp);
}

// Each thread takes a contiguous range of the output's 32-column groups (k/v's 6: 3 a thread; with kGatedBf16 a group
// of y reads the gate group g and the up group g + I / 32) and walks it in stretches of at most kPackedChunkGroups.
// Every 32-row block of x passes over one group before the next group (the group then in L1 or L2), the first block
// prefetching the stream kPackedPrefetch bytes ahead into L2: so a thread asks memory for weights all along, not in
// the first block's pass only (each block passing over a whole stretch, as before: gate/up at 64 rows from memory,
// two threads, 206 -> 172 us a call, 17 -> 21 GB/s; down 131 -> 113 us). A last block of at most 16 rows then passes
// over the stretch (two streams at once; prefetching those measured no faster at 1-16 rows). x: the rows as the
// caller holds them, padded by each thread into its own buffer (padded_rows).
void gemm_packed_bf16x(ffi::ThreadPool& pool, XRows x, int64_t M, int64_t K, const uint16_t* packed,
                       int64_t N, void* out, Epilogue epilogue, const void* aux, int64_t threads) {
  const float* act = static_cast<const float*>(aux);            // kGatedBf16: the activation's table
  const uint16_t* residual = epilogue == kResidualBf16 ? static_cast<const uint16_t*>(aux) : nullptr;
  const int64_t Mp = round_up(M, kTileRows), Kp = round_up(K, kTileK), group_elems = Kp * 32;
  const bool gated = epilogue == kGatedBf16;
  const int64_t G = gated ? N / 64 : (N + 31) / 32, up = N / 64;  // output groups; the up half's first group
  const int64_t pairs = Mp / (2 * kTileRows);
  const bool rest = Mp % (2 * kTileRows) != 0;
  float* const y32 = static_cast<float*>(out);
  uint16_t* const y16 = static_cast<uint16_t*>(out);
  const int64_t t = std::max<int64_t>(1, std::min(threads, G));
  // kArgmaxBf16: each chunk's running maxima (put_argmax), reduced in chunk order (lower columns first) at the end
  const bool argmax = epilogue == kArgmaxBf16;
  ArgmaxLanes lanes(argmax ? t : 0, M);
  jaxserve::parallel_chunks(pool, t, t, [&](int64_t c) {
    // each thread pads its own copy of x, so that the A tiles come from its own L2: read from the caller's, a
    // helper's tile loads waited on the other core (512 rows, two threads: o 305-325 -> 239-271 µs a call, down
    // 875-964 -> 628-692; gate/up within its noise)
    const uint16_t* xa = padded_rows(x, M, K, Mp, Kp);
    alignas(64) float block[2 * kTileRows * 32], block2[2 * kTileRows * 32];
    const int64_t r0 = c * G / t, r1 = (c + 1) * G / t;
    auto emit = [&](const float* buf, int64_t rows, int64_t m0, int64_t n0) {  // a block's bf16 epilogues
      if (argmax) put_argmax(buf, rows, N, m0, n0, lanes.best(c), lanes.at(c));
      else put_bf16(buf, rows, y16, N, m0, n0, residual);
    };
    auto group = [&](int64_t g) { return packed + g * group_elems; };
    for (int64_t g0 = r0; g0 < r1; g0 += kPackedChunkGroups) {
      const int64_t g1 = std::min(r1, g0 + kPackedChunkGroups);
      int64_t m0 = 0;
      if (pairs) {
        load_tile_config();
        for (int64_t g = g0; g < g1; ++g) {
          for (m0 = 0; m0 + 2 * kTileRows <= Mp; m0 += 2 * kTileRows) {
            const int64_t rows = std::min(2 * kTileRows, M - m0);
            pair_sums(xa, Kp, m0, group(g), m0 == 0);
            if (epilogue == kF32) {
              STORE_C(0, y32, N, m0, g * 32, M - m0, N - g * 32);
              STORE_C(1, y32, N, m0, g * 32 + 16, M - m0, N - g * 32 - 16);
              STORE_C(2, y32, N, m0 + kTileRows, g * 32, M - m0 - kTileRows, N - g * 32);
              STORE_C(3, y32, N, m0 + kTileRows, g * 32 + 16, M - m0 - kTileRows, N - g * 32 - 16);
            } else if (!gated) {
              store_pair_block(block);
              emit(block, rows, m0, g * 32);
            } else {
              store_pair_block(block);
              pair_sums(xa, Kp, m0, group(up + g), m0 == 0);
              store_pair_block(block2);
              put_gated(block, block2, rows, act, y16, N / 2, m0, g * 32);
            }
          }
        }
      }
      if (rest) {
        const int64_t rows = std::min(kTileRows, M - m0);
        load_tile_config_rows(rows);
        int64_t g = g0;
        if (gated) {
          for (; g < g1; ++g) {  // the gate and up groups of one output group, as two streams
            rest_sums(xa, Kp, m0, group(g), group(up + g));
            store_two_blocks(block, block2);
            put_gated(block, block2, rows, act, y16, N / 2, m0, g * 32);
          }
        }
        for (; g + 2 <= g1; g += 2) {
          rest_sums(xa, Kp, m0, group(g), group(g + 1));
          if (epilogue == kF32) {
            STORE_C(0, y32, N, m0, g * 32, M - m0, N - g * 32);
            STORE_C(1, y32, N, m0, g * 32 + 16, M - m0, N - g * 32 - 16);
            STORE_C(2, y32, N, m0, g * 32 + 32, M - m0, N - g * 32 - 32);
            STORE_C(3, y32, N, m0, g * 32 + 48, M - m0, N - g * 32 - 48);
          } else {
            store_two_blocks(block, block2);
            emit(block, rows, m0, g * 32);
            emit(block2, rows, m0, g * 32 + 32);
          }
        }
        if (g < g1) {
          rest_sum1(xa, Kp, m0, group(g));
          if (epilogue == kF32) {
            STORE_C(0, y32, N, m0, g * 32, M - m0, N - g * 32);
            STORE_C(1, y32, N, m0, g * 32 + 16, M - m0, N - g * 32 - 16);
          } else {
            _tile_stored(0, block, 128);
            _tile_stored(1, block + 16, 128);
            emit(block, rows, m0, g * 32);
          }
        }
      }
    }
    _tile_release();
  });
  if (argmax) lanes.reduce(static_cast<int32_t*>(out));
}

// y f32[M, N] = x f32[M, K] @ w packed (the kF32 epilogue; the guard-page harness's entry).
void gemm_packed(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* packed, int64_t N,
                 float* y, int64_t threads) {
  gemm_packed_bf16x(pool, XRows{x, true}, M, K, packed, N, y, kF32, nullptr, threads);
}

// ---- _nk: y = x @ e^T, e bf16[N, K] ----
// x's bf16 pairs transposed into B tiles: for k block kb and row block mb of x, 16 rows p of 16 u32 pairs
// (x[m, 2p], x[m, 2p + 1]) for the 16 rows m of the block, at xt[(kb * mblocks + mb) * 256].
const uint32_t* x_pairs_transposed(const uint16_t* xa, int64_t Mp, int64_t Kp) {
  const int64_t mblocks = Mp / kTileRows, kblocks = Kp / kTileK;
  uint32_t* xt = scratch<uint32_t, kXt>(kblocks * mblocks * 256);  // (every element written below)
  const uint32_t* pairs = reinterpret_cast<const uint32_t*>(xa);  // row m: Kp / 2 pairs
  for (int64_t m = 0; m < Mp; ++m)
    for (int64_t p = 0; p < Kp / 2; ++p)
      xt[((p / 16) * mblocks + m / kTileRows) * 256 + (p % 16) * 16 + m % kTileRows] = pairs[m * Kp / 2 + p];
  return xt;
}

// 32 rows of e from n0 (two A tiles; kTwoN false: one) against two row blocks of x (mb, mb + 1; kTwoM false: one),
// into yt[n - n0][m] (y^T, rows ldt floats apart). `a` points at e's row n0, rows `lda` elements apart (e itself, or
// a zero-padded copy of a ragged block).
template <bool kTwoN, bool kTwoM>
void nk_block(const uint16_t* a, int64_t lda, int64_t Kp, const uint32_t* xt, int64_t mblocks, int64_t mb, float* yt,
              int64_t ldt) {
  _tile_zero(0);
  if (kTwoM) _tile_zero(1);
  if (kTwoN) _tile_zero(2);
  if (kTwoN && kTwoM) _tile_zero(3);
  for (int64_t kb = 0; kb < Kp / kTileK; ++kb) {
    const uint32_t* b = xt + (kb * mblocks + mb) * 256;
    _tile_loadd(6, b, 64);
    if (kTwoM) _tile_loadd(7, b + 256, 64);
    _tile_loadd(4, a + kb * kTileK, lda * 2);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoM) _tile_dpbf16ps(1, 4, 7);
    if (kTwoN) {
      _tile_loadd(5, a + kTileRows * lda + kb * kTileK, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      if (kTwoM) _tile_dpbf16ps(3, 5, 7);
    }
  }
  float* out = yt + mb * kTileRows;
  _tile_stored(0, out, ldt * 4);
  if (kTwoM) _tile_stored(1, out + kTileRows, ldt * 4);
  if (kTwoN) _tile_stored(2, out + kTileRows * ldt, ldt * 4);
  if (kTwoN && kTwoM) _tile_stored(3, out + kTileRows * ldt + kTileRows, ldt * 4);
}

template <bool kTwoN>
void nk_rows(const uint16_t* a, int64_t lda, int64_t Kp, const uint32_t* xt, int64_t mblocks, float* yt,
             int64_t ldt) {
  int64_t mb = 0;
  for (; mb + 2 <= mblocks; mb += 2) nk_block<kTwoN, true>(a, lda, Kp, xt, mblocks, mb, yt, ldt);
  if (mb < mblocks) nk_block<kTwoN, false>(a, lda, Kp, xt, mblocks, mb, yt, ldt);
}

// yt f32[rows, ldt] (y^T of rows n0 .. n0 + rows) -> y[m, n0 + r] for m < M: 16 x 16 blocks through a gather each
// row (yt is in L1/L2; y is written along its rows: a scatter down y's columns touched a page per element).
void put_transposed(const float* yt, int64_t ldt, int64_t rows, float* y, int64_t M, int64_t N, int64_t n0) {
  const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int(ldt)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < rows; r += 16) {
      const __mmask16 mask = mask16(rows - r);
      _mm512_mask_storeu_ps(y + m * N + n0 + r, mask,
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, down, yt + r * ldt + m, 4));
    }
}

void gemm_nk(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const uint16_t* e, int64_t N, float* y,
             int64_t threads) {
  const int64_t Mp = round_up(M, kTileRows), Kp = round_up(K, kTileK), mblocks = Mp / kTileRows;
  const uint32_t* xt = x_pairs_transposed(x_to_bf16(x, M, K, Mp, Kp), Mp, Kp);
  const int64_t chunks = (N + kNkChunk - 1) / kNkChunk;
  jaxserve::parallel_chunks(pool, chunks, threads, [&](int64_t c) {
    float* yt = scratch<float, kYt>(round_up(kNkChunk, 2 * kTileRows) * Mp);  // (put_transposed reads written rows)
    load_tile_config();
    const int64_t begin = c * kNkChunk, end = std::min(N, begin + kNkChunk);
    int64_t n0 = begin;
    // Whole 32-row blocks are read in place when rows of e hold whole k blocks; a ragged one through a copy.
    for (; K == Kp && n0 + 2 * kTileRows <= end; n0 += 2 * kTileRows)
      nk_rows<true>(e + n0 * K, K, Kp, xt, mblocks, yt + (n0 - begin) * Mp, Mp);
    for (; n0 < end; n0 += 2 * kTileRows) {
      const int64_t rows = std::min(end - n0, 2 * kTileRows);
      uint16_t* copy = scratch<uint16_t, kCopy>(2 * kTileRows * Kp);
      std::fill_n(copy, 2 * kTileRows * Kp, uint16_t(0));
      for (int64_t r = 0; r < rows; ++r) std::memcpy(copy + r * Kp, e + (n0 + r) * K, K * 2);
      if (rows > kTileRows) nk_rows<true>(copy, Kp, Kp, xt, mblocks, yt + (n0 - begin) * Mp, Mp);
      else nk_rows<false>(copy, Kp, Kp, xt, mblocks, yt + (n0 - begin) * Mp, Mp);
    }
    _tile_release();
    put_transposed(yt, Mp, end - begin, y, M, N, begin);
  });
}

// Linux hands out AMX tile state only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA).
bool request_amx() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#else
constexpr bool kBuiltWithAmx = false;
void gemm_kn(ffi::ThreadPool&, const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t) {}
void gemm_nk(ffi::ThreadPool&, const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t) {}
void gemm_packed(ffi::ThreadPool&, const float*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t) {}
const uint16_t* x_to_bf16(const float*, int64_t, int64_t, int64_t, int64_t) { return nullptr; }
const uint16_t* x_bf16_padded(const uint16_t*, int64_t, int64_t, int64_t, int64_t) { return nullptr; }
void gemm_packed_bf16x(ffi::ThreadPool&, XRows, int64_t, int64_t, const uint16_t*, int64_t, void*, Epilogue,
                       const void*, int64_t) {}
inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
bool request_amx() { return false; }
#endif

bool amx_ready() {
  static const bool ready = kBuiltWithAmx && request_amx();
  return ready;
}

template <bool kNK>
ffi::Error Bf16Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::BF16, 2> w,
                    ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads) {
  const std::string name = std::string("bf16_gemm_") + (kNK ? "nk" : "kn");
  if (!amx_ready())
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, name + ": AMX tiles are unavailable (jaxserve_amx_enable)");
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = w.dimensions()[kNK ? 0 : 1];
  if (w.dimensions()[kNK ? 1 : 0] != K) return ffi::Error::InvalidArgument(name + ": K mismatch");
  float* yp = y->typed_data();
  if (M == 0 || N == 0) return ffi::Error::Success();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.typed_data());
  (kNK ? gemm_nk : gemm_kn)(pool, x.typed_data(), M, K, wp, N, yp, threads);
  return ffi::Error::Success();
}

// y = x @ w, w [K, N] as pack_bf16 packed it: bf16[ceil(N / 32), round_up(K, 32) * 32] (N the attribute n); x f32
// or bf16 [M, K]; y as the attribute `epilogue` says (Epilogue: f32[M, N], bf16[M, N], bf16[M, N / 2] for a gated
// [gate | up] weight, whose activation table aux is f32[65536], i32[M], or bf16[M, N] adding the residual aux;
// the others take any aux, unread). inv_rms f32[M] and scale bf16[K], or both empty: an RMSNorm the GEMM applies
// to bf16 rows of x as it reads them (XRows). fma = 1: float32 FMAs (packed_fma.h) instead of the tiles.
ffi::Error Bf16GemmPacked(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::BF16, 2> packed,
                          ffi::AnyBuffer aux, ffi::Buffer<ffi::F32, 1> inv_rms, ffi::Buffer<ffi::BF16, 1> scale,
                          ffi::Result<ffi::AnyBuffer> y, int64_t threads, int64_t epilogue, int64_t N, int64_t fma) {
  const std::string name = "bf16_gemm_packed";
  if (!fma && !amx_ready())
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, name + ": AMX tiles are unavailable");
  if (epilogue < kF32 || epilogue > kResidualBf16) return ffi::Error::InvalidArgument(name + ": unknown epilogue");
  const ffi::DataType want_y = epilogue == kF32 ? ffi::DataType::F32
                               : epilogue == kArgmaxBf16 ? ffi::DataType::S32 : ffi::DataType::BF16;
  const size_t y_rank = epilogue == kArgmaxBf16 ? 1 : 2;
  if (x.dimensions().size() != 2 || y->dimensions().size() != y_rank || y->element_type() != want_y ||
      (x.element_type() != ffi::DataType::F32 && x.element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument(name + ": x must be f32 or bf16 [M, K], y of the epilogue's type and rank");
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1];
  if (y->dimensions()[0] != M || packed.dimensions()[0] != (N + 31) / 32 ||
      packed.dimensions()[1] != (K + 31) / 32 * 32 * 32 ||
      (y_rank == 2 && y->dimensions()[1] != (epilogue == kGatedBf16 ? N / 2 : N)))
    return ffi::Error::InvalidArgument(name + ": the packed weight's shape does not match K and N");
  if (epilogue == kGatedBf16 && (N % 64 != 0 || aux.element_type() != ffi::DataType::F32 ||
                                 aux.element_count() != 65536))
    return ffi::Error::InvalidArgument(name + ": a gated epilogue needs N / 2 a multiple of 32 and a 65536-entry table");
  if (epilogue == kArgmaxBf16 && (N == 0 || N > std::numeric_limits<int32_t>::max()))
    return ffi::Error::InvalidArgument(name + ": an argmax needs 0 < N < 2^31 columns");
  if (epilogue == kResidualBf16 && (aux.element_type() != ffi::DataType::BF16 || aux.dimensions().size() != 2 ||
                                    aux.dimensions()[0] != M || aux.dimensions()[1] != N))
    return ffi::Error::InvalidArgument(name + ": a residual epilogue needs a bf16 residual [M, N]");
  const bool normed = inv_rms.element_count() != 0 || scale.element_count() != 0;
  if (normed && (x.element_type() != ffi::DataType::BF16 || inv_rms.dimensions()[0] != M ||
                 scale.dimensions()[0] != K))
    return ffi::Error::InvalidArgument(name + ": a norm to apply needs bf16 x [M, K], inv_rms f32[M], scale bf16[K]");
  if (M == 0 || N == 0) return ffi::Error::Success();
  XRows rows{x.untyped_data(), x.element_type() == ffi::DataType::F32};
  if (normed) {
    rows.inv_rms = inv_rms.typed_data();
    rows.scale = reinterpret_cast<const uint16_t*>(scale.typed_data());
  }
  (fma ? jaxserve::packed_fma::gemm_packed : gemm_packed_bf16x)(
      pool, rows, M, K, reinterpret_cast<const uint16_t*>(packed.typed_data()), N, y->untyped_data(),
      Epilogue(epilogue), aux.untyped_data(), threads);
  return ffi::Error::Success();
}

// y f32[M, N] = x f32[M, K] @ w, w [K, N] as pack_f32 packed it: f32[ceil(N / 32), K * 32] (N the attribute n),
// float32 FMAs in k order (packed_fma.h's gemm_packed_f32; no tiles: AMX has no float32 products).
ffi::Error F32GemmPacked(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> x, ffi::Buffer<ffi::F32, 2> packed,
                         ffi::ResultBuffer<ffi::F32, 2> y, int64_t threads, int64_t N) {
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1];
  if (y->dimensions()[0] != M || y->dimensions()[1] != N || packed.dimensions()[0] != (N + 31) / 32 ||
      packed.dimensions()[1] != K * 32)
    return ffi::Error::InvalidArgument("f32_gemm_packed: the packed weight's shape does not match K and N");
  if (M == 0 || N == 0) return ffi::Error::Success();
  jaxserve::packed_fma::gemm_packed_f32(pool, x.typed_data(), M, K, packed.typed_data(), N, y->typed_data(),
                                        threads);
  return ffi::Error::Success();
}

}  // namespace

using F32Matrix = ffi::Buffer<ffi::F32, 2>;
using Bf16Matrix = ffi::Buffer<ffi::BF16, 2>;
using F32Vector = ffi::Buffer<ffi::F32, 1>;
using Bf16Vector = ffi::Buffer<ffi::BF16, 1>;

#define JAXSERVE_BF16_GEMM(name, nk)                                                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, Bf16Gemm<nk>,                                                \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<F32Matrix>()                                              \
                                    .Arg<Bf16Matrix>()                                             \
                                    .Ret<F32Matrix>()                                              \
                                    .Attr<int64_t>("threads"));

JAXSERVE_BF16_GEMM(jaxserve_bf16_gemm_kn, false)
JAXSERVE_BF16_GEMM(jaxserve_bf16_gemm_nk, true)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_bf16_gemm_packed, Bf16GemmPacked,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<Bf16Matrix>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<F32Vector>()
                                  .Arg<Bf16Vector>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("epilogue")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("fma"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxserve_f32_gemm_packed, F32GemmPacked,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32Matrix>()
                                  .Arg<F32Matrix>()
                                  .Ret<F32Matrix>()
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("n"));

extern "C" int jaxserve_amx_enable() { return amx_ready() ? 1 : 0; }
