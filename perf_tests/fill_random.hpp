#pragma once
// Benchmark inputs: caches and queries filled in parallel with reproducible pseudo-random values,
// shared by kpa-bench and the Google Benchmark perf tests.

#include <kpa/kpa.hpp>

#include <cstdint>
#include <type_traits>

namespace kpa_bench {

/// Reproducible random contents from a counter-based hash of (seed, index), in [-1, 1): keys,
/// values (as cache storage S; fp8 caches hold the codes of value / scale) and the query.
template <class S, class KeyCache, class ValueCache, class Query>
struct FillRandom {
  KeyCache key_cache;
  ValueCache value_cache;
  Query query;
  std::uint64_t mix;
  float scale;

  KOKKOS_INLINE_FUNCTION static float hash(std::uint64_t z, std::uint64_t mix) {
    z = (z + mix) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / 8388608.0f - 1.0f;
  }
  template <class C>
  KOKKOS_INLINE_FUNCTION C stored(float v) const {
    if constexpr (std::is_same_v<C, std::uint8_t>) {
      return kpa::detail::from_float<S>(v / scale).bits;
    } else {
      return kpa::detail::from_float<C>(v);
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    using C = typename KeyCache::non_const_value_type;
    using T = typename Query::non_const_value_type;
    key_cache.data()[i] = stored<C>(hash(2 * i, mix));
    value_cache.data()[i] = stored<C>(hash(2 * i + 1, mix));
    if (i < static_cast<std::int64_t>(query.size())) query.data()[i] = kpa::detail::from_float<T>(hash(~i, mix));
  }
};

template <class S, class Space, class KeyCache, class ValueCache, class Query>
void fill_random(const Space& space, const KeyCache& key_cache, const ValueCache& value_cache, const Query& query,
                 std::uint64_t seed, float scale) {
  Kokkos::parallel_for("kpa_bench::fill",
                       Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, key_cache.size()),
                       FillRandom<S, KeyCache, ValueCache, Query>{key_cache, value_cache, query,
                                                                  seed * 0x9E3779B97F4A7C15ull, scale});
}

}  // namespace kpa_bench
