// Decode-step paged attention: v1, v2 and the automatic entry point over batch, sequence
// length, GQA ratio and cache dtype. Counters: KV bytes read per second and FLOP/s
// (2 FLOP per multiply-add in q.K and p.V).

#include "fill_random.hpp"

#include <kpa/kpa.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

enum Version { V1 = 1, V2 = 2, Auto = 3 };

// T: query / output type; C: cache element (T, or std::uint8_t for an fp8 E4M3 cache).
template <class T, class C = T>
struct Batch {
  int num_seqs, seq_len, heads, kv_heads, head_size, block_size;
  Kokkos::View<T***, Kokkos::LayoutRight, Memory> query, out;
  Kokkos::View<C*****, Kokkos::LayoutRight, Memory> key_cache;
  Kokkos::View<C****, Kokkos::LayoutRight, Memory> value_cache;
  Kokkos::View<int**, Kokkos::LayoutRight, Memory> block_tables;
  Kokkos::View<int*, Memory> seq_lens;
  Kokkos::View<float*, Memory> alibi{"alibi", 0};
  Kokkos::View<float***, Kokkos::LayoutRight, Memory> exp_sums, max_logits;
  Kokkos::View<float****, Kokkos::LayoutRight, Memory> tmp_out;
  kpa::AttentionParams params;
  kpa::Workspace<Space> workspace;

  Batch(int seqs, int len, int h, int kvh, int d, int bs)
      : num_seqs(seqs), seq_len(len), heads(h), kv_heads(kvh), head_size(d), block_size(bs),
        query("q", seqs, h, d), out("out", seqs, h, d),
        key_cache("k", seqs * blocks(), kvh, d / x(), bs, x()),
        value_cache("v", seqs * blocks(), kvh, d, bs),
        block_tables("bt", seqs, blocks()), seq_lens("lens", seqs),
        exp_sums("es", seqs, h, (len + 511) / 512), max_logits("ml", seqs, h, (len + 511) / 512),
        tmp_out("to", seqs, h, (len + 511) / 512, d) {
    params.scale = 1.0f / std::sqrt(static_cast<float>(d));
    if constexpr (std::is_same_v<C, std::uint8_t>) {
      params.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
      params.k_scale = params.v_scale = 0.01f;
    }
    kpa::detail::with_cache_storage<C>(params.kv_cache_dtype, [&](auto storage) {
      kpa_bench::fill_random<typename decltype(storage)::type>(Space(), key_cache, value_cache, query, 1, params.k_scale);
    });
    std::vector<int> order(seqs * blocks());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(1));
    auto tables = Kokkos::create_mirror_view(block_tables);
    auto lens = Kokkos::create_mirror_view(seq_lens);
    for (int s = 0; s < seqs; ++s) {
      lens(s) = len;
      for (int b = 0; b < blocks(); ++b) tables(s, b) = order[s * blocks() + b];
    }
    Kokkos::deep_copy(block_tables, tables);
    Kokkos::deep_copy(seq_lens, lens);
    params.check_indices = false;  // validated once above; time the kernels
  }
  int blocks() const { return (seq_len + block_size - 1) / block_size; }
  static int x() { return static_cast<int>(16 / sizeof(C)); }

  void run(Version version) {
    const Space space;
    if (version == V1) {
      kpa::paged_attention_v1(space, out, query, key_cache, value_cache, block_tables, seq_lens, seq_len, alibi, params);
    } else if (version == V2) {
      kpa::paged_attention_v2(space, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, block_tables,
                              seq_lens, seq_len, alibi, params, 512);
    } else {
      kpa::paged_attention(space, workspace, out, query, key_cache, value_cache, block_tables, seq_lens, seq_len,
                           alibi, params);
    }
  }
};

// Arguments: version, batch, seq_len, heads, kv_heads, head_size, block_size.
template <class T, class C = T>
void paged_attention(benchmark::State& state) {
  const auto version = static_cast<Version>(state.range(0));
  Batch<T, C> batch(state.range(1), state.range(2), state.range(3), state.range(4), state.range(5), state.range(6));
  batch.run(version);  // warm-up, workspace allocation
  Space().fence();
  for (auto _ : state) {
    batch.run(version);
    Space().fence();
  }
  const double tokens = static_cast<double>(batch.num_seqs) * batch.seq_len;
  const double kv_bytes = 2.0 * tokens * batch.kv_heads * batch.head_size * sizeof(C);
  const double flops = 4.0 * tokens * batch.heads * batch.head_size;
  state.counters["kv_bytes_per_s"] = benchmark::Counter(kv_bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flop_per_s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(version == V1 ? "v1" : version == V2 ? "v2" : "auto");
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"version", "batch", "seq_len", "heads", "kv_heads", "head", "block"});
  for (int version : {V1, V2, Auto}) {
    b->Args({version, 32, 4096, 32, 8, 128, 16});  // Llama-style batch
    b->Args({version, 1, 100000, 24, 4, 256, 16});  // the long-context case
    b->Args({version, 64, 512, 32, 8, 128, 16});    // single-tile
  }
  for (int seq_len = 128; seq_len <= 131072; seq_len *= 4) b->Args({Auto, 4, seq_len, 32, 8, 128, 16});
  for (int batch = 1; batch <= 256; batch *= 4) b->Args({Auto, batch, 1024, 32, 8, 128, 16});
  for (int ratio : {1, 4, 8}) b->Args({Auto, 16, 2048, 32, 32 / ratio, 128, 16});
  for (int block : {8, 32}) b->Args({Auto, 16, 2048, 32, 8, 128, block});
  for (int head : {64, 256}) b->Args({Auto, 16, 2048, 32, 8, head, 16});
  b->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.2);
}

BENCHMARK_TEMPLATE(paged_attention, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(paged_attention, kpa::bfloat16)->Apply(shapes);
BENCHMARK_TEMPLATE(paged_attention, float)->Apply(shapes);
BENCHMARK_TEMPLATE(paged_attention, kpa::half, std::uint8_t)->Name("paged_attention<kpa::half,fp8_e4m3>")->Apply(shapes);

}  // namespace
