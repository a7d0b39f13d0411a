// What AMX tiles can do on this CPU, beside what the packed GEMM's loop (jaxserve/kernels/cpu/amx.cc) gets: the
// ceilings a bf16 decode or prefill step's GEMMs are held against. Self-contained (no JAX); driven by
// benchmarks/amx_roofline.py, which builds it, runs it and writes the results:
//
//   g++ -O3 -march=native -std=c++17 -pthread benchmarks/amx_roofline.cc -o /tmp/amx_roofline && /tmp/amx_roofline
//
// One JSON object per line on stdout, each {"probe", "threads", ..., "value", "unit"}; every figure is the best of
// several timed repeats (a shared VM's noise only slows a run):
//   tdp_peak      GFLOP/s of TDPBF16PS on four independent C tiles, A and B tiles resident (no loads)
//   tdp_l1        the same with two A and two B tiles loaded from L1 for every four TDPBF16PS (the GEMM's 2 x 2 block)
//   stream        GB/s of tile loads alone over 1 GiB (beyond the L3), each thread its own contiguous part
//   decode_gemm   GB/s of weights for the packed GEMM's loop at M rows (K 576, N 3072: gate/up), 32-column groups
//                 each read by every 32-row block before the next group, the first block prefetching 32 KB ahead into
//                 L2 (amx.cc's pair_sums), weights cycling through 1 GiB; M = 32 and 64; threads split the groups
//   prefill_gemm  GFLOP/s at M 512, K 576, N 1536 (one thread, weights in L2): the loop with each block's C stored to
//                 a local buffer only, and with the block rounded to bf16 and written into y [M, N] (amx.cc's bf16
//                 epilogues): the output's cost
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void tile_config() {  // every tile 16 rows x 64 bytes (as amx.cc's load_tile_config)
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint16_t* buffer(size_t elems, uint16_t value) {
  auto* p = static_cast<uint16_t*>(std::aligned_alloc(64, (elems * 2 + 63) / 64 * 64));
  for (size_t i = 0; i < elems; ++i) p[i] = value;
  return p;
}

// Runs work(t, threads) on `threads` threads (the caller is thread 0) `repeats` times; the fastest run's seconds.
double best_of(int threads, int repeats, const std::function<void(int, int)>& work) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    std::vector<std::thread> pool;
    std::atomic<int> ready{0}, done{0};
    std::atomic<bool> go{false};
    for (int t = 1; t < threads; ++t)
      pool.emplace_back([&, t] {
        syscall(SYS_arch_prctl, 0x1023, 18);
        tile_config();
        ready++;
        while (!go) _mm_pause();
        work(t, threads);
        done++;
        _tile_release();
      });
    while (ready < threads - 1) _mm_pause();
    const double start = now();  // (threads started and spinning: their start-up is not timed)
    go = true;
    work(0, threads);
    while (done < threads - 1) _mm_pause();
    best = std::min(best, now() - start);
    for (auto& th : pool) th.join();
  }
  return best;
}

void emit(const char* probe, int threads, const char* extra, double value, const char* unit) {
  std::printf("{\"probe\": \"%s\", \"threads\": %d%s, \"value\": %.1f, \"unit\": \"%s\"}\n", probe, threads, extra,
              value, unit);
  std::fflush(stdout);
}

float sink[16 * 16 * 4] __attribute__((aligned(64)));

void tdp(int threads, bool loads) {
  alignas(64) static uint16_t a[2][512], b[2][512];
  for (int i = 0; i < 512; ++i) a[0][i] = a[1][i] = b[0][i] = b[1][i] = 0x3f80;
  const long n = 2000000;
  const double s = best_of(threads, 5, [&](int, int) {
    _tile_loadd(4, a[0], 64);
    _tile_loadd(5, a[1], 64);
    _tile_loadd(6, b[0], 64);
    _tile_loadd(7, b[1], 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long i = 0; i < n; ++i) {
      if (loads) {
        _tile_loadd(4, a[0], 64);
        _tile_loadd(6, b[0], 64);
        _tile_loadd(7, b[1], 64);
      }
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (loads) _tile_loadd(5, a[1], 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, sink, 64);
  });
  emit(loads ? "tdp_l1" : "tdp_peak", threads, "", threads * n * 4.0 * 16 * 16 * 32 * 2 / s / 1e9, "GFLOP/s");
}

constexpr size_t kBig = size_t(1) << 30;  // bytes of weights cycled through: beyond the L3

void stream(int threads, const uint16_t* w) {
  const size_t tiles = kBig / 1024;
  const double s = best_of(threads, 5, [&](int t, int n) {
    for (size_t i = tiles * t / n; i < tiles * (t + 1) / n; i += 2) {
      _tile_loadd(6, w + i * 512, 64);
      _tile_loadd(7, w + (i + 1) * 512, 64);
    }
    _tile_stored(6, sink, 64);
  });
  emit("stream", threads, "", kBig / s / 1e9, "GB/s");
}

// C 0-3 = rows m0 .. m0 + 31 of x (tiles of 16 x 32 bf16, k blocks KB apart) times packed group gp (amx.cc's
// pair_sums); prefetch: ask for the stream 32 KB ahead into L2 as it goes (the first block over a group does)
inline void block_sums(const uint16_t* x, const uint16_t* gp, int KB, int m0, bool prefetch) {
  const uint16_t* a0 = x + size_t(m0 / 16) * KB * 512;
  const uint16_t* a1 = a0 + KB * 512;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int kb = 0; kb < KB; ++kb) {
    const uint16_t* b = gp + kb * 1024;
    if (prefetch)
      for (int line = 0; line < 2048; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(b) + 32 * 1024 + line, _MM_HINT_T1);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 512, 64);
    _tile_loadd(4, a0 + kb * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + kb * 512, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// The packed GEMM's loop over gate/up (groups of K x 32 columns, each K / 32 k blocks of two 16 x 32 B tiles): each
// thread its range of groups, every 32-row block over a group before the next
void decode_gemm(int threads, int M, const uint16_t* pool_w) {
  const int K = 576, N = 3072, KB = K / 32, G = N / 32;
  const size_t weight_elems = size_t(K) * N, copies = kBig / (weight_elems * 2);
  std::vector<uint16_t*> xs(threads);
  for (auto& x : xs) x = buffer(size_t(M) * K, 0x3f80);  // each thread's rows, tile by tile (as padded_rows)
  size_t call = 0;
  const double s = best_of(threads, 40, [&](int t, int n) {
    const uint16_t* w = pool_w + (call % copies) * weight_elems;
    const uint16_t* x = xs[t];
    for (int g = G * t / n; g < G * (t + 1) / n; ++g) {
      const uint16_t* gp = w + size_t(g) * K * 32;
      for (int m0 = 0; m0 < M; m0 += 32) {
        block_sums(x, gp, KB, m0, m0 == 0);
        _tile_stored(0, sink, 64);
      }
    }
    if (t == 0) ++call;
  });
  char extra[64];
  std::snprintf(extra, sizeof extra, ", \"M\": %d", M);
  emit("decode_gemm", threads, extra, weight_elems * 2 / s / 1e9, "GB/s");
  for (auto* x : xs) std::free(x);
}

void prefill_gemm(bool write_bf16) {
  const int M = 512, K = 576, N = 1536, KB = K / 32, G = N / 32;
  uint16_t* x = buffer(size_t(M) * K, 0x3f80);
  uint16_t* w = buffer(size_t(K) * N, 0x3c00);
  uint16_t* y = buffer(size_t(M) * N, 0);
  const double s = best_of(1, 15, [&](int, int) {
    alignas(64) float block[32 * 32];
    for (int g = 0; g < G; ++g) {
      const uint16_t* gp = w + size_t(g) * K * 32;
      for (int m0 = 0; m0 < M; m0 += 32) {
        block_sums(x, gp, KB, m0, false);
        _tile_stored(0, block, 128);
        _tile_stored(1, block + 16, 128);
        _tile_stored(2, block + 512, 128);
        _tile_stored(3, block + 528, 128);
        if (write_bf16)
          for (int i = 0; i < 32; ++i) {
            const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(block + i * 32));
            const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(block + i * 32 + 16));
            _mm512_storeu_si512(y + size_t(m0 + i) * N + g * 32, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
          }
      }
    }
  });
  emit("prefill_gemm", 1, write_bf16 ? ", \"output\": \"bf16 y [M, N]\"" : ", \"output\": \"local block\"",
       2.0 * M * K * N / s / 1e9, "GFLOP/s");
  std::free(x);
  std::free(w);
  std::free(y);
}

}  // namespace

int main() {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
    std::fprintf(stderr, "AMX tiles unavailable (arch_prctl XTILEDATA refused)\n");
    return 1;
  }
  tile_config();
  const int threads = std::max(1, int(std::thread::hardware_concurrency()));
  for (int t = 1; t <= threads; t *= 2) {
    tdp(t, false);
    tdp(t, true);
  }
  uint16_t* big = buffer(kBig / 2, 0x3c00);
  for (int t = 1; t <= threads; t *= 2) stream(t, big);
  for (int M : {32, 64})
    for (int t = 1; t <= threads; t *= 2) decode_gemm(t, M, big);
  std::free(big);
  prefill_gemm(false);
  prefill_gemm(true);
  _tile_release();
  return 0;
}
