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

// Runs body(chunk) for chunk in [0, n) on the caller and up to threads - 1 pool helpers.
template <class Body>
void parallel_chunks(xla::ffi::ThreadPool& pool, int64_t n, int64_t threads, const Body& body) {
  if (threads <= 1 || n <= 1) {
    for (int64_t c = 0; c < n; ++c) body(c);
    return;
  }
  auto progress = std::make_shared<Progress>();
  // Helpers hold the shared counters; they touch body only after claiming a chunk, which
  // happens before the caller can return (it waits for every claimed chunk to finish).
  const Body* b = &body;
  for (int64_t t = 1; t < std::min(threads, n); ++t) {
    pool.Schedule([progress, b, n]() {
      for (int64_t c; (c = progress->next.fetch_add(1)) < n;) {
        (*b)(c);
        progress->done.fetch_add(1, std::memory_order_release);
      }
    });
  }
  for (int64_t c; (c = progress->next.fetch_add(1)) < n;) {
    body(c);
    progress->done.fetch_add(1, std::memory_order_release);
  }
  // A helper may have been descheduled mid-chunk (a busy machine): spin briefly, then give the core away.
  for (int spins = 0; progress->done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) _mm_pause();
    else std::this_thread::yield();
  }
}

}  // namespace jaxserve

#endif  // JAXSERVE_KERNELS_CPU_PARALLEL_H_
