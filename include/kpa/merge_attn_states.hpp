#pragma once
// vLLM's merge_attn_states: two attention results over disjoint key sets of the same queries
// (a shared prefix and the rest, in cascade attention; or any split of a sequence's keys),
// merged by their log-sum-exps into the result over both. For each (token, head):
//   M = max(lse_p, lse_s), w_x = exp(lse_x - M),
//   out = (w_p * prefix_out + w_s * suffix_out) / (w_p + w_s), out_lse = M + log(w_p + w_s).
// An input whose LSE is -inf or +inf carries no weight (+inf is what some kernels write for an
// empty set); both empty gives 0 and -inf. A NaN LSE makes the row NaN.

#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>

namespace kpa {
namespace detail {

template <class Space, class T>
struct MergeAttnStatesKernel {
  template <class Data>
  using view = Kokkos::View<Data, Kokkos::LayoutStride, typename Space::memory_space, Kokkos::MemoryUnmanaged>;
  view<T***> out;
  view<float**> out_lse;  ///< extent 0: not written
  view<const T***> prefix_out;
  view<const float**> prefix_lse;
  view<const T***> suffix_out;
  view<const float**> suffix_lse;
  int num_heads, head_size;

  /// LSE +inf counts as -inf: no weight.
  KOKKOS_INLINE_FUNCTION static float weightless_inf(float lse) {
    return lse == compat::infinity() ? -compat::infinity() : lse;
  }

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const int d = static_cast<int>(i % head_size);
    const std::int64_t row = i / head_size;
    const int head = static_cast<int>(row % num_heads);
    const int token = static_cast<int>(row / num_heads);
    const float lse_p = weightless_inf(prefix_lse(token, head)), lse_s = weightless_inf(suffix_lse(token, head));
    const bool nan = lse_p != lse_p || lse_s != lse_s;
    const float m = nan ? lse_p + lse_s : compat::fmax(lse_p, lse_s);
    float value = 0.0f, lse = -compat::infinity();
    if (nan) {
      value = lse = m;
    } else if (m != -compat::infinity()) {
      const float w_p = compat::exp(lse_p - m), w_s = compat::exp(lse_s - m);
      const float total = w_p + w_s;
      // A side without weight contributes nothing, even where its output holds NaN or garbage.
      const float p = w_p > 0.0f ? w_p * to_float(prefix_out(token, head, d)) : 0.0f;
      const float s = w_s > 0.0f ? w_s * to_float(suffix_out(token, head, d)) : 0.0f;
      value = (p + s) / total;
      lse = m + compat::log(total);
    }
    out(token, head, d) = from_float<T>(value);
    if (d == 0 && out_lse.extent(0) > 0) out_lse(token, head) = lse;
  }
};

}  // namespace detail

/// out[num_tokens][num_heads][head_size] (and out_lse[num_tokens][num_heads], or an empty view)
/// from the two results; enqueued on `space`. Outputs hold float, kpa::half or kpa::bfloat16
/// (all four the same type); LSEs are float.
template <class Space, class OutView, class OutLseView, class PrefixView, class PrefixLseView, class SuffixView,
          class SuffixLseView>
void merge_attn_states(const Space& space, const OutView& out, const OutLseView& out_lse, const PrefixView& prefix_out,
                       const PrefixLseView& prefix_lse, const SuffixView& suffix_out, const SuffixLseView& suffix_lse) {
  constexpr const char* call = "kpa::merge_attn_states";
  using T = typename OutView::non_const_value_type;
  static_assert(detail::is_activation_type_v<T>, "out must hold float, kpa::half or kpa::bfloat16");
  static_assert(std::is_same_v<typename PrefixView::non_const_value_type, T> &&
                    std::is_same_v<typename SuffixView::non_const_value_type, T>,
                "prefix_out and suffix_out must have out's type");
  static_assert(OutView::rank == 3 && PrefixView::rank == 3 && SuffixView::rank == 3,
                "out, prefix_out and suffix_out are [num_tokens, num_heads, head_size]");
  static_assert(OutLseView::rank == 2 && PrefixLseView::rank == 2 && SuffixLseView::rank == 2,
                "the LSEs are [num_tokens, num_heads]");
  static_assert(std::is_same_v<typename OutLseView::non_const_value_type, float> &&
                    std::is_same_v<typename PrefixLseView::non_const_value_type, float> &&
                    std::is_same_v<typename SuffixLseView::non_const_value_type, float>,
                "the LSEs hold float");
  for (const auto& [name, extents] : {std::pair{"prefix_out", detail::extents_of(prefix_out)},
                                      std::pair{"suffix_out", detail::extents_of(suffix_out)}}) {
    if (extents != detail::extents_of(out)) {
      detail::fail(call, name, " extents ", extents, " differ from out extents ", detail::extents_of(out));
    }
  }
  detail::check_int_extents(call, "out", out);
  const std::string rows = "[" + std::to_string(out.extent(0)) + ", " + std::to_string(out.extent(1)) + "]";
  for (const auto& [name, extents] : {std::pair{"prefix_lse", detail::extents_of(prefix_lse)},
                                      std::pair{"suffix_lse", detail::extents_of(suffix_lse)}}) {
    if (extents != rows) detail::fail(call, name, " extents ", extents, " do not match [num_tokens, num_heads] = ", rows);
  }
  if (out_lse.size() != 0 && detail::extents_of(out_lse) != rows) {
    detail::fail(call, "out_lse extents ", detail::extents_of(out_lse), " do not match [num_tokens, num_heads] = ",
                 rows, " (or give an empty view)");
  }
  using Kernel = detail::MergeAttnStatesKernel<Space, T>;
  const Kernel kernel{out, out_lse, prefix_out, prefix_lse, suffix_out, suffix_lse, static_cast<int>(out.extent(1)),
                      static_cast<int>(out.extent(2))};
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0)) * out.extent(1) * out.extent(2);
  if (n == 0) return;
  Kokkos::parallel_for(call, Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, n), kernel);
}

}  // namespace kpa
