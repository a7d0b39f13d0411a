// Buffers flush against PROT_NONE pages for the CPU kernel harnesses (cpu_*_guard_pages.cc): a read or write
// past a buffer's end (or, with guard_pages::g_front, before its start) faults.
#ifndef JAXSERVE_TESTS_GUARD_PAGES_H_
#define JAXSERVE_TESTS_GUARD_PAGES_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace guard_pages {

constexpr size_t kPage = 4096;
inline bool g_front = false;

// bytes rounded up to whole pages, between two PROT_NONE pages; returns the first usable byte.
inline char* fenced(size_t bytes) {
  const size_t span = (bytes + kPage - 1) / kPage * kPage;
  char* base = static_cast<char*>(mmap(nullptr, span + 2 * kPage, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED || mprotect(base, kPage, PROT_NONE) || mprotect(base + kPage + span, kPage, PROT_NONE)) {
    std::perror("mmap");
    std::exit(2);
  }
  return base + kPage;
}

// n elements of T flush against a guard page (after them, or before them with g_front).
template <class T>
T* guarded(int64_t n) {
  const size_t bytes = size_t(n) * sizeof(T), span = (bytes + kPage - 1) / kPage * kPage;
  char* start = fenced(bytes);
  return reinterpret_cast<T*>(g_front ? start : start + span - bytes);
}

// Makes [p, p + bytes) unreadable; p and bytes must be whole pages.
inline void forbid(const void* p, size_t bytes) {
  if (mprotect(const_cast<void*>(p), bytes, PROT_NONE)) {
    std::perror("mprotect");
    std::exit(2);
  }
}

// bf16 bits <-> float, for the references of the bf16 kernels.
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

}  // namespace guard_pages

#endif  // JAXSERVE_TESTS_GUARD_PAGES_H_
