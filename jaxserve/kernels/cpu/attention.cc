// Paged attention over packed query tokens for the CPU, as one XLA FFI handler: online softmax, float32 sums.
//
//   jaxserve_paged_attention: o f32[T, H, D] from q f32[T, H, D] (or both bf16: q widened exactly as it is read, o
//       rounded to nearest even as it is written, XLA's converts around a float32 call), kt_pages f32[P, K, D, S]
//       (tokens innermost),
//       v_pages f32[P, S, K, D], block_tables i32[B, M], context_lens i32[B], cu_q_lens i32[B+1];
//       attributes sm_scale, soft_cap (0: none), sliding_window (0: none), threads.
//   jaxserve_paged_attention_bf16: the same over pools of bf16 bits (u16[...]: a bf16 model's K/V, read at half the
//       bytes), each element widened to float32 as it is loaded: the same sums as float32 pools holding those values.
//   jaxserve_paged_attention_write(_bf16): the same after writing this step's K/V rows k, v [T, K, D] (the pools'
//       element type) into their flat slots i32[T]; the pools are operands aliased to the 2nd and 3rd results, and each
//       sequence owns at most kRowsPerItem rows (decode steps, verify rounds): see Fresh and write_rows.
//
// Sequence b owns rows cu_q_lens[b] .. cu_q_lens[b+1] of q; its i-th row sits at position
// context_lens[b] - q_len_b + i and sees the keys at positions <= its own, < context_lens[b] (and < M*S), and,
// with a window, > position - sliding_window. A row that sees nothing, and a row no sequence owns, gets zeros.
// Decode (cu_q_lens = 0, 1, .., B), uniform (every q_len equal: speculative verify) and ragged (mixed prefill
// and decode) batches are the same call: the contracts of pallas_kernels/paged_attention/online.py.
//
// Work items are (sequence, kv head, up to kRowsPerItem rows): the G query heads of those rows share each K/V page
// read. An item walks its pages in groups of up to 128 keys: scores of four 16-key pages at once (independent FMA
// chains), one softmax update per group (one max, one exp pass, one rescale), then the group's V rows. An item
// reads only the pages holding keys one of its rows sees, each page through its block-table id clamped into
// [0, P), so no table entry can make it read outside the pools; keys in a page that no row sees (past
// the context, or before the window) may hold anything, NaN included: their scores are selected away and their V
// rows never touched. Items run on XLA's intra-op pool (parallel.h), claimed up to kItemsPerChunk at a time (one at
// a time when few), each asking for the next one's pages while it computes; each computes its outputs alone, in one
// order, so the result does not depend on the thread count.
#include <immintrin.h>  // (the bf16 loads' AVX-512 conversion)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "xla/ffi/api/ffi.h"
#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

// 16 float32 lanes: one AVX-512 register, or a pair of AVX2 ones (GCC/Clang vector extensions).
constexpr int kLanes = 16;
using vf = float __attribute__((vector_size(4 * kLanes)));
using vi = int32_t __attribute__((vector_size(4 * kLanes)));
constexpr int64_t kRowsPerItem = 8;
constexpr int64_t kItemsPerChunk = 16;  // items a thread claims at once, at most (each prefetches the next one's pages)
constexpr int64_t kPrefetchPages = 64;  // pages of the next item asked for at most

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

vf splat(float x) { return vf{} + x; }

// exp(x) to about 2 ulp for x in [-87, 88] (Cephes' expf polynomial); below -87 it returns ~2^-126, not 0, and
// NaN may come out as anything: callers select masked lanes away.
vf vexp(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer, held in the low bits
  const vf t = x * splat(1.44269504088896341f) + magic;
  const vf n = t - magic;
  const vf r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  vi bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // t's integer part n, as the exponent of 2^n
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

struct Shape {
  int64_t T, H, D, P, K, S, B, M, G;
  float sm_scale, soft_cap;
  int64_t window;
};

struct Item {
  int64_t seq, head, row0, rows, pos0;  // rows row0 .. row0 + rows of q at positions pos0 .., kv head `head`
};

// This step's K/V rows [T, K, D] (the pools' element type) and their flat slots i32[T] (page * S + offset; < 0 or
// past the pool: not written), for the variant that writes them (k null: the pools are only read).
template <class KV>
struct Fresh {
  const KV* k = nullptr;
  const KV* v = nullptr;
  const int32_t* slots = nullptr;
};

// An item's rows' K/V of its head into their slots, before the item reads its pages: its rows are the only new
// keys of that (sequence, head) when no sequence has more than kRowsPerItem rows (the variant's contract), so every
// key an item reads was written by itself or an earlier step. The pages are the ones the item reads next: the
// write's misses are the read's (a separate scatter missed on every K line of a page written a step ago).
template <class KV>
void write_rows(const Shape& sh, const Fresh<KV>& fresh, const Item& it, KV* kt, KV* v) {
  const int64_t D = sh.D, K = sh.K, S = sh.S;
  for (int64_t t = it.row0; t < it.row0 + it.rows; ++t) {
    const int64_t slot = fresh.slots[t];
    if (slot < 0 || slot >= sh.P * S) continue;
    const int64_t page = slot / S, off = slot % S;
    const KV* kr = fresh.k + (t * K + it.head) * D;
    KV* kdst = kt + (page * K + it.head) * D * S + off;  // [P, K, D, S]: tokens innermost
    for (int64_t d = 0; d < D; ++d) kdst[d * S] = kr[d];
    std::memcpy(v + ((page * S + off) * K + it.head) * D, fresh.v + (t * K + it.head) * D, D * sizeof(KV));
  }
}

// Per-thread buffers of one item: scaled queries and accumulators [NQ, D], scores / probabilities [NQ, Sp].
struct Scratch {
  std::vector<float> q, acc, p, mx, sum;
  std::vector<int64_t> lo, hi;
};

vf load(const float* p) {
  vf x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// K/V elements: float32, or bf16 bits (uint16_t) widened exactly (a 16-bit shift).
using vh = uint16_t __attribute__((vector_size(2 * kLanes)));
vf load(const uint16_t* p) {
#if defined(__AVX512F__)
  // one vpmovzxwd from memory and a shift (the vector extension's conversion took two half conversions and an insert)
  const __m512 x = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  return (vf)x;
#else
  vh h;
  std::memcpy(&h, p, sizeof h);
  const vi w = __builtin_convertvector(h, vi) << 16;
  vf x;
  std::memcpy(&x, &w, sizeof x);
  return x;
#endif
}

inline float widen(float x) { return x; }
inline float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }

// An output element: float32 as is, or its bf16 bits rounded to nearest even (XLA's convert; NaN stays a quiet NaN).
inline float narrow(float x, float*) { return x; }
inline uint16_t narrow(float x, uint16_t*) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Scores of kN query vectors (rows of q, D each) against kP pages' K, kt[c] [D, kS] -> s [kN, ld], page c's at
// columns c * kS: kS a multiple of the lanes, kN * kP * kS / 16 accumulators in registers (independent chains: one
// page of 16 keys alone left the FMAs waiting on each other), each K row loaded once for the kN vectors.
template <int kS, int kN, int kP, class KV>
void scores_fixed(const float* q, int64_t D, const KV* const* kt, float* s, int64_t ld) {
  constexpr int C = kS / kLanes;
  vf a[kN][kP][C] = {};
  for (int64_t d = 0; d < D; ++d)
    for (int p = 0; p < kP; ++p)
      for (int c = 0; c < C; ++c) {
        const vf k = load(kt[p] + d * kS + c * kLanes);
        for (int n = 0; n < kN; ++n) a[n][p][c] += q[n * D + d] * k;
      }
  for (int n = 0; n < kN; ++n)
    for (int p = 0; p < kP; ++p)
      for (int c = 0; c < C; ++c) store(s + n * ld + p * kS + c * kLanes, a[n][p][c]);
}

// Scores of nq query vectors against kP pages (kS > 0), or one page of S_rt keys (kS = 0, kP = 1) -> s [nq, ld].
template <int kS, int kP, class KV>
void scores(const float* q, int64_t nq, int64_t D, const KV* const* kt, int64_t S_rt, float* s, int64_t ld) {
  if constexpr (kS > 0) {
    int64_t i = 0;
    for (; i + 4 <= nq; i += 4) scores_fixed<kS, 4, kP>(q + i * D, D, kt, s + i * ld, ld);
    switch (nq - i) {
      case 3: scores_fixed<kS, 3, kP>(q + i * D, D, kt, s + i * ld, ld); break;
      case 2: scores_fixed<kS, 2, kP>(q + i * D, D, kt, s + i * ld, ld); break;
      case 1: scores_fixed<kS, 1, kP>(q + i * D, D, kt, s + i * ld, ld); break;
      default: break;
    }
    return;
  }
  const int64_t S = S_rt;
  for (int64_t i = 0; i < nq; ++i) {
    float* out = s + i * ld;
    std::fill(out, out + S, 0.f);
    for (int64_t d = 0; d < D; ++d) {
      const float qd = q[i * D + d];
      const KV* k = kt[0] + d * S;
      for (int64_t j = 0; j < S; ++j) out[j] += qd * widen(k[j]);
    }
  }
}

// One page of a group for the V pass: its keys j0..j1 (those some row sees), their probabilities at column col + j
// of the group's rows, its V rows at vp + j * stride.
template <class KV>
struct PageV {
  const KV* vp;
  int64_t col, j0, j1;
};

// acc [kN, D] columns d .. d + kD * 16 += probabilities p [kN, ld] @ the pages' V rows, in page and then key order
// (the order of one page at a time): the chunk stays in registers while every key of the group passes, each V row
// chunk loaded once for the kN vectors.
template <int kN, int kD, class KV>
void pv_chunk(const float* p, int64_t ld, const PageV<KV>* pages, int64_t npages, int64_t stride, float* acc,
              int64_t D, int64_t d) {
  vf a[kN][kD];
  for (int n = 0; n < kN; ++n)
    for (int t = 0; t < kD; ++t) a[n][t] = load(acc + n * D + d + t * kLanes);
  for (int64_t c = 0; c < npages; ++c) {
    const PageV<KV>& pg = pages[c];
    for (int64_t j = pg.j0; j <= pg.j1; ++j) {
      vf x[kD];
      for (int t = 0; t < kD; ++t) x[t] = load(pg.vp + j * stride + d + t * kLanes);
      for (int n = 0; n < kN; ++n) {
        const float pj = p[n * ld + pg.col + j];
        for (int t = 0; t < kD; ++t) a[n][t] += pj * x[t];
      }
    }
  }
  for (int n = 0; n < kN; ++n)
    for (int t = 0; t < kD; ++t) store(acc + n * D + d + t * kLanes, a[n][t]);
}

template <int kN, class KV>
void pv_fixed(const float* p, int64_t ld, const PageV<KV>* pages, int64_t npages, int64_t stride, float* acc,
              int64_t D) {
  int64_t d = 0;
  for (; d + 4 * kLanes <= D; d += 4 * kLanes) pv_chunk<kN, 4>(p, ld, pages, npages, stride, acc, D, d);
  for (; d + kLanes <= D; d += kLanes) pv_chunk<kN, 1>(p, ld, pages, npages, stride, acc, D, d);
  for (; d < D; ++d)
    for (int64_t c = 0; c < npages; ++c)
      for (int64_t j = pages[c].j0; j <= pages[c].j1; ++j)
        for (int n = 0; n < kN; ++n)
          acc[n * D + d] += p[n * ld + pages[c].col + j] * widen(pages[c].vp[j * stride + d]);
}

// acc [nq, D] += probabilities p [nq, ld] @ the pages' V rows.
template <class KV>
void pv(const float* p, int64_t nq, int64_t ld, const PageV<KV>* pages, int64_t npages, int64_t stride, float* acc,
        int64_t D) {
  int64_t i = 0;
  for (; i + 4 <= nq; i += 4) pv_fixed<4>(p + i * ld, ld, pages, npages, stride, acc + i * D, D);
  switch (nq - i) {
    case 3: pv_fixed<3>(p + i * ld, ld, pages, npages, stride, acc + i * D, D); break;
    case 2: pv_fixed<2>(p + i * ld, ld, pages, npages, stride, acc + i * D, D); break;
    case 1: pv_fixed<1>(p + i * ld, ld, pages, npages, stride, acc + i * D, D); break;
    default: break;
  }
}

// Folds a group's scores s [width] (visible lanes a..b; width a multiple of the lanes) into a query vector's running
// max / sum / accumulator; leaves the probabilities in s (zero outside a..b).
void softmax_update(float* s, int64_t width, int64_t a, int64_t b, float soft_cap, float& mx, float& sum, float* acc,
                    int64_t D) {
  if (soft_cap > 0)
    for (int64_t j = a; j <= b; ++j) s[j] = soft_cap * std::tanh(s[j] / soft_cap);
  const vi iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int32_t a32 = int32_t(a), b32 = int32_t(b);
  vf m = splat(kNegInf);
  for (int64_t j0 = 0; j0 < width; j0 += kLanes) {
    const vi j = iota + int32_t(j0);
    const vf x = load(s + j0);
    m = (j >= a32) & (j <= b32) & (x > m) ? x : m;  // a select: a masked lane may hold NaN
  }
  float page_max = kNegInf;
  for (int l = 0; l < kLanes; ++l) page_max = std::max(page_max, m[l]);
  const float new_max = std::max(mx, page_max);
  const float scale = std::exp(mx - new_max);  // 0 on the first visible page (mx = -inf)
  vf total = {};
  for (int64_t j0 = 0; j0 < width; j0 += kLanes) {
    const vi j = iota + int32_t(j0);
    const vf e = vexp(load(s + j0) - new_max);
    const vf p = (j >= a32) & (j <= b32) ? e : splat(0.f);
    store(s + j0, p);
    total += p;
  }
  float page_sum = 0;
  for (int l = 0; l < kLanes; ++l) page_sum += total[l];
  sum = sum * scale + page_sum;
  mx = new_max;
  if (scale != 1.f)
    for (int64_t d = 0; d < D; ++d) acc[d] *= scale;
}

// Ask for a page's K block [D, S] (k_elements) or the V rows of one head (S rows of D, stride apart) ahead of use:
// the pages lie anywhere in the pool, beyond what the hardware prefetcher guesses.
// (kLocality: __builtin_prefetch's, 3 = into L1, 2 = into L2.)
template <int kLocality = 3, class KV>
void prefetch_k(const KV* kp, int64_t k_elements) {
  constexpr int64_t kLine = 64 / sizeof(KV);  // elements a cache line
  for (int64_t f = 0; f < k_elements; f += kLine) __builtin_prefetch(kp + f, 0, kLocality);
}

template <int kLocality = 3, class KV>
void prefetch_v(const KV* vp, int64_t S, int64_t stride, int64_t D) {
  constexpr int64_t kLine = 64 / sizeof(KV);
  for (int64_t j = 0; j < S; ++j)
    for (int64_t d = 0; d < D; d += kLine) __builtin_prefetch(vp + j * stride + d, 0, kLocality);
}

// Pages of kS keys scored together (kP: 64 keys, four accumulator chains per query vector) and folded into the
// softmax together (a group: up to kGroupKeys keys, one max, one exp pass and one rescale for all of them).
constexpr int64_t kGroupKeys = 128;
constexpr int64_t kMaxGroup = kGroupKeys / kLanes;
template <int kS>
constexpr int64_t kScorePages = kS > 0 ? std::max(1, 64 / kS) : 1;
template <int kS>
constexpr int64_t kGroupPages = kS > 0 ? std::max<int64_t>(kScorePages<kS>, kGroupKeys / kS) : 1;

template <int kS, class KV, class QO>
void attend_item(const Shape& sh, const QO* q, const KV* kt, const KV* v, const int32_t* tables,
                 int64_t context_len, const Item& it, QO* out, Scratch& w, const int32_t* next_tables,
                 int64_t next_len, const Item* next) {
  constexpr int64_t kP = kScorePages<kS>, kG = kGroupPages<kS>;
  static_assert(kG % kP == 0 && kG <= kMaxGroup, "a group is whole score calls");
  const int64_t D = sh.D, G = sh.G, S = kS ? kS : sh.S, sp = (S + kLanes - 1) / kLanes * kLanes, ld = kG * sp;
  const int64_t nq = it.rows * G;
  w.q.resize(nq * D);
  w.acc.assign(nq * D, 0.f);
  w.p.resize(nq * ld);
  w.mx.assign(nq, kNegInf);
  w.sum.assign(nq, 0.f);
  w.lo.resize(nq);
  w.hi.resize(nq);
  const int64_t last_key = std::min(context_len, sh.M * S) - 1;
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = -1;  // the keys some row sees
  for (int64_t r = 0; r < it.rows; ++r) {
    const int64_t pos = it.pos0 + r;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t i = r * G + g;
      const QO* src = q + ((it.row0 + r) * sh.H + it.head * G + g) * D;
      for (int64_t d = 0; d < D; ++d) w.q[i * D + d] = widen(src[d]) * sh.sm_scale;
      w.lo[i] = sh.window > 0 ? std::max<int64_t>(0, pos - sh.window + 1) : 0;
      w.hi[i] = std::min(pos, last_key);
    }
    if (w.lo[r * G] <= w.hi[r * G]) {  // a row seeing nothing (position < 0) widens nothing
      lo = std::min(lo, w.lo[r * G]);
      hi = std::max(hi, w.hi[r * G]);
    }
  }
  // The next item's pages, asked for into L2 while this one computes: an item's pages lie anywhere in the pool, and
  // at batch 64 a layer's K/V (6 MB) come from memory, where the item's own prefetches, one score call ahead, left
  // its first loads waiting (15% less time a call in a one-thread harness over 30 layers' pools). At most
  // kPrefetchPages: a long prefill item's later pages come with its own prefetches.
  if (next != nullptr) {
    const int64_t nhi = std::min({next->pos0 + next->rows - 1, next_len - 1, sh.M * S - 1});
    const int64_t nlo = sh.window > 0 ? std::max<int64_t>(0, next->pos0 - sh.window + 1) : 0;
    for (int64_t page = nlo / S; nhi >= nlo && page <= std::min(nhi / S, nlo / S + kPrefetchPages - 1); ++page) {
      const int64_t id = std::clamp<int64_t>(next_tables[page], 0, sh.P - 1);
      prefetch_k<2>(kt + (id * sh.K + next->head) * D * S, D * S);
      prefetch_v<2>(v + (id * S * sh.K + next->head) * D, S, sh.K * D, D);
    }
  }
  const KV* kp[kMaxGroup];
  PageV<KV> vpages[kMaxGroup];
  auto page_id = [&](int64_t page) { return std::clamp<int64_t>(tables[page], 0, sh.P - 1); };
  for (int64_t g0 = lo / S; hi >= lo && g0 <= hi / S; g0 += kG) {
    const int64_t pages = std::min(kG, hi / S - g0 + 1), first = g0 * S;
    for (int64_t c = 0; c < pages; ++c) {
      const int64_t id = page_id(g0 + c), key0 = first + c * S;
      kp[c] = kt + (id * sh.K + it.head) * D * S;
      vpages[c] = {v + (id * S * sh.K + it.head) * D, c * sp, std::max(lo - key0, int64_t(0)),
                   std::min(hi - key0, S - 1)};
    }
    for (int64_t c = pages; c < (pages + kP - 1) / kP * kP; ++c) kp[c] = kp[pages - 1];  // scored, never seen
    // The group's V rows are asked for now (read after its scores), the next score call's K while this one runs (a
    // whole next group at once into L1 measured slower: benchmarks/cpu_attention_pool.py, the scattered pool),
    // and the next group's K and V into L2 (a whole group ahead: at batch 64, 0.32 -> 0.28 ms a call over the
    // scattered pool; a few long contexts, batch 8 of 300-1000 keys, unchanged at ~23 GB/s).
    for (int64_t c = 0; c < pages; ++c) prefetch_v(vpages[c].vp, S, sh.K * D, D);
    for (int64_t n = g0 + kG; n < std::min(g0 + 2 * kG, hi / S + 1); ++n) {
      prefetch_k<2>(kt + (page_id(n) * sh.K + it.head) * D * S, D * S);
      prefetch_v<2>(v + (page_id(n) * S * sh.K + it.head) * D, S, sh.K * D, D);
    }
    for (int64_t c = 0; c < pages; c += kP) {
      for (int64_t n = g0 + c + kP; n < std::min(g0 + c + 2 * kP, hi / S + 1); ++n)
        prefetch_k(kt + (page_id(n) * sh.K + it.head) * D * S, D * S);
      scores<kS, kP>(w.q.data(), nq, D, kp + c, S, w.p.data() + c * sp, ld);
    }
    for (int64_t i = 0; i < nq; ++i) {
      // Columns of this group's keys: page c's key j at c * sp + j (sp = S but for kS = 0, whose groups are a page).
      const int64_t a = std::max(w.lo[i] - first, int64_t(0)), b = std::min(w.hi[i] - first, pages * S - 1);
      float* s = w.p.data() + i * ld;
      if (a > b) std::fill(s, s + pages * sp, 0.f);
      else softmax_update(s, pages * sp, a, b, sh.soft_cap, w.mx[i], w.sum[i], w.acc.data() + i * D, D);
    }
    // V rows of keys some row sees (all below the context length: written, finite).
    pv(w.p.data(), nq, ld, vpages, pages, sh.K * D, w.acc.data(), D);
  }
  for (int64_t r = 0; r < it.rows; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t i = r * G + g;
      const float denom = std::max(w.sum[i], 1e-30f);
      QO* dst = out + ((it.row0 + r) * sh.H + it.head * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = narrow(w.acc[i * D + d] / denom, dst);
    }
}

// The work items of a batch; zeroes the output rows no sequence owns. A malformed cu_q_lens (decreasing, or
// past T) is clamped so that sequences own disjoint rows inside [0, T).
template <class QO>
std::vector<Item> plan(const Shape& sh, const int32_t* context_lens, const int32_t* cu, QO* out) {
  std::vector<Item> items;
  int64_t covered = 0;
  for (int64_t b = 0; b < sh.B; ++b) {
    const int64_t row0 = std::clamp<int64_t>(cu[b], covered, sh.T), row1 = std::clamp<int64_t>(cu[b + 1], row0, sh.T);
    std::fill(out + covered * sh.H * sh.D, out + row0 * sh.H * sh.D, QO(0));
    const int64_t pos0 = int64_t(context_lens[b]) - (int64_t(cu[b + 1]) - cu[b]) + (row0 - cu[b]);
    for (int64_t r = row0; r < row1; r += kRowsPerItem)
      for (int64_t k = 0; k < sh.K; ++k)
        items.push_back({b, k, r, std::min(kRowsPerItem, row1 - r), pos0 + (r - row0)});
    covered = row1;
  }
  std::fill(out + covered * sh.H * sh.D, out + sh.T * sh.H * sh.D, QO(0));
  return items;
}

template <int kS, class KV, class QO>
void attend(ffi::ThreadPool& pool, const Shape& sh, const QO* q, const KV* kt, const KV* v,
            const int32_t* tables, const int32_t* context_lens, const std::vector<Item>& items, QO* out,
            int64_t threads, const Fresh<KV>& fresh) {
  // Few items (a batch's last few sequences, often with long contexts) are claimed one at a time, so that every
  // thread gets some: 16 a chunk left a batch of up to 5 sequences (15 items) on one thread.
  const int64_t n = int64_t(items.size());
  const int64_t per_chunk = std::clamp<int64_t>(n / (4 * std::max<int64_t>(threads, 1)), 1, kItemsPerChunk);
  const int64_t chunks = (n + per_chunk - 1) / per_chunk;
  jaxserve::parallel_chunks(pool, chunks, threads, [&](int64_t c) {
    thread_local Scratch scratch;
    const int64_t i1 = std::min(n, (c + 1) * per_chunk);
    for (int64_t i = c * per_chunk; i < i1; ++i) {
      const Item& it = items[i];
      const Item* next = i + 1 < i1 ? &items[i + 1] : nullptr;
      if (fresh.k != nullptr) write_rows(sh, fresh, it, const_cast<KV*>(kt), const_cast<KV*>(v));
      attend_item<kS>(sh, q, kt, v, tables + it.seq * sh.M, context_lens[it.seq], it, out, scratch,
                      next ? tables + next->seq * sh.M : nullptr, next ? context_lens[next->seq] : 0, next);
    }
  });
}

// The whole call, shapes checked: o [T, H, D] (see the top of this file); q and o float32, or both bf16 bits.
template <class KV, class QO>
void paged_attention(ffi::ThreadPool& pool, const Shape& sh, const QO* q, const KV* kt, const KV* v,
                     const int32_t* tables, const int32_t* context_lens, const int32_t* cu_q_lens, QO* o,
                     int64_t threads, const Fresh<KV>& fresh = Fresh<KV>{}) {
  if (sh.P == 0 || sh.M == 0 || sh.S == 0) {  // no keys anywhere
    std::fill(o, o + sh.T * sh.H * sh.D, QO(0));
    return;
  }
  const std::vector<Item> items = plan(sh, context_lens, cu_q_lens, o);
  auto run = [&](auto attend_s) { attend_s(pool, sh, q, kt, v, tables, context_lens, items, o, threads, fresh); };
  switch (sh.S) {
    case 16: run(attend<16, KV, QO>); break;
    case 32: run(attend<32, KV, QO>); break;
    default: run(attend<0, KV, QO>); break;
  }
}

// The handlers' body: shapes checked, then the call; with fresh.k set, kt and v are the (aliased) result pools.
template <ffi::DataType kKV, class KV = std::conditional_t<kKV == ffi::U16, uint16_t, float>>  // u16: bf16 bits
ffi::Error attention_call(ffi::ThreadPool& pool, const ffi::AnyBuffer& q, const ffi::Buffer<kKV, 4>& kt_pages,
                          const ffi::Buffer<kKV, 4>& v_pages, const KV* kt, const KV* v,
                          const ffi::Buffer<ffi::S32, 2>& block_tables, const ffi::Buffer<ffi::S32, 1>& context_lens,
                          const ffi::Buffer<ffi::S32, 1>& cu_q_lens, ffi::AnyBuffer out, float sm_scale,
                          float soft_cap, int64_t sliding_window, int64_t threads, const Fresh<KV>& fresh) {
  const ffi::DataType qt = q.element_type();
  if (q.dimensions().size() != 3 || out.dimensions().size() != 3 || out.element_type() != qt ||
      (qt != ffi::DataType::F32 && qt != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument("paged_attention: q and the output must be both f32 or both bf16 [T, H, D]");
  const auto qd = q.dimensions(), kd = kt_pages.dimensions(), vd = v_pages.dimensions();
  Shape sh{qd[0], qd[1], qd[2], kd[0], kd[1], kd[3], block_tables.dimensions()[0], block_tables.dimensions()[1], 0,
           sm_scale, soft_cap, sliding_window};
  if (sh.K <= 0 || sh.H % sh.K || kd[2] != sh.D || vd[0] != sh.P || vd[1] != sh.S || vd[2] != sh.K ||
      vd[3] != sh.D || context_lens.dimensions()[0] != sh.B || cu_q_lens.dimensions()[0] != sh.B + 1 ||
      out.dimensions()[0] != qd[0] || out.dimensions()[1] != qd[1] || out.dimensions()[2] != qd[2])
    return ffi::Error::InvalidArgument("paged_attention: inconsistent shapes");
  sh.G = sh.H / sh.K;
  if (qt == ffi::DataType::BF16)  // a bf16 model's queries and output as their bits: no converts around the call
    paged_attention(pool, sh, static_cast<const uint16_t*>(q.untyped_data()), kt, v, block_tables.typed_data(),
                    context_lens.typed_data(), cu_q_lens.typed_data(), static_cast<uint16_t*>(out.untyped_data()),
                    threads, fresh);
  else
    paged_attention(pool, sh, static_cast<const float*>(q.untyped_data()), kt, v, block_tables.typed_data(),
                    context_lens.typed_data(), cu_q_lens.typed_data(), static_cast<float*>(out.untyped_data()),
                    threads, fresh);
  return ffi::Error::Success();
}

template <ffi::DataType kKV>
ffi::Error PagedAttention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::Buffer<kKV, 4> kt_pages,
                          ffi::Buffer<kKV, 4> v_pages, ffi::Buffer<ffi::S32, 2> block_tables,
                          ffi::Buffer<ffi::S32, 1> context_lens, ffi::Buffer<ffi::S32, 1> cu_q_lens,
                          ffi::Result<ffi::AnyBuffer> out, float sm_scale, float soft_cap, int64_t sliding_window,
                          int64_t threads) {
  using KV = std::conditional_t<kKV == ffi::U16, uint16_t, float>;
  return attention_call<kKV>(pool, q, kt_pages, v_pages, reinterpret_cast<const KV*>(kt_pages.typed_data()),
                             reinterpret_cast<const KV*>(v_pages.typed_data()), block_tables, context_lens, cu_q_lens,
                             *out, sm_scale, soft_cap, sliding_window, threads, Fresh<KV>{});
}

// The variant that first writes this step's rows k, v [T, K, D] (the pools' element type) into their slots i32[T]:
// the pools are operands aliased to the 2nd and 3rd results (XLA hands over the donated buffers themselves). Each
// sequence must own at most kRowsPerItem rows (decode, verify rounds): one item then writes a (sequence, head)'s new
// keys before reading them.
template <ffi::DataType kKV>
ffi::Error PagedAttentionWrite(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::Buffer<kKV, 3> k_rows,
                               ffi::Buffer<kKV, 3> v_rows, ffi::Buffer<ffi::S32, 1> slots,
                               ffi::Buffer<kKV, 4> kt_pages, ffi::Buffer<kKV, 4> v_pages,
                               ffi::Buffer<ffi::S32, 2> block_tables, ffi::Buffer<ffi::S32, 1> context_lens,
                               ffi::Buffer<ffi::S32, 1> cu_q_lens, ffi::Result<ffi::AnyBuffer> out,
                               ffi::Result<ffi::Buffer<kKV, 4>> kt_out, ffi::Result<ffi::Buffer<kKV, 4>> v_out,
                               float sm_scale, float soft_cap, int64_t sliding_window, int64_t threads) {
  using KV = std::conditional_t<kKV == ffi::U16, uint16_t, float>;
  const auto rd = k_rows.dimensions(), kd = kt_pages.dimensions(), qd = q.dimensions();
  if (rd[0] != qd[0] || rd[1] != kd[1] || rd[2] != kd[2] || v_rows.dimensions()[0] != rd[0] ||
      v_rows.dimensions()[1] != rd[1] || v_rows.dimensions()[2] != rd[2] || slots.dimensions()[0] != rd[0])
    return ffi::Error::InvalidArgument("paged_attention_write: k, v must be [T, K, D] and slots [T] for q [T, H, D]");
  const int32_t* cu = cu_q_lens.typed_data();
  for (int64_t b = 0; b < cu_q_lens.dimensions()[0] - 1; ++b)
    if (int64_t(cu[b + 1]) - cu[b] > kRowsPerItem)
      return ffi::Error::InvalidArgument("paged_attention_write: a sequence owns more than 8 rows");
  KV* kt = reinterpret_cast<KV*>(kt_out->typed_data());
  KV* v = reinterpret_cast<KV*>(v_out->typed_data());
  if (static_cast<const void*>(kt) != kt_pages.untyped_data() || static_cast<const void*>(v) != v_pages.untyped_data())
    return ffi::Error::InvalidArgument("paged_attention_write: the pools must be aliased to the 2nd and 3rd results");
  const Fresh<KV> fresh{reinterpret_cast<const KV*>(k_rows.typed_data()),
                        reinterpret_cast<const KV*>(v_rows.typed_data()), slots.typed_data()};
  return attention_call<kKV>(pool, q, kt_pages, v_pages, kt, v, block_tables, context_lens, cu_q_lens, *out,
                             sm_scale, soft_cap, sliding_window, threads, fresh);
}

}  // namespace

// Aliases: the handler macro cannot take template arguments with commas.
using F32Pages = ffi::Buffer<ffi::F32, 4>;
using Bf16BitsPages = ffi::Buffer<ffi::U16, 4>;
using S32Matrix = ffi::Buffer<ffi::S32, 2>;
using S32Vector = ffi::Buffer<ffi::S32, 1>;

#define JAXSERVE_PAGED_ATTENTION(name, dtype, pages)                                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, PagedAttention<ffi::dtype>,                                  \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<ffi::AnyBuffer>()                                         \
                                    .Arg<pages>()                                                  \
                                    .Arg<pages>()                                                  \
                                    .Arg<S32Matrix>()                                              \
                                    .Arg<S32Vector>()                                              \
                                    .Arg<S32Vector>()                                              \
                                    .Ret<ffi::AnyBuffer>()                                         \
                                    .Attr<float>("sm_scale")                                       \
                                    .Attr<float>("soft_cap")                                       \
                                    .Attr<int64_t>("sliding_window")                               \
                                    .Attr<int64_t>("threads"));

JAXSERVE_PAGED_ATTENTION(jaxserve_paged_attention, F32, F32Pages)
JAXSERVE_PAGED_ATTENTION(jaxserve_paged_attention_bf16, U16, Bf16BitsPages)

using F32Rows = ffi::Buffer<ffi::F32, 3>;
using Bf16BitsRows = ffi::Buffer<ffi::U16, 3>;

#define JAXSERVE_PAGED_ATTENTION_WRITE(name, dtype, rows, pages)                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, PagedAttentionWrite<ffi::dtype>,                             \
                                ffi::Ffi::Bind()                                                   \
                                    .Ctx<ffi::ThreadPool>()                                        \
                                    .Arg<ffi::AnyBuffer>()                                         \
                                    .Arg<rows>()                                                   \
                                    .Arg<rows>()                                                   \
                                    .Arg<S32Vector>()                                              \
                                    .Arg<pages>()                                                  \
                                    .Arg<pages>()                                                  \
                                    .Arg<S32Matrix>()                                              \
                                    .Arg<S32Vector>()                                              \
                                    .Arg<S32Vector>()                                              \
                                    .Ret<ffi::AnyBuffer>()                                         \
                                    .Ret<pages>()                                                  \
                                    .Ret<pages>()                                                  \
                                    .Attr<float>("sm_scale")                                       \
                                    .Attr<float>("soft_cap")                                       \
                                    .Attr<int64_t>("sliding_window")                               \
                                    .Attr<int64_t>("threads"));

JAXSERVE_PAGED_ATTENTION_WRITE(jaxserve_paged_attention_write, F32, F32Rows, F32Pages)
JAXSERVE_PAGED_ATTENTION_WRITE(jaxserve_paged_attention_write_bf16, U16, Bf16BitsRows, Bf16BitsPages)
