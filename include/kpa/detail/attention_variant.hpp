#pragma once
// The variant part of an attention launch, apart from its plain parameters (FlashInfer's split):
// every rule that decides a logit, whether a key counts or what joins the softmax lives here, once.
//   logit()          the logit transform: the soft cap, then the ALiBi bias;
//   in_window(), attends_block()
//                    the mask: the row's causal window (several query tokens, sliding window)
//                    and vLLM's block-sparse pattern, which holds for whole blocks;
//   apply_to_row()   the transform and the mask over a row of a chunk's logits, the form the host
//                    path calls; its arithmetic goes through RowLoops, which the instruction sets
//                    specialise (a vectorised tanh for the cap, a vectorised ramp for ALiBi);
//   join_sink()      the sink logit joining a row's softmax denominator, with no value;
//   span_begin()     where a sequence's attended keys start (a window's first block): the kernels
//                    read from there, and the planner sizes partitions by the longest span.
// Both kernel paths and the partition reduce ask it; with everything off it changes nothing.

#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/detail/softmax_state.hpp>

#include <cstdint>

namespace kpa::detail {

/// A float array with a stride: an argument view as the kernels read it (data null: absent).
struct StridedFloats {
  const float* data = nullptr;
  std::int64_t stride = 1;

  KOKKOS_INLINE_FUNCTION bool present() const { return data != nullptr; }
  KOKKOS_INLINE_FUNCTION float operator[](int i) const { return data[i * stride]; }
};

/// vLLM's block-sparse pattern (its blocksparse_* arguments), in the kernel's terms.
struct BlockSparsePattern {
  int vert_stride = 0;  ///< <= 1: dense
  int local_blocks = 0;
  int block_size = 1;  ///< tokens per sparse block (a multiple of the cache block size)
  int head_sliding_step = 0;
  int tp_rank = 0;
  int num_heads = 0;     ///< query heads on this rank
  int num_kv_heads = 0;  ///< kv heads on this rank
  int group_size = 1;    ///< query heads per kv head
};

/// One query row as the rules see it: its query head, the absolute position of its query token
/// (the last key it may attend), and its ALiBi slope (0: none).
struct QueryRow {
  int head = 0;
  int position = 0;
  float alibi_slope = 0.0f;
};

struct AttentionVariant {
  float logits_soft_cap = 0.0f;  ///< c > 0: logit = c * tanh(logit / c); 0: off
  int sliding_window = 0;        ///< W > 0: keys p - W < j <= p; 0: every key j <= p
  /// Rows attend different keys (several query tokens per sequence, or a sliding window): each
  /// row is masked to its own range. Otherwise every row of a pass attends the same keys.
  bool masks_rows = false;
  BlockSparsePattern sparse;
  StridedFloats alibi_slopes;  ///< [num_heads]
  StridedFloats sinks;         ///< [num_heads]: a sink logit joins the denominator

  /// The rule's scalar definition of the soft cap; -inf (masked) and NaN stay as they are.
  KOKKOS_INLINE_FUNCTION static float soft_cap(float logit, float cap) {
    return logit == -compat::infinity() ? logit : cap * compat::tanh(logit / cap);
  }

  /// The rule's scalar definition of ALiBi: the bias of a key `distance` = j - p positions from
  /// the query (0 or negative).
  KOKKOS_INLINE_FUNCTION static float alibi_bias(float slope, float distance) { return slope * distance; }

  KOKKOS_INLINE_FUNCTION QueryRow row(int head, int position) const {
    return QueryRow{head, position, alibi_slopes.present() ? alibi_slopes[head] : 0.0f};
  }

  /// Hook 1, the logit transform: q.k (scale applied) of `row` and key `key` to the logit the
  /// softmax sees.
  KOKKOS_INLINE_FUNCTION float logit(float qk, const QueryRow& row, int key) const {
    if (logits_soft_cap > 0.0f) qk = soft_cap(qk, logits_soft_cap);
    if (row.alibi_slope != 0.0f) qk += alibi_bias(row.alibi_slope, static_cast<float>(key - row.position));
    return qk;
  }

  /// Hook 2, the mask, in two parts: `row` attends key `key` when the key lies in the row's window
  /// and the row attends its block. The causal window: keys first_key(position) ... position.
  KOKKOS_INLINE_FUNCTION bool in_window(const QueryRow& row, int key) const {
    return key <= row.position && key >= first_key(row.position);
  }

  /// The block-sparse part of the mask, which holds for whole blocks: whether `row` attends the
  /// sparse block holding key `key`. Dense attention attends everything.
  KOKKOS_INLINE_FUNCTION bool attends_block(const QueryRow& row, int key) const {
    if (sparse.vert_stride <= 1) return true;
    const int key_block = key / sparse.block_size;
    const int query_block = row.position / sparse.block_size;
    if (key_block > query_block - sparse.local_blocks) return true;
    const int offset = sparse.head_sliding_step >= 0
                           ? (sparse.tp_rank * sparse.num_heads + row.head) * sparse.head_sliding_step + 1
                           : (sparse.tp_rank * sparse.num_kv_heads + row.head / sparse.group_size) *
                                     -sparse.head_sliding_step + 1;
    return (key_block + offset) % sparse.vert_stride == 0;
  }

  /// Whether some blocks are skipped whole (then the kernels test each block before reading it).
  KOKKOS_INLINE_FUNCTION bool skips_blocks() const { return sparse.vert_stride > 1; }

  /// The first key a row at absolute position `position` attends (its last is `position`).
  KOKKOS_INLINE_FUNCTION int first_key(int position) const { return first_key(position, sliding_window); }
  KOKKOS_INLINE_FUNCTION static int first_key(int position, int window) {
    return (window > 0 && position >= window) ? position - window + 1 : 0;
  }

  /// Where a sequence's attended span starts: the block holding the first key of its first query
  /// row (query_len rows end at seq_len - 1). Partitions count from here, so a window over a
  /// long sequence plans and reads only the window's blocks. The static form is the planner's.
  KOKKOS_INLINE_FUNCTION int span_begin(int seq_len, int query_len, int block_size) const {
    return span_begin(seq_len, query_len, block_size, sliding_window);
  }
  KOKKOS_INLINE_FUNCTION static int span_begin(int seq_len, int query_len, int block_size, int window) {
    if (window <= 0) return 0;
    const int first = first_key(seq_len - (query_len > 0 ? query_len : 1), window);
    return first - first % block_size;
  }

  KOKKOS_INLINE_FUNCTION bool has_sinks() const { return sinks.present(); }

  /// Hook 3, the sink: query head `head`'s sink logit joins `state`'s denominator and adds no
  /// value. Returns the weight the state's own output keeps (1 without sinks).
  KOKKOS_INLINE_FUNCTION float join_sink(SoftmaxState& state, int head) const {
    if (!sinks.present()) return 1.0f;
    return state.merge(SoftmaxState{sinks[head], 1.0f}).self;
  }

  /// The row-wise form of both hooks, over `n` logits of `row` for the keys first_key,
  /// first_key + 1, ...: masked keys become -inf, then the transform applies (it keeps -inf).
  /// Keys of blocks no row of a pass attends may hold anything before: the mask overwrites them.
  /// `loops` gives the arithmetic: RowLoops (host_loops.hpp) or any type with the same members.
  /// `scale` multiplies the logits first, or is returned for the softmax to apply
  /// (RowLoops::softmax) where that is the same: where no transform follows and it is positive,
  /// so that it keeps -inf (a masked key) -inf; else 1 is returned.
  template <class Loops>
  KOKKOS_INLINE_FUNCTION float apply_to_row(const Loops& loops, float* logits, int n, int first, int block_size,
                                            const QueryRow& row, float scale) const {
    const bool transforms = logits_soft_cap > 0.0f || row.alibi_slope != 0.0f;
    if (scale > 0.0f && !transforms) {
      mask_row(logits, n, first, block_size, row);
      return scale;
    }
    if (scale != 1.0f) {
      for (int i = 0; i < n; ++i) logits[i] *= scale;
    }
    mask_row(logits, n, first, block_size, row);
    if (logits_soft_cap > 0.0f) loops.soft_cap(logits, n, logits_soft_cap);
    if (row.alibi_slope != 0.0f) loops.add_ramp(logits, n, row.alibi_slope, static_cast<float>(first - row.position));
    return 1.0f;
  }

 private:
  /// apply_to_row's mask.
  KOKKOS_INLINE_FUNCTION void mask_row(float* logits, int n, int first, int block_size, const QueryRow& row) const {
    if (skips_blocks()) {
      for (int i = 0; i < n; i += block_size) {
        if (attends_block(row, first + i)) continue;
        for (int j = i; j < n && j < i + block_size; ++j) logits[j] = -compat::infinity();
      }
    }
    if (masks_rows) {
      const int lo = first_key(row.position) - first, hi = row.position + 1 - first;
      for (int i = 0; i < n && i < lo; ++i) logits[i] = -compat::infinity();
      for (int i = hi < 0 ? 0 : hi; i < n; ++i) logits[i] = -compat::infinity();
    }
  }
};

}  // namespace kpa::detail
