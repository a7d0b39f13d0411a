// The FP4 [K, N] kernel (fp4_kn in jaxserve/kernels/cpu/matmul.cc, included whole) outside JAX: a hash of its
// output bits over many shapes, and its time per matmul on SmolLM2-135M's shapes. Build it against two versions of
// matmul.cc (the -I folder picks which) to check a change leaves every output bit as it was and to time both:
//
//   g++ -O3 -march=native -std=c++17 -w -I$(python -c 'import jax; print(jax.ffi.include_dir())') \
//       -I jaxserve/kernels/cpu benchmarks/cpu_fp4_kn.cc -o /tmp/fp4_new
//   /tmp/fp4_new hash            # one line per (format, x mode): a hash of every output bit over the shapes
//   taskset -c 1 /tmp/fp4_new head [rounds]          # the [N, K] kernel (fp4_nk) on the tied head [49152, 576]
//   taskset -c 1 /tmp/fp4_new time [rounds [bytes]]  # median us per matmul (and GB/s of codes + scales), M = 1, 2,
//                                                    # 4, 8, 16, over distinct weights of `bytes` in all
//
// One thread (threads = 1: parallel_chunks never touches the thread pool, which only XLA can provide). The timed
// calls cycle through distinct weights (>= 160 MB of codes and scales, beyond the L3), as a decode step walks 30
// layers.
#include "matmul.cc"

#include <chrono>
#include <cstdio>
#include <random>

namespace {

float round_bf16(float f) {  // finite inputs
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1)) & 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Fp4Weight {
  std::vector<uint8_t> codes, scales;
};

// Random codes, and scale bytes a quantizer could write: E4M3 without NaN, E8M0 in 2^-17 .. 2^12.
Fp4Weight random_weight(std::mt19937& rng, int64_t K, int64_t N, int64_t bs, int kind) {
  Fp4Weight w{std::vector<uint8_t>(K / 2 * N), std::vector<uint8_t>(K / bs * N)};
  for (auto& c : w.codes) c = uint8_t(rng());
  for (auto& s : w.scales) {
    s = kind == 0 ? uint8_t(rng()) : uint8_t(110 + rng() % 30);
    if (kind == 0 && (s & 0x7F) == 0x7F) s ^= 1;
  }
  return w;
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 0x100000001b3ull;
  return h;
}

ffi::ThreadPool& no_pool() {
  alignas(64) static unsigned char bytes[sizeof(ffi::ThreadPool)] = {};
  return *reinterpret_cast<ffi::ThreadPool*>(bytes);
}

// fp4_kn of either version: before the streaming kernel (commit c96e614 and earlier) it took the handler's table of
// decoded scales (lut) too.
template <class F = decltype(&fp4_kn)>
void run_fp4_kn(const float* x, int64_t M, int64_t K, const Fp4Weight& w, int64_t bs, int kind, float ts, int64_t N,
                float* y, bool x_bf16, F f = &fp4_kn) {
  using Old = void (*)(ffi::ThreadPool&, const float*, int64_t, int64_t, const uint8_t*, const uint8_t*, int64_t,
                       const float*, int64_t, float, int64_t, float*, bool, int64_t);
  if constexpr (std::is_convertible_v<F, Old>) {
    float lut[256];
    for (int b = 0; b < 256; ++b) lut[b] = (kind == 0 ? decode_e4m3(b) : decode_e8m0(b)) * ts;
    f(no_pool(), x, M, K, w.codes.data(), w.scales.data(), bs, lut, kind, ts, N, y, x_bf16, 1);
  } else {
    f(no_pool(), x, M, K, w.codes.data(), w.scales.data(), bs, kind, ts, N, y, x_bf16, 1);
  }
}

void hash_outputs() {
  for (int kind : {0, 1})
    for (bool x_bf16 : {false, true}) {
      const int64_t bs = kind == 0 ? 16 : 32;
      std::mt19937 rng(7);
      std::normal_distribution<float> normal;
      uint64_t h = 0xcbf29ce484222325ull;
      int64_t outputs = 0;
      for (int64_t K : {bs, 2 * bs, int64_t(64), int64_t(192), int64_t(576), int64_t(1536)})
        for (int64_t N : {1, 15, 16, 17, 31, 33, 64, 65, 100, 192, 576, 1000, 1536})
          for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33}) {
            if (K % bs) continue;
            const Fp4Weight w = random_weight(rng, K, N, bs, kind);
            std::vector<float> x(M * K), y(M * N);
            for (auto& v : x) v = x_bf16 ? round_bf16(normal(rng)) : normal(rng);
            const float ts = kind == 0 ? 0.37f : 1.0f;
            run_fp4_kn(x.data(), M, K, w, bs, kind, ts, N, y.data(), x_bf16);
            h = fnv(h, y.data(), y.size() * 4);
            outputs += M * N;
          }
      std::printf("%s x_%s: %lld outputs, hash %016llx\n", kind == 0 ? "nvfp4" : "mxfp4", x_bf16 ? "bf16" : "f32",
                  (long long)outputs, (unsigned long long)h);
    }
}

void time_shapes(int rounds, int64_t total_bytes) {
  const struct {
    const char* name;
    int64_t K, N;
  } shapes[] = {{"q/o", 576, 576}, {"k/v", 576, 192}, {"gate/up", 576, 1536}, {"down", 1536, 576}};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const auto& s : shapes)
    for (int kind : {0, 1}) {
      const int64_t bs = kind == 0 ? 16 : 32;
      const int64_t bytes = s.K / 2 * s.N + s.K / bs * s.N;
      const int64_t reps = std::max<int64_t>(1, total_bytes / bytes);
      std::vector<Fp4Weight> ws;
      for (int64_t r = 0; r < reps; ++r) ws.push_back(random_weight(rng, s.K, s.N, bs, kind));
      for (bool x_bf16 : {true, false})
        for (int64_t M : {1, 2, 4, 8, 16}) {
          std::vector<float> x(M * s.K), y(M * s.N);
          for (auto& v : x) v = round_bf16(normal(rng));
          std::vector<double> us;
          for (int round = 0; round < rounds; ++round) {
            const auto t0 = std::chrono::steady_clock::now();
            for (const auto& w : ws) run_fp4_kn(x.data(), M, s.K, w, bs, kind, 1.0f, s.N, y.data(), x_bf16);
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                         double(reps));
          }
          std::sort(us.begin(), us.end());
          const double med = us[us.size() / 2];
          std::printf("%-8s %4lldx%-5lld %s x_%-4s M=%-3lld %8.1f us [%.1f-%.1f]  %5.1f GB/s\n", s.name,
                      (long long)s.K, (long long)s.N, kind == 0 ? "nvfp4" : "mxfp4", x_bf16 ? "bf16" : "f32",
                      (long long)M, med, us.front(), us.back(), double(bytes) / med / 1e3);
          std::fflush(stdout);
        }
    }
}

// fp4_nk where this matmul.cc has it (the quantized tied head), else a message.
template <class... A>
auto call_fp4_nk(int, ffi::ThreadPool& pool, A... a) -> decltype(fp4_nk(pool, a...), true) {
  fp4_nk(pool, a...);
  return true;
}
template <class... A>
bool call_fp4_nk(long, ffi::ThreadPool&, A...) {
  return false;
}

void time_head(int rounds) {
  const int64_t V = 49152, K = 576;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int kind : {0, 1}) {
    const int64_t bs = kind == 0 ? 16 : 32;
    const Fp4Weight e = random_weight(rng, K, V, bs, kind);  // the same bytes, read as [V, K/2] and [V, K/bs]
    for (bool x_bf16 : {true, false})
      for (int64_t M : {1, 2, 4, 16}) {
        std::vector<float> x(M * K), y(M * V);
        for (auto& v : x) v = round_bf16(normal(rng));
        std::vector<double> us;
        for (int round = 0; round < rounds; ++round) {
          const auto t0 = std::chrono::steady_clock::now();
          if (!call_fp4_nk(0, no_pool(), x.data(), M, K, e.codes.data(), e.scales.data(), bs, int64_t(kind), 1.0f, V,
                           y.data(), x_bf16, int64_t(1))) {
            std::printf("this matmul.cc has no fp4_nk\n");
            return;
          }
          us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("head     %5lldx%-4lld %s x_%-4s M=%-3lld %8.1f us [%.1f-%.1f]  %5.1f GB/s\n", (long long)V,
                    (long long)K, kind == 0 ? "nvfp4" : "mxfp4", x_bf16 ? "bf16" : "f32", (long long)M,
                    us[us.size() / 2], us.front(), us.back(), double(e.codes.size() + e.scales.size()) / us[us.size() / 2] / 1e3);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "hash";
  if (mode == "hash") hash_outputs();
  else if (mode == "head") time_head(argc > 2 ? std::atoi(argv[2]) : 9);
  else time_shapes(argc > 2 ? std::atoi(argv[2]) : 7, argc > 3 ? std::atoll(argv[3]) : 160'000'000);
  return 0;
}
