#pragma once
// The baseline a user would otherwise write, run on the same inputs as kpa:
//   naive: one Kokkos thread per (sequence, query head), scalar loops over the paged layout with
//          an online softmax; K/V read once per query head (no GQA sharing).
// (dense_baseline.hpp has the other one, which needs Kokkos Kernels.)

#include <kpa/kpa.hpp>

#include <cstdint>
#include <vector>

namespace kpa_bench {

/// One element of a cache of storage type S (T for "auto", fp8_e4m3 / fp8_e5m2 for fp8) as float.
template <class S, class C>
KOKKOS_INLINE_FUNCTION float cache_value(const C& stored, float scale) {
  if constexpr (std::is_same_v<C, std::uint8_t>) {
    return kpa::to_float(S{stored}) * scale;
  } else {
    return kpa::to_float(stored);
  }
}

template <class Space, class S, class OutView, class QueryView, class KeyCache, class ValueCache, class Tables,
          class Lens>
void naive_attention(const Space& space, const OutView& out, const QueryView& query, const KeyCache& key_cache,
                     const ValueCache& value_cache, const Tables& block_tables, const Lens& seq_lens,
                     const kpa::AttentionParams& params) {
  using T = typename OutView::non_const_value_type;
  const int heads = static_cast<int>(query.extent(1)), head_size = static_cast<int>(query.extent(2));
  const int group = heads / static_cast<int>(key_cache.extent(1));
  const int block_size = static_cast<int>(key_cache.extent(3)), x = static_cast<int>(key_cache.extent(4));
  const float scale = params.scale, k_scale = params.k_scale, v_scale = params.v_scale;
  Kokkos::parallel_for(
      "kpa_bench::naive", Kokkos::RangePolicy<Space>(space, 0, static_cast<int>(query.extent(0)) * heads),
      KOKKOS_LAMBDA(int item) {
        const int s = item / heads, h = item % heads, g = h / group;
        float o[256] = {};
        float m = -kpa::detail::compat::infinity(), sum = 0.0f;
        for (int t = 0; t < seq_lens(s); ++t) {
          const int b = block_tables(s, t / block_size), slot = t % block_size;
          float logit = 0.0f;
          for (int d = 0; d < head_size; ++d)
            logit += kpa::to_float(query(s, h, d)) * cache_value<S>(key_cache(b, g, d / x, slot, d % x), k_scale);
          logit *= scale;
          const float new_m = logit > m ? logit : m;
          const float rescale = kpa::detail::compat::exp(m - new_m), w = kpa::detail::compat::exp(logit - new_m);
          sum = sum * rescale + w;
          for (int d = 0; d < head_size; ++d) o[d] = o[d] * rescale + w * cache_value<S>(value_cache(b, g, d, slot), v_scale);
          m = new_m;
        }
        for (int d = 0; d < head_size; ++d) out(s, h, d) = kpa::detail::from_float<T>(sum > 0.0f ? o[d] / sum : 0.0f);
      });
}

}  // namespace kpa_bench
