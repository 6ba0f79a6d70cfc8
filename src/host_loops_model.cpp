// HostIsa::AmxModel's loops (host_loops/model_loops.hpp): the AMX level's loop bodies over software
// models of the instructions an AVX2 CPU lacks, for tests. Kept apart from host_loops.cpp, so that
// the two compile side by side; CMakeLists.txt compiles this one lightly optimised, as the models
// only need to be right.

#include "host_loops/model_loops.hpp"

#include <kpa/launch_plan.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(KPA_PORTABLE_KERNELS)
#define KPA_IMPL_X86_LOOPS 1
#include "host_loops/amx.hpp"
#include "host_loops/avx512_model.hpp"
#endif

#include <type_traits>
#include <utility>

namespace kpa::detail {

template <int H, class CacheT>
void use_model_loops(HostLoops<H, CacheT>& loops, int head_size, int block_size, Passes passes) {
#ifdef KPA_IMPL_X86_LOOPS
  if constexpr (avx512::has_loops<CacheT>) {
    avx512::use_loops(loops, HostIsa::AmxModel, head_size, block_size,
                      &avx2::block_logits<H, CacheT, avx2::Avx512Model>,
                      &avx2::chunk_values<H, CacheT, avx2::Avx512Model>);
  }
  if (tile_loops_serve(passes, H)) amx::use_tile_loops<amx::TileModel>(loops, HostIsa::AmxModel, head_size, block_size);
#else
  (void)loops;
  (void)passes;
  (void)head_size;
  (void)block_size;
#endif
}

static_assert(std::is_same_v<HostRowsPerPass, std::integer_sequence<int, 1, 2, 4, 6, 8, 16, 32>>,
              "instantiate use_model_loops for every value of HostRowsPerPass");
#define KPA_IMPL_INSTANTIATE_MODEL_LOOPS(CacheT)                               \
  template void use_model_loops<1, CacheT>(HostLoops<1, CacheT>&, int, int, Passes);   \
  template void use_model_loops<2, CacheT>(HostLoops<2, CacheT>&, int, int, Passes);   \
  template void use_model_loops<4, CacheT>(HostLoops<4, CacheT>&, int, int, Passes);   \
  template void use_model_loops<6, CacheT>(HostLoops<6, CacheT>&, int, int, Passes);   \
  template void use_model_loops<8, CacheT>(HostLoops<8, CacheT>&, int, int, Passes);   \
  template void use_model_loops<16, CacheT>(HostLoops<16, CacheT>&, int, int, Passes);   \
  template void use_model_loops<32, CacheT>(HostLoops<32, CacheT>&, int, int, Passes);
KPA_IMPL_INSTANTIATE_MODEL_LOOPS(float)
KPA_IMPL_INSTANTIATE_MODEL_LOOPS(half)
KPA_IMPL_INSTANTIATE_MODEL_LOOPS(bfloat16)
KPA_IMPL_INSTANTIATE_MODEL_LOOPS(fp8_e4m3)
KPA_IMPL_INSTANTIATE_MODEL_LOOPS(fp8_e5m2)
#undef KPA_IMPL_INSTANTIATE_MODEL_LOOPS

}  // namespace kpa::detail
