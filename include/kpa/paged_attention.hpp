#pragma once
// vLLM-compatible paged attention for decode: paged_attention_v1 (one pass), paged_attention_v2
// (partitions, then a log-sum-exp reduce) and paged_attention (the launch planner decides).
// The automatic entry point also takes AttentionExtras: several query tokens per sequence,
// attention sinks and the log-sum-exp output.
// Contract: shapes, layouts and math of vLLM's ops (see README); every call validates its
// arguments and throws kpa::Error, and enqueues its kernels on `space`. It returns without
// waiting for them, except that with params.check_indices it waits for the index check.

#include <kpa/attention_params.hpp>
#include <kpa/detail/launch.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/launch_plan.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>

namespace kpa {

/// Plans a call of shape `shape` on `space` as the entry points do: DeviceProfile::detect(space)
/// (or KPA_DEVICE_PROFILE) and the back end's limits. (On a detected GPU the entry points also
/// give the planner the measured occupancy of the kernel they launch.)
template <class Space>
LaunchPlan plan_launch(const Space& space, const ProblemShape& shape, const PlanOptions& options = {}) {
  return plan_launch(DeviceProfile::detect(space), shape, options);
}

/// Partition temporaries of the automatic entry point. Default-constructible; grows when a call
/// needs more, and reuses its memory for every call of the same or a smaller shape. Calls from
/// several threads sharing one take turns with it, and a call on another instance of the space
/// first waits for the instance that used it last.
template <class Space>
class Workspace {
 public:
  using memory_space = typename Space::memory_space;
  using partial_view = Kokkos::View<float***, Kokkos::LayoutRight, memory_space, Kokkos::MemoryUnmanaged>;
  template <class TmpT>
  using tmp_out_view = Kokkos::View<TmpT****, Kokkos::LayoutRight, memory_space, Kokkos::MemoryUnmanaged>;

  template <class TmpT>
  struct Partials {
    partial_view exp_sums;
    partial_view max_logits;
    tmp_out_view<TmpT> tmp_out;
  };

  Workspace() = default;
  Workspace(Workspace&&) = default;
  Workspace& operator=(Workspace&&) = default;

  /// Holds the workspace for one call, from planning to its last enqueued kernel.
  std::unique_lock<std::mutex> acquire(const Space& space) {
    std::unique_lock<std::mutex> lock(*mutex_);
    if (last_space_ && !detail::compat::same_instance(space, *last_space_)) last_space_->fence();
    last_space_ = space;
    return lock;
  }

  /// Views over the workspace for [num_seqs, num_heads, num_partitions(, head_size)], with
  /// tmp_out of element type TmpT.
  template <class TmpT>
  Partials<TmpT> partials(int num_seqs, int num_heads, int num_partitions, int head_size) {
    const std::size_t rows = static_cast<std::size_t>(num_seqs) * num_heads * num_partitions;
    const std::size_t tmp_floats = (rows * head_size * sizeof(TmpT) + sizeof(float) - 1) / sizeof(float);
    const std::size_t needed = 2 * rows + tmp_floats;
    if (needed > buffer_.extent(0)) {
      buffer_ = Kokkos::View<float*, memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kpa::Workspace"),
                                                   needed);
      ++allocations_;
    }
    float* base = buffer_.data();
    return Partials<TmpT>{partial_view(base, num_seqs, num_heads, num_partitions),
                          partial_view(base + rows, num_seqs, num_heads, num_partitions),
                          tmp_out_view<TmpT>(reinterpret_cast<TmpT*>(base + 2 * rows), num_seqs, num_heads,
                                             num_partitions, head_size)};
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
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  std::optional<Space> last_space_;
};

/// The automatic entry point's optional inputs and outputs; an empty view is absent.
template <class Space>
struct AttentionExtras {
  using memory_space = typename Space::memory_space;
  template <class Data>
  using view = Kokkos::View<Data, Kokkos::LayoutStride, memory_space, Kokkos::MemoryUnmanaged>;

  /// [num_seqs + 1], vLLM's cumulative convention: sequence s has the query rows
  /// [query_start_loc[s], query_start_loc[s + 1]), n_s of them, its last n_s tokens (0 allowed,
  /// more than seq_lens[s] is an error); query, out and lse then have num_tokens =
  /// query_start_loc[num_seqs] rows. Absent: one query token per sequence.
  view<const int*> query_start_loc;
  /// The largest n_s (vLLM's max_query_len). 0: computed from query_start_loc (a reduction that
  /// waits for the space). A value below the true one is an error when indices are checked.
  int max_query_len = 0;
  /// [num_heads]: a learned sink logit per query head; exp(sink - m) joins the softmax
  /// denominator, with no value.
  view<const float*> sinks;
  /// [num_tokens][num_heads], written: the natural log of each row's softmax denominator in
  /// absolute terms (sink included); -inf for a row with nothing to attend.
  view<float**> lse;
};

namespace detail {

/// The kernels' arguments for an entry point's views (v2's partition triple left empty).
template <class Space, class TmpT, class OutView, class QueryView, class KeyCacheView, class ValueCacheView,
          class BlockTableView, class SeqLenView, class AlibiView>
auto attention_views(const OutView& out, const QueryView& query, const KeyCacheView& key_cache,
                    const ValueCacheView& value_cache, const BlockTableView& block_tables, const SeqLenView& seq_lens,
                    const AlibiView& alibi_slopes) {
  AttentionViews<Space, typename QueryView::non_const_value_type, TmpT> args;
  args.out = out;
  args.query = query;
  args.key_cache = key_cache.data();
  args.value_cache = value_cache.data();
  args.block_tables = block_tables;
  args.seq_lens = seq_lens;
  args.alibi_slopes = alibi_slopes;
  return args;
}

/// The largest query_start_loc(s + 1) - query_start_loc(s).
template <class View>
struct MaxQueryLen {
  View query_start_loc;
  KOKKOS_INLINE_FUNCTION void operator()(int s, int& longest) const {
    const int len = query_start_loc(s + 1) - query_start_loc(s);
    if (len > longest) longest = len;
  }
};

template <class Space, class View>
int max_query_len(const Space& space, const View& query_start_loc) {
  int longest = 0;
  const int num_seqs = static_cast<int>(query_start_loc.extent(0)) - 1;
  if (num_seqs > 0) {
    Kokkos::parallel_reduce("kpa::max_query_len", Kokkos::RangePolicy<Space>(space, 0, num_seqs),
                            MaxQueryLen<View>{query_start_loc}, Kokkos::Max<int>(longest));
  }
  return longest;
}

/// The extras' extents against the call's shape.
template <class Space>
void check_extras(const char* call, const Space&, const AttentionExtras<Space>& extras, const ProblemShape& shape) {
  check_int_extents(call, "query_start_loc", extras.query_start_loc);
  check_int_extents(call, "sinks", extras.sinks);
  check_int_extents(call, "lse", extras.lse);
  const bool several = extras.query_start_loc.extent(0) > 0;
  if (several && static_cast<long long>(extras.query_start_loc.extent(0)) != shape.num_seqs + 1LL) {
    fail(call, "query_start_loc has ", extras.query_start_loc.extent(0), " entries, expected num_seqs + 1 = ",
         shape.num_seqs + 1);
  }
  if (extras.max_query_len < 0 || (!several && extras.max_query_len != 0)) {
    fail(call, "max_query_len must be 0 (computed) or positive, and is given only with query_start_loc, got ",
         extras.max_query_len);
  }
  if (extras.sinks.extent(0) != 0 && static_cast<int>(extras.sinks.extent(0)) != shape.num_heads) {
    fail(call, "sinks has ", extras.sinks.extent(0), " entries, expected 0 or num_heads = ", shape.num_heads);
  }
  if (extras.lse.size() != 0 && (static_cast<int>(extras.lse.extent(0)) != shape.num_tokens ||
                                 static_cast<int>(extras.lse.extent(1)) != shape.num_heads)) {
    fail(call, "lse extents ", extents_of(extras.lse), " do not match [num_tokens = ", shape.num_tokens,
         ", num_heads = ", shape.num_heads, "]");
  }
}

/// With params.check_indices: every index the kernels will follow, checked by a kernel on `space`.
template <class Space, class T, class TmpT>
void check_indices(const char* call, const Space& space, const AttentionViews<Space, T, TmpT>& args,
                   const ProblemShape& shape, int num_blocks, const AttentionParams& params) {
  if (params.check_indices) check_sequence_indices(call, space, args.block_tables, args.seq_lens, shape, num_blocks);
}

}  // namespace detail

/// vLLM's paged_attention_v1: one pass over every sequence. `options` may override the team
/// shape, league size or kernel path (its partition_size is ignored: v1 has one partition).
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
void paged_attention_v1(const Space& space, const OutView& out, const QueryView& query, const KeyCacheView& key_cache,
                        const ValueCacheView& value_cache, const BlockTableView& block_tables,
                        const SeqLenView& seq_lens, int max_seq_len, const AlibiView& alibi_slopes,
                        const AttentionParams& params, const PlanOptions& options = {}) {
  constexpr const char* call = "kpa::paged_attention_v1";
  using T = typename QueryView::non_const_value_type;
  using CacheT = typename KeyCacheView::non_const_value_type;
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  const ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables,
                                                          seq_lens, max_seq_len, alibi_slopes, params);
  // v1 shares its kernel with the automatic entry point's single-partition launches.
  const auto args = detail::attention_views<Space, T>(out, query, key_cache, value_cache, block_tables, seq_lens,
                                                     alibi_slopes);
  detail::check_indices(call, space, args, shape, static_cast<int>(key_cache.extent(0)), params);
  PlanOptions single = options;
  single.partition_size = static_cast<int>((std::max(max_seq_len, 1) + static_cast<long long>(shape.block_size) - 1) /
                                           shape.block_size * shape.block_size);
  const LaunchPlan plan =
      detail::plan_attention<Space, CacheT, T, T>(call, space, shape, single, params.kv_cache_dtype);
  detail::launch_partition_kernel<CacheT>(call, space, plan, detail::Output::Final, shape, args, params);
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
  using T = typename QueryView::non_const_value_type;
  using TmpT = typename TmpOutView::non_const_value_type;
  using CacheT = typename KeyCacheView::non_const_value_type;
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  static_assert(std::is_same_v<typename PartialView::non_const_value_type, float> && PartialView::rank == 3,
                "exp_sums and max_logits are float [num_seqs, num_heads, max_num_partitions]");
  static_assert(TmpOutView::rank == 4 && (std::is_same_v<TmpT, float> || std::is_same_v<TmpT, T>),
                "tmp_out is [num_seqs, num_heads, max_num_partitions, head_size] of the query type or float");
  const ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables,
                                                          seq_lens, max_seq_len, alibi_slopes, params);
  auto args = detail::attention_views<Space, TmpT>(out, query, key_cache, value_cache, block_tables, seq_lens,
                                                  alibi_slopes);
  detail::check_indices(call, space, args, shape, static_cast<int>(key_cache.extent(0)), params);
  detail::check_partition_args(call, shape, partition_size, exp_sums, max_logits, tmp_out);
  args.exp_sums = exp_sums;
  args.max_logits = max_logits;
  args.tmp_out = tmp_out;
  PlanOptions partitioned = options;
  partitioned.partition_size = partition_size;
  const LaunchPlan plan =
      detail::plan_attention<Space, CacheT, T, TmpT>(call, space, shape, partitioned, params.kv_cache_dtype);
  detail::launch_partition_kernel<CacheT>("kpa::paged_attention_v2::partition", space, plan,
                                          detail::Output::Partition, shape, args, params);
  detail::launch_partition_reduce("kpa::paged_attention_v2::reduce", space, plan, shape, args, params);
}

/// Paged attention with the launch planner's choice: one kernel when every sequence fits one
/// partition (the single-partition path), otherwise partitions in `workspace` (tmp_out in the
/// query type, as vLLM's v2) and the reduce. `extras` adds several query tokens per sequence,
/// sinks and the LSE output. `options` overrides the planner (partition size, team shape,
/// league size, kernel path).
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
void paged_attention(const Space& space, Workspace<Space>& workspace, const OutView& out, const QueryView& query,
                     const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                     const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                     const AlibiView& alibi_slopes, const AttentionParams& params, const AttentionExtras<Space>& extras,
                     const PlanOptions& options = {}) {
  constexpr const char* call = "kpa::paged_attention";
  using T = typename QueryView::non_const_value_type;
  using CacheT = typename KeyCacheView::non_const_value_type;
  detail::check_view_types<Space, OutView, QueryView, KeyCacheView, ValueCacheView, BlockTableView, SeqLenView,
                           AlibiView>();
  const bool several_query_tokens = extras.query_start_loc.extent(0) > 0;
  ProblemShape shape = detail::check_attention_args(call, out, query, key_cache, value_cache, block_tables, seq_lens,
                                                    max_seq_len, alibi_slopes, params, several_query_tokens);
  detail::check_extras(call, space, extras, shape);
  auto args = detail::attention_views<Space, T>(out, query, key_cache, value_cache, block_tables, seq_lens,
                                               alibi_slopes);
  args.query_start_loc = extras.query_start_loc;
  args.sinks = extras.sinks;
  args.lse = extras.lse;
  if (several_query_tokens) {
    shape.max_query_len = extras.max_query_len > 0 ? extras.max_query_len
                                                   : detail::max_query_len(space, extras.query_start_loc);
    if (params.check_indices) detail::check_query_start_loc(call, space, extras.query_start_loc, seq_lens, shape);
  }
  detail::check_indices(call, space, args, shape, static_cast<int>(key_cache.extent(0)), params);
  const auto held = workspace.acquire(space);
  const LaunchPlan plan = detail::plan_attention<Space, CacheT, T, T>(call, space, shape, options, params.kv_cache_dtype);
  workspace.set_last_plan(plan);
  if (plan.single_partition) {
    detail::launch_partition_kernel<CacheT>("kpa::paged_attention::single_partition", space, plan,
                                            detail::Output::Final, shape, args, params);
    return;
  }
  const auto partials = workspace.template partials<T>(shape.num_tokens, shape.num_heads, plan.num_partitions,
                                                       shape.head_size);
  args.exp_sums = partials.exp_sums;
  args.max_logits = partials.max_logits;
  args.tmp_out = partials.tmp_out;
  detail::launch_partition_kernel<CacheT>("kpa::paged_attention::partition", space, plan, detail::Output::Partition,
                                          shape, args, params);
  detail::launch_partition_reduce("kpa::paged_attention::reduce", space, plan, shape, args, params);
}

/// The same without extras: one query token per sequence, no sinks, no LSE.
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
void paged_attention(const Space& space, Workspace<Space>& workspace, const OutView& out, const QueryView& query,
                     const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                     const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                     const AlibiView& alibi_slopes, const AttentionParams& params, const PlanOptions& options = {}) {
  paged_attention(space, workspace, out, query, key_cache, value_cache, block_tables, seq_lens, max_seq_len,
                  alibi_slopes, params, AttentionExtras<Space>{}, options);
}

}  // namespace kpa
