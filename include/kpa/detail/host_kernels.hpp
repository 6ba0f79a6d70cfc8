#pragma once
// The inner loops of the host kernel path, one set per instruction set (HostIsa): a team member
// calls them on raw pointers for one block or one chunk, so everything that depends on the CPU
// sits behind four function pointers chosen once per pass:
//   block_logits  q . k for the H query heads of a pass against the slots of one cache block;
//   row_soft_cap  one row of a chunk's logits soft-capped (the variant's logits transform);
//   row_softmax   one head's row of a chunk's logits: ALiBi, the max, p = exp(logit - max), the sum;
//   chunk_values  o = o * weight + p . V for a range of output dimensions over a chunk;
// and, per query / output type (HostRowKernels), a query row into scratch and an output row out.
// block_logits and chunk_values also take the member's BlockPrefetcher and spread its requests
// over their tiles (an idle BlockPrefetcher() asks for nothing).
// host_kernels_portable.hpp holds the arguments and the plain C++ set every CPU runs;
// host_kernels_x86.hpp the AVX2 + FMA + F16C set and host_kernels_avx512.hpp AVX-512 versions of
// block_logits and chunk_values, all compiled with target attributes whatever the translation
// unit's flags, so one binary runs the best set the CPU has (BackEndLimits::best_host_isa).

#include <kpa/detail/host_kernels_portable.hpp>
#include <kpa/detail/host_kernels_avx512.hpp>
#include <kpa/detail/host_kernels_x86.hpp>
#include <kpa/launch_plan.hpp>

namespace kpa::detail {

template <int H, class CacheT>
struct HostKernels {
  void (*block_logits)(const BlockLogitsArgs<CacheT>&, BlockPrefetcher&);
  /// For i < n: p[i] += slope * (position + i) (ALiBi; slope 0: none); then *max = the largest of
  /// `floor` and every p[i] (NaN ignored), p[i] = exp(p[i] - *max) (when *max is -inf, nothing is
  /// attended: 0, or NaN for a NaN), and the sum of the p[i] returned (NaN if any p[i] is).
  float (*row_softmax)(float* p, int n, float slope, float position, float floor, float* max);
  /// p[i] = cap * tanh(p[i] / cap) for i < n; -inf and NaN stay as they are.
  void (*row_soft_cap)(float* p, int n, float cap);
  void (*chunk_values)(const ChunkValuesArgs<CacheT>&, BlockPrefetcher&, int d_begin, int d_end);
};

/// The inner loops for `isa` (which the planner has checked this machine runs).
template <int H, class CacheT>
HostKernels<H, CacheT> host_kernels(HostIsa isa) {
#ifdef KPA_IMPL_X86_KERNELS
  if constexpr (avx512::has_kernels<CacheT>) {
    if constexpr (sizeof(CacheT) == 1) {  // fp8: codes widened through byte lookups with VBMI
      if (isa >= HostIsa::Avx512Vbmi) {
        return {&avx512::block_logits<H, CacheT, true>, &avx2::row_softmax, &avx2::row_soft_cap,
                &avx512::chunk_values<H, CacheT, true>};
      }
    }
    if (isa >= HostIsa::Avx512) {
      return {&avx512::block_logits<H, CacheT>, &avx2::row_softmax, &avx2::row_soft_cap,
              &avx512::chunk_values<H, CacheT>};
    }
  }
  if (isa >= HostIsa::Avx2 && avx2::has_kernels<CacheT>) {
    return {&avx2::block_logits<H, CacheT>, &avx2::row_softmax, &avx2::row_soft_cap, &avx2::chunk_values<H, CacheT>};
  }
#endif
  (void)isa;
  return {&portable::block_logits<H, CacheT>, &portable::row_softmax, &portable::row_soft_cap,
          &portable::chunk_values<H, CacheT>};
}

/// The row conversions between query / output types and scratch floats, for `isa`.
template <class T>
struct HostRowKernels {
  /// dst[i] = float(src[i]) * scale for i < n.
  void (*load)(const T* src, float scale, float* dst, int n);
  /// dst[i] = from_float<T>(src[i] * factor) for i < n, bit for bit.
  void (*store)(const float* src, float factor, T* dst, int n);
};

template <class T>
HostRowKernels<T> host_row_kernels(HostIsa isa) {
#ifdef KPA_IMPL_X86_KERNELS
  if (isa >= HostIsa::Avx2 && is_activation_type_v<T>) return {&avx2::load_row<T>, &avx2::store_row<T>};
#endif
  (void)isa;
  return {&portable::load_row<T>, &portable::store_row<T>};
}

}  // namespace kpa::detail
