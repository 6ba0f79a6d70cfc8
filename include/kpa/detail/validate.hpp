#pragma once
// Argument checks shared by every paged-attention entry point: one path, one message style
// ("<call>: <argument> <what is wrong>, got <value>").

#include <kpa/attention_params.hpp>
#include <kpa/error.hpp>
#include <kpa/launch_plan.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

namespace kpa::detail {

/// Throws Exception (kpa::Error unless named) with "<call>: <parts...>".
template <class Exception = Error, class... Parts>
[[noreturn]] void fail(const char* call, const Parts&... parts) {
  std::ostringstream message;
  message << call << ": ";
  (message << ... << parts);
  throw Exception(message.str());
}

template <class View>
std::string extents_of(const View& view) {
  std::string text = "[";
  for (unsigned r = 0; r < View::rank; ++r) text += (r ? ", " : "") + std::to_string(view.extent(r));
  return text + "]";
}

inline bool is_supported_head_size(int head_size, int x) {
  return head_size > 0 && head_size <= 256 && head_size % x == 0;
}

/// Static checks on the view types of an attention call.
template <class Space, class OutView, class QueryView, class KeyCacheView, class ValueCacheView,
          class BlockTableView, class SeqLenView, class AlibiView>
constexpr void check_view_types() {
  using T = typename QueryView::non_const_value_type;
  using CacheT = typename KeyCacheView::non_const_value_type;
  static_assert(is_activation_type_v<T>, "query must hold float, kpa::half or kpa::bfloat16");
  static_assert(std::is_same_v<typename OutView::non_const_value_type, T>, "out must have the query's type");
  static_assert(std::is_same_v<CacheT, typename ValueCacheView::non_const_value_type>,
                "key_cache and value_cache must have one element type");
  static_assert(std::is_same_v<CacheT, T> || std::is_same_v<CacheT, std::uint8_t>,
                "caches hold the query type (kv_cache_dtype auto) or std::uint8_t (fp8)");
  static_assert(OutView::rank == 3 && QueryView::rank == 3, "out and query are [num_seqs, num_heads, head_size]");
  static_assert(KeyCacheView::rank == 5, "key_cache is [num_blocks, num_kv_heads, head_size/x, block_size, x]");
  static_assert(ValueCacheView::rank == 4, "value_cache is [num_blocks, num_kv_heads, head_size, block_size]");
  static_assert(BlockTableView::rank == 2 && SeqLenView::rank == 1 && AlibiView::rank == 1,
                "block_tables is 2-D, seq_lens and alibi_slopes are 1-D");
  static_assert(std::is_same_v<typename BlockTableView::non_const_value_type, int> &&
                    std::is_same_v<typename SeqLenView::non_const_value_type, int>,
                "block_tables and seq_lens hold int");
  static_assert(std::is_same_v<typename AlibiView::non_const_value_type, float>, "alibi_slopes holds float");
  static_assert(std::is_same_v<typename KeyCacheView::array_layout, Kokkos::LayoutRight> &&
                    std::is_same_v<typename ValueCacheView::array_layout, Kokkos::LayoutRight> &&
                    std::is_same_v<typename OutView::array_layout, Kokkos::LayoutRight>,
                "out and the caches must be LayoutRight");
  static_assert(Kokkos::SpaceAccessibility<Space, typename OutView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename QueryView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename KeyCacheView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename ValueCacheView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename BlockTableView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename SeqLenView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename AlibiView::memory_space>::accessible,
                "every view must be accessible from the execution space");
}

/// Checks extents, relations and parameters of an attention call; returns its shape.
/// With params.check_indices it also reads seq_lens and block_tables (copying them to the
/// host when they live on a device) and checks every entry the kernels will follow.
template <class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
ProblemShape check_attention_args(const char* call, const OutView& out, const QueryView& query,
                                  const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                                  const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                                  const AlibiView& alibi_slopes, const AttentionParams& params) {
  using CacheT = typename KeyCacheView::non_const_value_type;
  const bool byte_cache = std::is_same_v<CacheT, std::uint8_t>;
  if (byte_cache != (params.kv_cache_dtype != KVCacheDType::Auto)) {
    fail(call, "kv_cache_dtype ", to_string(params.kv_cache_dtype), " does not match a ", sizeof(CacheT),
         "-byte cache element (fp8 caches are std::uint8_t views, \"auto\" caches have the query type)");
  }
  if (byte_cache && !(params.k_scale > 0.0f && params.v_scale > 0.0f)) {
    fail(call, "fp8 scales must be positive, got k_scale ", params.k_scale, " and v_scale ", params.v_scale);
  }
  const BlockSparse& sparse = params.block_sparse;
  if (sparse.vert_stride > 1) {
    if (sparse.block_size <= 0 || sparse.block_size % static_cast<int>(key_cache.extent(3)) != 0) {
      fail(call, "block_sparse.block_size ", sparse.block_size, " is not a positive multiple of block_size ",
           key_cache.extent(3));
    }
    if (sparse.local_blocks < 0) fail(call, "block_sparse.local_blocks must not be negative, got ", sparse.local_blocks);
    if (params.tp_rank < 0) fail(call, "tp_rank must not be negative, got ", params.tp_rank);
  }
  ProblemShape shape;
  shape.num_seqs = static_cast<int>(query.extent(0));
  shape.num_heads = static_cast<int>(query.extent(1));
  shape.head_size = static_cast<int>(query.extent(2));
  shape.num_kv_heads = static_cast<int>(key_cache.extent(1));
  shape.block_size = static_cast<int>(key_cache.extent(3));
  shape.max_seq_len = max_seq_len;
  const int x = static_cast<int>(16 / sizeof(CacheT));
  const int num_blocks = static_cast<int>(key_cache.extent(0));

  if (out.extent(0) != query.extent(0) || out.extent(1) != query.extent(1) || out.extent(2) != query.extent(2)) {
    fail(call, "out extents ", extents_of(out), " differ from query extents ", extents_of(query));
  }
  if (!is_supported_head_size(shape.head_size, x)) {
    fail<UnsupportedError>(call, "head_size ", shape.head_size, " is not supported (need a multiple of x = ", x,
         " between ", x, " and 256)");
  }
  if (static_cast<int>(key_cache.extent(4)) != x ||
      static_cast<int>(key_cache.extent(2)) * x != shape.head_size) {
    fail(call, "key_cache extents ", extents_of(key_cache), " do not match [num_blocks, num_kv_heads, head_size/x = ",
         shape.head_size / x, ", block_size, x = ", x, "]");
  }
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    fail(call, "num_heads ", shape.num_heads, " is not a multiple of num_kv_heads ", shape.num_kv_heads);
  }
  if (shape.block_size <= 0) fail(call, "block_size must be positive, got ", shape.block_size);
  if (value_cache.extent(0) != key_cache.extent(0) || value_cache.extent(1) != key_cache.extent(1) ||
      static_cast<int>(value_cache.extent(2)) != shape.head_size ||
      static_cast<int>(value_cache.extent(3)) != shape.block_size) {
    fail(call, "value_cache extents ", extents_of(value_cache), " do not match [", num_blocks, ", ",
         shape.num_kv_heads, ", ", shape.head_size, ", ", shape.block_size, "]");
  }
  if (block_tables.extent(0) != query.extent(0)) {
    fail(call, "block_tables has ", block_tables.extent(0), " rows, expected num_seqs = ", shape.num_seqs);
  }
  if (seq_lens.extent(0) != query.extent(0)) {
    fail(call, "seq_lens has ", seq_lens.extent(0), " entries, expected num_seqs = ", shape.num_seqs);
  }
  if (alibi_slopes.extent(0) != 0 && static_cast<int>(alibi_slopes.extent(0)) != shape.num_heads) {
    fail(call, "alibi_slopes has ", alibi_slopes.extent(0), " entries, expected 0 or num_heads = ", shape.num_heads);
  }
  if (max_seq_len < 0) fail(call, "max_seq_len must not be negative, got ", max_seq_len);
  const long long table_tokens = static_cast<long long>(block_tables.extent(1)) * shape.block_size;

  if (params.check_indices && shape.num_seqs > 0) {
    const auto lens = compat::host_copy(seq_lens);
    const auto table = compat::host_copy(block_tables);
    for (int s = 0; s < shape.num_seqs; ++s) {
      const int len = lens(s);
      if (len < 0) fail(call, "seq_lens[", s, "] = ", len, " is negative");
      if (len > max_seq_len) fail(call, "seq_lens[", s, "] = ", len, " exceeds max_seq_len = ", max_seq_len);
      if (len > table_tokens) {
        fail(call, "seq_lens[", s, "] = ", len, " needs more blocks than block_tables has columns (",
             block_tables.extent(1), " x block_size ", shape.block_size, ")");
      }
      const int used_blocks = (len + shape.block_size - 1) / shape.block_size;
      for (int b = 0; b < used_blocks; ++b) {
        const int block = table(s, b);
        if (block < 0 || block >= num_blocks) {
          fail(call, "block_tables[", s, "][", b, "] = ", block, " is outside [0, num_blocks = ", num_blocks, ")");
        }
      }
    }
  }
  return shape;
}

/// Checks the v2 intermediates against the shape and partition size.
template <class PartialView, class TmpOutView>
void check_partition_args(const char* call, const ProblemShape& shape, int partition_size,
                          const PartialView& exp_sums, const PartialView& max_logits, const TmpOutView& tmp_out) {
  if (partition_size <= 0 || partition_size % shape.block_size != 0) {
    fail(call, "partition_size ", partition_size, " is not a positive multiple of block_size ", shape.block_size);
  }
  const int needed = (shape.max_seq_len + partition_size - 1) / partition_size;
  const auto partitions = exp_sums.extent(2);
  if (static_cast<int>(exp_sums.extent(0)) != shape.num_seqs || static_cast<int>(exp_sums.extent(1)) != shape.num_heads) {
    fail(call, "exp_sums extents ", extents_of(exp_sums), " do not match [num_seqs = ", shape.num_seqs,
         ", num_heads = ", shape.num_heads, ", max_num_partitions]");
  }
  if (max_logits.extent(0) != exp_sums.extent(0) || max_logits.extent(1) != exp_sums.extent(1) ||
      max_logits.extent(2) != partitions) {
    fail(call, "max_logits extents ", extents_of(max_logits), " differ from exp_sums extents ", extents_of(exp_sums));
  }
  if (tmp_out.extent(0) != exp_sums.extent(0) || tmp_out.extent(1) != exp_sums.extent(1) ||
      tmp_out.extent(2) != partitions || static_cast<int>(tmp_out.extent(3)) != shape.head_size) {
    fail(call, "tmp_out extents ", extents_of(tmp_out), " do not match [", shape.num_seqs, ", ", shape.num_heads,
         ", ", partitions, ", head_size = ", shape.head_size, "]");
  }
  if (static_cast<int>(partitions) < needed) {
    fail(call, "max_num_partitions (exp_sums.extent(2)) = ", partitions, " is less than ceil(max_seq_len ",
         shape.max_seq_len, " / partition_size ", partition_size, ") = ", needed);
  }
}

}  // namespace kpa::detail
