// The AMX tile mapping (src/host_loops/amx_tiles.hpp): the software model against the
// architecture's definition of the instructions the AMX loops use (pair layout, row strides,
// accumulation, the subnormal rule, the shapes tdpbf16ps accepts), and, on CPUs with AMX, the
// instructions against the model. The loops on the model run in test_host_loops.cpp and in
// every attention test over bf16 and fp8 caches (attention_runner.hpp).

#include <kpa/host_isa.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))  // the mapping's assembly is x86's
#include "host_loops/amx_tiles.hpp"
#if !defined(__CUDACC__)
#include "host_loops/amx.hpp"
#endif

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

namespace {

using kpa::detail::amx::AmxTiles;
using kpa::detail::amx::TileConfig;
using kpa::detail::amx::TileModel;

std::uint16_t bf16(float x) {  // x must be exact in bf16
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// C[M][N] += A[M][2K] . B[K][N][2] on the tiles of Tiles, A and B in memory with row strides
/// of their own (in elements) to check that loads honour strides; returns C.
template <class Tiles>
std::vector<float> tile_product(int M, int N, int K, const std::vector<std::uint16_t>& a, int a_stride,
                                const std::vector<std::uint16_t>& b, int b_stride, const std::vector<float>& c0) {
  TileConfig config;
  config.set(0, M, 4 * N);
  config.set(1, M, 4 * K);
  config.set(2, K, 4 * N);
  std::vector<float> c(c0);
  Tiles::configure(config);
  Tiles::template load<0>(c.data(), 4 * N);
  Tiles::template load<1>(a.data(), 2 * a_stride);
  Tiles::template load<2>(b.data(), 2 * b_stride);
  Tiles::template dot_bf16<0, 1, 2>();
  Tiles::template store<0>(c.data(), 4 * N);
  Tiles::release();
  return c;
}

struct Case {
  int M, N, K, a_stride, b_stride;
  std::vector<std::uint16_t> a, b;
  std::vector<float> c0;
  std::vector<double> expected;  // exact: small integers
};

Case integer_case(int M, int N, int K, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-8, 8);
  Case t{M, N, K, 2 * K + 6, 2 * N + 4, {}, {}, {}, {}};
  t.a.assign(static_cast<std::size_t>(M) * t.a_stride, bf16(1000.0f));  // padding the tile must skip
  t.b.assign(static_cast<std::size_t>(K) * t.b_stride, bf16(1000.0f));
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < 2 * K; ++i) t.a[m * t.a_stride + i] = bf16(static_cast<float>(small(rng)));
  for (int k = 0; k < K; ++k)
    for (int i = 0; i < 2 * N; ++i) t.b[k * t.b_stride + i] = bf16(static_cast<float>(small(rng)));
  t.c0.resize(static_cast<std::size_t>(M) * N);
  for (float& v : t.c0) v = static_cast<float>(small(rng));
  t.expected.resize(t.c0.size());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double sum = t.c0[m * N + n];
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < 2; ++j) {
          float x, y;
          const std::uint32_t xa = static_cast<std::uint32_t>(t.a[m * t.a_stride + 2 * k + j]) << 16;
          const std::uint32_t yb = static_cast<std::uint32_t>(t.b[k * t.b_stride + 2 * n + j]) << 16;
          std::memcpy(&x, &xa, 4);
          std::memcpy(&y, &yb, 4);
          sum += static_cast<double>(x) * y;  // A's pair k meets B's row k, element by element
        }
      t.expected[m * N + n] = sum;
    }
  return t;
}

// Sums of small integers are exact whatever the order: the model must give the definition's
// value in every element, for full and partial tiles.
TEST(AmxTileModel, ComputesTheTileProductOfBf16Pairs) {
  for (auto [M, N, K] : {std::tuple{16, 16, 16}, std::tuple{16, 4, 16}, std::tuple{16, 1, 8}, std::tuple{5, 3, 2}}) {
    const Case t = integer_case(M, N, K, static_cast<unsigned>(M * 100 + N * 10 + K));
    const std::vector<float> c = tile_product<TileModel>(M, N, K, t.a, t.a_stride, t.b, t.b_stride, t.c0);
    for (std::size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], t.expected[i]) << M << "x" << N << "x" << K << " at " << i;
  }
}

// Each product joins the sum in order and the sum is rounded each time: 1 + 2^-24 + 2^-24
// stays 1 in f32 (where one rounding of the whole sum would give 1 + 2^-23).
TEST(AmxTileModel, RoundsEachSumInOrder) {
  std::vector<std::uint16_t> a(2, bf16(0x1p-24f)), b(2, bf16(1.0f));
  const std::vector<float> c = tile_product<TileModel>(1, 1, 1, a, 2, b, 2, {1.0f});
  EXPECT_EQ(c[0], 1.0f);
}

// Inputs below 2^-126 count as zero, and so does a sum below 2^-126.
TEST(AmxTileModel, FlushesSubnormalInputsAndResults) {
  const std::uint16_t subnormal = 0x0040;  // 2^-127
  std::vector<std::uint16_t> a{subnormal, bf16(0x1p-100f)}, b{bf16(0x1p100f), bf16(0x1p-30f)};
  const std::vector<float> c = tile_product<TileModel>(1, 1, 1, a, 2, b, 2, {0.0f});
  EXPECT_EQ(c[0], 0.0f) << "2^-127 * 2^100 must count as 0, and 2^-100 * 2^-30 flushes";
  std::vector<std::uint16_t> a2{bf16(0x1p-63f), bf16(0.0f)}, b2{bf16(0x1p-63f), bf16(0.0f)};
  EXPECT_EQ(tile_product<TileModel>(1, 1, 1, a2, 2, b2, 2, {0.0f})[0], 0x1p-126f) << "the smallest normal stays";
}

void product_of(const TileConfig& config) {
  TileModel::configure(config);
  TileModel::dot_bf16<0, 1, 2>();
}
void zero_tile_3(const TileConfig& config) {
  TileModel::configure(config);
  TileModel::zero<3>();
}
void zero_after_release() {
  TileModel::release();
  TileModel::zero<0>();
}

// What the CPU faults on, the model aborts on: a product of tiles whose shapes do not chain,
// a tile the configuration leaves unused, an instruction before ldtilecfg, a shape past 16 x 64.
TEST(AmxTileModelDeathTest, RefusesWhatTheInstructionsDoNotAccept) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TileConfig mismatched;
  mismatched.set(0, 16, 64);
  mismatched.set(1, 16, 64);
  mismatched.set(2, 8, 64);  // A's 16 pairs need 16 rows of B
  EXPECT_DEATH(product_of(mismatched), "tile shapes do not match");
  TileConfig partial;
  partial.set(0, 16, 64);
  EXPECT_DEATH(zero_tile_3(partial), "tmm3, which the configuration leaves unused");
  EXPECT_DEATH(zero_after_release(), "without ldtilecfg");
  TileConfig too_wide;
  too_wide.set(0, 16, 128);
  EXPECT_DEATH(TileModel::configure(too_wide), "out of range");
  TileConfig chained = mismatched;
  chained.set(2, 16, 64);
  product_of(chained);  // the control: shapes that chain
  TileModel::release();
}

// On CPUs with AMX: the instructions give the model's result (exact cases, so any order agrees).
TEST(AmxTiles, MatchTheModel) {
  if (kpa::detail::cpu_host_isa() != kpa::HostIsa::Amx) GTEST_SKIP() << "this CPU has no AMX-BF16 (or no tile permission)";
  for (auto [M, N, K] : {std::tuple{16, 16, 16}, std::tuple{16, 4, 16}, std::tuple{5, 3, 2}}) {
    const Case t = integer_case(M, N, K, static_cast<unsigned>(M + N + K));
    EXPECT_EQ((tile_product<AmxTiles>(M, N, K, t.a, t.a_stride, t.b, t.b_stride, t.c0)),
              (tile_product<TileModel>(M, N, K, t.a, t.a_stride, t.b, t.b_stride, t.c0)));
  }
}


// configured_as, by which the loops skip loading a configuration the tiles have: true for the
// configuration loaded last only, false once the tiles are released (the model and, on CPUs with
// AMX, the instructions).
template <class Tiles>
void check_configured_as() {
  TileConfig a, b;
  a.set(0, 16, 64);
  a.set(1, 16, 64);
  b.set(0, 16, 64);
  b.set(1, 8, 64);
  Tiles::release();
  EXPECT_FALSE(Tiles::configured_as(a)) << "released";
  Tiles::configure(a);
  EXPECT_TRUE(Tiles::configured_as(a));
  EXPECT_FALSE(Tiles::configured_as(b));
  Tiles::configure(b);
  EXPECT_TRUE(Tiles::configured_as(b));
  EXPECT_FALSE(Tiles::configured_as(a));
  Tiles::release();
  EXPECT_FALSE(Tiles::configured_as(b));
}

TEST(AmxTileModel, KnowsTheConfigurationItHas) { check_configured_as<TileModel>(); }

TEST(AmxTiles, KnowTheConfigurationTheyHave) {
  if (kpa::detail::cpu_host_isa() != kpa::HostIsa::Amx) GTEST_SKIP() << "this CPU has no AMX-BF16 (or no tile permission)";
  check_configured_as<AmxTiles>();
}
#if !defined(__CUDACC__)  // the code around the tiles is AVX2, which host_loops.cpp leaves out of device compilers
// The query in tile form (amx::prepare_query): its bf16 parts sum to it exactly, and there are as
// many as it needs: one for a query of bf16 values, two for f16 values, three for floats; with
// the model's AVX2 splitting and, where the CPU has AMX, the AVX512-BF16 one.
template <class Tiles>
void check_query_split() {
  constexpr int H = 4, D = 64;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> q(H * D);
  for (int needed = 1; needed <= 3; ++needed) {
    for (float& v : q) {
      const float x = uniform(rng);
      v = needed == 1 ? kpa::to_float(kpa::detail::from_float<kpa::bfloat16>(x))
                      : (needed == 2 ? kpa::to_float(kpa::detail::from_float<kpa::half>(x)) : x);
    }
    const kpa::detail::QueryTiles tiles = kpa::detail::amx::prepare_query<H, Tiles>(q.data(), D);
    EXPECT_EQ(tiles.parts, needed);
    for (int g = 0; g < H; ++g) {
      for (int i = 0; i < D; ++i) {
        double sum = 0.0;
        for (int p = 0; p < tiles.parts; ++p) {
          const std::uint32_t word = tiles.words[p * (H * D / 2) + g * (D / 2) + i / 2];
          const std::uint32_t bits = (i % 2 == 0 ? word & 0xffffu : word >> 16) << 16;
          float part;
          std::memcpy(&part, &bits, 4);
          sum += part;
        }
        EXPECT_EQ(sum, static_cast<double>(q[g * D + i])) << "row " << g << " element " << i << " of a query needing "
                                                          << needed << " parts";
      }
    }
  }
}

TEST(AmxLoops, SplitTheQueryIntoThePartsItNeeds) {
  if (kpa::detail::cpu_host_isa() < kpa::HostIsa::Avx2) GTEST_SKIP() << "the code around the tiles is AVX2";
  check_query_split<TileModel>();
  if (kpa::detail::cpu_host_isa() == kpa::HostIsa::Amx) check_query_split<AmxTiles>();
}

// The two splittings of rows into bf16 parts give the same codes, but for subnormal floats (the
// AVX512-BF16 one reads them as zeros, as the tile instruction reads their codes): partly filled
// and padded rows, rounding ties, NaN, the largest values. (An infinity's remainder is inf - inf,
// which the test main traps.)
TEST(AmxLoops, SplittingsAgree) {
  if (!__builtin_cpu_supports("avx512bf16")) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  constexpr int H = 3, kStride = 80, kPadded = 64;
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<float> rows(H * kStride);
  for (float& v : rows) v = uniform(rng);
  const float specials[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, -0.0f, std::numeric_limits<float>::quiet_NaN(), 0x1p-126f, 3e38f};
  for (std::size_t i = 0; i < std::size(specials); ++i) rows[kStride + 5 * i] = specials[i];
  for (int n : {kPadded, 45, 16, 1}) {
    for (int parts = 1; parts <= kpa::detail::amx::kParts; ++parts) {
      std::vector<std::uint16_t> model(kpa::detail::amx::kParts * H * kPadded, 0xdead), avx512 = model;
      const int model_parts = kpa::detail::amx::split_rows<H>(rows.data(), kStride, n, kPadded, parts, model.data(), kPadded,
                                                              H * kPadded);
      const int avx512_parts = kpa::detail::amx::split_rows_avx512_bf16<H>(rows.data(), kStride, n, kPadded, parts,
                                                                           avx512.data(), kPadded, H * kPadded);
      EXPECT_EQ(model_parts, avx512_parts) << n << " elements, " << parts << " parts";
      const auto nan = [](std::uint16_t code) { return (code & 0x7fffu) > 0x7f80u; };  // either sign
      for (std::size_t i = 0; i < model.size(); ++i) {
        if (model[i] != avx512[i] && !(nan(model[i]) && nan(avx512[i]))) {
          ADD_FAILURE() << n << " elements, " << parts << " parts: code " << i << " " << model[i] << " and " << avx512[i];
        }
      }
    }
  }
}
#endif

}  // namespace
#endif
