// What the packed bf16 GEMM (jaxserve_bf16_gemm_packed, packed.py's layout) reads and writes, shared by its two
// implementations: amx.cc's on AMX tiles and packed_fma.h's float32 FMAs for CPUs without them.
#ifndef JAXSERVE_KERNELS_CPU_PACKED_GEMM_H_
#define JAXSERVE_KERNELS_CPU_PACKED_GEMM_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace jaxserve {

// x [M, K] as the caller of the packed GEMM holds it: float32 or bf16 rows, K apart; with inv_rms (bf16 rows only)
// an RMSNorm still to apply: the GEMM's A is bf16(bf16(x[m, k] * inv_rms[m]) * scale[k]), the bits of the norm's
// last multiplies in a bf16 model's graph (jaxserve.layers.NormedRows), each product rounded to nearest even.
struct XRows {
  const void* data;
  bool f32;
  const float* inv_rms = nullptr;      // f32[M]
  const uint16_t* scale = nullptr;     // bf16[K]
};

// What the packed GEMM writes (its attribute "epilogue"):
//   kF32:       y f32[M, N], the sums.
//   kBf16:      y bf16[M, N], the sums rounded to nearest even: the bits of kF32's result converted by XLA, without
//               writing (and reading back) the float32 matrix.
//   kGatedBf16: w = [gate | up] (N = 2 I, I a multiple of 32), y bf16[M, I] = bf16(act(bf16(gate)) * bf16(up)),
//               act read from a table of its float32 value at each of the 65,536 bf16 inputs. The table is computed
//               by XLA (jaxserve.kernels.cpu.packed), and a product of two bf16 values is exact in float32, so y holds
//               the bits of the unfused graph (a bf16 gate_up, then act(gate) * up), with the [M, 2 I] matrix never
//               written: a gated MLP's activation in the GEMM's epilogue.
//   kArgmaxBf16: y i32[M], the first column of each row's largest bf16-rounded sum (jnp.argmax of kBf16's result:
//               a greedy LM head's tokens without its [M, N] logits; NaN sums are never the largest).
//   kResidualBf16: y bf16[M, N] = bf16(r + bf16(sums)) for a bf16 r[M, N] (the residual stream a projection adds to:
//               XLA's bf16 add, a float32 add rounded, of kBf16's result), without the projection written apart.
enum Epilogue : int64_t { kF32 = 0, kBf16 = 1, kGatedBf16 = 2, kArgmaxBf16 = 3, kResidualBf16 = 4 };

// This thread's scratch buffer number kSlot, of at least n T, 64-byte aligned, kept between calls: allocating them per
// call cost page faults on every call (glibc maps big blocks afresh).
template <class T, int kSlot>
T* scratch(int64_t n) {
  thread_local std::unique_ptr<T[]> buffer;
  thread_local int64_t capacity = -1;
  if (capacity < n) {
    buffer.reset(new T[n + 64 / sizeof(T)]);
    capacity = n;
  }
  return reinterpret_cast<T*>((reinterpret_cast<intptr_t>(buffer.get()) + 63) / 64 * 64);
}

// kArgmaxBf16's running maxima: each of `chunks` work chunks keeps 16 lanes of (largest value, its first column) per
// row at best / at + (chunk * M + m) * 16 (64-byte aligned), folded in column order; reduce() then takes each row's
// largest value's smallest column (no value above -inf: column 0, as jnp.argmax).
class ArgmaxLanes {
 public:
  ArgmaxLanes(int64_t chunks, int64_t M)
      : chunks_(chunks), M_(M), best_buf_(chunks * M * 16 + 16, -std::numeric_limits<float>::infinity()),
        at_buf_(chunks * M * 16 + 16, std::numeric_limits<int32_t>::max()) {}
  float* best(int64_t chunk) { return aligned(best_buf_.data()) + chunk * M_ * 16; }
  int32_t* at(int64_t chunk) { return aligned(at_buf_.data()) + chunk * M_ * 16; }
  void reduce(int32_t* y) {
    for (int64_t m = 0; m < M_; ++m) {
      float v = -std::numeric_limits<float>::infinity();
      int32_t col = std::numeric_limits<int32_t>::max();
      for (int64_t c = 0; c < chunks_; ++c)
        for (int64_t l = 0; l < 16; ++l) {
          const float b = best(c)[m * 16 + l];
          const int32_t a = at(c)[m * 16 + l];
          if (b > v || (b == v && a < col)) v = b, col = a;
        }
      y[m] = col == std::numeric_limits<int32_t>::max() ? 0 : col;
    }
  }

 private:
  template <class T>
  static T* aligned(T* p) {
    return reinterpret_cast<T*>((reinterpret_cast<intptr_t>(p) + 63) / 64 * 64);
  }
  int64_t chunks_, M_;
  std::vector<float> best_buf_;
  std::vector<int32_t> at_buf_;
};

}  // namespace jaxserve

#endif  // JAXSERVE_KERNELS_CPU_PACKED_GEMM_H_
