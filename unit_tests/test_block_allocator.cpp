// kpa::BlockAllocator: appends across block boundaries, forks with copy-on-write, frees,
// exhaustion, batches; and an end-to-end decode through it on every execution space.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <limits>
#include <map>
#include <random>

#include <kpa/kpa.hpp>

namespace {

using namespace kpa_test;

std::vector<std::int64_t> range(std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> v(count);
  for (std::int64_t i = 0; i < count; ++i) v[i] = first + i;
  return v;
}

TEST(BlockAllocator, AppendsAcrossBlockBoundaries) {
  kpa::BlockAllocator allocator(8, 4);
  EXPECT_EQ(allocator.num_blocks(), 8);
  EXPECT_EQ(allocator.block_size(), 4);
  EXPECT_EQ(allocator.num_free_blocks(), 8);
  EXPECT_FALSE(allocator.has_sequence(7));
  allocator.add_sequence(7);
  auto a = allocator.append_tokens(7, 3);
  EXPECT_EQ(a.slots, range(0, 3));  // block 0
  EXPECT_TRUE(a.copies.empty());
  a = allocator.append_tokens(7, 6);  // fills block 0, all of block 1, one slot of block 2
  EXPECT_EQ(a.slots, (std::vector<std::int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(allocator.seq_len(7), 9);
  EXPECT_EQ(allocator.block_table(7), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(allocator.num_free_blocks(), 5);
  EXPECT_TRUE(allocator.append_tokens(7, 0).slots.empty());
}

TEST(BlockAllocator, ForkSharesBlocksAndCopiesASharedLastBlockOnWrite) {
  kpa::BlockAllocator allocator(8, 4);
  allocator.add_sequence(1);
  allocator.append_tokens(1, 6);  // blocks 0 (full) and 1 (2 of 4)
  allocator.fork(1, 2);
  EXPECT_EQ(allocator.block_table(2), allocator.block_table(1));
  EXPECT_EQ(allocator.ref_count(0), 2);
  EXPECT_EQ(allocator.ref_count(1), 2);
  // The child writes into the shared, partly filled block 1: it gets its own copy first.
  const auto child = allocator.append_tokens(2, 1);
  ASSERT_EQ(child.copies.size(), 1u);
  EXPECT_EQ(child.copies[0].src, 1);
  EXPECT_EQ(child.copies[0].dst, 2);
  EXPECT_EQ(child.slots, (std::vector<std::int64_t>{2 * 4 + 2}));
  EXPECT_EQ(allocator.block_table(2), (std::vector<int>{0, 2}));
  EXPECT_EQ(allocator.block_table(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(allocator.ref_count(0), 2);
  EXPECT_EQ(allocator.ref_count(1), 1);
  // The parent now owns block 1 alone: no copy.
  const auto parent = allocator.append_tokens(1, 3);
  EXPECT_TRUE(parent.copies.empty());
  EXPECT_EQ(parent.slots, (std::vector<std::int64_t>{6, 7, 3 * 4}));
  // A fork at a block boundary shares only full blocks: appending needs no copy.
  allocator.add_sequence(3);
  allocator.append_tokens(3, 4);
  allocator.fork(3, 4);
  EXPECT_TRUE(allocator.append_tokens(4, 2).copies.empty());
}

TEST(BlockAllocator, FreeReturnsBlocksOnlyWhenNoSequenceHoldsThem) {
  kpa::BlockAllocator allocator(4, 2);
  allocator.add_sequence(1);
  allocator.append_tokens(1, 4);
  allocator.fork(1, 2);
  allocator.free_sequence(1);
  EXPECT_EQ(allocator.num_free_blocks(), 2);  // sequence 2 still holds blocks 0 and 1
  EXPECT_FALSE(allocator.has_sequence(1));
  allocator.free_sequence(2);
  EXPECT_EQ(allocator.num_free_blocks(), 4);
  EXPECT_THROW(allocator.free_sequence(2), kpa::Error);
}

TEST(BlockAllocator, ExhaustionIsAnErrorThatChangesNothing) {
  kpa::BlockAllocator allocator(3, 4);
  allocator.add_sequence(1);
  allocator.append_tokens(1, 10);  // 3 blocks
  try {
    allocator.append_tokens(1, 3);
    ADD_FAILURE() << "appended past the last block";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of blocks: sequence 1 needs 1 more, 0 of 3 are free"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(allocator.seq_len(1), 10);
  EXPECT_EQ(allocator.append_tokens(1, 2).slots, (std::vector<std::int64_t>{2 * 4 + 2, 2 * 4 + 3}));
  EXPECT_THROW(allocator.add_sequence(1), kpa::Error);
  EXPECT_THROW(allocator.append_tokens(9, 1), kpa::Error);
  EXPECT_THROW(allocator.fork(9, 10), kpa::Error);
  EXPECT_THROW(allocator.ref_count(3), kpa::Error);
  EXPECT_THROW(kpa::BlockAllocator(4, 0), kpa::Error);
}

// Lengths stay ints: an append past INT_MAX tokens is an error that changes nothing (it used to
// wrap the length).
TEST(BlockAllocator, LengthsBeyondIntMaxAreRefused) {
  kpa::BlockAllocator allocator(4, 1 << 30);
  allocator.add_sequence(1);
  allocator.append_tokens(1, 1);
  try {
    allocator.append_tokens(1, std::numeric_limits<int>::max());
    ADD_FAILURE() << "appended past INT_MAX tokens";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("would hold 2147483648 tokens, more than INT_MAX"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(allocator.seq_len(1), 1);
  EXPECT_EQ(allocator.num_free_blocks(), 3);
}

template <class Space>
class BlockAllocatorOnSpace : public ::testing::Test {};
TYPED_TEST_SUITE(BlockAllocatorOnSpace, kpa_test::ExecutionSpaces);

// A decode loop through the allocator: a prompt is written, the sequence forks (prefix shared),
// both branches append tokens (copy-on-write through copy_blocks), and attention over the
// batch equals the float64 reference over each branch's own tokens.
TYPED_TEST(BlockAllocatorOnSpace, ForkedDecodeMatchesTheReference) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  constexpr int kv_heads = 2, heads = 4, head_size = 32, block_size = 8, num_blocks = 16;
  kpa::BlockAllocator allocator(num_blocks, block_size);
  Kokkos::View<float*****, Kokkos::LayoutRight, MS> key_cache("k", num_blocks, kv_heads, head_size / 4, block_size, 4);
  Kokkos::View<float****, Kokkos::LayoutRight, MS> value_cache("v", num_blocks, kv_heads, head_size, block_size);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::map<std::int64_t, std::vector<float>> keys, values;  // per sequence: [token][kv_head][dim]

  auto append = [&](std::int64_t seq, int count) {
    const auto result = allocator.append_tokens(seq, count);
    if (!result.copies.empty()) {
      Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MS> mapping("mapping", result.copies.size(), 2);
      auto m = Kokkos::create_mirror_view(mapping);
      for (std::size_t i = 0; i < result.copies.size(); ++i) m(i, 0) = result.copies[i].src, m(i, 1) = result.copies[i].dst;
      Kokkos::deep_copy(mapping, m);
      kpa::copy_blocks(Space(), std::vector{key_cache}, std::vector{value_cache}, mapping);
    }
    Kokkos::View<float***, Kokkos::LayoutRight, MS> k("k", count, kv_heads, head_size), v("v", count, kv_heads, head_size);
    Kokkos::View<std::int64_t*, MS> slots("slots", count);
    auto hk = Kokkos::create_mirror_view(k);
    auto hv = Kokkos::create_mirror_view(v);
    auto hs = Kokkos::create_mirror_view(slots);
    for (int t = 0; t < count; ++t) {
      hs(t) = result.slots[t];
      for (int g = 0; g < kv_heads; ++g)
        for (int d = 0; d < head_size; ++d) {
          hk(t, g, d) = uniform(rng);
          hv(t, g, d) = uniform(rng);
          keys[seq].push_back(hk(t, g, d));
          values[seq].push_back(hv(t, g, d));
        }
    }
    Kokkos::deep_copy(k, hk);
    Kokkos::deep_copy(v, hv);
    Kokkos::deep_copy(slots, hs);
    kpa::reshape_and_cache(Space(), k, v, key_cache, value_cache, slots, kpa::KVCacheDType::Auto);
  };

  allocator.add_sequence(10);
  append(10, 13);  // a prompt of one full and one partly filled block
  allocator.fork(10, 11);
  keys[11] = keys[10];
  values[11] = values[10];
  append(11, 6);  // copy-on-write of the shared block, then a new block
  append(10, 1);
  append(10, 4);

  const std::vector<std::int64_t> batch = {10, 11};
  Kokkos::View<int**, Kokkos::LayoutRight, MS> block_tables("bt", 2, 4);
  Kokkos::View<int*, MS> seq_lens("lens", 2);
  const int max_seq_len = allocator.fill_batch(batch, block_tables, seq_lens);
  EXPECT_EQ(max_seq_len, 19);
  Kokkos::View<int**, Kokkos::LayoutRight, MS> narrow("bt", 2, 2);
  EXPECT_THROW(allocator.fill_batch(batch, narrow, seq_lens), kpa::Error);

  // The reference reads each branch's own tokens through a one-block-per-token table.
  HostProblem p;
  p.num_seqs = 2;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_size = head_size;
  p.block_size = 1;
  p.scale = 0.25f;
  p.max_blocks_per_seq = max_seq_len;
  p.block_tables.assign(2 * max_seq_len, 0);
  int next = 0;
  for (int s = 0; s < 2; ++s) {
    const auto& k = keys[batch[s]];
    const int len = static_cast<int>(k.size() / (kv_heads * head_size));
    p.seq_lens.push_back(len);
    for (int t = 0; t < len; ++t) {
      p.block_tables[s * max_seq_len + t] = next++;
      for (int g = 0; g < kv_heads; ++g)
        for (int d = 0; d < head_size; ++d) {
          p.keys.push_back(k[(t * kv_heads + g) * head_size + d]);
          p.values.push_back(values[batch[s]][(t * kv_heads + g) * head_size + d]);
        }
    }
  }
  p.num_blocks = next;
  Kokkos::View<float***, Kokkos::LayoutRight, MS> query("q", 2, heads, head_size), out("out", 2, heads, head_size);
  auto hq = Kokkos::create_mirror_view(query);
  for (std::size_t i = 0; i < hq.size(); ++i) {
    hq.data()[i] = uniform(rng);
    p.query.push_back(hq.data()[i]);
  }
  Kokkos::deep_copy(query, hq);
  kpa::AttentionParams params;
  params.scale = p.scale;
  Kokkos::View<float*, MS> no_alibi("alibi", 0);
  kpa::paged_attention_v1(Space(), out, query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, no_alibi,
                          params);
  expect_close_to_reference<float>(out, reference_attention(p), "decode through the allocator");
}

}  // namespace
