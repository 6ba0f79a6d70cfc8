// The host path's two arithmetic loops alone (detail/host_loops.hpp), one thread, on one 256-token
// chunk whose blocks stay in L1 / L2: q.k (block_logits over the chunk's blocks) and p.V
// (chunk_values over all output dimensions), for every instruction set this CPU runs, and for
// the passes of a prefill tile on the best level (the AMX tiles where the CPU has them). What a
// register tile or a widening costs shows here without the memory system: a decode step adds
// the cache reads (kpa-bench). Counters: tokens per second (a token being one kv head's key or
// value vector, used by the H query heads of a pass) and FLOP/s (2 per multiply-add).

#include <kpa/detail/host_loops.hpp>
#include <kpa/host_isa.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using kpa::HostIsa;

constexpr int kChunkTokens = 256;

/// One chunk of one kv head in vLLM's block layouts, its blocks in shuffled order, with queries,
/// probabilities and an output of H rows.
template <int H, class CacheT>
struct Chunk {
  int head_size, block_size, blocks;
  std::vector<CacheT> keys, values;
  std::vector<int> block_ids;
  std::vector<float> q, probs, o;

  Chunk(int d, int b) : head_size(d), block_size(b), blocks(kChunkTokens / b) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    keys.resize(static_cast<std::size_t>(blocks) * b * d);
    values.resize(keys.size());
    for (CacheT& k : keys) k = kpa::detail::from_float<CacheT>(uniform(rng));
    for (CacheT& v : values) v = kpa::detail::from_float<CacheT>(uniform(rng));
    block_ids.resize(blocks);
    for (int i = 0; i < blocks; ++i) block_ids[i] = i;
    std::shuffle(block_ids.begin(), block_ids.end(), rng);
    q.resize(static_cast<std::size_t>(H) * d);
    for (float& x : q) x = 0.1f * uniform(rng);
    probs.resize(static_cast<std::size_t>(H) * kChunkTokens);
    for (float& p : probs) p = (uniform(rng) + 1.0f) / kChunkTokens;
    o.assign(static_cast<std::size_t>(H) * d, 0.0f);
  }
  std::int64_t block_elements() const { return static_cast<std::int64_t>(block_size) * head_size; }
};

template <int H, class CacheT>
void count(benchmark::State& state, HostIsa isa, int head_size) {
  const double tokens = static_cast<double>(state.iterations()) * kChunkTokens;
  state.SetItemsProcessed(static_cast<std::int64_t>(tokens));
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * H * head_size * tokens, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(kpa::to_string(isa)));
}

/// q.k over the chunk's blocks. Arguments: instruction set, head size, block size. kTiles: as the
/// passes of a tile of several (a prefill chunk's rows, TileKey), which on the AMX level pack the
/// chunk's blocks in the first iteration and read what they packed from then on, as a tile's
/// later passes do.
template <int H, class CacheT, bool kTiles>
void qk(benchmark::State& state) {
  const auto isa = static_cast<HostIsa>(state.range(0));
  Chunk<H, CacheT> c(static_cast<int>(state.range(1)), static_cast<int>(state.range(2)));
  const auto kernels = kpa::detail::host_loops<H, CacheT>(isa, c.head_size, c.block_size, kpa::detail::Passes::Several);
  for (float& x : c.q) x = kpa::to_float(kpa::detail::from_float<kpa::bfloat16>(x));  // a bf16 model's query
  const kpa::detail::QueryTiles q_tiles =
      kernels.prepare_query != nullptr ? kernels.prepare_query(c.q.data(), c.head_size) : kpa::detail::QueryTiles{};
  const kpa::detail::TileKey tile{kernels.call, kTiles ? 0 : -1};
  kpa::detail::BlockPrefetcher idle;  // the chunk stays in cache: nothing to ask for
  for (auto _ : state) {
    for (int b = 0; b < c.blocks; ++b) {
      kernels.block_logits({c.keys.data() + c.block_ids[b] * c.block_elements(), c.block_size, c.head_size,
                            c.block_size, c.q.data(), c.probs.data() + b * c.block_size, kChunkTokens, q_tiles,
                            tile},
                           idle);
    }
    benchmark::DoNotOptimize(c.probs.data());
    benchmark::ClobberMemory();
  }
  count<H, CacheT>(state, isa, c.head_size);
}

/// p.V over the chunk for all output dimensions, as qk (a bf16 output's probabilities).
template <int H, class CacheT, bool kTiles>
void pv(benchmark::State& state) {
  const auto isa = static_cast<HostIsa>(state.range(0));
  Chunk<H, CacheT> c(static_cast<int>(state.range(1)), static_cast<int>(state.range(2)));
  const auto kernels = kpa::detail::host_loops<H, CacheT>(isa, c.head_size, c.block_size, kpa::detail::Passes::Several);
  kpa::detail::ChunkValuesArgs<CacheT> args{c.values.data(), c.block_elements(), c.block_ids.data(),
                                            c.blocks,        c.block_size,       c.block_size,
                                            c.head_size,     c.probs.data(),     kChunkTokens,
                                            c.o.data()};
  args.tile = kpa::detail::TileKey{kernels.call, kTiles ? 0 : -1};
  args.probability_parts = kpa::detail::probability_parts_for<kpa::bfloat16>();
  kpa::detail::BlockPrefetcher idle;
  for (auto _ : state) {
    kernels.chunk_values(args, idle, 0, c.head_size);
    benchmark::DoNotOptimize(c.o.data());
    benchmark::ClobberMemory();
  }
  count<H, CacheT>(state, isa, c.head_size);
}

template <int H, class CacheT>
void host_qk(benchmark::State& state) { qk<H, CacheT, false>(state); }
template <int H, class CacheT>
void host_pv(benchmark::State& state) { pv<H, CacheT, false>(state); }
template <int H, class CacheT>
void tile_qk(benchmark::State& state) { qk<H, CacheT, true>(state); }
template <int H, class CacheT>
void tile_pv(benchmark::State& state) { pv<H, CacheT, true>(state); }

/// The tile loops' level where the CPU has AMX, else the best vector set, for head size 128 in
/// blocks of 32 and 128.
void tile_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"isa", "head_size", "block_size"});
  for (int block : {32, 128}) b->Args({static_cast<int>(kpa::detail::best_host_isa()), 128, block});
}

/// Every instruction set this CPU runs (the planner's choice among them: KPA_HOST_ISA), for
/// head sizes 128 and 256 in blocks of 16.
void shapes(benchmark::internal::Benchmark* b) {
  const HostIsa best = kpa::detail::best_host_isa();
  b->ArgNames({"isa", "head_size", "block_size"});
  for (HostIsa isa : {HostIsa::Portable, HostIsa::Avx2, HostIsa::Avx512, HostIsa::Avx512Vbmi}) {
    if (isa > best) continue;
    for (int d : {128, 256}) b->Args({static_cast<int>(isa), d, 16});
  }
}

// Pass sizes of multi-head attention (1: Llama 2 7B) and of the usual GQA groups: 4 (Llama 3 8B),
// 6, 8 (Llama 3 70B).
BENCHMARK_TEMPLATE(host_qk, 1, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 1, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 1, kpa::fp8_e4m3)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 1, kpa::fp8_e4m3)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 4, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 4, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 4, kpa::fp8_e4m3)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 4, kpa::fp8_e4m3)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 6, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 6, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 8, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 8, kpa::half)->Apply(shapes);
BENCHMARK_TEMPLATE(host_qk, 8, kpa::fp8_e4m3)->Apply(shapes);
BENCHMARK_TEMPLATE(host_pv, 8, kpa::fp8_e4m3)->Apply(shapes);
// Prefill passes over a bf16 cache: 16 rows (4 query tokens x a GQA group of 4), and the 32 the
// planner takes on the AMX levels.
BENCHMARK_TEMPLATE(tile_qk, 16, kpa::bfloat16)->Apply(tile_shapes);
BENCHMARK_TEMPLATE(tile_pv, 16, kpa::bfloat16)->Apply(tile_shapes);
BENCHMARK_TEMPLATE(tile_qk, 32, kpa::bfloat16)->Apply(tile_shapes);
BENCHMARK_TEMPLATE(tile_pv, 32, kpa::bfloat16)->Apply(tile_shapes);

}  // namespace
