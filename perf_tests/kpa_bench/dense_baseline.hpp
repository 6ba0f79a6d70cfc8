#pragma once
// The dense baseline: the seed design's algorithm with Kokkos Kernels. Per sequence and kv head
// (a host loop), gather K and V into contiguous Views, then logits = Q K^T (gemm), softmax,
// out = P V (gemm). Built when kpa-bench finds Kokkos Kernels.

#include "baselines.hpp"

#include <KokkosBlas3_gemm.hpp>

namespace kpa_bench {

/// Dense gather + Kokkos Kernels gemm. seq_lens and block_tables are read on the host: the
/// per-sequence host loop is the point of this baseline.
template <class Space, class S>
class DenseAttention {
 public:
  using Memory = typename Space::memory_space;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Memory>;

  template <class OutView, class QueryView, class KeyCache, class ValueCache, class Tables, class Lens>
  void operator()(const Space& space, const OutView& out, const QueryView& query, const KeyCache& key_cache,
                  const ValueCache& value_cache, const Tables& block_tables, const Lens& seq_lens,
                  const kpa::AttentionParams& params) {
    using T = typename OutView::non_const_value_type;
    const auto lens = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), seq_lens);
    const int heads = static_cast<int>(query.extent(1)), head_size = static_cast<int>(query.extent(2));
    const int kv_heads = static_cast<int>(key_cache.extent(1)), group = heads / kv_heads;
    const int block_size = static_cast<int>(key_cache.extent(3)), x = static_cast<int>(key_cache.extent(4));
    int max_len = 0;
    for (std::size_t s = 0; s < lens.extent(0); ++s) max_len = lens(s) > max_len ? lens(s) : max_len;
    if (keys_.extent(0) < static_cast<std::size_t>(max_len) || keys_.extent(1) != static_cast<std::size_t>(head_size) ||
        q_.extent(0) != static_cast<std::size_t>(group)) {
      keys_ = Matrix("kpa_bench::dense_k", max_len, head_size);
      values_ = Matrix("kpa_bench::dense_v", max_len, head_size);
      probs_ = Matrix("kpa_bench::dense_p", group, max_len);
      q_ = Matrix("kpa_bench::dense_q", group, head_size);
      o_ = Matrix("kpa_bench::dense_o", group, head_size);
    }
    const float k_scale = params.k_scale, v_scale = params.v_scale, scale = params.scale;
    for (int s = 0; s < static_cast<int>(lens.extent(0)); ++s) {
      const int len = lens(s);
      for (int g = 0; g < kv_heads; ++g) {
        if (len == 0) {
          Kokkos::parallel_for("kpa_bench::dense_empty", Kokkos::RangePolicy<Space>(space, 0, group * head_size),
                               KOKKOS_LAMBDA(int i) {
                                 out(s, g * group + i / head_size, i % head_size) = kpa::detail::from_float<T>(0.0f);
                               });
          continue;
        }
        const auto k = Kokkos::subview(keys_, std::pair<int, int>(0, len), Kokkos::ALL);
        const auto v = Kokkos::subview(values_, std::pair<int, int>(0, len), Kokkos::ALL);
        const auto p = Kokkos::subview(probs_, Kokkos::ALL, std::pair<int, int>(0, len));
        const auto q = q_, o = o_;
        Kokkos::parallel_for(
            "kpa_bench::dense_gather", Kokkos::RangePolicy<Space>(space, 0, len * head_size), KOKKOS_LAMBDA(int i) {
              const int t = i / head_size, d = i % head_size, b = block_tables(s, t / block_size), slot = t % block_size;
              k(t, d) = cache_value<S>(key_cache(b, g, d / x, slot, d % x), k_scale);
              v(t, d) = cache_value<S>(value_cache(b, g, d, slot), v_scale);
            });
        Kokkos::parallel_for(
            "kpa_bench::dense_query", Kokkos::RangePolicy<Space>(space, 0, group * head_size), KOKKOS_LAMBDA(int i) {
              q(i / head_size, i % head_size) = kpa::to_float(query(s, g * group + i / head_size, i % head_size)) * scale;
            });
        KokkosBlas::gemm("N", "T", 1.0f, q, k, 0.0f, p);
        Kokkos::parallel_for(
            "kpa_bench::dense_softmax", Kokkos::RangePolicy<Space>(space, 0, group), KOKKOS_LAMBDA(int r) {
              float m = -kpa::detail::compat::infinity(), sum = 0.0f;
              for (int t = 0; t < len; ++t) m = p(r, t) > m ? p(r, t) : m;
              for (int t = 0; t < len; ++t) sum += (p(r, t) = kpa::detail::compat::exp(p(r, t) - m));
              for (int t = 0; t < len; ++t) p(r, t) /= sum;
            });
        KokkosBlas::gemm("N", "N", 1.0f, p, v, 0.0f, o);
        Kokkos::parallel_for(
            "kpa_bench::dense_store", Kokkos::RangePolicy<Space>(space, 0, group * head_size), KOKKOS_LAMBDA(int i) {
              out(s, g * group + i / head_size, i % head_size) = kpa::detail::from_float<T>(o(i / head_size, i % head_size));
            });
      }
    }
  }

 private:
  Matrix keys_, values_, probs_, q_, o_;
};

}  // namespace kpa_bench
