// A cache of more than 2^31 elements: an fp8 cache of 2.25 GB a side, whose sequences live in
// blocks past element 2^31, attended through v1, v2 and auto on every kernel path and written by
// reshape_and_cache. Every index into the caches must be 64-bit for this to hold.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <cstdint>

namespace {

using namespace kpa_test;

template <class Space>
class LargeCache : public ::testing::Test {};
TYPED_TEST_SUITE(LargeCache, kpa_test::ExecutionSpaces);

TYPED_TEST(LargeCache, BlocksPastElementTwoToTheThirtyOne) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  ProblemSpec spec;
  spec.seq_lens = {300, 1, 129};
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_size = 128;
  spec.block_size = 16;
  spec.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
  spec.k_scale = 0.05f;
  spec.v_scale = 0.01f;
  HostProblem p = make_problem<kpa::half>(spec);
  DeviceProblem<kpa::half, Space, std::uint8_t> d(p);

  // 2^31 elements hold 2^20 blocks of 16 x 128 bytes; the problem's blocks go past them.
  const std::int64_t block_elems = 16 * 128;
  const std::int64_t first_far = (std::int64_t{1} << 31) / block_elems + 5;
  const std::int64_t num_blocks = first_far + p.num_blocks;
  ASSERT_GT(num_blocks * block_elems, std::int64_t{1} << 31);
  Kokkos::View<std::uint8_t*****, Kokkos::LayoutRight, MS> key_cache(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "large_key_cache"), num_blocks, 1, 128 / 16, 16, 16);
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, MS> value_cache(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "large_value_cache"), num_blocks, 1, 128, 16);
  for (int b = 0; b < p.num_blocks; ++b) {
    Kokkos::deep_copy(kpa::detail::cache_block(key_cache, first_far + b), kpa::detail::cache_block(d.key_cache, b));
    Kokkos::deep_copy(kpa::detail::cache_block(value_cache, first_far + b), kpa::detail::cache_block(d.value_cache, b));
  }
  auto tables = Kokkos::create_mirror_view(d.block_tables);
  Kokkos::deep_copy(tables, d.block_tables);
  for (int s = 0; s < p.num_seqs; ++s)
    for (int c = 0; c < p.max_blocks_per_seq; ++c) {
      if (tables(s, c) >= 0) tables(s, c) = static_cast<int>(first_far + tables(s, c));
    }
  Kokkos::deep_copy(d.block_tables, tables);
  d.key_cache = key_cache;
  d.value_cache = value_cache;
  check_versions(d, p, 64);  // the reference reads the small problem: same values, small block ids

  // reshape_and_cache into the last block of the cache, the furthest element.
  Kokkos::View<kpa::half***, Kokkos::LayoutRight, MS> key("key", 1, 1, 128), value("value", 1, 1, 128);
  Kokkos::deep_copy(key, kpa::to_half(0.5f));
  Kokkos::deep_copy(value, kpa::to_half(-0.25f));
  Kokkos::View<std::int64_t*, MS> slot("slot", 1);
  Kokkos::deep_copy(slot, num_blocks * 16 - 1);
  kpa::reshape_and_cache(Space(), key, value, key_cache, value_cache, slot, kpa::KVCacheDType::Fp8E4M3, 0.05f,
                         0.01f);
  Space().fence();
  const auto last_key = kpa::detail::compat::host_copy(kpa::detail::cache_block(key_cache, num_blocks - 1));
  const auto last_value = kpa::detail::compat::host_copy(kpa::detail::cache_block(value_cache, num_blocks - 1));
  EXPECT_EQ(last_key(0, 7, 15, 15), kpa::to_fp8_e4m3(0.5f / 0.05f).bits);
  EXPECT_EQ(last_value(0, 127, 15), kpa::to_fp8_e4m3(-0.25f / 0.01f).bits);
}

}  // namespace
