#pragma once
// The variant part of an attention launch, apart from its plain parameters (FlashInfer's split):
// how a logit is transformed (soft-capping), which keys a query row attends (causal order for
// several query tokens, the sliding window), and what joins the softmax denominator (sinks).
// Both kernel paths and the partition reduce ask it; with everything off it changes nothing
// and costs a compare per chunk.

#include <kpa/detail/kokkos_compat.hpp>

namespace kpa::detail {

struct AttentionVariant {
  float logits_soft_cap = 0.0f;  ///< c > 0: logit = c * tanh(logit / c); 0: off
  int sliding_window = 0;        ///< W > 0: keys p - W < j <= p; 0: every key j <= p
  bool sinks = false;            ///< a per-head sink logit joins the denominator (the extras' view)

  KOKKOS_INLINE_FUNCTION bool transforms_logits() const { return logits_soft_cap > 0.0f; }

  /// The soft cap of one logit (before ALiBi and masks); -inf (masked) and NaN stay as they are.
  KOKKOS_INLINE_FUNCTION float transform(float logit) const {
    if (logits_soft_cap > 0.0f && logit != -compat::infinity()) {
      return logits_soft_cap * compat::tanh(logit / logits_soft_cap);
    }
    return logit;
  }

  /// The first key a query row at absolute position `position` attends (its last is `position`).
  KOKKOS_INLINE_FUNCTION int first_key(int position) const {
    return (sliding_window > 0 && position >= sliding_window) ? position - sliding_window + 1 : 0;
  }

  /// Where a sequence's attended span starts: the block holding the first key of its first query
  /// row (query_len rows end at seq_len - 1). Partitions count from here, so a window over a
  /// long sequence plans and reads only the window's blocks.
  KOKKOS_INLINE_FUNCTION int span_begin(int seq_len, int query_len, int block_size) const {
    if (sliding_window <= 0) return 0;
    const int first = first_key(seq_len - (query_len > 0 ? query_len : 1));
    return first - first % block_size;
  }
};

}  // namespace kpa::detail
