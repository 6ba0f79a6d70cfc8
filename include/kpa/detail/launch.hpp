#pragma once
// From a LaunchPlan to kernel launches: the plan's compile-time choices (kernel path, rows per
// pass, cache storage type) become one PartitionKernel type, whose team policy, scratch and
// parameters come straight from the plan; the call's arguments become its views, parameters and
// variant. On a detected GPU the planner asks here for the occupancy of the very kernel that
// will run.

#include <kpa/attention_params.hpp>
#include <kpa/detail/attention_kernels.hpp>
#include <kpa/detail/cache_storage.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/launch_plan.hpp>

#include <cstdint>
#include <type_traits>

namespace kpa::detail {

/// Calls f(std::integral_constant<int, r>{}) for rows == r, one of the values of the sequence
/// (HostRowsPerPass or DeviceRowsPerPass).
template <int... Values, class F>
void with_rows_per_pass(std::integer_sequence<int, Values...>, int rows, F&& f) {
  const bool found = ((rows == Values ? (f(std::integral_constant<int, Values>{}), true) : false) || ...);
  if (!found) fail("kpa", "no kernel is compiled for ", rows, " rows per pass on this kernel path");
}

/// Calls f(TypeTag<Kernel>{}) with the PartitionKernel the plan runs that a translation unit
/// compiles for Space: the host path on host back ends, the device path on device back ends. (The
/// device path on host back ends is libkpa's: launch_device_path_on_host.)
template <class Space, class CacheT, class T, class TmpT, class F>
void with_partition_kernel(const char* call, const LaunchPlan& plan, KVCacheDType kv_cache_dtype, F&& f) {
  constexpr bool host_space = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  if ((plan.kernel_path == KernelPath::Host) != host_space) {
    fail<UnsupportedError>(call, "the ", to_string(plan.kernel_path), " kernel path is not compiled here for ",
                           Space::name());
  }
  with_cache_storage<CacheT>(kv_cache_dtype, [&](auto storage) {
    using StorageT = typename decltype(storage)::type;
    if constexpr (host_space) {
      with_rows_per_pass(HostRowsPerPass{}, plan.rows_per_pass, [&](auto rows) {
        f(TypeTag<PartitionKernel<Space, HostPath<decltype(rows)::value, StorageT>, T, TmpT>>{});
      });
    } else {
      with_rows_per_pass(DeviceRowsPerPass{}, plan.rows_per_pass, [&](auto rows) {
        f(TypeTag<PartitionKernel<Space, DevicePath<decltype(rows)::value, StorageT>, T, TmpT>>{});
      });
    }
  });
}

/// The team policy of `plan` for Kernel (league, team, vector, scratch). Checks the team size
/// against what the back end can launch for this kernel (on GPUs: its registers).
template <class Policy, class Kernel>
Policy team_policy_for(const char* call, const typename Policy::execution_space& space, const LaunchPlan& plan,
                       int league_size, std::size_t scratch_bytes, int scratch_level, const Kernel& kernel) {
  // Host back ends abort on constructing a policy with too large a team: ask a one-thread policy.
  Policy probe(space, league_size, 1, plan.vector_length);
  probe.set_scratch_size(scratch_level, Kokkos::PerTeam(scratch_bytes));
  const int max_team = probe.team_size_max(kernel, Kokkos::ParallelForTag());
  if (plan.team_size < 1 || plan.team_size > max_team) {
    fail(call, "team_size ", plan.team_size, " is outside [1, ", max_team, "] for ", Policy::execution_space::name(),
         " and this kernel");
  }
  Policy policy(space, league_size, plan.team_size, plan.vector_length);
  policy.set_scratch_size(scratch_level, Kokkos::PerTeam(scratch_bytes));
  return policy;
}

/// The plan for an attention call on `space`: DeviceProfile::detect(space) (or
/// KPA_DEVICE_PROFILE); on a detected GPU the planner sizes the league with the measured
/// occupancy of the kernel its team shape selects.
template <class Space, class CacheT, class T, class TmpT>
LaunchPlan plan_attention(const char* call, const Space& space, const ProblemShape& shape, const PlanOptions& options,
                          KVCacheDType kv_cache_dtype) {
  const OccupancyQuery occupancy = [&](const LaunchPlan& plan) {
    int resident = 0;
    with_partition_kernel<Space, CacheT, T, TmpT>(call, plan, kv_cache_dtype, [&](auto kernel) {
      using Kernel = typename decltype(kernel)::type;
      using Policy = typename Kernel::policy_type;
      const Policy policy(space, 1, plan.team_size, plan.vector_length);
      resident = compat::resident_teams_per_sm<Kernel>(space, policy, plan.scratch_level == 0 ? plan.scratch_bytes : 0);
    });
    return resident;
  };
  return plan_launch(DeviceProfile::detect(space), shape, options, occupancy);
}

/// The sizes and scalars of a kernel of `plan`.
template <class Space, class T, class TmpT>
KernelParams kernel_params(const LaunchPlan& plan, Output output, const ProblemShape& shape,
                           const AttentionViews<Space, T, TmpT>& views, const AttentionParams& params) {
  const bool fp8 = params.kv_cache_dtype != KVCacheDType::Auto;
  KernelParams k;
  k.output = output;
  k.num_kv_heads = shape.num_kv_heads;
  k.group_size = shape.num_heads / shape.num_kv_heads;
  k.several_query_tokens = views.query_start_loc.extent(0) > 0;
  k.head_size = shape.head_size;
  k.block_size = shape.block_size;
  k.partition_size = plan.partition_size;
  k.num_partitions = plan.num_partitions;
  k.tiles = plan.tiles;
  k.league_size = plan.league_size;
  k.chunk_tokens = plan.chunk_tokens;
  // Keys are dequantised through the query (q . (k s) = (q s) . k), values through the output.
  k.scale = params.scale * (fp8 ? params.k_scale : 1.0f);
  k.value_scale = fp8 ? params.v_scale : 1.0f;
  k.cache_head_stride = static_cast<std::int64_t>(shape.head_size) * shape.block_size;
  k.cache_block_stride = k.cache_head_stride * shape.num_kv_heads;
  k.scratch = plan.scratch_layout;
  k.scratch_level = plan.scratch_level;
  return k;
}

template <class View>
StridedFloats strided_floats(const View& view) {
  return view.extent(0) > 0 ? StridedFloats{view.data(), static_cast<std::int64_t>(view.stride(0))} : StridedFloats{};
}

/// The call's logit rules.
template <class Space, class T, class TmpT>
AttentionVariant attention_variant(const ProblemShape& shape, const AttentionViews<Space, T, TmpT>& views,
                                   const AttentionParams& params) {
  AttentionVariant v;
  v.logits_soft_cap = params.logits_soft_cap;
  v.sliding_window = params.sliding_window;
  v.masks_rows = views.query_start_loc.extent(0) > 0 || params.sliding_window > 0;
  if (params.block_sparse.vert_stride > 1) {
    v.sparse.vert_stride = params.block_sparse.vert_stride;
    v.sparse.local_blocks = params.block_sparse.local_blocks;
    v.sparse.block_size = params.block_sparse.block_size;
    v.sparse.head_sliding_step = params.block_sparse.head_sliding_step;
    v.sparse.tp_rank = params.tp_rank;
    v.sparse.num_heads = shape.num_heads;
    v.sparse.num_kv_heads = shape.num_kv_heads;
    v.sparse.group_size = shape.num_heads / shape.num_kv_heads;
  }
  v.alibi_slopes = strided_floats(views.alibi_slopes);
  v.sinks = strided_floats(views.sinks);
  return v;
}

/// The kernel path object of a plan: the host path's loops are chosen here, once per call.
template <class Path>
Path kernel_path(const LaunchPlan& plan, const ProblemShape& shape) {
  if constexpr (std::is_constructible_v<Path, HostIsa, int, int>) {
    return Path(plan.host_isa, shape.head_size, shape.block_size);
  } else {
    return Path{};
  }
}

/// Launches Kernel, a PartitionKernel, for `plan`.
template <class Kernel, class Space, class T, class TmpT>
void launch_kernel(const char* label, const Space& space, const LaunchPlan& plan, Output output,
                   const ProblemShape& shape, const AttentionViews<Space, T, TmpT>& views,
                   const AttentionParams& params) {
  using Path = std::remove_cv_t<decltype(Kernel::path)>;
  const Kernel kernel(views, kernel_params(plan, output, shape, views, params), attention_variant(shape, views, params),
                      kernel_path<Path>(plan, shape));
  const auto policy = team_policy_for<typename Kernel::policy_type>(label, space, plan, plan.league_size,
                                                                    plan.scratch_bytes, plan.scratch_level, kernel);
  Kokkos::parallel_for(label, policy, kernel);
}

/// The device kernel path's launch on a host back end (device_path_in_libkpa), compiled once into
/// libkpa for every dtype and cache type: the GPU-shaped code runs on any machine (kpa's tests run
/// it on every host back end) without every program compiling it.
template <class CacheT, class Space, class T, class TmpT>
void launch_device_path_on_host(const char* label, const Space& space, const LaunchPlan& plan, Output output,
                                const ProblemShape& shape, const AttentionViews<Space, T, TmpT>& views,
                                const AttentionParams& params);

/// Launches the attention kernel of `plan`, writing `output` (the final output, or the v2
/// partition triple of `views`). CacheT is the caches' element type (std::uint8_t for fp8).
template <class CacheT, class Space, class T, class TmpT>
void launch_partition_kernel(const char* label, const Space& space, const LaunchPlan& plan, Output output,
                             const ProblemShape& shape, const AttentionViews<Space, T, TmpT>& views,
                             const AttentionParams& params) {
  if (plan.tiles == 0) return;
  if (plan.kernel_path == KernelPath::Device) check_aligned_caches(label, views.key_cache, views.value_cache);
  if constexpr (device_path_in_libkpa<Space>) {
    if (plan.kernel_path == KernelPath::Device) {
      launch_device_path_on_host<CacheT>(label, space, plan, output, shape, views, params);
      return;
    }
  }
  with_partition_kernel<Space, CacheT, T, TmpT>(label, plan, params.kv_cache_dtype, [&](auto tag) {
    launch_kernel<typename decltype(tag)::type>(label, space, plan, output, shape, views, params);
  });
}

/// Launches the v2 reduce of `plan`: merges the partition triple of every (query row, head)
/// into out (and lse when asked for).
template <class Space, class T, class TmpT>
void launch_partition_reduce(const char* label, const Space& space, const LaunchPlan& plan, const ProblemShape& shape,
                             const AttentionViews<Space, T, TmpT>& views, const AttentionParams& params) {
  using Kernel = PartitionReduceKernel<Space, T, TmpT>;
  const int rows = static_cast<int>(views.out.extent(0));
  if (rows == 0 || shape.num_heads == 0) return;
  const Kernel kernel(views, kernel_params(plan, Output::Final, shape, views, params),
                      attention_variant(shape, views, params), shape.num_heads, shape.num_seqs, rows,
                      plan.reduce_league_size, plan.reduce_scratch_level);
  const auto policy = team_policy_for<typename Kernel::policy_type>(label, space, plan, plan.reduce_league_size,
                                                                    plan.reduce_scratch_bytes,
                                                                    plan.reduce_scratch_level, kernel);
  Kokkos::parallel_for(label, policy, kernel);
}

}  // namespace kpa::detail
