// NaN semantics: corrupt cache data that is attended shows in the affected outputs as NaN, as in
// the float64 reference, on every entry point and kernel path; NaN where nothing attends (slots
// past a sequence's end, blocks skipped by a sparse pattern) never shows. (Every other test's
// problems already hold NaN in every slot no sequence owns.)

#include "attention_runner.hpp"
#include "test_spaces.hpp"

namespace {

using namespace kpa_test;

template <class Space>
class NanSemantics : public ::testing::Test {};
TYPED_TEST_SUITE(NanSemantics, kpa_test::ExecutionSpaces);

ProblemSpec nan_spec() {
  ProblemSpec spec;
  spec.seq_lens = {300, 77, 0, 129};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  spec.block_size = 16;
  spec.tables = TableKind::Sequential;  // no prefix sharing: a corrupt element belongs to one sequence
  return spec;
}

/// The cache index of token t of sequence s, kv head g, dimension d.
std::size_t element(const HostProblem& p, int s, int t, int g, int d) {
  const int block = p.block_tables[static_cast<std::size_t>(s) * p.max_blocks_per_seq + t / p.block_size];
  return p.kv_index(block, g, t % p.block_size, d);
}

template <class T, class Space>
void check_nan_pattern() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostProblem p = make_problem<T>(nan_spec());
  p.keys[element(p, 0, 130, 1, 5)] = nan;   // one key element: every head of kv head 1 of sequence 0
  p.values[element(p, 1, 20, 0, 9)] = nan;  // one value element: dimension 9 of kv head 0's heads
  p.values[element(p, 3, 128, 1, 0)] = nan;  // the last token of a partly filled block
  // The reference shows exactly those outputs as NaN; make sure the problem says what this test claims.
  const std::vector<double> ref = reference_attention(p);
  const auto at = [&](int s, int h, int d) { return ref[(static_cast<std::size_t>(s) * p.num_heads + h) * p.head_size + d]; };
  for (int h = 0; h < 8; ++h) {
    ASSERT_EQ(std::isnan(at(0, h, 40)), h >= 4) << h;
    ASSERT_EQ(std::isnan(at(1, h, 9)), h < 4) << h;
    ASSERT_FALSE(std::isnan(at(1, h, 8))) << h;
    ASSERT_EQ(std::isnan(at(3, h, 0)), h >= 4) << h;
    ASSERT_FALSE(std::isnan(at(2, h, 0))) << h;
  }
  for (int partition : {64, 512}) check_attention_on<T, Space>(p, partition);
}

// The test main traps invalid operations: a NaN reaching an ordered comparison would crash here.
TYPED_TEST(NanSemantics, AttendedNanShowsInTheAffectedOutputsF32) { check_nan_pattern<float, TypeParam>(); }
TYPED_TEST(NanSemantics, AttendedNanShowsInTheAffectedOutputsF16) { check_nan_pattern<kpa::half, TypeParam>(); }
TYPED_TEST(NanSemantics, AttendedNanShowsInTheAffectedOutputsBF16) { check_nan_pattern<kpa::bfloat16, TypeParam>(); }

// A prompt's query tokens (several passes over the same blocks): NaN in the cache at one of its
// tokens shows in the rows of that token and later ones, never in the passes before it, from
// which the causal mask hides it (even where a set packs a block once for all of them). The rows
// of a pass share its reads, so each NaN here is at the first token of a pass (32 tokens into
// the prompt: a multiple of every pass's tokens).
template <class T, class C, class Space>
void check_nan_in_a_prompt(kpa::KVCacheDType cache_dtype) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ProblemSpec spec = nan_spec();
  spec.seq_lens = {150, 45};
  spec.query_lens = {40, 45};
  spec.kv_cache_dtype = cache_dtype;
  HostProblem p = make_problem<T>(spec);
  p.keys[element(p, 0, 142, 0, 5)] = nan;    // every dimension of kv head 0's rows from token 142
  p.values[element(p, 0, 142, 1, 9)] = nan;  // dimension 9 of kv head 1's rows from token 142
  p.values[element(p, 1, 32, 0, 2)] = nan;   // dimension 2 of kv head 0's rows from token 32
  const std::vector<double> ref = reference_attention(p);
  const auto at = [&](int token, int h, int d) {
    return ref[(static_cast<std::size_t>(token) * p.num_heads + h) * p.head_size + d];
  };
  for (int h = 0; h < 8; ++h) {
    for (int i = 0; i < 40; ++i) {
      const bool attended = 110 + i >= 142;
      ASSERT_EQ(std::isnan(at(i, h, 0)), h < 4 && attended) << i << " " << h;
      ASSERT_EQ(std::isnan(at(i, h, 9)), attended) << i << " " << h;
    }
    for (int i = 0; i < 45; ++i) ASSERT_EQ(std::isnan(at(40 + i, h, 2)), h < 4 && i >= 32) << i << " " << h;
  }
  for (int partition : {64, 512}) check_attention_on<T, Space, C>(p, partition);
}

TYPED_TEST(NanSemantics, NanInAPromptShowsFromItsTokenOnBF16) {
  check_nan_in_a_prompt<kpa::bfloat16, kpa::bfloat16, TypeParam>(kpa::KVCacheDType::Auto);
}
TYPED_TEST(NanSemantics, NanInAPromptShowsFromItsTokenOnFp8) {
  check_nan_in_a_prompt<kpa::bfloat16, std::uint8_t, TypeParam>(kpa::KVCacheDType::Fp8E4M3);
}

// A sequence whose only attended logits are NaN: no finite max exists, and the output is still NaN
// (not the zeros of a sequence with nothing to attend).
TYPED_TEST(NanSemantics, OnlyNanLogitsGiveNan) {
  ProblemSpec spec = nan_spec();
  spec.seq_lens = {1, 2, 0};
  HostProblem p = make_problem<float>(spec);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.keys[element(p, 0, 0, 0, 3)] = nan;  // sequence 0's only token, kv head 0
  p.keys[element(p, 1, 0, 1, 0)] = nan;  // both tokens of sequence 1, kv head 1
  p.keys[element(p, 1, 1, 1, 7)] = nan;
  const std::vector<double> ref = reference_attention(p);
  const auto at = [&](int s, int h) { return ref[(static_cast<std::size_t>(s) * p.num_heads + h) * p.head_size]; };
  for (int h = 0; h < 8; ++h) {
    ASSERT_EQ(std::isnan(at(0, h)), h < 4) << h;
    ASSERT_EQ(std::isnan(at(1, h)), h >= 4) << h;
    ASSERT_EQ(at(2, h), 0.0) << h;
  }
  check_attention_on<float, TypeParam>(p, 16);
}

// NaN in blocks a sparse pattern skips, and past every sequence's end, never shows.
TYPED_TEST(NanSemantics, UnattendedNanNeverShows) {
  ProblemSpec spec = nan_spec();
  spec.sparse.local_blocks = 1;
  spec.sparse.vert_stride = 4;
  spec.sparse.block_size = 32;
  spec.sparse.head_sliding_step = -1;  // whole kv groups skip blocks: those blocks are NaN-filled
  const HostProblem p = make_problem<float>(spec);
  std::size_t nan_slots = 0;
  for (float k : p.keys) nan_slots += std::isnan(k) ? 1 : 0;
  ASSERT_GT(nan_slots, 0u);
  for (double r : reference_attention(p)) ASSERT_FALSE(std::isnan(r));
  check_attention_on<float, TypeParam>(p, 64);
}

}  // namespace
