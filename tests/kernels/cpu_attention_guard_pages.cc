// The CPU paged-attention kernel (jaxserve/kernels/cpu/attention.cc, included whole) on pools where every page
// holding no key some query sees is PROT_NONE, and whose block tables, queries, lengths and output end at a
// PROT_NONE page: reading a page outside the visible ones, or anything past an array, faults. The table entries of
// those pages (past the context, wholly before the sliding window) are garbage (out of the pool's range, negative).
// The outputs are checked against a double-precision reference that reads only visible keys. Built and run by
// test_cpu_attention.py.
//
// threads = 1: parallel_chunks then never touches the thread pool, which only XLA can provide.
#include "attention.cc"

#include "guard_pages.h"

#include <cstdio>
#include <random>

namespace {

struct Case {
  int64_t S, K, G, D, window;
  float soft_cap;
  std::vector<int64_t> q_lens, context_lens;
};

double g_worst = 0;  // max |o - reference| over max(1, |reference|)
int64_t g_outputs = 0;

// Position of row r of sequence b (rows in cu order), and the keys it sees: [lo, hi], empty when lo > hi.
void visible(const Case& c, int64_t b, int64_t i, int64_t& lo, int64_t& hi) {
  const int64_t pos = c.context_lens[b] - c.q_lens[b] + i;
  hi = std::min(pos, c.context_lens[b] - 1);
  lo = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
}

void run(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const int64_t B = c.q_lens.size(), H = c.K * c.G, S = c.S, K = c.K, D = c.D;
  int64_t M = 1, T = 0, P = 0;
  std::vector<int64_t> cu{0};
  for (int64_t b = 0; b < B; ++b) {
    M = std::max(M, (c.context_lens[b] + S - 1) / S + 1);
    T += c.q_lens[b];
    cu.push_back(T);
  }
  T += 2;  // padding rows
  // Each sequence's pages are its own: page b * M + m holds logical page m of sequence b.
  P = B * M;
  const size_t page_bytes = size_t(K * D * S) * 4;
  if (page_bytes % guard_pages::kPage) std::exit(3);  // a pool page must be whole OS pages to protect it alone
  float* kt = reinterpret_cast<float*>(guard_pages::fenced(P * page_bytes));
  float* v = reinterpret_cast<float*>(guard_pages::fenced(P * page_bytes));
  for (int64_t i = 0; i < P * K * D * S; ++i) kt[i] = normal(rng), v[i] = normal(rng);
  int32_t* tables = guard_pages::guarded<int32_t>(B * M);
  int32_t* lens = guard_pages::guarded<int32_t>(B);
  int32_t* cu32 = guard_pages::guarded<int32_t>(B + 1);
  float* q = guard_pages::guarded<float>(T * H * D);
  float* out = guard_pages::guarded<float>(T * H * D);
  for (int64_t i = 0; i < T * H * D; ++i) q[i] = normal(rng), out[i] = NAN;
  const int32_t garbage[] = {INT32_MAX, INT32_MIN, -1, int32_t(P)};
  for (int64_t b = 0; b <= B; ++b) cu32[b] = int32_t(cu[b]);
  for (int64_t b = 0; b < B; ++b) {
    lens[b] = int32_t(c.context_lens[b]);
    int64_t lo = INT64_MAX, hi = -1;
    for (int64_t i = 0; i < c.q_lens[b]; ++i) {
      int64_t l, h;
      visible(c, b, i, l, h);
      if (l <= h) lo = std::min(lo, l), hi = std::max(hi, h);
    }
    for (int64_t m = 0; m < M; ++m) {
      const bool seen = hi >= 0 && m >= lo / S && m <= hi / S;
      tables[b * M + m] = seen ? int32_t(b * M + m) : garbage[rng() % 4];
      if (!seen) {
        guard_pages::forbid(reinterpret_cast<char*>(kt) + (b * M + m) * page_bytes, page_bytes);
        guard_pages::forbid(reinterpret_cast<char*>(v) + (b * M + m) * page_bytes, page_bytes);
      }
    }
  }
  const float sm_scale = 1.f / std::sqrt(float(D));
  Shape sh{T, H, D, P, K, S, B, M, c.G, sm_scale, c.soft_cap, c.window};
  alignas(64) unsigned char no_pool[sizeof(ffi::ThreadPool)] = {};
  paged_attention(*reinterpret_cast<ffi::ThreadPool*>(no_pool), sh, q, kt, v, tables, lens, cu32, out, 1);

  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < c.q_lens[b]; ++i) {
      int64_t lo, hi;
      visible(c, b, i, lo, hi);
      const int64_t row = cu[b] + i;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t k = h / c.G;
        std::vector<double> s, o(D, 0.0);
        double mx = -INFINITY, sum = 0;
        for (int64_t pos = lo; pos <= hi; ++pos) {
          const int64_t page = b * M + pos / S, j = pos % S;
          double x = 0;
          for (int64_t d = 0; d < D; ++d)
            x += double(q[(row * H + h) * D + d] * sm_scale) * kt[((page * K + k) * D + d) * S + j];
          if (c.soft_cap > 0) x = c.soft_cap * std::tanh(x / c.soft_cap);
          s.push_back(x);
          mx = std::max(mx, x);
        }
        for (int64_t pos = lo; pos <= hi; ++pos) {
          const double p = std::exp(s[pos - lo] - mx);
          const int64_t page = b * M + pos / S, j = pos % S;
          sum += p;
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[((page * S + j) * K + k) * D + d];
        }
        for (int64_t d = 0; d < D; ++d) {
          const double want = sum > 0 ? o[d] / sum : 0.0, got = out[(row * H + h) * D + d];
          const double err = std::isnan(got) ? INFINITY : std::fabs(got - want) / std::max(1.0, std::fabs(want));
          g_worst = std::max(g_worst, err);
          ++g_outputs;
        }
      }
    }
  for (int64_t i = cu[B] * H * D; i < T * H * D; ++i)  // padding rows: zeros
    if (out[i] != 0.f) g_worst = INFINITY;

  // bf16 queries and output (bits, each array ending at a PROT_NONE page): the float32 call on the same (rounded)
  // queries, its output rounded to nearest even, bit for bit.
  uint16_t* q16 = guard_pages::guarded<uint16_t>(T * H * D);
  uint16_t* out16 = guard_pages::guarded<uint16_t>(T * H * D);
  float* qb = guard_pages::guarded<float>(T * H * D);
  float* outb = guard_pages::guarded<float>(T * H * D);
  for (int64_t i = 0; i < T * H * D; ++i) {
    q16[i] = narrow(q[i], q16), out16[i] = 0x7FC0;
    qb[i] = widen(q16[i]);
  }
  paged_attention(*reinterpret_cast<ffi::ThreadPool*>(no_pool), sh, qb, kt, v, tables, lens, cu32, outb, 1);
  paged_attention(*reinterpret_cast<ffi::ThreadPool*>(no_pool), sh, q16, kt, v, tables, lens, cu32, out16, 1);
  for (int64_t i = 0; i < T * H * D; ++i)
    if (out16[i] != narrow(outb[i], out16)) g_worst = INFINITY;
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  const std::vector<Case> cases = {
      {16, 3, 3, 64, 0, 0.f, {1, 1, 1, 1}, {1, 16, 17, 100}},           // decode, SmolLM2-135M's heads
      {16, 3, 3, 64, 7, 0.f, {1, 1, 1}, {40, 33, 5}},                   // a window: early pages unseen
      {16, 1, 4, 64, 0, 3.f, {5, 5, 5}, {5, 21, 48}},                   // uniform (verify), soft cap
      {16, 2, 1, 64, 20, 0.f, {37, 1, 0, 9, 1}, {60, 17, 0, 9, 90}},     // ragged, window, an idle sequence
      {32, 1, 2, 32, 0, 0.f, {3, 1, 12}, {70, 64, 12}},                 // page 32, head dim 32
      {8, 2, 2, 64, 9, 0.f, {1, 14, 2}, {30, 14, 8}},                   // page 8: the generic path
  };
  for (const Case& c : cases) run(c, rng);
  std::printf("%lld outputs, worst |error| / max(1, |reference|) = %.3g\n", (long long)g_outputs, g_worst);
  return g_worst <= 1e-5 ? 0 : 1;
}
