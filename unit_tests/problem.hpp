#pragma once
// Random decode batches for the tests: generated on the host, rounded to the storage type,
// uploaded into vLLM's cache layout on the execution space under test.

#include "reference.hpp"

#include <kpa/kpa.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace kpa_test {

enum class TableKind {
  Sequential,  ///< sequence s owns blocks in order
  Permuted,    ///< blocks shuffled across the whole cache
  Shared,      ///< every sequence after the first shares the first sequence's leading blocks
};

struct ProblemSpec {
  std::vector<int> seq_lens;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_size = 64;
  int block_size = 16;
  TableKind tables = TableKind::Permuted;
  bool alibi = false;
  int extra_columns = 1;  ///< block-table columns beyond the longest sequence (filled with garbage)
  std::uint64_t seed = 1;
  kpa::KVCacheDType kv_cache_dtype = kpa::KVCacheDType::Auto;
  float k_scale = 1.0f, v_scale = 1.0f;
  kpa::BlockSparse sparse;  ///< blocks no head of a kv group attends are filled with NaN
  int tp_rank = 0;
  // Variants.
  std::vector<int> query_lens;  ///< query tokens per sequence (query_start_loc); empty: decode
  float soft_cap = 0.0f;
  int window = 0;
  bool sinks = false;  ///< a random sink logit per head
  std::optional<float> scale;  ///< the attention scale; none: 1 / sqrt(head_size)
};

template <class T>
float round_to(float v) {
  return kpa::to_float(kpa::detail::from_float<T>(v));
}

/// The one-byte code of v in an fp8 cache of the given format and scale.
inline std::uint8_t fp8_code(kpa::KVCacheDType dtype, float v, float scale) {
  return dtype == kpa::KVCacheDType::Fp8E5M2 ? kpa::to_fp8_e5m2(v / scale).bits : kpa::to_fp8_e4m3(v / scale).bits;
}

/// The value an fp8 code stands for (dequantised with its scale).
inline float fp8_value(kpa::KVCacheDType dtype, std::uint8_t code, float scale) {
  return (dtype == kpa::KVCacheDType::Fp8E5M2 ? kpa::to_float(kpa::fp8_e5m2{code}) : kpa::to_float(kpa::fp8_e4m3{code})) *
         scale;
}

/// v as the cache stores it: rounded to T for "auto", quantised and dequantised for fp8.
template <class T>
float round_to_cache(const ProblemSpec& spec, float v, float scale) {
  if (spec.kv_cache_dtype == kpa::KVCacheDType::Auto) return round_to<T>(v);
  return fp8_value(spec.kv_cache_dtype, fp8_code(spec.kv_cache_dtype, v, scale), scale);
}

/// Builds the host problem; values are already rounded to T.
template <class T>
HostProblem make_problem(const ProblemSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  HostProblem p;
  p.num_seqs = static_cast<int>(spec.seq_lens.size());
  p.num_heads = spec.num_heads;
  p.num_kv_heads = spec.num_kv_heads;
  p.head_size = spec.head_size;
  p.block_size = spec.block_size;
  p.scale = spec.scale.value_or(1.0f / std::sqrt(static_cast<float>(spec.head_size)));
  p.seq_lens = spec.seq_lens;
  int max_blocks = 0;
  int total_blocks = 0;
  for (int len : spec.seq_lens) {
    const int blocks = (len + spec.block_size - 1) / spec.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
  }
  p.max_blocks_per_seq = max_blocks + spec.extra_columns;
  p.num_blocks = total_blocks + 3;  // a few blocks no sequence uses
  std::vector<int> order(p.num_blocks);
  std::iota(order.begin(), order.end(), 0);
  if (spec.tables != TableKind::Sequential) std::shuffle(order.begin(), order.end(), rng);
  // Garbage in unread columns: the kernels must never follow them.
  p.block_tables.assign(static_cast<std::size_t>(p.num_seqs) * p.max_blocks_per_seq, -12345);
  int next = 0;
  const int shared_blocks = p.num_seqs > 0 ? (spec.seq_lens[0] / spec.block_size) : 0;  // whole blocks only
  for (int s = 0; s < p.num_seqs; ++s) {
    const int blocks = (spec.seq_lens[s] + spec.block_size - 1) / spec.block_size;
    for (int b = 0; b < blocks; ++b) {
      const bool share = spec.tables == TableKind::Shared && s > 0 && b < shared_blocks &&
                         (b + 1) * spec.block_size <= spec.seq_lens[s];
      p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + b] =
          share ? p.block_tables[b] : order[next++];
    }
  }
  const std::size_t kv_elems = static_cast<std::size_t>(p.num_blocks) * p.num_kv_heads * p.block_size * p.head_size;
  // Slots no sequence reads hold NaN: they must never influence a result.
  p.keys.assign(kv_elems, std::numeric_limits<float>::quiet_NaN());
  p.values.assign(kv_elems, std::numeric_limits<float>::quiet_NaN());
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int t = 0; t < spec.seq_lens[s]; ++t) {
      const int block = p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + t / spec.block_size];
      for (int g = 0; g < p.num_kv_heads; ++g) {
        for (int d = 0; d < p.head_size; ++d) {
          const std::size_t i = p.kv_index(block, g, t % spec.block_size, d);
          if (std::isnan(p.keys[i])) {  // shared blocks keep the owner's values
            p.keys[i] = round_to_cache<T>(spec, uniform(rng), spec.k_scale);
            p.values[i] = round_to_cache<T>(spec, uniform(rng), spec.v_scale);
          }
        }
      }
    }
  }
  if (!spec.query_lens.empty()) {
    p.query_start_loc.assign(1, 0);
    for (int n : spec.query_lens) p.query_start_loc.push_back(p.query_start_loc.back() + n);
  }
  p.soft_cap = spec.soft_cap;
  p.window = spec.window;
  p.query.resize(static_cast<std::size_t>(p.num_tokens()) * p.num_heads * p.head_size);
  for (float& q : p.query) q = round_to<T>(uniform(rng));
  if (spec.alibi) {
    p.alibi.resize(p.num_heads);
    for (int h = 0; h < p.num_heads; ++h) p.alibi[h] = std::exp2(-8.0f * (h + 1) / p.num_heads);
  }
  if (spec.sinks) {
    std::uniform_real_distribution<float> sink(-1.0f, 2.0f);
    p.sinks.resize(p.num_heads);
    for (float& v : p.sinks) v = sink(rng);
  }
  p.kv_cache_dtype = spec.kv_cache_dtype;
  p.k_scale = spec.k_scale;
  p.v_scale = spec.v_scale;
  p.sparse = spec.sparse;
  p.tp_rank = spec.tp_rank;
  // Blocks that no query head of a kv group attends must not be read: make them NaN.
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int t = 0; t < spec.seq_lens[s]; t += spec.block_size) {
      const int block = p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + t / spec.block_size];
      for (int g = 0; g < p.num_kv_heads; ++g) {
        const int group = p.num_heads / p.num_kv_heads;
        bool read = false;
        for (int i = 0; i < p.query_len(s); ++i) {
          const int position = p.seq_lens[s] - p.query_len(s) + i;
          for (int h = g * group; h < (g + 1) * group; ++h)
            for (int o = 0; o < p.block_size && t + o < p.seq_lens[s]; ++o) read = read || p.attends_at(s, h, t + o, position);
        }
        if (read) continue;
        for (int o = 0; o < p.block_size; ++o)
          for (int d = 0; d < p.head_size; ++d) {
            p.keys[p.kv_index(block, g, o, d)] = std::numeric_limits<float>::quiet_NaN();
            p.values[p.kv_index(block, g, o, d)] = std::numeric_limits<float>::quiet_NaN();
          }
      }
    }
  }
  return p;
}

/// values into a rank-1 view of Space.
template <class View, class V>
void upload(const View& view, const std::vector<V>& values) {
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < values.size(); ++i) host(i) = values[i];
  Kokkos::deep_copy(view, host);
}

/// The problem's views on Space, in the layouts of the kpa/vLLM contract. C is the cache
/// element: T for "auto" caches, std::uint8_t for fp8 caches.
template <class T, class Space, class C = T>
struct DeviceProblem {
  using memory_space = typename Space::memory_space;
  Kokkos::View<T***, Kokkos::LayoutRight, memory_space> query;
  Kokkos::View<T***, Kokkos::LayoutRight, memory_space> out;
  Kokkos::View<C*****, Kokkos::LayoutRight, memory_space> key_cache;
  Kokkos::View<C****, Kokkos::LayoutRight, memory_space> value_cache;
  Kokkos::View<int**, Kokkos::LayoutRight, memory_space> block_tables;
  Kokkos::View<int*, memory_space> seq_lens;
  Kokkos::View<float*, memory_space> alibi;
  Kokkos::View<int*, memory_space> query_start_loc;  // extent 0: decode
  Kokkos::View<float*, memory_space> sinks;          // extent 0: none
  Kokkos::View<float**, Kokkos::LayoutRight, memory_space> lse;
  int max_seq_len = 0;
  kpa::AttentionParams params;

  /// The automatic entry point's extras for this problem (lse always asked for).
  kpa::AttentionExtras<Space> extras() const {
    kpa::AttentionExtras<Space> e;
    if (query_start_loc.extent(0) > 0) e.query_start_loc = query_start_loc;
    if (sinks.extent(0) > 0) e.sinks = sinks;
    e.lse = lse;
    return e;
  }

  explicit DeviceProblem(const HostProblem& p)
      : query("query", p.num_tokens(), p.num_heads, p.head_size),
        out("out", p.num_tokens(), p.num_heads, p.head_size),
        key_cache("key_cache", p.num_blocks, p.num_kv_heads, p.head_size / (16 / sizeof(C)), p.block_size,
                  16 / sizeof(C)),
        value_cache("value_cache", p.num_blocks, p.num_kv_heads, p.head_size, p.block_size),
        block_tables("block_tables", p.num_seqs, p.max_blocks_per_seq),
        seq_lens("seq_lens", p.num_seqs),
        alibi("alibi", p.alibi.size()),
        query_start_loc("query_start_loc", p.query_start_loc.size()),
        sinks("sinks", p.sinks.size()),
        lse("lse", p.num_tokens(), p.num_heads),
        max_seq_len(p.max_seq_len()) {
    params.logits_soft_cap = p.soft_cap;
    params.sliding_window = p.window;
    upload(query_start_loc, p.query_start_loc);
    upload(sinks, p.sinks);
    params.scale = p.scale;
    params.kv_cache_dtype = p.kv_cache_dtype;
    params.k_scale = p.k_scale;
    params.v_scale = p.v_scale;
    params.block_sparse = p.sparse;
    params.tp_rank = p.tp_rank;
    const int x = static_cast<int>(16 / sizeof(C));
    const auto to_cache = [&](float v, float scale) {
      if constexpr (std::is_same_v<C, std::uint8_t>) {
        // NaN (unread slots) stays NaN; stored values are exactly representable by construction.
        return std::isnan(v) ? std::uint8_t{0x7f} : fp8_code(p.kv_cache_dtype, v, scale);
      } else {
        return kpa::detail::from_float<T>(v);
      }
    };
    auto q = Kokkos::create_mirror_view(query);
    for (int s = 0; s < p.num_tokens(); ++s)
      for (int h = 0; h < p.num_heads; ++h)
        for (int d = 0; d < p.head_size; ++d)
          q(s, h, d) = kpa::detail::from_float<T>(p.query[(static_cast<std::size_t>(s) * p.num_heads + h) * p.head_size + d]);
    Kokkos::deep_copy(query, q);
    auto k = Kokkos::create_mirror_view(key_cache);
    auto v = Kokkos::create_mirror_view(value_cache);
    for (int b = 0; b < p.num_blocks; ++b)
      for (int g = 0; g < p.num_kv_heads; ++g)
        for (int o = 0; o < p.block_size; ++o)
          for (int d = 0; d < p.head_size; ++d) {
            k(b, g, d / x, o, d % x) = to_cache(p.keys[p.kv_index(b, g, o, d)], p.k_scale);
            v(b, g, d, o) = to_cache(p.values[p.kv_index(b, g, o, d)], p.v_scale);
          }
    Kokkos::deep_copy(key_cache, k);
    Kokkos::deep_copy(value_cache, v);
    auto bt = Kokkos::create_mirror_view(block_tables);
    for (int s = 0; s < p.num_seqs; ++s)
      for (int b = 0; b < p.max_blocks_per_seq; ++b) bt(s, b) = p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + b];
    Kokkos::deep_copy(block_tables, bt);
    auto sl = Kokkos::create_mirror_view(seq_lens);
    for (int s = 0; s < p.num_seqs; ++s) sl(s) = p.seq_lens[s];
    Kokkos::deep_copy(seq_lens, sl);
    auto al = Kokkos::create_mirror_view(alibi);
    for (std::size_t h = 0; h < p.alibi.size(); ++h) al(h) = p.alibi[h];
    Kokkos::deep_copy(alibi, al);
    // out starts as NaN so an unwritten output cannot pass.
    auto o = Kokkos::create_mirror_view(out);
    Kokkos::deep_copy(o, kpa::detail::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
    Kokkos::deep_copy(out, o);
  }
};

/// Tolerance of an output of storage type T against the float64 reference:
/// |got - ref| <= atol + rtol * |ref|.
template <class T>
struct Tolerance;
/// f32: accumulation error only (vLLM's own tests use atol 1e-3, rtol 1e-5).
template <>
struct Tolerance<float> {
  static constexpr double atol = 1e-5, rtol = 1e-5;
};
/// f16: up to two roundings to binary16 (tmp_out, then out) of values in [-1, 1], 2^-11 each.
template <>
struct Tolerance<kpa::half> {
  static constexpr double atol = 1e-3, rtol = 1e-5;
};
/// bf16: up to two roundings to bfloat16 of values in [-1, 1], 2^-8 each.
template <>
struct Tolerance<kpa::bfloat16> {
  static constexpr double atol = 8e-3, rtol = 1e-5;
};

template <class T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, kpa::half>) return "f16";
  return "bf16";
}

/// Compares a [num_seqs][num_heads][head_size] view with the reference; returns the max error.
/// Where the reference is NaN (corrupt cache data that is attended), the output must be NaN too.
template <class T, class View>
double expect_close_to_reference(const View& out, const std::vector<double>& ref, const std::string& what) {
  const auto host = kpa::detail::compat::host_copy(out);
  const T* data = host.data();
  double max_err = 0.0;
  int reported = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double got = kpa::to_float(data[i]);
    if (std::isnan(ref[i])) {
      if (!std::isnan(got) && reported++ < 5) {
        ADD_FAILURE() << what << " (" << dtype_name<T>() << "): element " << i << " got " << got
                      << ", reference NaN";
      }
      continue;
    }
    if (std::isinf(ref[i])) {  // an LSE of nothing attended: exactly -inf
      if (got != ref[i] && reported++ < 5) {
        ADD_FAILURE() << what << " (" << dtype_name<T>() << "): element " << i << " got " << got << ", reference "
                      << ref[i];
      }
      continue;
    }
    const double err = std::fabs(got - ref[i]);
    max_err = std::isnan(err) ? err : std::max(max_err, err);
    // NaN where the reference is finite is reported, not compared (the test main traps FE_INVALID).
    if ((std::isnan(err) || !(err <= Tolerance<T>::atol + Tolerance<T>::rtol * std::fabs(ref[i]))) && reported++ < 5) {
      ADD_FAILURE() << what << " (" << dtype_name<T>() << "): element " << i << " got " << got << ", reference "
                    << ref[i] << ", error " << err;
    }
  }
  return max_err;
}

}  // namespace kpa_test
