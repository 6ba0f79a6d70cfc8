#pragma once
// vLLM-compatible paged attention for decode: paged_attention_v1 (one pass), paged_attention_v2
// (partitions, then a log-sum-exp reduce) and paged_attention (the launch planner decides).
// Contract: shapes, layouts and math of vLLM's ops (see README); every call validates its
// arguments and throws kpa::Error, enqueues its kernels on `space` and returns without waiting.

#include <kpa/attention_params.hpp>
#include <kpa/detail/attention_kernels.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/launch_plan.hpp>

#include <algorithm>

namespace kpa {

/// Plans a call of shape `shape` on `space`: DeviceProfile::detect(space) (or KPA_DEVICE_PROFILE),
/// then team and vector sizes clamped to what the back end allows, unless `options` asked for them.
template <class Space>
LaunchPlan plan_launch(const Space& space, const ProblemShape& shape, const PlanOptions& options = {}) {
  LaunchPlan plan = plan_launch(DeviceProfile::detect(space), shape, options);
  using policy_type = Kokkos::TeamPolicy<Space>;
  const int max_vector = policy_type::vector_length_max();
  if (options.vector_length == 0) plan.vector_length = std::min(plan.vector_length, max_vector);
  // Host back ends run at most one team member per thread; device team sizes are checked
  // against the kernel at launch.
  if (options.team_size == 0 && Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
    plan.team_size = std::min(plan.team_size, static_cast<int>(space.concurrency()));
  }
  return plan;
}

/// Partition temporaries of the automatic entry point. Default-constructible; grows when a call
/// needs more, and reuses its memory for every call of the same or a smaller shape.
template <class Space>
class Workspace {
 public:
  using memory_space = typename Space::memory_space;
  using partial_view = Kokkos::View<float***, Kokkos::LayoutRight, memory_space, Kokkos::MemoryUnmanaged>;
  using tmp_out_view = Kokkos::View<float****, Kokkos::LayoutRight, memory_space, Kokkos::MemoryUnmanaged>;

  struct Partials {
    partial_view exp_sums;
    partial_view max_logits;
    tmp_out_view tmp_out;
  };

  Workspace() = default;

  /// Views over the workspace for [num_seqs, num_heads, num_partitions(, head_size)].
  Partials partials(int num_seqs, int num_heads, int num_partitions, int head_size) {
    const std::size_t rows = static_cast<std::size_t>(num_seqs) * num_heads * num_partitions;
    const std::size_t needed = rows * (2 + static_cast<std::size_t>(head_size));
    if (needed > buffer_.extent(0)) {
      buffer_ = Kokkos::View<float*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kpa::Workspace"),
                                                   needed);
      ++allocations_;
    }
    float* base = buffer_.data();
    return Partials{partial_view(base, num_seqs, num_heads, num_partitions),
                    partial_view(base + rows, num_seqs, num_heads, num_partitions),
                    tmp_out_view(base + 2 * rows, num_seqs, num_heads, num_partitions, head_size)};
  }

  std::size_t capacity_bytes() const { return buffer_.extent(0) * sizeof(float); }
  /// How often the workspace has allocated device memory (0 until a multi-partition call).
  int allocations() const { return allocations_; }
  /// The plan of the last paged_attention call made with this workspace.
  const LaunchPlan& last_plan() const { return last_plan_; }
  void set_last_plan(const LaunchPlan& plan) { last_plan_ = plan; }

 private:
  Kokkos::View<float*, memory_space> buffer_;
  int allocations_ = 0;
  LaunchPlan last_plan_;
};

namespace detail {

/// Builds the team policy for `kernel` from `plan`, choosing the scratch level that fits.
template <class Policy, class Kernel>
Policy team_policy_for(const char* call, const typename Policy::execution_space& space, const LaunchPlan& plan,
                       int league_size, Kernel& kernel) {
  const std::size_t bytes = kernel.scratch_bytes();
  kernel.scratch_level = bytes <= static_cast<std::size_t>(Policy::scratch_size_max(0)) ? 0 : 1;
  if (plan.vector_length > Policy::vector_length_max()) {
    fail(call, "vector_length ", plan.vector_length, " exceeds the back end's maximum ", Policy::vector_length_max());
  }
  // Host back ends abort on constructing a policy with too large a team: ask a one-thread policy.
  Policy probe(space, league_size, 1, plan.vector_length);
  probe.set_scratch_size(kernel.scratch_level, Kokkos::PerTeam(bytes));
  const int max_team = probe.team_size_max(kernel, Kokkos::ParallelForTag());
  if (plan.team_size < 1 || plan.team_size > max_team) {
    fail(call, "team_size ", plan.team_size, " is outside [1, ", max_team, "] for ",
         Policy::execution_space::name());
  }
  Policy policy(space, league_size, plan.team_size, plan.vector_length);
  policy.set_scratch_size(kernel.scratch_level, Kokkos::PerTeam(bytes));
  return policy;
}

/// Calls `run.template operator()<StorageT>()` with the element type the kernels read the cache
/// as: the view's type for "auto", the fp8 format named by kv_cache_dtype for std::uint8_t.
template <class CacheT, class Run>
void with_cache_storage(KVCacheDType dtype, Run&& run) {
  if constexpr (std::is_same_v<CacheT, std::uint8_t>) {
    if (dtype == KVCacheDType::Fp8E5M2) {
      run(static_cast<fp8_e5m2*>(nullptr));
    } else {
      run(static_cast<fp8_e4m3*>(nullptr));
    }
  } else {
    run(static_cast<CacheT*>(nullptr));
  }
}

template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView, class PartialView, class TmpOutView>
void run_partition_kernel(const char* label, const Space& space, const LaunchPlan& plan, Output output,
                          const ProblemShape& shape, const OutView& out, const QueryView& query,
                          const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                          const BlockTableView& block_tables, const SeqLenView& seq_lens,
                          const AlibiView& alibi_slopes, const AttentionParams& params, const PartialView& exp_sums,
                          const PartialView& max_logits, const TmpOutView& tmp_out) {
  using CacheT = typename KeyCacheView::non_const_value_type;
  if (plan.tiles == 0) return;
  const bool fp8 = params.kv_cache_dtype != KVCacheDType::Auto;
  PartitionGeometry geo;
  geo.output = output;
  geo.num_kv_heads = shape.num_kv_heads;
  geo.group_size = shape.num_heads / shape.num_kv_heads;
  geo.head_size = shape.head_size;
  geo.block_size = shape.block_size;
  geo.partition_size = plan.partition_size;
  geo.num_partitions = plan.num_partitions;
  geo.tiles = plan.tiles;
  geo.league_size = plan.league_size;
  geo.chunk_tokens = chunk_tokens_for(shape.block_size);
  // Keys are dequantised through the query (q . (k s) = (q s) . k), values through the output.
  geo.scale = params.scale * (fp8 ? params.k_scale : 1.0f);
  geo.value_scale = fp8 ? params.v_scale : 1.0f;
  if (params.block_sparse.vert_stride > 1) {
    geo.sparse.vert_stride = params.block_sparse.vert_stride;
    geo.sparse.local_blocks = params.block_sparse.local_blocks;
    geo.sparse.block_size = params.block_sparse.block_size;
    geo.sparse.head_sliding_step = params.block_sparse.head_sliding_step;
    geo.sparse.tp_rank = params.tp_rank;
    geo.sparse.num_heads = shape.num_heads;
  }
  geo.cache_head_stride = static_cast<std::int64_t>(shape.head_size) * shape.block_size;
  geo.cache_block_stride = geo.cache_head_stride * shape.num_kv_heads;
  with_cache_storage<CacheT>(params.kv_cache_dtype, [&](auto* storage) {
    using StorageT = std::remove_pointer_t<decltype(storage)>;
    using Kernel = PartitionKernel<Space, StorageT, OutView, QueryView, BlockTableView, SeqLenView, AlibiView,
                                   PartialView, TmpOutView>;
    Kernel kernel{out,
                  query,
                  reinterpret_cast<const StorageT*>(key_cache.data()),
                  reinterpret_cast<const StorageT*>(value_cache.data()),
                  block_tables,
                  seq_lens,
                  alibi_slopes,
                  exp_sums,
                  max_logits,
                  tmp_out,
                  geo};
    const auto policy = team_policy_for<typename Kernel::policy_type>(label, space, plan, plan.league_size, kernel);
    Kokkos::parallel_for(label, policy, kernel);
  });
}

template <class Space, class OutView, class SeqLenView, class PartialView, class TmpOutView>
void run_partition_reduce(const char* label, const Space& space, const LaunchPlan& plan, const ProblemShape& shape,
                          const OutView& out, const SeqLenView& seq_lens, const PartialView& exp_sums,
                          const PartialView& max_logits, const TmpOutView& tmp_out) {
  using Kernel = PartitionReduceKernel<Space, OutView, SeqLenView, PartialView, TmpOutView>;
  const int items = shape.num_seqs * shape.num_heads;
  if (items == 0) return;
  Kernel kernel{out, seq_lens, exp_sums, max_logits, tmp_out, shape.num_heads, shape.head_size, plan.partition_size,
                items, plan.reduce_league_size};
  const auto policy = team_policy_for<typename Kernel::policy_type>(label, space, plan, plan.reduce_league_size, kernel);
  Kokkos::parallel_for(label, policy, kernel);
}

}  // namespace detail

/// vLLM's paged_attention_v1: one pass over every sequence. `options` may override the team
/// shape or league size (its partition_size is ignored: v1 has one partition).
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
void paged_attention_v1(const Space& space, const OutView& out, const QueryView& query, const KeyCacheView& key_cache,
                        const ValueCacheView& value_cache, const BlockTableView& block_tables,
                        const SeqLenView& seq_lens, int max_seq_len, const AlibiView& alibi_slopes,
                        const AttentionParams& params, const PlanOptions& options = {}) {
  constexpr const char* call = "kpa::paged_attention_v1";
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  const ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables,
                                                          seq_lens, max_seq_len, alibi_slopes, params);
  PlanOptions single = options;
  single.partition_size = ((std::max(max_seq_len, 1) + shape.block_size - 1) / shape.block_size) * shape.block_size;
  const LaunchPlan plan = plan_launch(space, shape, single);
  typename Workspace<Space>::partial_view no_partials;
  typename Workspace<Space>::tmp_out_view no_tmp_out;
  detail::run_partition_kernel(call, space, plan, detail::Output::Final, shape, out, query, key_cache, value_cache,
                               block_tables, seq_lens, alibi_slopes, params, no_partials, no_partials, no_tmp_out);
}

/// vLLM's paged_attention_v2: per-partition results into max_logits / exp_sums / tmp_out
/// (tmp_out normalised per partition), then their reduce into `out`.
template <class Space, class OutView, class PartialView, class TmpOutView, class QueryView, class KeyCacheView,
          class ValueCacheView, class BlockTableView, class SeqLenView, class AlibiView>
void paged_attention_v2(const Space& space, const OutView& out, const PartialView& exp_sums,
                        const PartialView& max_logits, const TmpOutView& tmp_out, const QueryView& query,
                        const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                        const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                        const AlibiView& alibi_slopes, const AttentionParams& params, int partition_size = 512,
                        const PlanOptions& options = {}) {
  constexpr const char* call = "kpa::paged_attention_v2";
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  static_assert(std::is_same_v<typename PartialView::non_const_value_type, float> && PartialView::rank == 3,
                "exp_sums and max_logits are float [num_seqs, num_heads, max_num_partitions]");
  static_assert(TmpOutView::rank == 4 && (std::is_same_v<typename TmpOutView::non_const_value_type, float> ||
                                          std::is_same_v<typename TmpOutView::non_const_value_type,
                                                         typename QueryView::non_const_value_type>),
                "tmp_out is [num_seqs, num_heads, max_num_partitions, head_size] of the query type or float");
  const ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables,
                                                          seq_lens, max_seq_len, alibi_slopes, params);
  detail::check_partition_args(call, shape, partition_size, exp_sums, max_logits, tmp_out);
  PlanOptions partitioned = options;
  partitioned.partition_size = partition_size;
  const LaunchPlan plan = plan_launch(space, shape, partitioned);
  detail::run_partition_kernel("kpa::paged_attention_v2::partition", space, plan, detail::Output::Partition, shape,
                               out, query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, params,
                               exp_sums, max_logits, tmp_out);
  detail::run_partition_reduce("kpa::paged_attention_v2::reduce", space, plan, shape, out, seq_lens, exp_sums,
                               max_logits, tmp_out);
}

/// Paged attention with the launch planner's choice: one kernel when every sequence fits one
/// partition (the single-tile path), otherwise partitions in `workspace` and the reduce.
/// `options` overrides the planner (partition size, team shape, league size).
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
void paged_attention(const Space& space, Workspace<Space>& workspace, const OutView& out, const QueryView& query,
                     const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                     const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                     const AlibiView& alibi_slopes, const AttentionParams& params, const PlanOptions& options = {}) {
  constexpr const char* call = "kpa::paged_attention";
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  const ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables,
                                                          seq_lens, max_seq_len, alibi_slopes, params);
  const LaunchPlan plan = plan_launch(space, shape, options);
  workspace.set_last_plan(plan);
  if (plan.single_tile) {
    typename Workspace<Space>::partial_view no_partials;
    typename Workspace<Space>::tmp_out_view no_tmp_out;
    detail::run_partition_kernel("kpa::paged_attention::single_tile", space, plan, detail::Output::Final, shape, out,
                                 query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, params,
                                 no_partials, no_partials, no_tmp_out);
    return;
  }
  const auto partials = workspace.partials(shape.num_seqs, shape.num_heads, plan.num_partitions, shape.head_size);
  detail::run_partition_kernel("kpa::paged_attention::partition", space, plan, detail::Output::Partition, shape, out,
                               query, key_cache, value_cache, block_tables, seq_lens, alibi_slopes, params,
                               partials.exp_sums, partials.max_logits, partials.tmp_out);
  detail::run_partition_reduce("kpa::paged_attention::reduce", space, plan, shape, out, seq_lens, partials.exp_sums,
                               partials.max_logits, partials.tmp_out);
}

}  // namespace kpa
