// The device kernel path on host back ends (launch_device_path_on_host, detail/launch.hpp),
// compiled once here for every host back end of the Kokkos installation, dtype and cache type,
// rather than in every program that includes kpa's headers.

#include <kpa/detail/launch.hpp>

#include <cstdint>

namespace kpa::detail {

template <class CacheT, class Space, class T, class TmpT>
void launch_device_path_on_host(const char* label, const Space& space, const LaunchPlan& plan, Output output,
                                const ProblemShape& shape, const AttentionViews<Space, T, TmpT>& views,
                                const AttentionParams& params) {
  with_cache_storage<CacheT>(params.kv_cache_dtype, [&](auto storage) {
    using StorageT = typename decltype(storage)::type;
    with_rows_per_pass(DeviceRowsPerPass{}, plan.rows_per_pass, [&](auto rows) {
      using Kernel = PartitionKernel<Space, DevicePath<decltype(rows)::value, StorageT>, T, TmpT>;
      launch_kernel<Kernel>(label, space, plan, output, shape, views, params);
    });
  });
}

// Every (cache element, space, dtype, tmp_out type) the entry points launch: caches of the query
// type or fp8 bytes, v2's tmp_out in the query type or float.
#define KPA_IMPL_INSTANTIATE(CacheT, Space, T, TmpT)                                                                 \
  template void launch_device_path_on_host<CacheT, Space, T, TmpT>(const char*, const Space&, const LaunchPlan&, \
                                                                  Output, const ProblemShape&,                  \
                                                                  const AttentionViews<Space, T, TmpT>&,        \
                                                                  const AttentionParams&);
#define KPA_IMPL_INSTANTIATE_TMP(Space, T, TmpT)    \
  KPA_IMPL_INSTANTIATE(T, Space, T, TmpT)           \
  KPA_IMPL_INSTANTIATE(std::uint8_t, Space, T, TmpT)
#define KPA_IMPL_INSTANTIATE_SPACE(Space)                   \
  KPA_IMPL_INSTANTIATE_TMP(Space, float, float)             \
  KPA_IMPL_INSTANTIATE_TMP(Space, kpa::half, kpa::half)     \
  KPA_IMPL_INSTANTIATE_TMP(Space, kpa::half, float)         \
  KPA_IMPL_INSTANTIATE_TMP(Space, kpa::bfloat16, kpa::bfloat16) \
  KPA_IMPL_INSTANTIATE_TMP(Space, kpa::bfloat16, float)

#ifdef KOKKOS_ENABLE_SERIAL
KPA_IMPL_INSTANTIATE_SPACE(Kokkos::Serial)
#endif
#ifdef KOKKOS_ENABLE_OPENMP
KPA_IMPL_INSTANTIATE_SPACE(Kokkos::OpenMP)
#endif
#ifdef KOKKOS_ENABLE_THREADS
KPA_IMPL_INSTANTIATE_SPACE(Kokkos::Threads)
#endif

}  // namespace kpa::detail
