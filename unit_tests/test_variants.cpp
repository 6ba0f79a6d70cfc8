// Attention variants against the float64 reference (reference_rows, written from the README's
// semantics) on every execution space and kernel path: soft-capping, sliding windows, sinks,
// several query tokens per sequence, the LSE output, head size 512, their combinations, and
// merge_attn_states. Outputs use the per-dtype tolerances of problem.hpp; LSEs, computed in
// float from the same rounded inputs, use float's.
//
// make_problem fills every block that no query row of a kv group attends with NaN (blocks
// wholly outside a window included): a kernel that read one would show NaN in the output.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <kpa/detail/attention_variant.hpp>
#include <kpa/detail/host_loops.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace kpa_test;

template <class Space>
class Variants : public ::testing::Test {};
TYPED_TEST_SUITE(Variants, kpa_test::ExecutionSpaces);

ProblemSpec base_spec(int block_size = 16) {
  ProblemSpec spec;
  spec.block_size = block_size;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  return spec;
}

// The cap comes before ALiBi and before masks: with ALiBi's large negative offsets a cap applied
// after it would clamp them to -c, far from the reference.
TYPED_TEST(Variants, SoftCapBeforeAlibiAndMasks) {
  for (bool alibi : {false, true}) {
    ProblemSpec spec = base_spec();
    spec.seq_lens = {0, 1, 15, 16, 17, 300};
    spec.soft_cap = 0.25f;  // logits here have a spread of about 0.3: the cap bends them
    spec.alibi = alibi;
    SCOPED_TRACE(alibi ? "with ALiBi" : "without ALiBi");
    check_attention<float, TypeParam>(spec, 64);
    check_attention<kpa::half, TypeParam>(spec, 64);
    check_attention<kpa::bfloat16, TypeParam>(spec, 64);
  }
}

// Window edges: W = 1 (only the query's own key), W < block size, W = block size, W between
// partitions, W = L and W > L (no effect), for several partition sizes.
TYPED_TEST(Variants, SlidingWindowEdges) {
  const int B = 16;
  for (int window : {1, 5, B, 2 * B + 7, 3 * B, 300, 301, 1000}) {
    ProblemSpec spec = base_spec(B);
    spec.seq_lens = {0, 1, B - 1, B, B + 1, 5 * B + 3, 300};
    spec.window = window;
    spec.seed = 7 + window;
    SCOPED_TRACE("window " + std::to_string(window));
    check_attention<float, TypeParam>(spec, 2 * B);
    check_attention<kpa::half, TypeParam>(spec, 4 * B, {}, /*auto_partition=*/false);
  }
}

// A window of 64 over 2000 tokens: the plan counts partitions over the window, not the sequence.
TYPED_TEST(Variants, SlidingWindowPlansOnlyTheWindow) {
  ProblemSpec spec = base_spec();
  spec.seq_lens = {2000, 1500, 64};
  spec.window = 64;
  check_attention<float, TypeParam>(spec, 32);
  const HostProblem p = make_problem<float>(spec);
  DeviceProblem<float, TypeParam> d(p);
  kpa::Workspace<TypeParam> workspace;
  kpa::PlanOptions options;
  options.partition_size = 32;
  kpa::paged_attention(TypeParam(), workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                       d.max_seq_len, d.alibi, d.params, options);
  // 64 keys from a block boundary span at most 64 + 15 tokens: 3 partitions of 32, not 63.
  EXPECT_EQ(workspace.last_plan().num_partitions, 3);
}

TYPED_TEST(Variants, SinksJoinTheDenominator) {
  for (bool several : {false, true}) {
    ProblemSpec spec = base_spec();
    spec.seq_lens = {0, 1, 40, 333};
    if (several) {
      spec.seq_lens = {3, 1, 40, 333, 0};
      spec.query_lens = {3, 1, 4, 2, 0};
    }
    spec.sinks = true;
    SCOPED_TRACE(several ? "several query tokens" : "decode");
    check_attention<float, TypeParam>(spec, 64);
    check_attention<kpa::bfloat16, TypeParam>(spec, 64, {}, /*auto_partition=*/false);
  }
}

// Several query tokens per sequence: n_s = 0, n_s = seq_len, group sizes that fill a pass
// exactly, leave padding rows and need several passes.
TYPED_TEST(Variants, SeveralQueryTokensAreCausal) {
  for (auto [heads, kv_heads] : {std::pair{8, 2}, {6, 2}, {4, 4}, {16, 2}}) {
    ProblemSpec spec = base_spec();
    spec.num_heads = heads;
    spec.num_kv_heads = kv_heads;
    spec.seq_lens = {5, 0, 17, 200, 64, 9};
    spec.query_lens = {5, 0, 1, 4, 7, 0};
    spec.seed = heads * 10 + kv_heads;
    SCOPED_TRACE("heads " + std::to_string(heads) + "/" + std::to_string(kv_heads));
    check_attention<float, TypeParam>(spec, 32);
    check_attention<kpa::half, TypeParam>(spec, 64, {}, /*auto_partition=*/false);
  }
}

// Any scale, on every level (the tile loops leave it to the row softmax where it is positive and
// no transform follows, so that masked keys stay masked): negative, zero, large; bf16 caches and
// rows of several query tokens, whose passes take the tiles (32 rows on the AMX levels).
TYPED_TEST(Variants, AnyScale) {
  for (float scale : {-0.3f, 0.0f, 2.5f}) {
    ProblemSpec spec = base_spec();
    spec.num_heads = 8;
    spec.num_kv_heads = 2;
    spec.seq_lens = {40, 200, 9};
    spec.query_lens = {9, 40, 9};
    spec.scale = scale;
    SCOPED_TRACE("scale " + std::to_string(scale));
    check_attention<kpa::bfloat16, TypeParam>(spec, 32);
    spec.soft_cap = 20.0f;
    check_attention<kpa::bfloat16, TypeParam>(spec, 32);
  }
}

// Everything that composes, together: cap + window + sinks + ALiBi + several query tokens, on
// f16 caches, fp8 caches and a block-sparse pattern (the query block being each token's own).
TYPED_TEST(Variants, CombinationsWithFp8AndBlockSparse) {
  for (int kind = 0; kind < 3; ++kind) {
    ProblemSpec spec = base_spec();
    spec.seq_lens = {100, 7, 260, 33};
    spec.query_lens = {3, 2, 5, 1};
    spec.soft_cap = 0.3f;
    spec.window = 70;
    spec.sinks = true;
    spec.alibi = true;
    spec.seed = 40 + kind;
    if (kind == 1) {
      spec.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
      spec.k_scale = 0.5f;
      spec.v_scale = 0.25f;
    }
    if (kind == 2) {
      spec.window = 0;  // a window and a sparse pattern would leave little to attend
      spec.sparse.vert_stride = 3;
      spec.sparse.local_blocks = 2;
      spec.sparse.block_size = 32;
      spec.sparse.head_sliding_step = 1;
    }
    SCOPED_TRACE(kind == 0 ? "f16 cache" : kind == 1 ? "fp8 e4m3 cache" : "block-sparse");
    if (kind == 1) {
      check_attention<kpa::half, TypeParam, std::uint8_t>(spec, 64);
    } else {
      check_attention<kpa::half, TypeParam>(spec, 64);
      check_attention<float, TypeParam>(spec, 32, {}, /*auto_partition=*/false);
    }
  }
}

// Gemma's global layers: head size 512, block sizes 16 and 32, f16 and bf16, decode and
// several query tokens.
TYPED_TEST(Variants, HeadSize512) {
  for (int block_size : {16, 32}) {
    for (bool several : {false, true}) {
      ProblemSpec spec = base_spec(block_size);
      spec.head_size = 512;
      spec.num_heads = 4;
      spec.num_kv_heads = 1;
      spec.seq_lens = {1, block_size + 3, 130};
      if (several) spec.query_lens = {1, 2, 3};
      SCOPED_TRACE("block_size " + std::to_string(block_size) + (several ? ", several query tokens" : ""));
      check_attention<kpa::half, TypeParam>(spec, 2 * block_size);
      check_attention<kpa::bfloat16, TypeParam>(spec, 64, {}, /*auto_partition=*/false);
    }
  }
}

// ---- merge_attn_states ----

template <class Space>
using Rows = Kokkos::View<float***, Kokkos::LayoutRight, typename Space::memory_space>;
template <class Space>
using Lses = Kokkos::View<float**, Kokkos::LayoutRight, typename Space::memory_space>;

/// Attends keys [first, first + len) of every sequence (first a multiple of the block size) by
/// pointing the block tables past the first blocks; out and lse come back.
template <class Space>
void attend_range(DeviceProblem<float, Space>& d, const HostProblem& p, int first, int len) {
  const int skip = first / p.block_size;
  Kokkos::View<int**, Kokkos::LayoutRight, typename Space::memory_space> tables("tables", p.num_seqs,
                                                                              p.max_blocks_per_seq - skip);
  Kokkos::View<int*, typename Space::memory_space> lens("lens", p.num_seqs);
  auto t = Kokkos::create_mirror_view(tables);
  auto l = Kokkos::create_mirror_view(lens);
  for (int s = 0; s < p.num_seqs; ++s) {
    l(s) = len;
    for (int b = 0; b < p.max_blocks_per_seq - skip; ++b) t(s, b) = p.block_tables[s * p.max_blocks_per_seq + b + skip];
  }
  Kokkos::deep_copy(tables, t);
  Kokkos::deep_copy(lens, l);
  kpa::Workspace<Space> workspace;
  kpa::AttentionExtras<Space> extras;
  extras.lse = d.lse;
  kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache, tables, lens, len, d.alibi,
                       d.params, extras);
  Space().fence();
}

// Attending a sequence's keys in two halves and merging them equals attending all of them.
TYPED_TEST(Variants, MergeOfTwoHalvesIsTheWhole) {
  using Space = TypeParam;
  ProblemSpec spec = base_spec();
  spec.seq_lens = {320, 320};
  const HostProblem p = make_problem<float>(spec);
  const ReferenceResult whole = reference_rows(p);
  DeviceProblem<float, Space> d(p);
  const int split = 128;
  Rows<Space> prefix("prefix", p.num_seqs, p.num_heads, p.head_size), suffix("suffix", p.num_seqs, p.num_heads,
                                                                                p.head_size);
  Lses<Space> prefix_lse("prefix_lse", p.num_seqs, p.num_heads), suffix_lse("suffix_lse", p.num_seqs, p.num_heads);
  attend_range(d, p, 0, split);
  Kokkos::deep_copy(prefix, d.out);
  Kokkos::deep_copy(prefix_lse, d.lse);
  attend_range(d, p, split, 320 - split);
  Kokkos::deep_copy(suffix, d.out);
  Kokkos::deep_copy(suffix_lse, d.lse);
  Rows<Space> merged("merged", p.num_seqs, p.num_heads, p.head_size);
  Lses<Space> merged_lse("merged_lse", p.num_seqs, p.num_heads);
  kpa::merge_attn_states(Space(), merged, merged_lse, prefix, prefix_lse, suffix, suffix_lse);
  expect_close_to_reference<float>(merged, whole.out, "merged halves");
  expect_close_to_reference<float>(merged_lse, whole.lse, "merged halves, lse");
  // out_lse may be absent.
  Kokkos::deep_copy(merged, std::numeric_limits<float>::quiet_NaN());
  kpa::merge_attn_states(Space(), merged, Lses<Space>(), prefix, prefix_lse, suffix, suffix_lse);
  expect_close_to_reference<float>(merged, whole.out, "merged halves without out_lse");
}

// An input with LSE -inf (or +inf) carries no weight, whatever its output holds; both empty
// gives 0 and -inf; a NaN LSE gives NaN.
TYPED_TEST(Variants, MergeOfEmptySides) {
  using Space = TypeParam;
  constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Rows: (prefix lse, suffix lse) per head.
  const std::vector<std::pair<float, float>> cases = {{-inf, 0.5f}, {1.0f, -inf}, {inf, 2.0f}, {-inf, -inf},
                                                      {inf, inf},   {-inf, inf},  {nan, 1.0f}, {0.0f, 0.0f}};
  const int heads = static_cast<int>(cases.size()), D = 4;
  Rows<Space> prefix("prefix", 1, heads, D), suffix("suffix", 1, heads, D), out("out", 1, heads, D);
  Lses<Space> prefix_lse("prefix_lse", 1, heads), suffix_lse("suffix_lse", 1, heads), out_lse("out_lse", 1, heads);
  auto hp = Kokkos::create_mirror_view(prefix);
  auto hs = Kokkos::create_mirror_view(suffix);
  auto hpl = Kokkos::create_mirror_view(prefix_lse);
  auto hsl = Kokkos::create_mirror_view(suffix_lse);
  std::vector<double> expected_out, expected_lse;
  for (int h = 0; h < heads; ++h) {
    const auto [lp, ls] = cases[h];
    hpl(0, h) = lp;
    hsl(0, h) = ls;
    const bool wp = std::isfinite(lp), ws = std::isfinite(ls);
    for (int d = 0; d < D; ++d) {
      hp(0, h, d) = wp ? 1.0f + d : nan;  // a side without weight may hold anything
      hs(0, h, d) = ws ? -2.0f * d : nan;
      const double a = wp ? std::exp(static_cast<double>(lp)) : 0.0, b = ws ? std::exp(static_cast<double>(ls)) : 0.0;
      expected_out.push_back(std::isnan(lp) ? nan : (a + b == 0.0 ? 0.0 : (a * (1.0 + d) + b * (-2.0 * d)) / (a + b)));
    }
    const double a = wp ? std::exp(static_cast<double>(lp)) : 0.0, b = ws ? std::exp(static_cast<double>(ls)) : 0.0;
    expected_lse.push_back(std::isnan(lp) ? nan : (a + b == 0.0 ? -std::numeric_limits<double>::infinity() : std::log(a + b)));
  }
  Kokkos::deep_copy(prefix, hp);
  Kokkos::deep_copy(suffix, hs);
  Kokkos::deep_copy(prefix_lse, hpl);
  Kokkos::deep_copy(suffix_lse, hsl);
  kpa::merge_attn_states(Space(), out, out_lse, prefix, prefix_lse, suffix, suffix_lse);
  Space().fence();
  expect_close_to_reference<float>(out, expected_out, "merge of empty sides");
  expect_close_to_reference<float>(out_lse, expected_lse, "merge of empty sides, lse");
}

// ---- the rules' two forms ----

// Each rule of AttentionVariant in both its forms, key by key: the scalar one the device path and
// the reduce take (in_window, attends_block, logit) and the row-wise one the host path takes
// (apply_to_row, with the row loops of every instruction set this CPU runs). A new rule is a new
// row of this table.
TEST(VariantRules, RowFormEqualsScalarForm) {
  using kpa::detail::AttentionVariant;
  const float slopes[] = {0.0f, -0.125f, 0.5f, 0.03125f};  // ALiBi, per query head
  AttentionVariant none, cap, alibi, window, causal, sparse, all;
  cap.logits_soft_cap = 5.0f;
  alibi.alibi_slopes = {slopes, 1};
  window.sliding_window = 37;
  window.masks_rows = true;
  causal.masks_rows = true;  // several query tokens: each row ends at its own position
  sparse.sparse = {3, 2, 32, 1, 1, 4, 2, 2};  // vert stride, local blocks, sparse block, step, rank, heads
  all = sparse;
  all.logits_soft_cap = 30.0f;
  all.alibi_slopes = {slopes, 1};
  all.sliding_window = 100;
  all.masks_rows = true;
  const struct {
    const char* name;
    AttentionVariant variant;
  } rules[] = {{"none", none},     {"soft cap", cap},       {"ALiBi", alibi},      {"sliding window", window},
               {"causal rows", causal}, {"block-sparse", sparse}, {"all together", all}};
  constexpr int B = 16;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<kpa::HostIsa> isas{kpa::HostIsa::Portable};
  if (kpa::detail::best_host_isa() != kpa::HostIsa::Portable) isas.push_back(kpa::detail::best_host_isa());
  for (const auto& rule : rules) {
    const AttentionVariant& v = rule.variant;
    for (int head = 0; head < 4; ++head) {
      for (int position : {0, 5, 40, 150, 333}) {
        const auto row = v.row(head, position);
        // Rows of a pass share its keys unless the variant masks rows: then they may reach past a
        // row's own position (other rows' later keys), which the row form must mask too.
        for (int first : {0, 32, 128, 320}) {
          const int end = v.masks_rows ? first + 70 : position + 1;
          if (first >= end) continue;
          const int n = end - first;
          std::vector<float> qk(n);
          for (int i = 0; i < n; ++i) qk[i] = 20.0f * std::sin(0.37f * static_cast<float>(first + i) + head);
          for (kpa::HostIsa isa : isas) {
            for (float scale : {1.0f, 0.25f, -0.5f}) {
              // Logits 1 / scale times the scaled ones (exactly: a power of two), and the scale:
              // returned for the softmax where it is positive and no transform follows, else
              // applied first.
              std::vector<float> got = qk;
              for (float& x : got) x /= scale;
              const float left = v.apply_to_row(kpa::detail::host_row_loops(isa), got.data(), n, first, B, row, scale);
              const bool transforms = v.logits_soft_cap > 0.0f || row.alibi_slope != 0.0f;
              EXPECT_EQ(left, transforms || scale < 0.0f ? 1.0f : scale) << rule.name;
              for (float& x : got) x *= left;
              for (int i = 0; i < n; ++i) {
                const int key = first + i;
                const std::string what = std::string(rule.name) + " (" + std::string(kpa::to_string(isa)) +
                                         "): head " + std::to_string(head) + ", position " +
                                         std::to_string(position) + ", key " + std::to_string(key);
                if (v.in_window(row, key) && v.attends_block(row, key)) {
                  const float want = v.logit(qk[i], row, key);
                  // The row form's tanh is within 4e-7 x cap of the scalar one (HostLoops' test);
                  // then both add the ALiBi bias, which may cancel most of the capped logit.
                  const float bias = AttentionVariant::alibi_bias(row.alibi_slope, static_cast<float>(key - position));
                  const float tolerance = 4e-7f * v.logits_soft_cap + 1e-6f * (1.0f + std::fabs(want) + std::fabs(bias));
                  EXPECT_NEAR(got[i], want, tolerance) << what;
                } else {
                  EXPECT_EQ(got[i], -kInf) << what;
                }
              }
            }
          }
        }
      }
    }
  }
}

// The sink joins a row's denominator only: the same state merged with the sink's one-token state,
// its own output weighted by what the merge leaves it; without sinks nothing changes.
TEST(VariantRules, TheSinkJoinsTheDenominator) {
  using kpa::detail::AttentionVariant;
  using kpa::detail::SoftmaxState;
  const float sinks[] = {1.5f, -3.0f};
  AttentionVariant with_sinks;
  with_sinks.sinks = {sinks, 1};
  for (int head = 0; head < 2; ++head) {
    SoftmaxState state{2.0f, 3.0f};
    const float weight = with_sinks.join_sink(state, head);
    const double total = 3.0 * std::exp(2.0 - std::max(2.0, double(sinks[head]))) +
                         std::exp(double(sinks[head]) - std::max(2.0, double(sinks[head])));
    EXPECT_NEAR(state.exp_sum, total, 1e-6 * total) << head;
    EXPECT_EQ(state.max_logit, std::max(2.0f, sinks[head])) << head;
    EXPECT_NEAR(weight, std::exp(2.0 - std::max(2.0, double(sinks[head]))), 1e-7) << head;
  }
  SoftmaxState state{2.0f, 3.0f};
  EXPECT_EQ(AttentionVariant{}.join_sink(state, 0), 1.0f);
  EXPECT_EQ(state.max_logit, 2.0f);
  EXPECT_EQ(state.exp_sum, 3.0f);
}

// ---- argument errors ----

TYPED_TEST(Variants, BadVariantArgumentsAreRefused) {
  using Space = TypeParam;
  ProblemSpec spec = base_spec();
  spec.seq_lens = {10, 4, 0};
  spec.query_lens = {2, 4, 0};
  const HostProblem p = make_problem<float>(spec);
  DeviceProblem<float, Space> d(p);
  kpa::Workspace<Space> workspace;
  auto run = [&](const kpa::AttentionParams& params, const kpa::AttentionExtras<Space>& extras) {
    kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                         d.max_seq_len, d.alibi, params, extras);
  };
  kpa::AttentionParams params = d.params;
  params.logits_soft_cap = -1.0f;
  expect_error([&] { run(params, d.extras()); }, "logits_soft_cap must be 0 (off) or a positive finite number, got -1");
  params.logits_soft_cap = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { run(params, d.extras()); }, "logits_soft_cap");
  params = d.params;
  params.sliding_window = -3;
  expect_error([&] { run(params, d.extras()); }, "sliding_window must be 0 (off) or positive, got -3");

  // query_start_loc contents (checked on the space, with check_indices).
  auto with_starts = [&](std::vector<int> starts, int max_query_len, const std::string& expected) {
    Kokkos::View<int*, typename Space::memory_space> qsl("qsl", starts.size());
    upload(qsl, starts);
    kpa::AttentionExtras<Space> extras = d.extras();
    extras.query_start_loc = qsl;
    extras.max_query_len = max_query_len;
    expect_error([&] { run(d.params, extras); }, expected);
  };
  with_starts({1, 3, 6, 6}, 0, "query_start_loc[0] = 1 is not 0");
  with_starts({0, 4, 3, 6}, 0, "query_start_loc decreases at sequence 1 (4 then 3)");
  with_starts({0, 1, 6, 6}, 0, "sequence 1 has 5 query tokens, more than seq_lens[1] = 4");
  with_starts({0, 2, 5, 5}, 0, "query_start_loc[3] = 5 is not num_tokens = 6");
  with_starts({0, 2, 6, 6}, 3, "sequence 1 has 4 query tokens, more than seq_lens[1] = 4 or max_query_len = 3");

  // Extents.
  kpa::AttentionExtras<Space> extras = d.extras();
  Kokkos::View<int*, typename Space::memory_space> short_qsl("short", 3);
  extras.query_start_loc = short_qsl;
  expect_error([&] { run(d.params, extras); }, "query_start_loc has 3 entries, expected num_seqs + 1 = 4");
  extras = d.extras();
  Kokkos::View<float*, typename Space::memory_space> sinks("sinks", 3);
  extras.sinks = sinks;
  expect_error([&] { run(d.params, extras); }, "sinks has 3 entries, expected 0 or num_heads = 8");
  extras = d.extras();
  Kokkos::View<float**, Kokkos::LayoutRight, typename Space::memory_space> lse("lse", 5, 8);
  extras.lse = lse;
  expect_error([&] { run(d.params, extras); }, "lse extents [5, 8] do not match [num_tokens = 6, num_heads = 8]");
  {  // a decode batch (no query_start_loc) with a max_query_len
    ProblemSpec decode = base_spec();
    decode.seq_lens = {10, 4, 0};
    DeviceProblem<float, Space> dd(make_problem<float>(decode));
    kpa::AttentionExtras<Space> decode_extras;
    decode_extras.max_query_len = 2;
    expect_error(
        [&] {
          kpa::paged_attention(Space(), workspace, dd.out, dd.query, dd.key_cache, dd.value_cache, dd.block_tables,
                               dd.seq_lens, dd.max_seq_len, dd.alibi, dd.params, decode_extras);
        },
        "given only with query_start_loc");
  }

  // merge_attn_states extents.
  Rows<Space> a("a", 2, 3, 4), b("b", 2, 3, 5);
  Lses<Space> la("la", 2, 3), lb("lb", 3, 2);
  expect_error([&] { kpa::merge_attn_states(Space(), a, la, a, la, b, la); },
               "suffix_out extents [2, 3, 5] differ from out extents [2, 3, 4]");
  expect_error([&] { kpa::merge_attn_states(Space(), a, la, a, lb, a, la); },
               "prefix_lse extents [3, 2] do not match [num_tokens, num_heads] = [2, 3]");
}

}  // namespace
