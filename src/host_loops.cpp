// The host loops of every instruction set, compiled once and chosen once per call: the one place
// that knows which set has which loop for which sizes (include/kpa/detail/host_loops.hpp).
//
// The x86 sets are compiled with target attributes, so libkpa built for baseline x86-64 carries
// them all; they are left out where the compiler cannot take GCC's target attributes and x86
// intrinsics (other architectures, device compilers) or where KPA_PORTABLE_KERNELS is defined.

#include <kpa/detail/host_loops.hpp>
#include <kpa/launch_plan.hpp>

#include "host_loops/portable.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(KPA_PORTABLE_KERNELS)
#define KPA_IMPL_X86_LOOPS 1
#include "host_loops/avx2.hpp"
#include "host_loops/avx512.hpp"
#include "host_loops/amx.hpp"
#endif
#ifdef KPA_IMPL_SOFTWARE_MODELS
#include "host_loops/model_loops.hpp"
#endif

#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace kpa::detail {

HostIsa compiled_host_isa() {
#ifdef KPA_IMPL_X86_LOOPS
  return HostIsa::Amx;
#else
  return HostIsa::Portable;
#endif
}

namespace {
std::atomic<std::uint64_t> calls{0};
}  // namespace

template <int H, class CacheT>
HostLoops<H, CacheT> host_loops(HostIsa isa, int head_size, int block_size, Passes passes) {
  if (isa == HostIsa::Amx || isa == HostIsa::AmxModel) {
    HostLoops<H, CacheT> loops = host_loops<H, CacheT>(vector_isa(isa), head_size, block_size, passes);
#ifdef KPA_IMPL_X86_LOOPS
    if (isa == HostIsa::Amx && tile_loops_serve(passes, H)) amx::use_tile_loops<amx::AmxTiles>(loops, isa, head_size, block_size);
#endif
#ifdef KPA_IMPL_SOFTWARE_MODELS
    if (isa == HostIsa::AmxModel) use_model_loops(loops, head_size, block_size, passes);
#endif
    return loops;
  }
  HostLoops<H, CacheT> loops;
  loops.call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  loops.isa = HostIsa::Portable;
  loops.block_logits = &portable::block_logits<H, CacheT>;
  loops.chunk_values = &portable::chunk_values<H, CacheT>;
  loops.rows = host_row_loops(isa);
#ifdef KPA_IMPL_X86_LOOPS
  if (isa >= HostIsa::Avx2) {
    loops.isa = HostIsa::Avx2;
    if (head_size % 8 == 0) loops.block_logits = &avx2::block_logits<H, CacheT, avx2::Avx2>;
    loops.chunk_values = &avx2::chunk_values<H, CacheT, avx2::Avx2>;
  }
  if constexpr (avx512::has_loops<CacheT>) {
    if (isa < HostIsa::Avx512) return loops;
    // fp8 codes widen through byte lookups where the CPU has VBMI.
    if (sizeof(CacheT) == 1 && isa >= HostIsa::Avx512Vbmi) {
      avx512::use_loops(loops, HostIsa::Avx512Vbmi, head_size, block_size,
                        &avx512::block_logits<H, CacheT, avx512::Avx512Vbmi>,
                        &avx512::chunk_values<H, CacheT, avx512::Avx512Vbmi>);
    } else {
      avx512::use_loops(loops, HostIsa::Avx512, head_size, block_size, &avx512::block_logits<H, CacheT, avx512::Avx512>,
                        &avx512::chunk_values<H, CacheT, avx512::Avx512>);
    }
  }
#else
  (void)head_size;
  (void)block_size;
#endif
  (void)passes;
  return loops;
}

RowLoops host_row_loops(HostIsa isa) {
  isa = vector_isa(isa);
#ifdef KPA_IMPL_X86_LOOPS
  if (isa >= HostIsa::Avx512) {
    return {&avx2::row_soft_cap, &avx2::row_add_ramp, &avx512::row_softmax, &avx2::row_softmax_to_bf16};
  }
  if (isa >= HostIsa::Avx2) return {&avx2::row_soft_cap, &avx2::row_add_ramp, &avx2::row_softmax, &avx2::row_softmax_to_bf16};
#endif
  (void)isa;
  return {&portable::row_soft_cap, &portable::row_add_ramp, &portable::row_softmax, &portable::row_softmax_to_bf16};
}

template <class T>
RowConversions<T> host_row_conversions(HostIsa isa) {
  isa = vector_isa(isa);
#ifdef KPA_IMPL_X86_LOOPS
  if (isa >= HostIsa::Avx2) return {&avx2::load_row<T>, &avx2::store_row<T>};
#endif
  (void)isa;
  return {&portable::load_row<T>, &portable::store_row<T>};
}

// Every (rows per pass, cache storage type) the host path runs.
static_assert(std::is_same_v<HostRowsPerPass, std::integer_sequence<int, 1, 2, 4, 6, 8, 16, 32>>,
              "instantiate host_loops for every value of HostRowsPerPass");
#define KPA_IMPL_INSTANTIATE_HOST_LOOPS(CacheT)                                   \
  template HostLoops<1, CacheT> host_loops<1, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<2, CacheT> host_loops<2, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<4, CacheT> host_loops<4, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<6, CacheT> host_loops<6, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<8, CacheT> host_loops<8, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<16, CacheT> host_loops<16, CacheT>(HostIsa, int, int, Passes);   \
  template HostLoops<32, CacheT> host_loops<32, CacheT>(HostIsa, int, int, Passes);
KPA_IMPL_INSTANTIATE_HOST_LOOPS(float)
KPA_IMPL_INSTANTIATE_HOST_LOOPS(half)
KPA_IMPL_INSTANTIATE_HOST_LOOPS(bfloat16)
KPA_IMPL_INSTANTIATE_HOST_LOOPS(fp8_e4m3)
KPA_IMPL_INSTANTIATE_HOST_LOOPS(fp8_e5m2)
#undef KPA_IMPL_INSTANTIATE_HOST_LOOPS

template RowConversions<float> host_row_conversions<float>(HostIsa);
template RowConversions<half> host_row_conversions<half>(HostIsa);
template RowConversions<bfloat16> host_row_conversions<bfloat16>(HostIsa);

}  // namespace kpa::detail
