// reshape_and_cache, copy_blocks and swap_blocks on every execution space.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <array>
#include <cstring>

namespace {

using namespace kpa_test;

template <class Space>
class CacheOps : public ::testing::Test {};
TYPED_TEST_SUITE(CacheOps, kpa_test::ExecutionSpaces);

/// The tokens of a problem as reshape_and_cache inputs: key / value [tokens][kv_heads][head_size]
/// (inside a wider buffer, so rows are strided), with a padding token (slot -1) after every
/// sequence. Values are the problem's (already rounded) ones.
template <class T, class Space>
struct TokenBatch {
  using MS = typename Space::memory_space;
  Kokkos::View<T***, Kokkos::LayoutRight, MS> fused;  // [tokens][2 * kv_heads + 1][head_size]
  Kokkos::View<T***, Kokkos::LayoutStride, MS> key, value;
  Kokkos::View<std::int64_t*, MS> slots;

  explicit TokenBatch(const HostProblem& p) {
    std::vector<std::array<int, 2>> tokens;  // (block, offset), block -1: padding
    for (int s = 0; s < p.num_seqs; ++s) {
      for (int t = 0; t < p.seq_lens[s]; ++t) {
        tokens.push_back({p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + t / p.block_size],
                          t % p.block_size});
      }
      tokens.push_back({-1, 0});
    }
    const int n = static_cast<int>(tokens.size());
    fused = decltype(fused)("fused", n, 2 * p.num_kv_heads + 1, p.head_size);
    key = Kokkos::subview(fused, Kokkos::ALL, std::pair<int, int>(0, p.num_kv_heads), Kokkos::ALL);
    value = Kokkos::subview(fused, Kokkos::ALL, std::pair<int, int>(p.num_kv_heads, 2 * p.num_kv_heads), Kokkos::ALL);
    slots = decltype(slots)("slots", n);
    auto h = Kokkos::create_mirror_view(fused);
    auto hs = Kokkos::create_mirror_view(slots);
    for (int i = 0; i < n; ++i) {
      const auto [block, offset] = tokens[i];
      hs(i) = block < 0 ? -1 : static_cast<std::int64_t>(block) * p.block_size + offset;
      for (int g = 0; g < p.num_kv_heads; ++g)
        for (int d = 0; d < p.head_size; ++d) {
          const float k = block < 0 ? 99.0f : p.keys[p.kv_index(block, g, offset, d)];
          const float v = block < 0 ? 99.0f : p.values[p.kv_index(block, g, offset, d)];
          h(i, g, d) = kpa::detail::from_float<T>(k);
          h(i, p.num_kv_heads + g, d) = kpa::detail::from_float<T>(v);
        }
    }
    Kokkos::deep_copy(fused, h);
    Kokkos::deep_copy(slots, hs);
  }
};

/// A host copy of `view` that later changes to `view` do not reach (create_mirror_view would
/// alias a host view).
template <class View>
auto snapshot(const View& view) {
  auto copy = Kokkos::create_mirror(Kokkos::HostSpace(), view);
  Kokkos::deep_copy(copy, view);
  return copy;
}

template <class View>
bool same_bytes(const View& a, const View& b) {
  const auto ha = kpa::detail::compat::host_copy(a);
  const auto hb = kpa::detail::compat::host_copy(b);
  return ha.size() == hb.size() &&
         std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(typename View::value_type)) == 0;
}

// "auto": the caches written token by token equal the caches laid out directly (bit for bit,
// unwritten slots untouched), so attention over them is identical too.
template <class Space, class T>
void check_auto_round_trip() {
  ProblemSpec spec;
  spec.seq_lens = {33, 1, 0, 100};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  spec.block_size = 16;
  spec.extra_columns = 0;
  const HostProblem p = make_problem<T>(spec);
  DeviceProblem<T, Space> direct(p);
  DeviceProblem<T, Space> written(p);
  Kokkos::deep_copy(written.key_cache, kpa::detail::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
  Kokkos::deep_copy(written.value_cache, kpa::detail::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
  TokenBatch<T, Space> tokens(p);
  kpa::reshape_and_cache(Space(), tokens.key, tokens.value, written.key_cache, written.value_cache, tokens.slots,
                         kpa::KVCacheDType::Auto);
  Space().fence();
  EXPECT_TRUE(same_bytes(direct.key_cache, written.key_cache));
  EXPECT_TRUE(same_bytes(direct.value_cache, written.value_cache));
  kpa::Workspace<Space> workspace;
  for (auto* d : {&direct, &written}) {
    kpa::paged_attention(Space(), workspace, d->out, d->query, d->key_cache, d->value_cache, d->block_tables,
                         d->seq_lens, d->max_seq_len, d->alibi, d->params);
  }
  EXPECT_TRUE(same_bytes(direct.out, written.out));
  expect_close_to_reference<T>(written.out, reference_attention(p), "attention after reshape_and_cache");
}

TYPED_TEST(CacheOps, ReshapeAndCacheAutoEqualsDirectLayout) {
  check_auto_round_trip<TypeParam, float>();
  check_auto_round_trip<TypeParam, kpa::half>();
  check_auto_round_trip<TypeParam, kpa::bfloat16>();
}

// fp8: every written code is the rounded, saturated value / scale, and attention over the
// quantised cache stays within fp8's tolerance of the float64 attention over the unquantised
// keys and values.
template <class Space>
void check_fp8_write(kpa::KVCacheDType dtype, double tolerance) {
  ProblemSpec spec;
  spec.seq_lens = {300, 77};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 128;
  spec.block_size = 16;
  const HostProblem original = make_problem<kpa::half>(spec);  // unquantised (f16) keys and values
  HostProblem quantised = original;
  quantised.kv_cache_dtype = dtype;
  quantised.k_scale = 1.0f / 200.0f;  // |k| <= 1 -> up to 200 fp8 units
  quantised.v_scale = 1.0f / 100.0f;
  DeviceProblem<kpa::half, Space, std::uint8_t> d(quantised);
  Kokkos::deep_copy(d.key_cache, std::uint8_t{0x7f});
  Kokkos::deep_copy(d.value_cache, std::uint8_t{0x7f});
  TokenBatch<kpa::half, Space> tokens(original);
  kpa::reshape_and_cache(Space(), tokens.key, tokens.value, d.key_cache, d.value_cache, tokens.slots, dtype,
                         quantised.k_scale, quantised.v_scale);
  Space().fence();
  const auto k = kpa::detail::compat::host_copy(d.key_cache);
  const auto v = kpa::detail::compat::host_copy(d.value_cache);
  for (int s = 0; s < original.num_seqs; ++s)
    for (int t = 0; t < original.seq_lens[s]; ++t) {
      const int block = original.block_tables[static_cast<std::size_t>(s) * original.max_blocks_per_seq + t / 16];
      for (int g = 0; g < 2; ++g)
        for (int dim = 0; dim < 128; ++dim) {
          const std::size_t i = original.kv_index(block, g, t % 16, dim);
          ASSERT_EQ(k(block, g, dim / 16, t % 16, dim % 16), fp8_code(dtype, original.keys[i], quantised.k_scale));
          ASSERT_EQ(v(block, g, dim, t % 16), fp8_code(dtype, original.values[i], quantised.v_scale));
        }
    }
  kpa::paged_attention_v1(Space(), d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                          d.max_seq_len, d.alibi, d.params);
  const auto out = kpa::detail::compat::host_copy(d.out);
  const auto ref = reference_attention(original);
  double max_err = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(kpa::to_float(out.data()[i]) - ref[i]));
  EXPECT_LT(max_err, tolerance) << kpa::to_string(dtype);
  EXPECT_GT(max_err, 0.0) << "quantisation left no trace: was the cache really fp8?";
}

TYPED_TEST(CacheOps, ReshapeAndCacheFp8QuantisesOnWrite) {
  check_fp8_write<TypeParam>(kpa::KVCacheDType::Fp8E4M3, 1e-2);  // vLLM's fp8 tolerance
  check_fp8_write<TypeParam>(kpa::KVCacheDType::Fp8E5M2, 2e-2);  // one mantissa bit fewer
}

TYPED_TEST(CacheOps, ReshapeAndCacheRejectsBadSlotsAndShapes) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  Kokkos::View<float***, Kokkos::LayoutRight, MS> key("k", 3, 2, 32), value("v", 3, 2, 32);
  Kokkos::View<float*****, Kokkos::LayoutRight, MS> key_cache("kc", 4, 2, 8, 16, 4);
  Kokkos::View<float****, Kokkos::LayoutRight, MS> value_cache("vc", 4, 2, 32, 16);
  Kokkos::View<std::int64_t*, MS> slots("slots", 3);
  auto host_slots = Kokkos::create_mirror_view(slots);
  host_slots(0) = 5;
  host_slots(1) = 64;  // 4 blocks x 16 slots: one past the end
  host_slots(2) = -1;
  Kokkos::deep_copy(slots, host_slots);
  try {
    kpa::reshape_and_cache(Space(), key, value, key_cache, value_cache, slots, kpa::KVCacheDType::Auto);
    ADD_FAILURE() << "accepted slot 64";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot_mapping[1] = 64 is outside the cache's 64 slots"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(kpa::reshape_and_cache(Space(), key, value, key_cache, value_cache, slots, kpa::KVCacheDType::Fp8E4M3),
               kpa::Error);
  Kokkos::View<float***, Kokkos::LayoutRight, MS> odd_key("k", 3, 2, 30), odd_value("v", 3, 2, 30);
  EXPECT_THROW(kpa::reshape_and_cache(Space(), odd_key, odd_value, key_cache, value_cache, slots, kpa::KVCacheDType::Auto),
               kpa::UnsupportedError);  // head_size 30 is not a multiple of x = 4
  Kokkos::View<std::int64_t*, MS> short_slots("slots", 2);
  EXPECT_THROW(kpa::reshape_and_cache(Space(), key, value, key_cache, value_cache, short_slots, kpa::KVCacheDType::Auto),
               kpa::Error);
}

template <class View>
void fill_iota(const View& view, float start) {
  auto h = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] = start + static_cast<float>(i);
  Kokkos::deep_copy(view, h);
}

TYPED_TEST(CacheOps, CopyBlocksInEveryLayer) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  using KeyCache = Kokkos::View<float*****, Kokkos::LayoutRight, MS>;
  using ValueCache = Kokkos::View<float****, Kokkos::LayoutRight, MS>;
  std::vector<KeyCache> keys;
  std::vector<ValueCache> values;
  for (int layer = 0; layer < 3; ++layer) {
    keys.emplace_back("k", 6, 2, 4, 8, 4);
    values.emplace_back("v", 6, 2, 16, 8);
    fill_iota(keys.back(), 1e5f * layer);
    fill_iota(values.back(), -1e5f * (layer + 1));
  }
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MS> mapping("mapping", 3, 2);
  auto m = Kokkos::create_mirror_view(mapping);
  const int pairs[3][2] = {{1, 3}, {0, 5}, {4, 2}};
  for (int i = 0; i < 3; ++i) m(i, 0) = pairs[i][0], m(i, 1) = pairs[i][1];
  Kokkos::deep_copy(mapping, m);
  std::vector<decltype(snapshot(keys[0]))> keys_before;
  std::vector<decltype(snapshot(values[0]))> values_before;
  for (int layer = 0; layer < 3; ++layer) {
    keys_before.push_back(snapshot(keys[layer]));
    values_before.push_back(snapshot(values[layer]));
  }
  kpa::copy_blocks(Space(), keys, values, mapping);
  Space().fence();
  const int source_of[6] = {0, 1, 4, 1, 4, 0};  // block -> the block its contents come from
  for (int layer = 0; layer < 3; ++layer) {
    const auto k = kpa::detail::compat::host_copy(keys[layer]);
    const auto v = kpa::detail::compat::host_copy(values[layer]);
    const std::size_t kb = k.size() / 6, vb = v.size() / 6;
    for (int b = 0; b < 6; ++b) {
      for (std::size_t e = 0; e < kb; ++e) ASSERT_EQ(k.data()[b * kb + e], keys_before[layer].data()[source_of[b] * kb + e]);
      for (std::size_t e = 0; e < vb; ++e) ASSERT_EQ(v.data()[b * vb + e], values_before[layer].data()[source_of[b] * vb + e]);
    }
  }
  m(2, 1) = 6;
  Kokkos::deep_copy(mapping, m);
  try {
    kpa::copy_blocks(Space(), keys, values, mapping);
    ADD_FAILURE() << "accepted block 6 of 6";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_mapping[2][1] = 6 is outside [0, num_blocks = 6)"), std::string::npos)
        << e.what();
  }
}

// Offload to a host cache and back: the round trip restores the blocks exactly.
TYPED_TEST(CacheOps, SwapBlocksBetweenMemorySpacesRoundTrips) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  Kokkos::View<kpa::half*****, Kokkos::LayoutRight, MS> device("device", 6, 2, 4, 16, 8);
  Kokkos::View<kpa::half*****, Kokkos::LayoutRight, Kokkos::HostSpace> host("host", 3, 2, 4, 16, 8);
  {
    auto h = Kokkos::create_mirror_view(device);
    for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] = kpa::to_half(static_cast<float>(i % 2000));
    Kokkos::deep_copy(device, h);
  }
  const auto before = snapshot(device);
  Kokkos::View<std::int64_t**, Kokkos::HostSpace> out_map("out", 2, 2), in_map("in", 2, 2);
  out_map(0, 0) = 4, out_map(0, 1) = 0, out_map(1, 0) = 1, out_map(1, 1) = 2;  // device 4 -> host 0, 1 -> 2
  in_map(0, 0) = 0, in_map(0, 1) = 1, in_map(1, 0) = 2, in_map(1, 1) = 4;      // host 0 -> device 1, 2 -> 4
  kpa::swap_blocks(Space(), device, host, out_map);
  kpa::swap_blocks(Space(), host, device, in_map);  // blocks 1 and 4 trade places
  Space().fence();
  const auto after = kpa::detail::compat::host_copy(device);
  const std::size_t block = after.size() / 6;
  const int source_of[6] = {0, 4, 2, 3, 1, 5};
  for (int b = 0; b < 6; ++b)
    for (std::size_t e = 0; e < block; ++e)
      ASSERT_EQ(after.data()[b * block + e].bits, before.data()[source_of[b] * block + e].bits) << "block " << b;
  out_map(1, 1) = 3;  // the host cache has 3 blocks
  try {
    kpa::swap_blocks(Space(), device, host, out_map);
    ADD_FAILURE() << "accepted block 3 of a 3-block destination";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_mapping[1][1] = 3 is outside [0, num_blocks = 3) of the destination cache"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
