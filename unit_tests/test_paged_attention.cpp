// paged_attention_v1 / v2 / automatic against the float64 reference on every execution space.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <atomic>
#include <chrono>
#include <thread>

namespace {

using namespace kpa_test;

template <class Space>
class PagedAttention : public ::testing::Test {};
TYPED_TEST_SUITE(PagedAttention, kpa_test::ExecutionSpaces);

template <class Space, class T>
void sweep_head_and_block_sizes() {
  const int device_runs_before = device_path_runs();
  for (int head_size : {32, 64, 80, 96, 112, 120, 128, 192, 256}) {
    for (int block_size : {8, 16, 32}) {
      ProblemSpec spec;
      const int B = block_size;
      spec.seq_lens = {0, 1, B - 1, B, B + 1, 5 * B + 3};
      spec.head_size = head_size;
      spec.block_size = B;
      spec.num_heads = 4;
      spec.num_kv_heads = 2;
      spec.seed = head_size * 100 + block_size;
      SCOPED_TRACE(std::string(dtype_name<T>()) + " head_size " + std::to_string(head_size) + " block_size " +
                   std::to_string(B));
      check_attention<T, Space>(spec, 2 * B);  // v2 and auto: several partitions per sequence
    }
  }
  // Host back ends with the device path run every one of the 27 shapes on it.
  if (kpa::BackEndLimits::of(Space()).device_path) {
    EXPECT_GE(device_path_runs() - device_runs_before, 27) << "shapes run by the device path";
  }
}

TYPED_TEST(PagedAttention, EveryHeadAndBlockSizeF32) { sweep_head_and_block_sizes<TypeParam, float>(); }
TYPED_TEST(PagedAttention, EveryHeadAndBlockSizeF16) { sweep_head_and_block_sizes<TypeParam, kpa::half>(); }
TYPED_TEST(PagedAttention, EveryHeadAndBlockSizeBF16) { sweep_head_and_block_sizes<TypeParam, kpa::bfloat16>(); }

// Sequence lengths around vLLM's default partition of 512 tokens, and several partitions.
TYPED_TEST(PagedAttention, PartitionBoundariesDefaultPartitionSize) {
  ProblemSpec spec;
  spec.seq_lens = {511, 512, 513, 3 * 512 + 5, 1, 0};
  spec.head_size = 128;
  spec.block_size = 16;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  check_attention<float, TypeParam>(spec, 512);
  check_attention<kpa::half, TypeParam>(spec, 512);
  check_attention<kpa::bfloat16, TypeParam>(spec, 512, {}, /*auto_partition=*/false);
}

TYPED_TEST(PagedAttention, GqaAndMqaRatios) {
  // (num_heads, num_kv_heads): MHA, GQA 2 to 6, MQA, and groups larger than one pass (12 > 8).
  for (auto [heads, kv_heads] :
       {std::pair{4, 4}, {8, 4}, {6, 2}, {32, 8}, {10, 2}, {12, 2}, {8, 1}, {12, 1}, {24, 2}}) {
    ProblemSpec spec;
    spec.seq_lens = {37, 300, 129};
    spec.num_heads = heads;
    spec.num_kv_heads = kv_heads;
    spec.head_size = 64;
    spec.block_size = 16;
    SCOPED_TRACE(std::to_string(heads) + "/" + std::to_string(kv_heads) + " heads");
    check_attention<float, TypeParam>(spec, 128);
    check_attention<kpa::half, TypeParam>(spec, 64);
  }
}

TYPED_TEST(PagedAttention, Alibi) {
  ProblemSpec spec;
  spec.seq_lens = {1, 100, 700, 0};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 80;
  spec.block_size = 16;
  spec.alibi = true;
  check_attention<float, TypeParam>(spec, 256);
  check_attention<kpa::bfloat16, TypeParam>(spec, 512);
}

TYPED_TEST(PagedAttention, SequentialPermutedAndSharedBlockTables) {
  for (TableKind kind : {TableKind::Sequential, TableKind::Permuted, TableKind::Shared}) {
    ProblemSpec spec;
    spec.seq_lens = {200, 203, 64, 250};
    spec.tables = kind;
    spec.block_size = 8;
    spec.extra_columns = 4;
    SCOPED_TRACE(static_cast<int>(kind));
    check_attention<float, TypeParam>(spec, 64);
  }
}

// One sequence longer than 100K tokens (and a short one beside it), in one and in many partitions.
TYPED_TEST(PagedAttention, LongerThan100KTokens) {
  ProblemSpec spec;
  spec.seq_lens = {100003, 5};
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_size = 64;
  spec.block_size = 32;
  check_attention<float, TypeParam>(spec, 512, {}, /*auto_partition=*/false);
}

// head_size 256 with more than one thread per team: the team reduction and scratch sharing must
// hold (Kokkos 3.4's host team-reduce buffer overflows with large reduction values).
TYPED_TEST(PagedAttention, TeamSizesAboveOne) {
  using Space = TypeParam;
  const int max_team = static_cast<int>(Space().concurrency());
  if (max_team < 2) GTEST_SKIP() << Space::name() << " runs one thread per team";
  ProblemSpec spec;
  spec.seq_lens = {1000, 17, 0, 333};
  spec.num_heads = 16;
  spec.num_kv_heads = 2;  // 8 rows per pass
  spec.head_size = 256;
  spec.block_size = 16;
  for (int team_size = 2; team_size <= std::min(max_team, 4); ++team_size) {
    kpa::PlanOptions options;
    options.team_size = team_size;
    options.league_size = 3;
    SCOPED_TRACE("team_size " + std::to_string(team_size));
    check_attention<float, Space>(spec, 256, options);
    check_attention<kpa::half, Space>(spec, 128, options);
  }
}

TYPED_TEST(PagedAttention, LeagueSmallerThanTiles) {
  ProblemSpec spec;
  spec.seq_lens = {90, 1, 260, 33, 0, 128};
  spec.num_heads = 6;
  spec.num_kv_heads = 3;
  spec.head_size = 32;
  spec.block_size = 8;
  for (int league : {1, 2, 5}) {
    kpa::PlanOptions options;
    options.league_size = league;
    check_attention<float, TypeParam>(spec, 32, options);
  }
}

// q may be a slice of a fused qkv buffer: a row stride other than num_heads * head_size.
TYPED_TEST(PagedAttention, StridedQueryFromFusedQkv) {
  using Space = TypeParam;
  ProblemSpec spec;
  spec.seq_lens = {70, 3, 129};
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  const HostProblem p = make_problem<kpa::half>(spec);
  DeviceProblem<kpa::half, Space> d(p);
  const int qkv_heads = spec.num_heads + 2 * spec.num_kv_heads;
  Kokkos::View<kpa::half***, Kokkos::LayoutRight, typename Space::memory_space> qkv("qkv", p.num_seqs, qkv_heads,
                                                                                    p.head_size);
  Kokkos::deep_copy(qkv, kpa::to_half(std::numeric_limits<float>::quiet_NaN()));
  auto q_part = Kokkos::subview(qkv, Kokkos::ALL, std::pair<int, int>(0, spec.num_heads), Kokkos::ALL);
  Kokkos::deep_copy(q_part, d.query);
  Kokkos::View<const kpa::half***, Kokkos::LayoutStride, typename Space::memory_space> query = q_part;
  ASSERT_EQ(query.stride(0), static_cast<std::size_t>(qkv_heads * p.head_size));
  const auto ref = reference_attention(p);
  kpa::Workspace<Space> workspace;
  kpa::paged_attention_v1(Space(), d.out, query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                          d.max_seq_len, d.alibi, d.params);
  expect_close_to_reference<kpa::half>(d.out, ref, "v1 strided query");
  Partials<float, Space> partials(p, 64);  // f32 tmp_out with an f16 query
  kpa::paged_attention_v2(Space(), d.out, partials.exp_sums, partials.max_logits, partials.tmp_out, query,
                          d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.max_seq_len, d.alibi, d.params,
                          64);
  expect_close_to_reference<kpa::half>(d.out, ref, "v2 strided query, f32 tmp_out");
  kpa::paged_attention(Space(), workspace, d.out, query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                       d.max_seq_len, d.alibi, d.params);
  expect_close_to_reference<kpa::half>(d.out, ref, "auto strided query");
}

// Repeated calls give bitwise-identical results, and the workspace allocates once for a shape
// and never again for the same or smaller shapes.
TYPED_TEST(PagedAttention, RepeatedCallsAreBitwiseIdenticalAndReuseTheWorkspace) {
  using Space = TypeParam;
  ProblemSpec spec;
  spec.seq_lens = {1500, 700, 2};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  const HostProblem p = make_problem<float>(spec);
  DeviceProblem<float, Space> d(p);
  kpa::Workspace<Space> workspace;
  kpa::PlanOptions options;
  options.partition_size = 256;
  std::vector<float> first;
  for (int call = 0; call < 3; ++call) {
    kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                         d.max_seq_len, d.alibi, d.params, options);
    const auto host = kpa::detail::compat::host_copy(d.out);
    std::vector<float> now(host.data(), host.data() + host.size());
    if (call == 0) {
      first = now;
      EXPECT_FALSE(workspace.last_plan().single_partition);
    } else {
      EXPECT_EQ(std::memcmp(first.data(), now.data(), now.size() * sizeof(float)), 0) << "call " << call;
    }
  }
  EXPECT_EQ(workspace.allocations(), 1);
  const std::size_t capacity = workspace.capacity_bytes();
  // A smaller batch reuses the memory.
  auto fewer = Kokkos::subview(d.seq_lens, std::pair<int, int>(1, 3));
  auto fewer_tables = Kokkos::subview(d.block_tables, std::pair<int, int>(1, 3), Kokkos::ALL);
  auto fewer_query = Kokkos::subview(d.query, std::pair<int, int>(1, 3), Kokkos::ALL, Kokkos::ALL);
  Kokkos::View<float***, Kokkos::LayoutRight, typename Space::memory_space> fewer_out("out", 2, p.num_heads,
                                                                                      p.head_size);
  kpa::paged_attention(Space(), workspace, fewer_out, fewer_query, d.key_cache, d.value_cache, fewer_tables, fewer,
                       700, d.alibi, d.params, options);
  EXPECT_EQ(workspace.allocations(), 1);
  EXPECT_EQ(workspace.capacity_bytes(), capacity);
  Kokkos::fence();
  const auto all_out = kpa::detail::compat::host_copy(d.out);
  const auto some_out = kpa::detail::compat::host_copy(fewer_out);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < p.num_heads; ++h)
      for (int dim = 0; dim < p.head_size; ++dim) ASSERT_EQ(some_out(s, h, dim), all_out(s + 1, h, dim));
}

// Threads sharing a workspace take turns: a second holder waits until the first lets go.
TYPED_TEST(PagedAttention, WorkspaceHoldersTakeTurns) {
  using Space = TypeParam;
  kpa::Workspace<Space> workspace;
  std::atomic<bool> waiting{false}, released{false}, second_saw_release{false};
  {
    auto held = workspace.acquire(Space());
    std::thread second([&] {
      waiting = true;
      auto mine = workspace.acquire(Space());
      second_saw_release = released.load();
    });
    while (!waiting) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the second is blocked in acquire
    released = true;
    held.unlock();
    second.join();
  }
  EXPECT_TRUE(second_saw_release);
}

TYPED_TEST(PagedAttention, EmptyBatchIsANoOp) {
  using Space = TypeParam;
  ProblemSpec spec;
  spec.seq_lens = {};
  const HostProblem p = make_problem<float>(spec);
  DeviceProblem<float, Space> d(p);
  kpa::Workspace<Space> workspace;
  EXPECT_NO_THROW(kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache,
                                       d.block_tables, d.seq_lens, 0, d.alibi, d.params));
  EXPECT_NO_THROW(kpa::paged_attention_v1(Space(), d.out, d.query, d.key_cache, d.value_cache, d.block_tables,
                                          d.seq_lens, 0, d.alibi, d.params));
}

}  // namespace
