// The AMX bf16 GEMMs (jaxserve/kernels/cpu/amx.cc, included whole: [K, N], [N, K] and packed) and the packed GEMM's
// float32-FMA implementation (packed_fma.h, which amx.cc includes) on buffers that end
// at, or (argument "front") start at, a PROT_NONE page: a read or write outside a buffer faults. The shapes reach
// every ragged edge (the packed one also normalizing the rows it reads: XRows): M past whole tiles and row blocks (1, 17, 33, 50), K below and past whole 32-k blocks (the
// [N, K] kernel then copies ragged rows of e instead of loading tiles from it), N past 16-column tiles, 32-column
// blocks, the 256-wide chunks and the packed kernel's pairs of 32-column groups. Results are checked against a
// double-precision reference of the same operands (x rounded to bf16).
// Where the build or the kernel has no tiles, only the FMA implementation runs (and "no AMX" is printed first). Built
// and run by test_cpu_amx.py.
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
  const bool amx = amx_ready();
  if (!amx) std::printf("no AMX\n");
  guard_pages::g_front = argc > 1 && std::string(argv[1]) == "front";
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  alignas(64) unsigned char no_pool[sizeof(ffi::ThreadPool)] = {};
  ffi::ThreadPool& pool = *reinterpret_cast<ffi::ThreadPool*>(no_pool);
  double worst = 0;
  float worst_bf16 = 0;
  int64_t outputs = 0, normed_differ = 0, epilogues_differ = 0;
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
        // the packed GEMM as implemented by `impl` (0: FMAs, 1: AMX tiles)
        auto packed_gemm = [&](int impl, XRows rows, void* out, Epilogue epilogue, const void* aux) {
          (impl ? gemm_packed_bf16x : jaxserve::packed_fma::gemm_packed)(pool, rows, M, K, packed, N, out, epilogue,
                                                                           aux, 1);
        };
        for (int variant : {0, 1, 2, 3}) {  // _kn, _nk (AMX), packed on the tiles, packed with FMAs
          const bool nk = variant == 1;
          if (variant < 3 && !amx) continue;
          if (variant >= 2) packed_gemm(variant == 2, XRows{x, true}, y, kF32, nullptr);
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
        for (int impl = 0; impl <= int(amx); ++impl) {
          // bf16 x, bf16 y (kBf16), and for [gate | up] weights bf16 act(gate) * up (kGatedBf16, act = SiLU here):
          // the float32 sums above rounded, checked to bf16's precision.
          uint16_t* xb = guard_pages::guarded<uint16_t>(M * K);
          for (int64_t i = 0; i < M * K; ++i) xb[i] = to_bf16(x[i]);
          packed_gemm(impl, XRows{x, true}, y, kF32, nullptr);  // the float32 sums, the reference of both
          uint16_t* yb = guarded<uint16_t>(M * N);
          packed_gemm(impl, XRows{xb, false}, yb, kBf16, nullptr);
          for (int64_t i = 0; i < M * N; ++i)
            worst_bf16 = std::max(worst_bf16, std::fabs(from_bf16(yb[i]) - y[i]) / std::max(std::fabs(y[i]), 1e-30f));
          // the same rows with a norm the GEMM applies (XRows' inv_rms and scale, both 1 here): the same bits
          float* inv_rms = guarded<float>(M);
          uint16_t* scale = guarded<uint16_t>(K);
          std::fill_n(inv_rms, M, 1.0f);
          std::fill_n(scale, K, to_bf16(1.0f));
          uint16_t* yn = guarded<uint16_t>(M * N);
          packed_gemm(impl, XRows{xb, false, inv_rms, scale}, yn, kBf16, nullptr);
          normed_differ += std::memcmp(yn, yb, M * N * 2) != 0;
          // kResidualBf16 onto a zero residual: yb's bits; kArgmaxBf16: each row's first largest column of yb
          uint16_t* zero = guarded<uint16_t>(M * N);
          std::fill_n(zero, M * N, uint16_t(0));
          uint16_t* yr = guarded<uint16_t>(M * N);
          packed_gemm(impl, XRows{xb, false}, yr, kResidualBf16, zero);
          epilogues_differ += std::memcmp(yr, yb, M * N * 2) != 0;
          int32_t* top = guarded<int32_t>(M);
          packed_gemm(impl, XRows{xb, false}, top, kArgmaxBf16, nullptr);
          for (int64_t m = 0; m < M; ++m) {
            int64_t first = 0;
            for (int64_t n = 1; n < N; ++n)
              if (from_bf16(yb[m * N + n]) > from_bf16(yb[m * N + first])) first = n;
            epilogues_differ += top[m] != first;
          }
          if (N % 64 == 0) {
            const int64_t I = N / 2;
            uint16_t* h = guarded<uint16_t>(M * I);
            packed_gemm(impl, XRows{xb, false}, h, kGatedBf16, silu.data());
            for (int64_t m = 0; m < M; ++m)
              for (int64_t i = 0; i < I; ++i) {
                const float want = silu[to_bf16(y[m * N + i])] * from_bf16(to_bf16(y[m * N + I + i]));
                worst_bf16 = std::max(worst_bf16, std::fabs(from_bf16(h[m * I + i]) - want) /
                                                      std::max(std::fabs(want), 1e-30f));
              }
          }
        }
      }
  std::printf("outputs %ld worst %.3g worst bf16 %.3g normed shapes differing %ld residual/argmax differing %ld\n",
              long(outputs), worst, worst_bf16, long(normed_differ), long(epilogues_differ));
  // float32 sums of exact products: K roundings of at most 2^-24 each, K <= 100; one bf16 rounding (2^-8 relative:
  // NaN-free finite values), and for the gated values two
  return worst <= 1e-6 && worst_bf16 <= 1.0f / 64 && normed_differ == 0 && epilogues_differ == 0 ? 0 : 1;
}
