// The CPU matmul kernels (jaxserve/kernels/cpu/matmul.cc, included whole: whichever implementation -march=native
// selects) on buffers that end at, or (argument "front") start at, a PROT_NONE page: a read or write outside a
// buffer faults. Also checks the results against a double-precision reference of the same semantics (x rounded
// to bf16 for the bf16 kernels, as it is for the float32 ones; the exact dequantized weight for FP4, E4M3 and E8M0
// scale bytes), and the FP4 kernel's vector scale byte decoding (AVX-512: fp4_scales16, AVX2: fp4_scales) against
// decode_e4m3 / decode_e8m0 times the tensor scale, every byte, bit for bit. The shapes reach the AVX-512 FP4
// kernel's chunk ends (N = 130 at M = 17: chunks of 128 columns, a second sweep of x's rows); the [N, K] FP4
// kernel (fp4_nk, the quantized tied head) reads the same buffers as rows of e, K = 160 ending mid-line. Built and
// run by test_cpu_matmul.py.
//
// threads = 1: parallel_chunks then never touches the thread pool, which only XLA can provide.
#include "matmul.cc"

#include "guard_pages.h"

#include <cstdio>
#include <random>

namespace {

using guard_pages::from_bf16;
using guard_pages::guarded;
using guard_pages::to_bf16;

double g_worst = 0;  // max |y - reference| / sum |products| over all outputs
int64_t g_outputs = 0;

void check(float got, double want, double magnitude) {
  g_worst = std::max(g_worst, std::fabs(got - want) / std::max(magnitude, 1e-30));
  ++g_outputs;
}

}  // namespace

int main(int argc, char** argv) {
  guard_pages::g_front = argc > 1 && std::string(argv[1]) == "front";
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  alignas(64) unsigned char no_pool[sizeof(ffi::ThreadPool)] = {};
  ffi::ThreadPool& pool = *reinterpret_cast<ffi::ThreadPool*>(no_pool);
  for (int64_t M : {1, 2, 3, 5, 17})
    for (int64_t K : {0, 1, 2, 7, 8, 9, 16, 31, 33, 64, 96, 160})
      for (int64_t N : {0, 1, 3, 7, 8, 9, 17, 31, 32, 33, 65, 130}) {
        float* x = guarded<float>(M * K);
        for (int64_t i = 0; i < M * K; ++i) x[i] = normal(rng);
        uint16_t* w = guarded<uint16_t>(K * N);  // read as [K, N] by _kn and as [N, K] by _nk
        float* wf = guarded<float>(K * N);       // likewise
        for (int64_t i = 0; i < K * N; ++i) wf[i] = normal(rng), w[i] = to_bf16(normal(rng));
        float* y = guarded<float>(M * N);
        for (bool nk : {false, true})
          for (bool f32 : {false, true}) {
            if (f32) (nk ? matmul_nk<float> : matmul_kn<float>)(pool, x, M, K, wf, N, y, 1);
            else (nk ? matmul_nk<uint16_t> : matmul_kn<uint16_t>)(pool, x, M, K, w, N, y, 1);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                double sum = 0, magnitude = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const int64_t i = nk ? n * K + k : k * N + n;
                  const double p = f32 ? double(x[m * K + k]) * wf[i]
                                       : double(from_bf16(to_bf16(x[m * K + k]))) * from_bf16(w[i]);
                  sum += p;
                  magnitude += std::fabs(p);
                }
                check(y[m * N + n], sum, magnitude);
              }
          }
        for (int64_t bs : {2, 16, 32}) {
          if (K % bs) continue;
          uint8_t* codes = guarded<uint8_t>(K / 2 * N);
          for (int64_t i = 0; i < K / 2 * N; ++i) codes[i] = uint8_t(rng());
          uint8_t* scales = guarded<uint8_t>(K / bs * N);
          for (int kind : {0, 1}) {  // scale_kind 0: E4M3 bytes (any but NaN), 1: E8M0 (2^-17 .. 2^12)
          for (int64_t i = 0; i < K / bs * N; ++i) {
            scales[i] = kind == 0 ? uint8_t(rng()) : uint8_t(110 + rng() % 30);
            if (kind == 0 && (scales[i] & 0x7F) == 0x7F) scales[i] ^= 1;
          }
          float lut[256];  // the reference's block scale x tensor scale
          for (int b = 0; b < 256; ++b) lut[b] = (kind == 0 ? decode_e4m3(b) : decode_e8m0(b)) * 0.75f;
          for (bool x_bf16 : {false, true}) {
            if (x_bf16)  // that mode's x holds bf16 values
              for (int64_t i = 0; i < M * K; ++i) x[i] = from_bf16(to_bf16(x[i]));
            // [K, N] (codes [K/2, N], scales [K/bs, N]), and [N, K] (the same buffers as [N, K/2], [N, K/bs];
            // block sizes dividing 128 from 8)
            for (bool nk : {false, true}) {
              if (nk && (bs < 8 || 128 % bs)) continue;
              (nk ? fp4_nk : fp4_kn)(pool, x, M, K, codes, scales, bs, kind, 0.75f, N, y, x_bf16, 1);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) {
                  double sum = 0, magnitude = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const int64_t byte = nk ? n * (K / 2) + k / 2 : k / 2 * N + n;
                    const int code = (codes[byte] >> (4 * (k % 2))) & 15;
                    const double p = double(x[m * K + k]) *
                                     (kE2M1[code] * lut[scales[nk ? n * (K / bs) + k / bs : k / bs * N + n]]);
                    sum += p;
                    magnitude += std::fabs(p);
                  }
                  check(y[m * N + n], sum, magnitude);
                }
            }
          }
          }
        }
      }
  // The FP4 kernel decodes the scale bytes itself (no table): every byte of both kinds, bit for bit against
  // decode_e4m3(b) * ts / decode_e8m0(b) * ts (AVX-512: a NaN as the same NaN; AVX2: any NaN for a NaN).
  int64_t scale_mismatches = 0;
  const auto compare = [&](int kind, int b, float ts, float got) {
    const float want = (kind == 0 ? decode_e4m3(b) : decode_e8m0(b)) * ts;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
    const bool same = std::memcmp(&want, &got, 4) == 0;
#else
    const bool same = std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, 4) == 0;
#endif
    if (!same && scale_mismatches++ < 5)
      std::printf("scale kind %d byte %d ts %g: %g, want %g\n", kind, b, ts, got, want);
  };
  for (float ts : {0.75f, 1.0f, 3.0517578e-05f, 1.7e-30f, 6.1e+20f, -2.5f})
    for (int kind : {0, 1})
      for (int b0 = 0; b0 < 256; b0 += 32) {
        alignas(32) uint8_t bytes[32];
        for (int i = 0; i < 32; ++i) bytes[i] = uint8_t(b0 + i);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
        for (int half = 0; half < 2; ++half) {
          const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 16 * half));
          alignas(64) float got[16];
          _mm512_store_ps(got, kind == 0 ? fp4_scales16<0>(v, _mm512_set1_ps(ts)) : fp4_scales16<1>(v, _mm512_set1_ps(ts)));
          for (int l = 0; l < 16; ++l) compare(kind, b0 + 16 * half + l, ts, got[l]);
        }
#else
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes));
        __m256 s[4];
        if (kind == 0) fp4_scales<0>(v, ts, s);
        else fp4_scales<1>(v, ts, s);
        for (int q = 0; q < 4; ++q) {  // group order: E0, O0 = E0 + 1, E1 = E0 + 8, O1 = E0 + 9
          alignas(32) float got[8];
          _mm256_store_ps(got, s[q]);
          for (int l = 0; l < 8; ++l)
            compare(kind, b0 + (l < 4 ? 2 * l : 16 + 2 * (l - 4)) + (q & 1) + 8 * (q >> 1), ts, got[l]);
        }
#endif
      }
  std::printf("%lld outputs, worst |error| / sum |products| = %.3g; %lld scale decode mismatches\n",
              (long long)g_outputs, g_worst, (long long)scale_mismatches);
  // float32 sums of up to 64 exact products (FP4 on AVX2: plus one rounding per block): <= (63 + 32) * 2^-24 relative
  return g_worst <= 1e-5 && scale_mismatches == 0 ? 0 : 1;
}
