// What a call launches, recorded through Kokkos Tools callbacks: with the index check off
// (params.check_indices, or the last argument of the cache operations) a call is its kernels and
// nothing else (no index check, no copy between memory spaces, so on a GPU nothing waits for the
// device and the call can be captured in a CUDA graph); with it on, exactly one index-check
// reduction comes first.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace kpa_test;

std::vector<std::string> events;

void on_parallel_for(const char* name, std::uint32_t, std::uint64_t*) { events.push_back(std::string("for ") + name); }
void on_parallel_reduce(const char* name, std::uint32_t, std::uint64_t*) {
  events.push_back(std::string("reduce ") + name);
}
void on_deep_copy(Kokkos_Profiling_SpaceHandle, const char* dst, const void*, Kokkos_Profiling_SpaceHandle,
                  const char* src, const void*, std::uint64_t) {
  events.push_back(std::string("copy ") + src + " -> " + dst);
}

/// The kernels and copies `call` makes.
template <class Call>
std::vector<std::string> record(Call&& call) {
  events.clear();
  Kokkos::fence();
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(&on_parallel_for);
  Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(&on_parallel_reduce);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(&on_deep_copy);
  call();
  Kokkos::fence();
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  return events;
}

using Events = std::vector<std::string>;

template <class Space>
class CallStructure : public ::testing::Test {};
TYPED_TEST_SUITE(CallStructure, kpa_test::ExecutionSpaces);

TYPED_TEST(CallStructure, UncheckedCallsLaunchTheirKernelsOnly) {
  using Space = TypeParam;
  ProblemSpec spec;
  spec.seq_lens = {700, 5, 1300};
  const HostProblem p = make_problem<kpa::half>(spec);
  DeviceProblem<kpa::half, Space> d(p);
  Partials<kpa::half, Space> partials(p, 256);
  kpa::Workspace<Space> workspace;
  kpa::PlanOptions split;
  split.partition_size = 256;
  auto checked = d.params;
  auto unchecked = d.params;
  unchecked.check_indices = false;
  const auto v1 = [&](const kpa::AttentionParams& params) {
    kpa::paged_attention_v1(Space(), d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                            d.max_seq_len, d.alibi, params);
  };
  const auto v2 = [&](const kpa::AttentionParams& params) {
    kpa::paged_attention_v2(Space(), d.out, partials.exp_sums, partials.max_logits, partials.tmp_out, d.query,
                            d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.max_seq_len, d.alibi, params,
                            256);
  };
  const auto automatic = [&](const kpa::AttentionParams& params, const kpa::PlanOptions& options) {
    kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                         d.max_seq_len, d.alibi, params, options);
  };
  EXPECT_EQ(record([&] { v1(unchecked); }), Events{"for kpa::paged_attention_v1"});
  EXPECT_EQ(record([&] { v1(checked); }), (Events{"reduce kpa::check_indices", "for kpa::paged_attention_v1"}));
  EXPECT_EQ(record([&] { v2(unchecked); }),
            (Events{"for kpa::paged_attention_v2::partition", "for kpa::paged_attention_v2::reduce"}));
  automatic(unchecked, split);  // the first multi-partition call allocates the workspace
  EXPECT_EQ(record([&] { automatic(unchecked, split); }),
            (Events{"for kpa::paged_attention::partition", "for kpa::paged_attention::reduce"}));
  const Events planned = record([&] { automatic(unchecked, {}); });  // the planner's own partitions
  EXPECT_EQ(planned.size(), workspace.last_plan().single_partition ? 1u : 2u);
  kpa::PlanOptions whole;
  whole.partition_size = 1312;  // every sequence in one partition
  EXPECT_EQ(record([&] { automatic(unchecked, whole); }), Events{"for kpa::paged_attention::single_partition"});
  EXPECT_EQ(record([&] { automatic(checked, whole); }),
            (Events{"reduce kpa::check_indices", "for kpa::paged_attention::single_partition"}));
  expect_close_to_reference<kpa::half>(d.out, reference_attention(p), "after the recorded calls");
}

TYPED_TEST(CallStructure, UncheckedCacheOperationsLaunchTheirKernelsOnly) {
  using Space = TypeParam;
  using Memory = typename Space::memory_space;
  using Layout = Kokkos::LayoutRight;
  Kokkos::View<kpa::half***, Layout, Memory> keys("keys", 4, 2, 64);
  Kokkos::View<kpa::half*****, Layout, Memory> key_cache("key_cache", 3, 2, 8, 16, 8);
  Kokkos::View<kpa::half****, Layout, Memory> value_cache("value_cache", 3, 2, 64, 16);
  Kokkos::View<std::int64_t*, Layout, Memory> slots("slots", 4);
  Kokkos::View<std::int64_t**, Layout, Memory> mapping("mapping", 1, 2);
  const auto cache = [&](bool check) {
    kpa::reshape_and_cache(Space(), keys, keys, key_cache, value_cache, slots, kpa::KVCacheDType::Auto, 1.0f, 1.0f,
                           check);
  };
  const auto copy = [&](bool check) {
    kpa::copy_blocks(Space(), std::vector{key_cache}, std::vector{value_cache}, mapping, check);
  };
  EXPECT_EQ(record([&] { cache(false); }), Events{"for kpa::reshape_and_cache"});
  EXPECT_EQ(record([&] { cache(true); }), (Events{"reduce kpa::check_slot_mapping", "for kpa::reshape_and_cache"}));
  EXPECT_EQ(record([&] { copy(false); }), (Events{"for kpa::copy_blocks", "for kpa::copy_blocks"}));
  EXPECT_EQ(record([&] { copy(true); }),
            (Events{"reduce kpa::check_block_mapping", "for kpa::copy_blocks", "for kpa::copy_blocks"}));
}

}  // namespace
