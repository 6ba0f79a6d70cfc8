#pragma once
// The two inner loops of the attention kernel, as free functions a team member calls:
//   slot_logits: q . k for the query heads of a pass against one cache slot;
//   chunk_pv:    sum over a chunk's slots of p * v for one output dimension.
// Portable versions for every back end; x86 hosts with AVX2/FMA/F16C take the register-blocked
// versions of x86_host.hpp (same math, different float summation order).

#include <kpa/detail/x86_host.hpp>
#include <kpa/numeric_types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// Asks host compilers to vectorise a short elementwise loop; device compilers do not see it.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KPA_IMPL_SIMD _Pragma("omp simd")
#else
#define KPA_IMPL_SIMD
#endif

namespace kpa::detail {

/// Partial sums kept per head in the portable p.V loop.
inline constexpr int kLanes = 8;

/// Hint that slice `part` of `parts` equal slices of [p, p + bytes) will be read soon. Paged
/// blocks sit at unrelated addresses, so a CPU's prefetchers, which follow streams, miss the
/// start of every block; the kernel spreads these hints over the work of the step before.
/// A no-op on GPUs, which hide latency by occupancy.
KOKKOS_INLINE_FUNCTION void prefetch_slice(const void* p, std::size_t bytes, int part, int parts) {
#ifdef KPA_IMPL_X86_HOST_KERNELS
  x86::prefetch_slice(p, bytes, part, parts);
#else
  (void)p;
  (void)bytes;
  (void)part;
  (void)parts;
#endif
}

/// Slots whose logits one slot_logits call computes: several on x86 hosts (see x86_host.hpp),
/// one elsewhere (GPU lanes each take a slot).
#ifdef KPA_IMPL_X86_HOST_KERNELS
inline constexpr int kSlotsPerCall = 2;
#else
inline constexpr int kSlotsPerCall = 1;
#endif

/// logits[s][g] = q_g . k_s for the H heads of a pass (q_g = q + g * head_size) and `count`
/// (<= S) consecutive cache slots. `key` points at the first slot's first X-element vector; a
/// slot's `vectors` vectors are `stride` apart and consecutive slots X apart.
template <int H, int X, int S, class CacheT>
KOKKOS_INLINE_FUNCTION void slot_logits(const CacheT* key, int stride, int vectors, const float* q, int head_size,
                                        int count, float (&logits)[S][H]) {
#ifdef KPA_IMPL_X86_HOST_KERNELS
  if constexpr (x86::has_kernels_for<CacheT>) {
    if ((X * vectors) % 8 == 0) {
      if (count == S) {
        x86::slot_logits<H, X, S>(key, stride, vectors, q, head_size, logits);
      } else {
        float one[1][H];
        for (int s = 0; s < count; ++s) {
          x86::slot_logits<H, X, 1>(key + s * X, stride, vectors, q, head_size, one);
          for (int g = 0; g < H; ++g) logits[s][g] = one[0][g];
        }
      }
      return;
    }
  }
#endif
  for (int s = 0; s < count; ++s) {
    float acc[H][X] = {};  // X partial sums per head: vectorisable without reassociating floats
    for (int dx = 0; dx < vectors; ++dx) {
      float k[X];
      for (int i = 0; i < X; ++i) k[i] = to_float(key[s * X + dx * stride + i]);
      const float* qd = q + dx * X;
      for (int g = 0; g < H; ++g) {
        KPA_IMPL_SIMD
        for (int i = 0; i < X; ++i) acc[g][i] += qd[g * head_size + i] * k[i];
      }
    }
    for (int g = 0; g < H; ++g) {
      float sum = 0.0f;
      for (int i = 0; i < X; ++i) sum += acc[g][i];
      logits[s][g] = sum;
    }
  }
}

/// sums[g] = sum over the chunk's slots of p_g[slot] * v[slot] for one output dimension, where
/// `value_row` is that dimension's row in kv head 0 of physical block 0 (value_cache[0][h][d]),
/// block lb of the chunk is physical block block_ids[lb], and p_g = probs + g * probs_stride
/// holds the chunk's probabilities block after block. Only the last block may be partly filled;
/// a negative block id marks a block no head attends.
template <int H, class CacheT>
KOKKOS_INLINE_FUNCTION void chunk_pv(const CacheT* value_row, const int* block_ids, std::int64_t block_stride,
                                     int block_size, int blocks, int last_block_slots, const float* probs,
                                     int probs_stride, float (&sums)[H]) {
#ifdef KPA_IMPL_X86_HOST_KERNELS
  if constexpr (x86::has_kernels_for<CacheT>) {
    x86::chunk_pv<H>(value_row, block_ids, block_stride, block_size, blocks, last_block_slots, probs, probs_stride,
                     sums);
    return;
  }
#endif
  constexpr int W = kLanes;
  float part[H][W] = {};
  for (int lb = 0; lb < blocks; ++lb) {
    if (block_ids[lb] < 0) continue;  // skipped by every head (block-sparse): never read
    const CacheT* v = value_row + block_ids[lb] * block_stride;
    const float* p = probs + lb * block_size;
    const int slots = lb + 1 == blocks ? last_block_slots : block_size;
    int slot = 0;
    for (; slot + W <= slots; slot += W) {
      float vf[W];
      for (int j = 0; j < W; ++j) vf[j] = to_float(v[slot + j]);
      for (int g = 0; g < H; ++g) {
        KPA_IMPL_SIMD
        for (int j = 0; j < W; ++j) part[g][j] += p[g * probs_stride + slot + j] * vf[j];
      }
    }
    for (; slot < slots; ++slot) {  // never read past the sequence: unused slots may hold NaN
      const float vf = to_float(v[slot]);
      for (int g = 0; g < H; ++g) part[g][0] += p[g * probs_stride + slot] * vf;
    }
  }
  for (int g = 0; g < H; ++g) {
    float sum = 0.0f;
    for (int j = 0; j < W; ++j) sum += part[g][j];
    sums[g] = sum;
  }
}

}  // namespace kpa::detail
