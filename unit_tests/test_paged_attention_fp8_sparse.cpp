// fp8 KV caches and block-sparse attention, v1 / v2 / automatic, against the float64 reference.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

namespace {

using namespace kpa_test;

template <class Space>
class PagedAttentionFp8 : public ::testing::Test {};
TYPED_TEST_SUITE(PagedAttentionFp8, kpa_test::ExecutionSpaces);

// The reference is built from the dequantised cache, so fp8 adds no error of its own here: the
// tolerance is the output type's. (vLLM tests fp8 caches against the unquantised values with atol 1e-2.)
template <class Space, class T>
void sweep_fp8(kpa::KVCacheDType dtype) {
  for (int head_size : {64, 80, 96, 112, 128, 192, 256}) {  // every supported size divisible by 16
    ProblemSpec spec;
    spec.seq_lens = {0, 1, 15, 16, 17, 300};
    spec.head_size = head_size;
    spec.block_size = head_size % 32 == 0 ? 32 : 16;
    spec.num_heads = 6;
    spec.num_kv_heads = 2;
    spec.kv_cache_dtype = dtype;
    spec.k_scale = 0.05f;  // values up to 20 in fp8 units
    spec.v_scale = 0.004f;
    spec.seed = head_size;
    SCOPED_TRACE(std::string(kpa::to_string(dtype)) + " head_size " + std::to_string(head_size));
    check_attention<T, Space, std::uint8_t>(spec, 64);
  }
}

TYPED_TEST(PagedAttentionFp8, E4M3WithF32Query) { sweep_fp8<TypeParam, float>(kpa::KVCacheDType::Fp8E4M3); }
TYPED_TEST(PagedAttentionFp8, E4M3WithF16Query) { sweep_fp8<TypeParam, kpa::half>(kpa::KVCacheDType::Fp8E4M3); }
TYPED_TEST(PagedAttentionFp8, E5M2WithBF16Query) { sweep_fp8<TypeParam, kpa::bfloat16>(kpa::KVCacheDType::Fp8E5M2); }
TYPED_TEST(PagedAttentionFp8, E5M2WithF32QueryAlibiAndLongSequence) {
  ProblemSpec spec;
  spec.seq_lens = {5000, 513};
  spec.num_heads = 8;
  spec.num_kv_heads = 1;
  spec.head_size = 128;
  spec.alibi = true;
  spec.kv_cache_dtype = kpa::KVCacheDType::Fp8E5M2;
  spec.k_scale = 0.5f;
  spec.v_scale = 2.0f;
  check_attention<float, TypeParam, std::uint8_t>(spec, 512);
}

// The host path reads fp8 caches in 128-token chunks where a pass has one or two rows (single
// heads, groups of 2): sequences ending before, at and past chunk and partition boundaries.
TYPED_TEST(PagedAttentionFp8, SingleHeadsAndPairsInShortChunks) {
  for (int group : {1, 2}) {
    ProblemSpec spec;
    spec.seq_lens = {1, 127, 128, 129, 300, 1100};
    spec.num_heads = 4;
    spec.num_kv_heads = 4 / group;
    spec.head_size = 128;
    spec.block_size = 16;
    spec.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
    spec.k_scale = 0.05f;
    spec.v_scale = 0.004f;
    spec.seed = 40 + group;
    SCOPED_TRACE("groups of " + std::to_string(group));
    const HostProblem p = make_problem<kpa::half>(spec);
    DeviceProblem<kpa::half, TypeParam, std::uint8_t> d(p);
    check_versions(d, p, 512, {}, true);
    kpa::Workspace<TypeParam> workspace;
    run_version(Version::Auto, d, 0, {}, workspace, p);
    if (workspace.last_plan().kernel_path == kpa::KernelPath::Host) {
      EXPECT_EQ(workspace.last_plan().chunk_tokens, 128);
    }
  }
}

template <class Space>
class PagedAttentionBlockSparse : public ::testing::Test {};
TYPED_TEST_SUITE(PagedAttentionBlockSparse, kpa_test::ExecutionSpaces);

ProblemSpec sparse_spec(int local_blocks, int vert_stride, int sparse_block_size, int step, int tp_rank) {
  ProblemSpec spec;
  spec.seq_lens = {1, 64, 700, 1500, 333};
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  spec.block_size = 16;
  spec.tables = TableKind::Sequential;  // a block belongs to one sequence: its NaN fill is safe
  spec.sparse.local_blocks = local_blocks;
  spec.sparse.vert_stride = vert_stride;
  spec.sparse.block_size = sparse_block_size;
  spec.sparse.head_sliding_step = step;
  spec.tp_rank = tp_rank;
  return spec;
}

// Blocks no head of a kv group attends hold NaN in these problems: the kernels must skip them.
TYPED_TEST(PagedAttentionBlockSparse, SlidingOverQueryHeads) {
  check_attention<float, TypeParam>(sparse_spec(2, 4, 64, 1, 0), 128);
  check_attention<kpa::half, TypeParam>(sparse_spec(1, 3, 32, 2, 1), 256);
}

TYPED_TEST(PagedAttentionBlockSparse, SlidingOverKvHeadsAndTensorParallelRank) {
  check_attention<float, TypeParam>(sparse_spec(2, 4, 64, -1, 0), 128);
  check_attention<kpa::bfloat16, TypeParam>(sparse_spec(3, 8, 16, -2, 3), 64);
}

// A vertical stride that skips most blocks, with partitions of one sparse block: many partitions
// carry no weight at all and must drop out of the reduce (no NaN, no wrong scale).
TYPED_TEST(PagedAttentionBlockSparse, PartitionsWithoutAnyAttendedBlock) {
  ProblemSpec spec = sparse_spec(1, 16, 64, -1, 0);
  check_attention<float, TypeParam>(spec, 64);
  spec.sparse.local_blocks = 0;  // the last block is not attended by default either
  check_attention<float, TypeParam>(spec, 64);
}

TYPED_TEST(PagedAttentionBlockSparse, Fp8CacheAndSparsity) {
  ProblemSpec spec = sparse_spec(2, 4, 32, 1, 0);
  spec.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
  spec.k_scale = 0.1f;
  spec.v_scale = 0.01f;
  check_attention<kpa::half, TypeParam, std::uint8_t>(spec, 128);
}

}  // namespace
