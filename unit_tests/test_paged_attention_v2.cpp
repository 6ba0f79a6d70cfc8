// paged_attention_v2's intermediates, partition by partition, against the float64 reference.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <cfloat>

namespace {

using namespace kpa_test;

template <class Space>
class PagedAttentionV2 : public ::testing::Test {};
TYPED_TEST_SUITE(PagedAttentionV2, kpa_test::ExecutionSpaces);

template <class T, class TmpT, class Space>
void check_intermediates(const ProblemSpec& spec, int partition_size) {
  const HostProblem p = make_problem<T>(spec);
  DeviceProblem<T, Space> d(p);
  Partials<TmpT, Space> partials(p, partition_size);
  kpa::paged_attention_v2(Space(), d.out, partials.exp_sums, partials.max_logits, partials.tmp_out, d.query,
                          d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.max_seq_len, d.alibi, d.params,
                          partition_size);
  Space().fence();
  const auto exp_sums = kpa::detail::compat::host_copy(partials.exp_sums);
  const auto max_logits = kpa::detail::compat::host_copy(partials.max_logits);
  const auto tmp_out = kpa::detail::compat::host_copy(partials.tmp_out);
  const int max_partitions = static_cast<int>(exp_sums.extent(2));
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int part = 0; part < max_partitions; ++part) {
        const int begin = part * partition_size;
        SCOPED_TRACE("seq " + std::to_string(s) + " head " + std::to_string(h) + " partition " + std::to_string(part));
        constexpr float sentinel = Partials<TmpT, Space>::sentinel;
        if (begin >= p.seq_lens[s]) {
          // Partitions at or past the sequence's end are not written.
          EXPECT_EQ(exp_sums(s, h, part), sentinel);
          EXPECT_EQ(max_logits(s, h, part), sentinel);
          EXPECT_EQ(kpa::to_float(tmp_out(s, h, part, 0)), sentinel);
          continue;
        }
        const ReferencePart ref = reference_part(p, s, h, begin, std::min(p.seq_lens[s], begin + partition_size));
        // Logits are f32 (rounding ~ eps * |logit|; ALiBi makes |logit| reach hundreds), and the
        // relative error of exp_sum follows the absolute error of (logit - max).
        const double logit_tol = 1e-5 + 8 * FLT_EPSILON * std::fabs(ref.max_logit);
        EXPECT_NEAR(max_logits(s, h, part), ref.max_logit, logit_tol);
        EXPECT_NEAR(exp_sums(s, h, part), ref.exp_sum, (1e-5 + logit_tol) * ref.exp_sum);
        for (int dim = 0; dim < p.head_size; ++dim) {
          const double got = kpa::to_float(tmp_out(s, h, part, dim));
          ASSERT_NEAR(got, ref.out[dim], Tolerance<TmpT>::atol + Tolerance<TmpT>::rtol * std::fabs(ref.out[dim]))
              << "tmp_out dim " << dim;
        }
      }
    }
  }
  expect_close_to_reference<T>(d.out, reference_attention(p), "v2 out");
}

TYPED_TEST(PagedAttentionV2, IntermediatesPerPartitionF32) {
  ProblemSpec spec;
  spec.seq_lens = {0, 1, 63, 64, 65, 200, 1000};
  spec.num_heads = 6;
  spec.num_kv_heads = 2;
  spec.head_size = 96;
  spec.block_size = 16;
  spec.alibi = true;
  check_intermediates<float, float, TypeParam>(spec, 64);
}

TYPED_TEST(PagedAttentionV2, IntermediatesPerPartitionHalfWithF32TmpOut) {
  ProblemSpec spec;
  spec.seq_lens = {511, 512, 513, 2000};
  spec.num_heads = 4;
  spec.num_kv_heads = 4;
  spec.head_size = 128;
  spec.block_size = 32;
  check_intermediates<kpa::half, float, TypeParam>(spec, 512);
  check_intermediates<kpa::half, kpa::half, TypeParam>(spec, 512);
}

TYPED_TEST(PagedAttentionV2, IntermediatesPerPartitionBFloat16) {
  ProblemSpec spec;
  spec.seq_lens = {100, 37};
  spec.num_heads = 8;
  spec.num_kv_heads = 1;
  spec.head_size = 256;
  spec.block_size = 8;
  check_intermediates<kpa::bfloat16, kpa::bfloat16, TypeParam>(spec, 32);
}

// The seed's v2 was wrong for every sequence longer than one partition; this is that case at
// the seed's own partition size (1024) on sequences of 1 to 9 partitions.
TYPED_TEST(PagedAttentionV2, SeedPartitionSizeManyPartitions) {
  ProblemSpec spec;
  spec.seq_lens = {1025, 2048, 4097, 9000};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 128;
  spec.block_size = 16;
  check_intermediates<float, float, TypeParam>(spec, 1024);
}

}  // namespace
