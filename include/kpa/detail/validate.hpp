#pragma once
// Every argument check of kpa's operations: one path, one message style
// ("<call>: <argument> <what is wrong>, got <value>"). Checks of sizes run on the host from the
// views' extents; checks of indices held in views (seq_lens, block tables, slot and block
// mappings) run as a kernel on the call's execution space, so the tables are never copied to
// the host: only the position of the first bad entry comes back (one small device-to-host copy,
// which waits for the space).

#include <kpa/attention_params.hpp>
#include <kpa/error.hpp>
#include <kpa/launch_plan.hpp>
#include <kpa/numeric_types.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
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

inline constexpr int kMaxHeadSize = 512;

/// Every view extent kpa indexes with int must fit one.
template <class View>
void check_int_extents(const char* call, const char* name, const View& view) {
  for (unsigned r = 0; r < View::rank; ++r) {
    if (view.extent(r) > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      fail(call, name, " extents ", extents_of(view), " exceed the int range");
    }
  }
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

/// A cache element type and kv_cache_dtype that belong together, and positive fp8 scales.
template <class CacheT>
void check_cache_format(const char* call, KVCacheDType kv_cache_dtype, float k_scale, float v_scale) {
  constexpr bool byte_cache = std::is_same_v<CacheT, std::uint8_t>;
  if (byte_cache != (kv_cache_dtype != KVCacheDType::Auto)) {
    fail(call, "kv_cache_dtype ", to_string(kv_cache_dtype), " does not match a ", sizeof(CacheT),
         "-byte cache element (fp8 caches are std::uint8_t views, \"auto\" caches have the activation type)");
  }
  if (byte_cache && !(k_scale > 0.0f && v_scale > 0.0f)) {
    fail(call, "fp8 scales must be positive, got k_scale ", k_scale, " and v_scale ", v_scale);
  }
}

struct CacheExtents {
  int num_blocks = 0;
  int block_size = 0;
};

/// The key and value caches of `num_kv_heads` heads of `head_size`, in vLLM's layouts:
/// key [num_blocks, num_kv_heads, head_size/x, block_size, x], value [num_blocks, num_kv_heads,
/// head_size, block_size], x = 16 / element size.
template <class KeyCacheView, class ValueCacheView>
CacheExtents check_cache_extents(const char* call, const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                                 int num_kv_heads, int head_size) {
  constexpr int x = static_cast<int>(16 / sizeof(typename KeyCacheView::non_const_value_type));
  check_int_extents(call, "key_cache", key_cache);
  check_int_extents(call, "value_cache", value_cache);
  if (head_size <= 0 || head_size % x != 0) {
    fail<UnsupportedError>(call, "head_size ", head_size, " is not supported (need a positive multiple of x = ", x, ")");
  }
  const CacheExtents extents{static_cast<int>(key_cache.extent(0)), static_cast<int>(key_cache.extent(3))};
  if (extents.block_size <= 0) fail(call, "block_size (key_cache.extent(3)) must be positive, got ", extents.block_size);
  if (static_cast<int>(key_cache.extent(1)) != num_kv_heads || static_cast<int>(key_cache.extent(4)) != x ||
      static_cast<int>(key_cache.extent(2)) * x != head_size) {
    fail(call, "key_cache extents ", extents_of(key_cache), " do not match [num_blocks, num_kv_heads = ", num_kv_heads,
         ", head_size/x = ", head_size / x, ", block_size, x = ", x, "]");
  }
  if (value_cache.extent(0) != key_cache.extent(0) || static_cast<int>(value_cache.extent(1)) != num_kv_heads ||
      static_cast<int>(value_cache.extent(2)) != head_size ||
      static_cast<int>(value_cache.extent(3)) != extents.block_size) {
    fail(call, "value_cache extents ", extents_of(value_cache), " do not match [", extents.num_blocks, ", ",
         num_kv_heads, ", ", head_size, ", ", extents.block_size, "]");
  }
  return extents;
}

/// The device kernel path reads the caches in aligned 16-byte vectors.
inline void check_aligned_caches(const char* call, const void* key_cache, const void* value_cache) {
  if (reinterpret_cast<std::uintptr_t>(key_cache) % 16 != 0 || reinterpret_cast<std::uintptr_t>(value_cache) % 16 != 0) {
    fail(call, "key_cache and value_cache must start on 16-byte boundaries for the device kernel path");
  }
}

/// Checks extents, relations and parameters of an attention call; returns its shape. With
/// `several_query_tokens` (query_start_loc given) query and out have a row per query token and
/// seq_lens a row per sequence; otherwise a row per sequence each.
template <class OutView, class QueryView, class KeyCacheView, class ValueCacheView, class BlockTableView,
          class SeqLenView, class AlibiView>
ProblemShape check_attention_args(const char* call, const OutView& out, const QueryView& query,
                                  const KeyCacheView& key_cache, const ValueCacheView& value_cache,
                                  const BlockTableView& block_tables, const SeqLenView& seq_lens, int max_seq_len,
                                  const AlibiView& alibi_slopes, const AttentionParams& params,
                                  bool several_query_tokens = false) {
  using CacheT = typename KeyCacheView::non_const_value_type;
  constexpr int x = static_cast<int>(16 / sizeof(CacheT));
  check_cache_format<CacheT>(call, params.kv_cache_dtype, params.k_scale, params.v_scale);
  check_int_extents(call, "query", query);
  check_int_extents(call, "out", out);
  check_int_extents(call, "block_tables", block_tables);
  check_int_extents(call, "seq_lens", seq_lens);
  if (out.extent(0) != query.extent(0) || out.extent(1) != query.extent(1) || out.extent(2) != query.extent(2)) {
    fail(call, "out extents ", extents_of(out), " differ from query extents ", extents_of(query));
  }
  ProblemShape shape;
  shape.num_seqs = static_cast<int>(several_query_tokens ? seq_lens.extent(0) : query.extent(0));
  shape.num_tokens = static_cast<int>(query.extent(0));
  shape.num_heads = static_cast<int>(query.extent(1));
  shape.head_size = static_cast<int>(query.extent(2));
  shape.num_kv_heads = static_cast<int>(key_cache.extent(1));
  shape.max_seq_len = max_seq_len;
  shape.cache_element_size = static_cast<int>(sizeof(CacheT));
  if (shape.head_size <= 0 || shape.head_size > kMaxHeadSize || shape.head_size % x != 0) {
    fail<UnsupportedError>(call, "head_size ", shape.head_size, " is not supported (need a multiple of x = ", x,
                           " between ", x, " and ", kMaxHeadSize, ")");
  }
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    fail(call, "num_heads ", shape.num_heads, " is not a multiple of num_kv_heads ", shape.num_kv_heads);
  }
  shape.block_size = check_cache_extents(call, key_cache, value_cache, shape.num_kv_heads, shape.head_size).block_size;
  if (static_cast<int>(block_tables.extent(0)) != shape.num_seqs) {
    fail(call, "block_tables has ", block_tables.extent(0), " rows, expected num_seqs = ", shape.num_seqs);
  }
  if (static_cast<int>(seq_lens.extent(0)) != shape.num_seqs) {
    fail(call, "seq_lens has ", seq_lens.extent(0), " entries, expected num_seqs = ", shape.num_seqs);
  }
  if (alibi_slopes.extent(0) != 0 && static_cast<int>(alibi_slopes.extent(0)) != shape.num_heads) {
    fail(call, "alibi_slopes has ", alibi_slopes.extent(0), " entries, expected 0 or num_heads = ", shape.num_heads);
  }
  if (max_seq_len < 0) fail(call, "max_seq_len must not be negative, got ", max_seq_len);
  if (max_seq_len > std::numeric_limits<int>::max() - shape.block_size) {  // token counts stay ints
    fail(call, "max_seq_len ", max_seq_len, " exceeds the supported maximum ",
         std::numeric_limits<int>::max() - shape.block_size, " (INT_MAX - block_size)");
  }
  if (!std::isfinite(params.logits_soft_cap) || params.logits_soft_cap < 0.0f) {  // isfinite first: no FE_INVALID
    fail(call, "logits_soft_cap must be 0 (off) or a positive finite number, got ", params.logits_soft_cap);
  }
  if (params.sliding_window < 0) fail(call, "sliding_window must be 0 (off) or positive, got ", params.sliding_window);
  shape.sliding_window = params.sliding_window;
  const BlockSparse& sparse = params.block_sparse;
  if (sparse.vert_stride > 1) {
    if (sparse.block_size <= 0 || sparse.block_size % shape.block_size != 0) {
      fail(call, "block_sparse.block_size ", sparse.block_size, " is not a positive multiple of block_size ",
           shape.block_size);
    }
    if (sparse.local_blocks < 0) fail(call, "block_sparse.local_blocks must not be negative, got ", sparse.local_blocks);
    if (params.tp_rank < 0) fail(call, "tp_rank must not be negative, got ", params.tp_rank);
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
  const long long needed = (static_cast<long long>(shape.max_seq_len) + partition_size - 1) / partition_size;
  const auto partitions = exp_sums.extent(2);
  check_int_extents(call, "tmp_out", tmp_out);
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
  if (static_cast<long long>(partitions) < needed) {
    fail(call, "max_num_partitions (exp_sums.extent(2)) = ", partitions, " is less than ceil(max_seq_len ",
         shape.max_seq_len, " / partition_size ", partition_size, ") = ", needed);
  }
}

// ---- Index checks, as kernels on the call's execution space ----

/// Min-reduces check(i) >= 0 (a failure code) over i; -1 codes are good entries.
template <class Check>
struct FirstFailure {
  Check check;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t& first) const {
    const std::int64_t code = check(i);
    if (code >= 0 && code < first) first = code;
  }
};

/// The smallest failure code check(i) gives over [0, n), or -1 when every entry is good.
template <class Space, class Check>
std::int64_t first_failure(const char* label, const Space& space, std::int64_t n, const Check& check) {
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  std::int64_t first = none;
  if (n > 0) {
    Kokkos::parallel_reduce(label, Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, n),
                            FirstFailure<Check>{check}, Kokkos::Min<std::int64_t>(first));
  }
  return first == none ? -1 : first;
}

/// Element `index` of a rank-1 or rank-2 view, read on the host (error messages only).
template <class View, class... Index>
auto element_on_host(const View& view, Index... index) {
  using value_type = typename View::non_const_value_type;
  Kokkos::View<value_type, Kokkos::HostSpace> element("kpa::element");
  Kokkos::deep_copy(element, Kokkos::subview(view, index...));
  return element();
}

/// Sequence s of a batch: its length (< 0, > max_seq_len, beyond the table) or one of the block
/// ids it uses (outside [0, num_blocks)). Code s * (columns + 1) for the length, + 1 + b for
/// column b, so the smallest code is the first bad entry in row order.
template <class BlockTableView, class SeqLenView>
struct SequenceIndexCheck {
  BlockTableView block_tables;
  SeqLenView seq_lens;
  int max_seq_len;
  int num_blocks;
  int block_size;
  std::int64_t columns;

  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t s) const {
    const std::int64_t row = s * (columns + 1);
    const std::int64_t len = seq_lens(s);
    if (len < 0 || len > max_seq_len || len > columns * block_size) return row;
    const std::int64_t used = (len + block_size - 1) / block_size;
    for (std::int64_t b = 0; b < used; ++b) {
      const int block = block_tables(s, b);
      if (block < 0 || block >= num_blocks) return row + 1 + b;
    }
    return -1;
  }
};

/// Every entry of seq_lens and of block_tables the kernels will follow; throws kpa::Error
/// naming the first bad one.
template <class Space, class BlockTableView, class SeqLenView>
void check_sequence_indices(const char* call, const Space& space, const BlockTableView& block_tables,
                            const SeqLenView& seq_lens, const ProblemShape& shape, int num_blocks) {
  const auto columns = static_cast<std::int64_t>(block_tables.extent(1));
  const SequenceIndexCheck<BlockTableView, SeqLenView> check{block_tables,   seq_lens,         shape.max_seq_len,
                                                             num_blocks,     shape.block_size, columns};
  const std::int64_t first = first_failure("kpa::check_indices", space, shape.num_seqs, check);
  if (first < 0) return;
  const std::int64_t s = first / (columns + 1), column = first % (columns + 1) - 1;
  const int len = element_on_host(seq_lens, s);
  if (column < 0) {
    if (len < 0) fail(call, "seq_lens[", s, "] = ", len, " is negative");
    if (len > shape.max_seq_len) fail(call, "seq_lens[", s, "] = ", len, " exceeds max_seq_len = ", shape.max_seq_len);
    fail(call, "seq_lens[", s, "] = ", len, " needs more blocks than block_tables has columns (", columns,
         " x block_size ", shape.block_size, ")");
  }
  fail(call, "block_tables[", s, "][", column, "] = ", element_on_host(block_tables, s, column),
       " is outside [0, num_blocks = ", num_blocks, ")");
}

/// query_start_loc of `num_seqs` sequences over `num_tokens` query rows: it starts at 0, ends
/// at num_tokens and never decreases, and sequence s has at most min(seq_lens[s], max_query_len)
/// query tokens. Code 2s: entry s out of order; 2s + 1: sequence s has too many tokens; code
/// 2 num_seqs: the last entry is not num_tokens.
template <class QueryStartView, class SeqLenView>
struct QueryStartCheck {
  QueryStartView query_start_loc;
  SeqLenView seq_lens;
  std::int64_t num_seqs, num_tokens;
  int max_query_len;

  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t s) const {
    if (s == num_seqs) return query_start_loc(s) == num_tokens ? -1 : 2 * s;
    const std::int64_t start = query_start_loc(s), len = query_start_loc(s + 1) - start;
    if ((s == 0 && start != 0) || len < 0) return 2 * s;
    if (len > seq_lens(s) || len > max_query_len) return 2 * s + 1;
    return -1;
  }
};

template <class Space, class QueryStartView, class SeqLenView>
void check_query_start_loc(const char* call, const Space& space, const QueryStartView& query_start_loc,
                           const SeqLenView& seq_lens, const ProblemShape& shape) {
  const QueryStartCheck<QueryStartView, SeqLenView> check{query_start_loc, seq_lens, shape.num_seqs,
                                                          shape.num_tokens, shape.max_query_len};
  const std::int64_t first = first_failure("kpa::check_query_start_loc", space, shape.num_seqs + 1, check);
  if (first < 0) return;
  const std::int64_t s = first / 2;
  if (s == shape.num_seqs) {
    fail(call, "query_start_loc[", s, "] = ", element_on_host(query_start_loc, s), " is not num_tokens = ",
         shape.num_tokens, " (the rows of query)");
  }
  const int start = element_on_host(query_start_loc, s), next = element_on_host(query_start_loc, s + 1);
  if (first % 2 == 0) {
    if (s == 0 && start != 0) fail(call, "query_start_loc[0] = ", start, " is not 0");
    fail(call, "query_start_loc decreases at sequence ", s, " (", start, " then ", next, ")");
  }
  fail(call, "sequence ", s, " has ", next - start, " query tokens, more than seq_lens[", s,
       "] = ", element_on_host(seq_lens, s), " or max_query_len = ", shape.max_query_len);
}

template <class SlotView>
struct SlotCheck {
  SlotView slot_mapping;
  std::int64_t num_slots;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t t) const {
    return slot_mapping(t) >= num_slots ? t : -1;  // negative slots are padding
  }
};

/// Every slot of slot_mapping is padding (< 0) or one of the cache's num_slots slots.
template <class Space, class SlotView>
void check_slot_mapping(const char* call, const Space& space, const SlotView& slot_mapping, std::int64_t num_slots) {
  const std::int64_t first = first_failure("kpa::check_slot_mapping", space,
                                           static_cast<std::int64_t>(slot_mapping.extent(0)),
                                           SlotCheck<SlotView>{slot_mapping, num_slots});
  if (first >= 0) {
    fail(call, "slot_mapping[", first, "] = ", element_on_host(slot_mapping, first), " is outside the cache's ",
         num_slots, " slots");
  }
}

template <class MappingView>
struct BlockMappingCheck {
  MappingView mapping;
  std::int64_t src_blocks, dst_blocks;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const {
    for (int side = 0; side < 2; ++side) {
      const std::int64_t block = mapping(i, side);
      if (block < 0 || block >= (side == 0 ? src_blocks : dst_blocks)) return 2 * i + side;
    }
    return -1;
  }
};

/// A [pairs][2] int64 block mapping: every source id (column 0) in [0, src_blocks), every
/// destination id (column 1) in [0, dst_blocks). Checked on `space` (the mapping's side).
template <class Space, class MappingView>
void check_block_mapping(const char* call, const Space& space, const MappingView& block_mapping,
                         std::int64_t src_blocks, std::int64_t dst_blocks) {
  static_assert(MappingView::rank == 2 && std::is_same_v<typename MappingView::non_const_value_type, std::int64_t>,
                "block_mapping is int64 [pairs][2]");
  if (block_mapping.extent(0) > 0 && block_mapping.extent(1) != 2) {
    fail(call, "block_mapping extents ", extents_of(block_mapping), " are not [pairs, 2]");
  }
  const std::int64_t first = first_failure("kpa::check_block_mapping", space,
                                           static_cast<std::int64_t>(block_mapping.extent(0)),
                                           BlockMappingCheck<MappingView>{block_mapping, src_blocks, dst_blocks});
  if (first >= 0) {
    const std::int64_t pair = first / 2;
    const int side = static_cast<int>(first % 2);
    fail(call, "block_mapping[", pair, "][", side, "] = ", element_on_host(block_mapping, pair, side),
         " is outside [0, num_blocks = ", side == 0 ? src_blocks : dst_blocks, ") of the ",
         side == 0 ? "source" : "destination", " cache");
  }
}

}  // namespace kpa::detail
