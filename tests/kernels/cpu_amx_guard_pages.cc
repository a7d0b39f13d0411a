// The AMX bf16 GEMMs (jaxserve/kernels/cpu/amx.cc, included whole: [K, N], [N, K] and packed) on buffers that end
// at, or (argument "front") start at, a PROT_NONE page: a read or write outside a buffer faults. The shapes reach
// every ragged edge (the packed one also normalizing the rows it reads: XRows): M past whole tiles and row blocks (1, 17, 33, 50), K below and past whole 32-k blocks (the
// [N, K] kernel then copies ragged rows of e instead of loading tiles from it), N past 16-column tiles, 32-column
// blocks, the 256-wide chunks and the packed kernel's pairs of 32-column groups. Results are checked against a
// double-precision reference of the same operands (x rounded to bf16).
// Prints "no AMX" and exits 0 where the build or the kernel has no tiles. Built and run by test_cpu_amx.py.
//
// threads = 1: parallel_chunks then never touches the thread pool, which only XLA can provide.
#include "amx.cc"

#include "guard_pages.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using guard_pages::from_bf16;
using guard_pages::guarded;
using guard_pages::to_bf16;

int main(int argc, char** argv) {
  if (!amx_ready()) {
    std::printf("no AMX\n");
    return 0;
  }
  guard_pages::g_front = argc > 1 && std::string(argv[1]) == "front";
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  alignas(64) unsigned char no_pool[sizeof(ffi::ThreadPool)] = {};
  ffi::ThreadPool& pool = *reinterpret_cast<ffi::ThreadPool*>(no_pool);
  double worst = 0;
  float worst_bf16 = 0;
  int64_t outputs = 0, normed_differ = 0;
  std::vector<float> silu(65536);  // the gated epilogue's table: SiLU of every bf16 value, rounded to bf16
  for (int64_t b = 0; b < 65536; ++b) {
    const float v = from_bf16(uint16_t(b));
    silu[b] = from_bf16(to_bf16(v / (1.0f + std::exp(-v))));
  }
  for (int64_t M : {1, 17, 33, 50})
    for (int64_t K : {0, 1, 31, 32, 33, 64, 100})
      for (int64_t N : {1, 15, 17, 32, 33, 64, 100, 128, 300}) {
        float* x = guard_pages::guarded<float>(M * K);
        for (int64_t i = 0; i < M * K; ++i) x[i] = normal(rng);
        uint16_t* w = guard_pages::guarded<uint16_t>(K * N);  // read as [K, N] by _kn and as [N, K] by _nk
        for (int64_t i = 0; i < K * N; ++i) w[i] = to_bf16(normal(rng));
        float* y = guard_pages::guarded<float>(M * N);
        // w [K, N] in the packed layout (jaxserve/kernels/cpu/packed.py): [ceil(N / 32)][Kp / 32][2][16][16][2]
        const int64_t G = (N + 31) / 32, Kp = (K + 31) / 32 * 32;
        uint16_t* packed = guard_pages::guarded<uint16_t>(G * Kp * 32);
        for (int64_t i = 0; i < G * Kp * 32; ++i) {
          const int64_t g = i / (Kp * 32), r = i % (Kp * 32), kb = r / 1024, t = r / 512 % 2, p = r / 32 % 16,
                        j = r / 2 % 16, parity = r % 2, k = kb * 32 + 2 * p + parity, n = g * 32 + t * 16 + j;
          packed[i] = k < K && n < N ? w[k * N + n] : 0;
        }
        for (int variant : {0, 1, 2}) {
          const bool nk = variant == 1;
          if (variant == 2) gemm_packed(pool, x, M, K, packed, N, y, 1);
          else (nk ? gemm_nk : gemm_kn)(pool, x, M, K, w, N, y, 1);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double sum = 0, magnitude = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(from_bf16(to_bf16(x[m * K + k]))) * from_bf16(w[nk ? n * K + k : k * N + n]);
                sum += p;
                magnitude += std::fabs(p);
              }
              worst = std::max(worst, std::fabs(y[m * N + n] - sum) / std::max(magnitude, 1e-30));
              ++outputs;
            }
        }
        // bf16 x, bf16 y (kBf16), and for [gate | up] weights bf16 act(gate) * up (kGatedBf16, act = SiLU here):
        // the float32 sums above rounded, checked to bf16's precision.
        uint16_t* xb = guard_pages::guarded<uint16_t>(M * K);
        for (int64_t i = 0; i < M * K; ++i) xb[i] = to_bf16(x[i]);
        gemm_packed(pool, x, M, K, packed, N, y, 1);  // the float32 sums, the reference of both
        uint16_t* yb = guarded<uint16_t>(M * N);
        gemm_packed_bf16x(pool, XRows{xb, false}, M, K, packed, N, yb, kBf16, nullptr, 1);
        for (int64_t i = 0; i < M * N; ++i)
          worst_bf16 = std::max(worst_bf16, std::fabs(from_bf16(yb[i]) - y[i]) / std::max(std::fabs(y[i]), 1e-30f));
        // the same rows with a norm the GEMM applies (XRows' inv_rms and scale, both 1 here): the same bits
        float* inv_rms = guarded<float>(M);
        uint16_t* scale = guarded<uint16_t>(K);
        std::fill_n(inv_rms, M, 1.0f);
        std::fill_n(scale, K, to_bf16(1.0f));
        uint16_t* yn = guarded<uint16_t>(M * N);
        gemm_packed_bf16x(pool, XRows{xb, false, inv_rms, scale}, M, K, packed, N, yn, kBf16, nullptr, 1);
        normed_differ += std::memcmp(yn, yb, M * N * 2) != 0;
        if (N % 64 == 0) {
          const int64_t I = N / 2;
          uint16_t* h = guarded<uint16_t>(M * I);
          gemm_packed_bf16x(pool, XRows{xb, false}, M, K, packed, N, h, kGatedBf16, silu.data(), 1);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t i = 0; i < I; ++i) {
              const float want = silu[to_bf16(y[m * N + i])] * from_bf16(to_bf16(y[m * N + I + i]));
              worst_bf16 = std::max(worst_bf16, std::fabs(from_bf16(h[m * I + i]) - want) /
                                                    std::max(std::fabs(want), 1e-30f));
            }
        }
      }
  std::printf("outputs %ld worst %.3g worst bf16 %.3g normed shapes differing %ld\n", long(outputs), worst, worst_bf16,
              long(normed_differ));
  // float32 sums of exact products: K roundings of at most 2^-24 each, K <= 100; one bf16 rounding (2^-8 relative:
  // NaN-free finite values), and for the gated values two
  return worst <= 1e-6 && worst_bf16 <= 1.0f / 64 && normed_differ == 0 ? 0 : 1;
}
