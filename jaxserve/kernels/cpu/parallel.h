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

// How many chunks a GEMM of M rows over G column groups splits into for `threads` threads. Up to kStreamRows rows
// (decode steps of one to four sequences: bound by reading the weights) one contiguous range a thread, so each
// streams its share from one start (each chunk start waits on memory before its software prefetches run ahead: at
// eight chunks a thread, a [576, 576] projection's chunks are one or two 36 KB groups); more rows (bound by the
// FMAs) kChunksPerThread each, at least one group a chunk, claimed as threads come free.
// Measured on the 2-core Ice Lake VM, bf16 on FMAs, chains of 100 MB of packed weights (past the 48 MB L3), two
// alternating pairs: at 1 row [576, 576] 48-50 -> 41-42 us a call, [576, 960] 66-73 -> 57-71, [1536, 576] 98-118 ->
// 91-108, [576, 3072] 166-211 -> 176-187; at 4 rows 50-53 -> 40-45, 73-78 -> 55-62, 109 -> 92-100, 183-189 -> 160-182.
// At 64 rows, 30 chained [576, 3072] GEMMs, six processes alternating with one range a thread: float32 median 42.8
// -> 39.3 ms, bf16 on FMAs 40.2 -> 38.4.
constexpr int64_t kChunksPerThread = 8;
constexpr int64_t kStreamRows = 4;
inline int64_t group_chunks(int64_t G, int64_t threads, int64_t M) {
  return std::max<int64_t>(1, std::min(G, M <= kStreamRows ? threads : threads * kChunksPerThread));
}

}  // namespace jaxserve

#endif  // JAXSERVE_KERNELS_CPU_PARALLEL_H_
