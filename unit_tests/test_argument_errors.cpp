// Every argument check: bad input throws kpa::Error naming the argument and the value.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

namespace {

using namespace kpa_test;

template <class Space>
class ArgumentErrors : public ::testing::Test {};
TYPED_TEST_SUITE(ArgumentErrors, kpa_test::ExecutionSpaces);

ProblemSpec small_spec() {
  ProblemSpec spec;
  spec.seq_lens = {40, 17, 0};
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_size = 64;
  spec.block_size = 16;
  spec.tables = TableKind::Sequential;
  return spec;
}

template <class Space, class T>
struct Fixture {
  HostProblem host;
  DeviceProblem<T, Space> d;
  kpa::Workspace<Space> workspace;
  explicit Fixture(const ProblemSpec& spec) : host(make_problem<T>(spec)), d(host) {}

  void v1(int max_seq_len, const kpa::AttentionParams& params) {
    kpa::paged_attention_v1(Space(), d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                            max_seq_len, d.alibi, params);
  }
  void all(int max_seq_len, const kpa::AttentionParams& params, const std::string& expected) {
    expect_error([&] { v1(max_seq_len, params); }, expected);
    expect_error(
        [&] {
          Partials<T, Space> partials(host, 16);
          kpa::paged_attention_v2(Space(), d.out, partials.exp_sums, partials.max_logits, partials.tmp_out, d.query,
                                  d.key_cache, d.value_cache, d.block_tables, d.seq_lens, max_seq_len, d.alibi, params,
                                  16);
        },
        expected);
    expect_error(
        [&] {
          kpa::paged_attention(Space(), workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables,
                               d.seq_lens, max_seq_len, d.alibi, params);
        },
        expected);
  }
  void set_host(Kokkos::View<int**, Kokkos::LayoutRight, typename Space::memory_space> view, int i, int j, int value) {
    auto h = Kokkos::create_mirror_view(view);
    Kokkos::deep_copy(h, view);
    h(i, j) = value;
    Kokkos::deep_copy(view, h);
  }
  void set_len(int s, int value) {
    auto h = Kokkos::create_mirror_view(d.seq_lens);
    Kokkos::deep_copy(h, d.seq_lens);
    h(s) = value;
    Kokkos::deep_copy(d.seq_lens, h);
  }
};

TYPED_TEST(ArgumentErrors, BlockIdsOutOfRange) {
  Fixture<TypeParam, float> f(small_spec());
  const int num_blocks = f.host.num_blocks;
  f.set_host(f.d.block_tables, 1, 1, num_blocks);
  f.all(40, f.d.params, "block_tables[1][1] = " + std::to_string(num_blocks));
  f.set_host(f.d.block_tables, 1, 1, -1);
  f.all(40, f.d.params, "block_tables[1][1] = -1");
  // The same garbage past the blocks a sequence uses is never read, so it is no error.
  f.set_host(f.d.block_tables, 1, 1, 0);
  f.set_host(f.d.block_tables, 1, 2, -1);
  EXPECT_NO_THROW(f.v1(40, f.d.params));
}

TYPED_TEST(ArgumentErrors, SeqLensNegativeTooLongOrBeyondTheTable) {
  Fixture<TypeParam, float> f(small_spec());
  f.set_len(2, -3);
  f.all(40, f.d.params, "seq_lens[2] = -3 is negative");
  f.set_len(2, 0);
  f.all(39, f.d.params, "seq_lens[0] = 40 exceeds max_seq_len = 39");
  f.all(-1, f.d.params, "max_seq_len must not be negative, got -1");
  const int columns = f.host.max_blocks_per_seq;
  f.set_len(1, columns * 16 + 1);
  f.all(columns * 16 + 1, f.d.params, "seq_lens[1] = " + std::to_string(columns * 16 + 1) + " needs more blocks");
}

// With check_indices off the kernels trust seq_lens; a length beyond max_seq_len then makes a
// call attend the sequence's first ceil(max_seq_len / partition_size) partitions, and nothing is
// read or written past the views it was given. The v2 triple here is a window of larger arrays
// whose other partitions hold NaN: reading one would show in the output.
TYPED_TEST(ArgumentErrors, UncheckedLengthsBeyondMaxSeqLenStayInsideTheirPartitions) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  Fixture<Space, float> f(small_spec());  // sequence 0 holds 40 tokens
  auto unchecked = f.d.params;
  unchecked.check_indices = false;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Kokkos::View<float***, Kokkos::LayoutRight, MS> all_sums("sums", 3, 4, 4), all_maxes("maxes", 3, 4, 4);
  Kokkos::View<float****, Kokkos::LayoutRight, MS> all_tmp("tmp", 3, 4, 4, 64);
  Kokkos::deep_copy(all_sums, nan);
  Kokkos::deep_copy(all_maxes, nan);
  Kokkos::deep_copy(all_tmp, nan);
  const auto first_two = std::pair<int, int>(0, 2);  // ceil(max_seq_len 20 / 16) partitions
  const auto sums = Kokkos::subview(all_sums, Kokkos::ALL, Kokkos::ALL, first_two);
  const auto maxes = Kokkos::subview(all_maxes, Kokkos::ALL, Kokkos::ALL, first_two);
  const auto tmp = Kokkos::subview(all_tmp, Kokkos::ALL, Kokkos::ALL, first_two, Kokkos::ALL);
  const auto v2 = [&](const kpa::AttentionParams& params) {
    kpa::paged_attention_v2(Space(), f.d.out, sums, maxes, tmp, f.d.query, f.d.key_cache, f.d.value_cache,
                            f.d.block_tables, f.d.seq_lens, 20, f.d.alibi, params, 16);
  };
  EXPECT_THROW(v2(f.d.params), kpa::Error);
  v2(unchecked);
  Space().fence();
  // The expected result: sequence 0 over its first 32 tokens, the others whole.
  std::vector<double> expected = reference_attention(f.host);
  for (int h = 0; h < f.host.num_heads; ++h) {
    const ReferencePart part = reference_part(f.host, 0, h, 0, 32);
    for (int d = 0; d < f.host.head_size; ++d) expected[h * f.host.head_size + d] = part.out[d];
  }
  expect_close_to_reference<float>(f.d.out, expected, "v2, unchecked length beyond max_seq_len");
  const auto host_sums = kpa::detail::compat::host_copy(all_sums);
  for (int s = 0; s < 3; ++s)
    for (int h = 0; h < 4; ++h)
      for (int p = 2; p < 4; ++p) EXPECT_TRUE(std::isnan(host_sums(s, h, p))) << "exp_sums written past the view";
  f.v1(20, unchecked);
  expect_close_to_reference<float>(f.d.out, expected, "v1, unchecked length beyond max_seq_len");
}

// Sizes that would overflow int arithmetic inside the kernels are refused up front.
TYPED_TEST(ArgumentErrors, SizesNearIntMaxAreRefused) {
  Fixture<TypeParam, float> f(small_spec());
  const int near_max = std::numeric_limits<int>::max() - 1;
  f.all(near_max, f.d.params, "exceeds the supported maximum");
  auto unchecked = f.d.params;
  unchecked.check_indices = false;
  expect_error([&] { f.v1(near_max, unchecked); }, "exceeds the supported maximum");
}

// A block size of 0 with a block-sparse pattern is an error, not a division by zero.
TYPED_TEST(ArgumentErrors, ZeroBlockSizeWithSparsityIsAnError) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  Fixture<Space, float> f(small_spec());
  Kokkos::View<float*****, Kokkos::LayoutRight, MS> key_cache("k", 4, 2, 16, 0, 4);
  Kokkos::View<float****, Kokkos::LayoutRight, MS> value_cache("v", 4, 2, 64, 0);
  auto params = f.d.params;
  params.block_sparse.vert_stride = 4;
  params.block_sparse.block_size = 16;
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), f.d.out, f.d.query, key_cache, value_cache, f.d.block_tables, f.d.seq_lens,
                                40, f.d.alibi, params);
      },
      "block_size (key_cache.extent(3)) must be positive, got 0");
}

TYPED_TEST(ArgumentErrors, KvCacheDtypeMustMatchTheCacheElement) {
  using Space = TypeParam;
  Fixture<Space, float> f(small_spec());
  auto params = f.d.params;
  params.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
  f.all(40, params, "kv_cache_dtype fp8_e4m3 does not match a 4-byte cache element");
  // A one-byte cache is an fp8 cache: "auto" cannot describe it.
  Kokkos::View<std::uint8_t*****, Kokkos::LayoutRight, typename Space::memory_space> k8("k8", 4, 2, 4, 16, 16);
  Kokkos::View<std::uint8_t****, Kokkos::LayoutRight, typename Space::memory_space> v8("v8", 4, 2, 64, 16);
  auto run = [&](const kpa::AttentionParams& p) {
    kpa::paged_attention_v1(Space(), f.d.out, f.d.query, k8, v8, f.d.block_tables, f.d.seq_lens, 40, f.d.alibi, p);
  };
  expect_error([&] { run(f.d.params); }, "kv_cache_dtype auto does not match a 1-byte cache element");
  params.k_scale = 0.0f;
  expect_error([&] { run(params); }, "fp8 scales must be positive, got k_scale 0");
}

TYPED_TEST(ArgumentErrors, InvalidBlockSparseCombinations) {
  Fixture<TypeParam, float> f(small_spec());
  auto params = f.d.params;
  params.block_sparse.vert_stride = 4;
  params.block_sparse.block_size = 24;  // not a multiple of the cache block size 16
  f.all(40, params, "block_sparse.block_size 24 is not a positive multiple of block_size 16");
  params.block_sparse.block_size = 32;
  params.block_sparse.local_blocks = -1;
  f.all(40, params, "block_sparse.local_blocks must not be negative, got -1");
  params.block_sparse.local_blocks = 1;
  params.tp_rank = -2;
  f.all(40, params, "tp_rank must not be negative, got -2");
  // vert_stride <= 1 is dense attention: the other fields are not looked at.
  params = f.d.params;
  params.block_sparse.vert_stride = 1;
  params.block_sparse.block_size = 24;
  EXPECT_NO_THROW(f.v1(40, params));
}

TYPED_TEST(ArgumentErrors, ShapesThatDoNotFit) {
  using Space = TypeParam;
  using MS = typename Space::memory_space;
  {
    auto spec = small_spec();
    spec.num_heads = 6;
    spec.num_kv_heads = 4;
    Fixture<Space, float> f(spec);
    f.all(40, f.d.params, "num_heads 6 is not a multiple of num_kv_heads 4");
  }
  {
    auto spec = small_spec();
    spec.head_size = 520;
    Fixture<Space, float> f(spec);
    f.all(40, f.d.params, "head_size 520 is not supported");
    EXPECT_THROW(f.v1(40, f.d.params), kpa::UnsupportedError);
  }
  {
    // x = 8 for 2-byte caches: head_size 20 cannot be laid out.
    auto spec = small_spec();
    spec.head_size = 20;
    spec.num_heads = 2;
    spec.num_kv_heads = 2;
    const HostProblem host = make_problem<float>(spec);
    Kokkos::View<kpa::half***, Kokkos::LayoutRight, MS> q("q", 3, 2, 20), out("out", 3, 2, 20);
    Kokkos::View<kpa::half*****, Kokkos::LayoutRight, MS> k("k", 8, 2, 2, 16, 8);
    Kokkos::View<kpa::half****, Kokkos::LayoutRight, MS> v("v", 8, 2, 20, 16);
    DeviceProblem<float, Space> d(host);
    expect_error(
        [&] {
          kpa::paged_attention_v1(Space(), out, q, k, v, d.block_tables, d.seq_lens, 40, d.alibi, d.params);
        },
        "head_size 20 is not supported (need a multiple of x = 8");
  }
  Fixture<Space, float> f(small_spec());
  Kokkos::View<float***, Kokkos::LayoutRight, MS> wrong_out("out", 3, 4, 32);
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), wrong_out, f.d.query, f.d.key_cache, f.d.value_cache, f.d.block_tables,
                                f.d.seq_lens, 40, f.d.alibi, f.d.params);
      },
      "out extents [3, 4, 32] differ from query extents [3, 4, 64]");
  Kokkos::View<float*, MS> wrong_alibi("alibi", 3);
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), f.d.out, f.d.query, f.d.key_cache, f.d.value_cache, f.d.block_tables,
                                f.d.seq_lens, 40, wrong_alibi, f.d.params);
      },
      "alibi_slopes has 3 entries, expected 0 or num_heads = 4");
  Kokkos::View<float****, Kokkos::LayoutRight, MS> wrong_values("v", f.host.num_blocks, 2, 64, 8);
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), f.d.out, f.d.query, f.d.key_cache, wrong_values, f.d.block_tables,
                                f.d.seq_lens, 40, f.d.alibi, f.d.params);
      },
      "value_cache extents");
  Kokkos::View<int*, MS> short_lens("lens", 2);
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), f.d.out, f.d.query, f.d.key_cache, f.d.value_cache, f.d.block_tables,
                                short_lens, 40, f.d.alibi, f.d.params);
      },
      "seq_lens has 2 entries, expected num_seqs = 3");
}

TYPED_TEST(ArgumentErrors, V2Intermediates) {
  using Space = TypeParam;
  Fixture<Space, float> f(small_spec());
  auto v2 = [&](int partition_size, int partitions, int head_size) {
    Kokkos::View<float***, Kokkos::LayoutRight, typename Space::memory_space> sums("s", 3, 4, partitions),
        maxes("m", 3, 4, partitions);
    Kokkos::View<float****, Kokkos::LayoutRight, typename Space::memory_space> tmp("t", 3, 4, partitions, head_size);
    kpa::paged_attention_v2(Space(), f.d.out, sums, maxes, tmp, f.d.query, f.d.key_cache, f.d.value_cache,
                            f.d.block_tables, f.d.seq_lens, 40, f.d.alibi, f.d.params, partition_size);
  };
  EXPECT_NO_THROW(v2(16, 3, 64));
  expect_error([&] { v2(16, 2, 64); }, "max_num_partitions (exp_sums.extent(2)) = 2 is less than ceil(max_seq_len 40 / partition_size 16) = 3");
  expect_error([&] { v2(24, 2, 64); }, "partition_size 24 is not a positive multiple of block_size 16");
  expect_error([&] { v2(0, 2, 64); }, "partition_size 0");
  expect_error([&] { v2(16, 3, 32); }, "tmp_out extents");
}

TYPED_TEST(ArgumentErrors, TeamSizeTheBackEndCannotRun) {
  using Space = TypeParam;
  Fixture<Space, float> f(small_spec());
  kpa::PlanOptions options;
  options.team_size = 4096;
  expect_error(
      [&] {
        kpa::paged_attention_v1(Space(), f.d.out, f.d.query, f.d.key_cache, f.d.value_cache, f.d.block_tables,
                                f.d.seq_lens, 40, f.d.alibi, f.d.params, options);
      },
      "team_size 4096");
}

}  // namespace
