// Splitting a kernel's work over XLA's intra-op thread pool; shared by matmul.cc and attention.cc.
//
// Work is a count of independent chunks claimed from an atomic counter by the calling thread and by helpers
// scheduled on the pool. The caller only waits for chunks a helper has claimed, so a helper that never runs
// cannot block it; with threads <= 1 the pool is never touched (the guard-page harnesses rely on that).
#ifndef JAXSERVE_KERNELS_CPU_PARALLEL_H_
#define JAXSERVE_KERNELS_CPU_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace jaxserve {

struct Progress {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// Runs body(state, chunk) for chunk in [0, n) on the caller and up to threads - 1 pool helpers, each thread calling
// state = prepare() once, after claiming its first chunk (e.g. its own copy of x, converted once a call, not once a
// chunk). Chunks go to whichever thread asks next: with more chunks than threads, a thread that starts late (a pool
// helper waking up) or runs slower (a shared VM's vCPU) takes fewer, and the others more, instead of the call waiting
// on its share.
template <class Prepare, class Body>
void parallel_chunks(xla::ffi::ThreadPool& pool, int64_t n, int64_t threads, const Prepare& prepare, const Body& body) {
  // A thread's share: prepare and body are touched only after claiming a chunk, which happens before the caller
  // can return (it waits for every claimed chunk to finish); a helper that wakes after the last claim touches neither.
  auto work = [n](Progress* progress, const Prepare* prep, const Body* run) {
    int64_t c = progress->next.fetch_add(1);
    if (c >= n) return;
    auto state = (*prep)();
    for (; c < n; c = progress->next.fetch_add(1)) {
      (*run)(state, c);
      progress->done.fetch_add(1, std::memory_order_release);
    }
  };
  if (threads <= 1 || n <= 1) {
    Progress progress;
    work(&progress, &prepare, &body);
    return;
  }
  auto progress = std::make_shared<Progress>();  // helpers hold the shared counters
  for (int64_t t = 1; t < std::min(threads, n); ++t)
    pool.Schedule([progress, p = &prepare, b = &body, work]() { work(progress.get(), p, b); });
  work(progress.get(), &prepare, &body);
  // A helper may have been descheduled mid-chunk (a busy machine): spin briefly, then give the core away.
  for (int spins = 0; progress->done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) _mm_pause();
    else std::this_thread::yield();
  }
}

// Runs body(chunk) for chunk in [0, n) on the caller and up to threads - 1 pool helpers (no per-thread state).
template <class Body>
void parallel_chunks(xla::ffi::ThreadPool& pool, int64_t n, int64_t threads, const Body& body) {
  parallel_chunks(pool, n, threads, [] { return 0; }, [&body](int, int64_t c) { body(c); });
}

// How many chunks a GEMM over G column groups splits into for `threads` threads: kChunksPerThread each (at least
// one group a chunk). A chain of 30 [576, 3072] packed GEMMs at 64 rows, 2 threads, the 2-core Ice Lake VM, six
// processes each alternating with one range a thread: float32 median 42.8 -> 39.3 ms, bf16 on FMAs 40.2 -> 38.4
// (each process's own figure moving 34-55 ms with the VM); at one row the same (11.2, 6.4 ms).
constexpr int64_t kChunksPerThread = 8;
inline int64_t group_chunks(int64_t G, int64_t threads) {
  return std::max<int64_t>(1, std::min(G, threads * kChunksPerThread));
}

}  // namespace jaxserve

#endif  // JAXSERVE_KERNELS_CPU_PARALLEL_H_
