#pragma once
// The online-softmax state and its merge: the one rule by which kpa combines partial attention
// results, at every level (vector lanes over a block, team threads over a chunk, chunks over a
// partition, and partitions in the v2 reduce).
//
// A partial result over a token set T is (m, s, o): m = max logit over T, s = sum exp(l - m),
// o = sum exp(l - m) * v. Two of them merge by rescaling both to the larger max. The scalar pair
// (m, s) travels through Kokkos reductions; the head_size-wide o stays in team scratch and is
// rescaled with the same weights, because reduction values of hundreds of bytes overflow the
// host team-reduce buffer of Kokkos 3.4 and spill registers on GPUs.

#include <kpa/detail/kokkos_compat.hpp>

namespace kpa::detail {

/// Factors that rescale two partial results to their common max. Empty sides (m = -inf)
/// get weight 0; two empty sides give an empty result, never (-inf) - (-inf) = NaN.
struct MergeWeights {
  float max_logit;
  float self;
  float other;
};

KOKKOS_INLINE_FUNCTION MergeWeights merge_weights(float max_self, float max_other) {
  const float merged = compat::fmax(max_self, max_other);
  if (merged == -compat::infinity()) return MergeWeights{merged, 0.0f, 0.0f};
  return MergeWeights{merged, compat::exp(max_self - merged), compat::exp(max_other - merged)};
}

struct SoftmaxState {
  float max_logit = -compat::infinity();
  float exp_sum = 0.0f;

  /// Folds `other` into this state; returns the weights to apply to the matching o vectors
  /// (o = o * self + o_other * other).
  KOKKOS_INLINE_FUNCTION MergeWeights merge(const SoftmaxState& other) {
    const MergeWeights w = merge_weights(max_logit, other.max_logit);
    max_logit = w.max_logit;
    exp_sum = exp_sum * w.self + other.exp_sum * w.other;
    return w;
  }

  /// Folds one logit into the state with one exp. -inf (masked) leaves it unchanged; NaN
  /// makes the sum NaN, so corrupt data shows in the output instead of vanishing.
  KOKKOS_INLINE_FUNCTION void add(float logit) {
    if (logit == -compat::infinity()) return;
    if (logit != logit) {  // NaN (a quiet comparison: an ordered one would raise FE_INVALID)
      exp_sum = logit;
      return;
    }
    if (logit > max_logit) {
      exp_sum = exp_sum * compat::exp(max_logit - logit) + 1.0f;
      max_logit = logit;
    } else {
      exp_sum += compat::exp(logit - max_logit);
    }
  }

  /// max + log(sum): the log-sum-exp of the logits folded in; -inf when none was (sum 0), NaN
  /// for a NaN sum.
  KOKKOS_INLINE_FUNCTION float log_sum_exp() const {
    return exp_sum == 0.0f ? -compat::infinity() : max_logit + compat::log(exp_sum);
  }

  /// Weight of a partial result (m, s) whose o is normalised (o / s) in the merged whole:
  /// s * exp(m - M) / S. This is how the v2 reduce combines per-partition outputs.
  KOKKOS_INLINE_FUNCTION float share_of(const SoftmaxState& part) const {
    if (exp_sum == 0.0f || part.exp_sum == 0.0f) return 0.0f;
    // A part with no finite logit but a sum is one whose logits were all NaN: its share is NaN
    // (and (-inf) - (-inf) must not be computed: it raises FE_INVALID).
    if (part.max_logit == -compat::infinity()) return part.exp_sum != part.exp_sum ? part.exp_sum : 0.0f;
    return part.exp_sum * compat::exp(part.max_logit - max_logit) / exp_sum;
  }
};

/// The states of the query heads of one pass, merged head by head: a chunk's state for all of
/// them comes out of one team reduction.
template <int H>
struct SoftmaxStates {
  SoftmaxState head[H];

  KOKKOS_INLINE_FUNCTION void merge(const SoftmaxStates& other) {
    for (int g = 0; g < H; ++g) head[g].merge(other.head[g]);
  }
};

/// Kokkos reducer whose join is the merge of State (SoftmaxState, or SoftmaxStates<H> for the
/// heads of a pass).
template <class Space, class State = SoftmaxState>
struct SoftmaxReducer {
  using reducer = SoftmaxReducer;
  using value_type = State;
  using result_view_type = Kokkos::View<value_type, Space, Kokkos::MemoryUnmanaged>;

 private:
  result_view_type value_;

 public:
  KOKKOS_INLINE_FUNCTION explicit SoftmaxReducer(value_type& value) : value_(&value) {}

  KOKKOS_INLINE_FUNCTION void join(value_type& dest, const value_type& src) const { dest.merge(src); }

  KPA_COMPAT_VOLATILE_JOIN(value_type)

  KOKKOS_INLINE_FUNCTION void init(value_type& value) const { value = value_type(); }
  KOKKOS_INLINE_FUNCTION value_type& reference() const { return *value_.data(); }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return value_; }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return true; }
};

}  // namespace kpa::detail
