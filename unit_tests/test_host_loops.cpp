// The host path's inner loops (detail/host_loops.hpp) on their own, for every instruction set
// (an instruction set this CPU lacks reports a skip), against float64 sums written here: every cache type, odd block and head
// sizes, partly filled blocks whose unused slots hold NaN, skipped blocks, and the exp's special
// values. The attention tests cover them again inside the kernels.

#include "problem.hpp"

#include <kpa/detail/host_loops.hpp>
#include <kpa/host_isa.hpp>

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using kpa::HostIsa;
using kpa::detail::Passes;

std::string name_of(HostIsa isa) { return std::string(kpa::to_string(isa)); }

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// One instruction set per test instance; skipped where this CPU (or this build) lacks it.
class HostLoops : public ::testing::TestWithParam<HostIsa> {
 protected:
  void SetUp() override {
    if (!kpa::detail::host_isa_runs(GetParam(), kpa::detail::best_host_isa())) {
      GTEST_SKIP() << name_of(GetParam()) << " is not available here (best: "
                   << name_of(kpa::detail::best_host_isa()) << ")";
    }
  }
  HostIsa isa() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(AllInstructionSets, HostLoops,
                         ::testing::Values(HostIsa::Portable, HostIsa::Avx2, HostIsa::Avx512, HostIsa::Avx512Vbmi,
                                           HostIsa::Amx, HostIsa::AmxModel),
                         [](const ::testing::TestParamInfo<HostIsa>& info) {
                           std::string name = name_of(info.param);  // amx-model: amx_model
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

bool tiles(HostIsa isa) { return isa == HostIsa::Amx || isa == HostIsa::AmxModel; }

/// The loop tables a set has: the tile sets one for tiles of one pass and one for the passes of
/// tiles of several (Passes); the others one for both.
std::vector<Passes> tables(HostIsa isa) {
  return tiles(isa) ? std::vector<Passes>{Passes::One, Passes::Several} : std::vector<Passes>{Passes::One};
}

/// Whether the loops for passes of `rows` rows are the tile products (AMX, or its model).
bool on_tiles(HostIsa isa, Passes passes, int rows) {
  return tiles(isa) && kpa::detail::tile_loops_serve(passes, rows);
}

// The table runs the set asked for wherever that set has the loop: a test of one set never
// measures another.
TEST_P(HostLoops, SelectsTheSetAskedFor) {
  using kpa::detail::host_loops;
  const HostIsa vector = kpa::detail::vector_isa(isa());  // the tile sets' own vector set
  // VBMI serves fp8 only; the model of Amx runs its 16-lane loops on AVX2 registers.
  const HostIsa want =
      isa() == HostIsa::AmxModel ? HostIsa::AmxModel : (vector == HostIsa::Avx512Vbmi ? HostIsa::Avx512 : vector);
  const HostIsa fp8 = isa() == HostIsa::Amx ? HostIsa::Avx512Vbmi : isa();  // fp8, tiles of one pass
  for (Passes passes : tables(isa())) {
    const bool tile = on_tiles(isa(), passes, 4);
    EXPECT_EQ((host_loops<4, kpa::half>(isa(), 128, 16, passes).isa), want);  // tiles: bf16 and fp8
    EXPECT_EQ((host_loops<4, kpa::fp8_e4m3>(isa(), 128, 16, passes).isa), tile ? isa() : fp8);
    const HostIsa f32 = vector > HostIsa::Avx2 ? HostIsa::Avx2 : vector;  // f32 caches: at most AVX2
    EXPECT_EQ((host_loops<1, float>(isa(), 64, 16, passes).isa), f32);
    // 16 rows fill the tiles: tile loops for passes of one as well.
    const bool tile16 = on_tiles(isa(), passes, 16);
    EXPECT_EQ(tile16, tiles(isa()));
    const auto bf16 = host_loops<16, kpa::bfloat16>(isa(), 128, 32, passes);
    EXPECT_EQ(bf16.isa, tile16 ? isa() : want);
    EXPECT_EQ(bf16.prepare_query != nullptr, tile16);
    EXPECT_EQ((host_loops<32, kpa::bfloat16>(isa(), 128, 32, passes).isa), on_tiles(isa(), passes, 32) ? isa() : want);
    // Sizes the tiles do not take (head sizes not a multiple of 32, blocks not of 16): vector loops.
    const auto odd = host_loops<16, kpa::bfloat16>(isa(), 80, 12, passes);
    EXPECT_EQ(odd.isa, want);
    EXPECT_EQ(odd.prepare_query, nullptr);
    // p.V of blocks of 12 runs on 8 lanes in every x86 set; of 16, on 16 where the set has them.
    const auto avx2 = host_loops<4, kpa::half>(HostIsa::Avx2, 64, 16, Passes::One);
    EXPECT_EQ((host_loops<4, kpa::half>(isa(), 64, 12, passes).chunk_values == avx2.chunk_values),
              vector >= HostIsa::Avx2);
    EXPECT_EQ((host_loops<4, kpa::half>(isa(), 64, 16, passes).chunk_values == avx2.chunk_values),
              want == HostIsa::Avx2);
  }
}

/// Runs the set's q.k on `args`, preparing the query first where the set has that step (whose
/// logits are then unscaled, as args.q holds no scale: the same logits).
template <int H, class S>
void run_block_logits(const kpa::detail::HostLoops<H, S>& loops, kpa::detail::BlockLogitsArgs<S> args) {
  if (loops.prepare_query != nullptr) args.q_tiles = loops.prepare_query(args.q, args.head_size);
  kpa::detail::BlockPrefetcher idle;
  loops.block_logits(args, idle);
}

// The soft cap's vectorised tanh: within 4e-7 * cap of tanh in float64 over the whole range
// (including where tanh saturates and near 0), -inf stays -inf, +inf gives cap, NaN stays NaN;
// every row length (masked tails).
TEST_P(HostLoops, RowSoftCapMatchesTanh) {
  const HostIsa isa = this->isa();
  {
    const auto rows = kpa::detail::host_row_loops(isa);
    for (float cap : {0.25f, 30.0f, 50.0f}) {
      std::vector<float> x;
      for (float v = -40.0f * cap; v <= 40.0f * cap; v += 0.0173f * cap) x.push_back(v);
      for (float v : {0.0f, 1e-6f, -1e-6f, -kInf, kInf, kNan}) x.push_back(v);
      for (int n : {static_cast<int>(x.size()), 1, 7, 9}) {
        std::vector<float> p(x.begin(), x.begin() + n);
        rows.soft_cap(p.data(), n, cap);
        for (int i = 0; i < n; ++i) {
          if (std::isnan(x[i])) {
            EXPECT_TRUE(std::isnan(p[i])) << name_of(isa);
          } else if (x[i] == -kInf) {
            EXPECT_EQ(p[i], -kInf) << name_of(isa);
          } else {
            const double want = cap * std::tanh(static_cast<double>(x[i]) / cap);
            EXPECT_NEAR(p[i], want, 4e-7 * cap) << name_of(isa) << " cap " << cap << " x " << x[i];
          }
        }
      }
    }
  }
}

// The softmax's scale: the same bits as the softmax of the logits multiplied first (rounded), its
// max in scaled units against the floor, for every row length (masked tails) and special values.
TEST_P(HostLoops, RowSoftmaxScalesFirst) {
  const auto rows = kpa::detail::host_row_loops(isa());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f);
  for (int n : {1, 7, 16, 63, 64, 65, 200}) {
    for (float scale : {0.08838835f, 1.7f, -0.5f}) {  // a negative scale turns the order round
      std::vector<float> x(n);
      for (float& v : x) v = uniform(rng);
      if (n > 5) {
        x[2] = scale > 0.0f ? -kInf : kInf;  // a masked key, scaled: -inf
        x[5] = kNan;
      }
      std::vector<float> scaled = x, premultiplied = x;
      for (float& v : premultiplied) v *= scale;
      float max_scaled = 0.0f, max_premultiplied = 0.0f;
      const float floor = 0.5f * scale * uniform(rng);
      const float sum = rows.softmax(scaled.data(), n, scale, floor, &max_scaled);
      const float want = rows.softmax(premultiplied.data(), n, 1.0f, floor, &max_premultiplied);
      EXPECT_EQ(max_scaled, max_premultiplied) << name_of(isa()) << " n " << n;
      EXPECT_TRUE(sum == want || (std::isnan(sum) && std::isnan(want))) << name_of(isa()) << " n " << n;
      for (int i = 0; i < n; ++i) {
        std::uint32_t a, b;
        std::memcpy(&a, &scaled[i], 4);
        std::memcpy(&b, &premultiplied[i], 4);
        ASSERT_EQ(a, b) << name_of(isa()) << " n " << n << " i " << i;
      }
    }
  }
}

// The softmax that leaves bf16 codes, as the set's loops run it: the same max as the softmax, the
// same sum to the rounding of its additions (a set may run another set's, which adds in another
// order), each probability's code rounded to nearest even (NaN a NaN; a subnormal float may give
// 0, which the tiles read alike), zeros to the padded end, for every row length.
TEST_P(HostLoops, RowSoftmaxToBf16RoundsTheSoftmax) {
  const auto rows = kpa::detail::host_loops<8, kpa::bfloat16>(isa(), 128, 64, Passes::Several).rows;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f);
  for (int n : {1, 7, 8, 16, 31, 63, 64, 65, 200}) {
    for (float scale : {1.0f, 0.08838835f}) {
      for (int special = 0; special < 3; ++special) {  // none; a masked key and a NaN; all masked
        std::vector<float> x(static_cast<std::size_t>(n + 32));
        for (int i = 0; i < n; ++i) x[i] = special == 2 ? -kInf : uniform(rng);
        if (special == 1 && n > 5) {
          x[2] = -kInf;
          x[5] = kNan;
        }
        const int n_padded = (n + 15) / 16 * 16;
        std::vector<float> floats = x, codes = x;
        float max_floats = 0.0f, max_codes = 0.0f;
        const float floor = special == 2 ? -kInf : 0.25f * uniform(rng);
        const float sum = rows.softmax(floats.data(), n, scale, floor, &max_floats);
        const float sum_codes = rows.softmax_to_bf16(codes.data(), n, n_padded, scale, floor, &max_codes);
        const std::string where = std::string(name_of(isa())) + " n " + std::to_string(n) + " case " + std::to_string(special);
        EXPECT_TRUE(max_codes == max_floats || (std::isnan(max_codes) && std::isnan(max_floats))) << where;
        if (std::isnan(sum)) {
          EXPECT_TRUE(std::isnan(sum_codes)) << where;
        } else {
          EXPECT_NEAR(sum_codes, sum, 0x1p-23f * static_cast<float>(n) * sum) << where;
        }
        std::vector<std::uint16_t> got(static_cast<std::size_t>(n_padded));
        std::memcpy(got.data(), codes.data(), got.size() * 2);
        for (int i = 0; i < n_padded; ++i) {
          if (i < n && std::isnan(floats[i])) {
            EXPECT_GT(got[i] & 0x7fff, 0x7f80) << where << " i " << i;
          } else if (i < n && floats[i] < 0x1p-126f && got[i] == 0) {
            continue;
          } else {
            const std::uint16_t want = i < n ? kpa::detail::from_float<kpa::bfloat16>(floats[i]).bits : 0;
            ASSERT_EQ(got[i], want) << where << " i " << i;
          }
        }
      }
    }
  }
}

TEST_P(HostLoops, RowSoftmaxMatchesStdExpAndKeepsSpecialValues) {
  const HostIsa isa = this->isa();
  {
    const auto rows = kpa::detail::host_row_loops(isa);
    std::vector<float> x;
    for (float v = -100.0f; v <= 0.0f; v += 0.0371f) x.push_back(v);
    x.push_back(-kInf);
    x.push_back(kNan);
    x.push_back(-87.0f);
    x.push_back(-88.0f);
    x.push_back(0.0f);
    std::vector<float> p(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) p[i] = x[i] + 0.5f;  // the row's max is 0.5
    float max = 0.0f;
    const float sum = rows.softmax(p.data(), static_cast<int>(p.size()), 1.0f, -kInf, &max);
    EXPECT_EQ(max, 0.5f) << name_of(isa) << ": NaN is ignored by the max";
    EXPECT_TRUE(std::isnan(sum)) << name_of(isa) << ": a NaN logit makes the sum NaN";
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double expected = std::exp(static_cast<double>(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(p[i])) << name_of(isa);
      } else if (expected < 1.2e-38) {  // below the smallest normal float: flushed to zero is fine
        EXPECT_LE(p[i], 1.2e-38f) << name_of(isa) << " x = " << x[i];
        EXPECT_GE(p[i], 0.0f) << name_of(isa) << " x = " << x[i];
      } else {
        EXPECT_NEAR(p[i], expected, 4e-7 * expected) << name_of(isa) << " x = " << x[i];
      }
    }
  }
  // The vector sets share one polynomial: a row's probabilities are the same bits on each,
  // down to the smallest ones, which scale into subnormals.
  if (isa != HostIsa::Portable && isa != HostIsa::Avx2) {
    std::vector<float> x;
    for (float v = -90.0f; v <= 0.0f; v += 0.0093f) x.push_back(v);
    for (float v = -87.3366f; v <= -87.3364f; v = std::nextafter(v, 0.0f)) x.push_back(v);
    std::vector<float> p = x, q = x;
    float max_p = 0.0f, max_q = 0.0f;
    const float sum_p = kpa::detail::host_row_loops(isa).softmax(p.data(), static_cast<int>(p.size()), 1.0f, 0.0f, &max_p);
    const float sum_q =
        kpa::detail::host_row_loops(HostIsa::Avx2).softmax(q.data(), static_cast<int>(q.size()), 1.0f, 0.0f, &max_q);
    EXPECT_EQ(max_p, max_q) << name_of(isa);
    EXPECT_NEAR(sum_p, sum_q, 1e-6f * sum_q) << name_of(isa) << ": the same terms, summed in another order";
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::uint32_t a, b;
      std::memcpy(&a, &p[i], 4);
      std::memcpy(&b, &q[i], 4);
      ASSERT_EQ(a, b) << name_of(isa) << " x = " << x[i];
    }
  }
}

// ALiBi's ramp, then the softmax with a floor on its max.
TEST_P(HostLoops, RampThenSoftmaxTakesTheFloor) {
  const HostIsa isa = this->isa();
  {
    const auto rows = kpa::detail::host_row_loops(isa);
    for (int n = 0; n <= 19; ++n) {
      std::vector<float> logits(n);
      for (int i = 0; i < n; ++i) logits[i] = std::sin(1.7f * i);
      for (float floor : {-kInf, 0.3f, 5.0f}) {
        const float slope = 0.25f, position = -static_cast<float>(n) + 1;
        std::vector<float> p = logits;
        float max = 0.0f;
        rows.add_ramp(p.data(), n, slope, position);
        const float sum = rows.softmax(p.data(), n, 1.0f, floor, &max);
        double expected_max = floor, expected_sum = 0.0;
        for (int i = 0; i < n; ++i) expected_max = std::max(expected_max, logits[i] + slope * (position + i) + 0.0);
        if (expected_max == -kInf) {  // n = 0 with no floor (EXPECT_NEAR of infinities is NaN)
          EXPECT_EQ(max, -kInf) << name_of(isa);
        } else {
          EXPECT_NEAR(max, expected_max, 1e-6) << name_of(isa) << " n " << n;
        }
        for (int i = 0; i < n; ++i) {
          const double e = expected_max == -kInf ? 0.0 : std::exp(logits[i] + slope * (position + i) - expected_max);
          expected_sum += e;
          EXPECT_NEAR(p[i], e, 1e-6) << name_of(isa) << " n " << n << " i " << i;
        }
        EXPECT_NEAR(sum, expected_sum, 1e-5) << name_of(isa) << " n " << n;
      }
      // Nothing attended: a max of -inf gives zeros and a zero sum.
      std::vector<float> masked(n, -kInf);
      float max = 0.0f;
      EXPECT_EQ(rows.softmax(masked.data(), n, 1.0f, -kInf, &max), 0.0f) << name_of(isa);
      EXPECT_EQ(max, -kInf) << name_of(isa);
      for (float v : masked) EXPECT_EQ(v, 0.0f) << name_of(isa);
    }
  }
}

/// A random cache block of one kv head in vLLM's layouts (keys [D/x][B][x], values [D][B]),
/// holding codes of storage type S; slots at or past `filled` hold NaN.
template <class S>
struct Block {
  static constexpr int X = static_cast<int>(16 / sizeof(S));
  int B, D;
  std::vector<S> keys, values;
  std::vector<double> key, value;  // [slot][d], as the kernels must read them

  Block(int block_size, int head_size, int filled, std::mt19937& rng) : B(block_size), D(head_size) {
    keys.resize(static_cast<std::size_t>(B) * D);
    values.resize(keys.size());
    key.assign(keys.size(), 0.0);
    value.assign(keys.size(), 0.0);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int slot = 0; slot < B; ++slot)
      for (int d = 0; d < D; ++d) {
        const float kv = slot < filled ? uniform(rng) : kNan, vv = slot < filled ? uniform(rng) : kNan;
        const S kc = kpa::detail::from_float<S>(kv), vc = kpa::detail::from_float<S>(vv);
        keys[(static_cast<std::size_t>(d / X) * B + slot) * X + d % X] = kc;
        values[static_cast<std::size_t>(d) * B + slot] = vc;
        key[static_cast<std::size_t>(slot) * D + d] = kpa::to_float(kc);
        value[static_cast<std::size_t>(slot) * D + d] = kpa::to_float(vc);
      }
  }
};

template <int H, class S>
void check_block_logits(HostIsa isa, Passes passes, int block_size, int head_size) {
  std::mt19937 rng(block_size * 131 + head_size * 7 + H);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto kernels = kpa::detail::host_loops<H, S>(isa, head_size, block_size, passes);
  for (int slots : {block_size, block_size - 1, 1}) {
    if (slots < 1) continue;
    const Block<S> block(block_size, head_size, slots, rng);
    std::vector<float> q(static_cast<std::size_t>(H) * head_size);
    for (float& v : q) v = uniform(rng);
    const int stride = block_size + 3;
    std::vector<float> logits(static_cast<std::size_t>(H) * stride, -12345.0f);
    run_block_logits<H, S>(kernels, {block.keys.data(), block_size, head_size, slots, q.data(), logits.data(), stride});
    for (int g = 0; g < H; ++g) {
      for (int slot = 0; slot < slots; ++slot) {
        double dot = 0.0;
        for (int d = 0; d < head_size; ++d) dot += q[g * head_size + d] * block.key[slot * head_size + d];
        EXPECT_NEAR(logits[g * stride + slot], dot, 2e-5 * (1 + std::fabs(dot)))
            << name_of(isa) << " H " << H << " B " << block_size << " D " << head_size << " slot " << slot;
      }
      for (int slot = slots; slot < stride; ++slot) EXPECT_EQ(logits[g * stride + slot], -12345.0f) << "written past";
    }
  }
}

/// Three blocks, the middle one skipped (id -1), the last holding `last` slots.
template <int H, class S>
void check_chunk_values(HostIsa isa, Passes passes, int block_size, int head_size, int last) {
  std::mt19937 rng(block_size * 17 + head_size + H + last * 5);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const auto kernels = kpa::detail::host_loops<H, S>(isa, head_size, block_size, passes);
  const int blocks = 3;
  std::vector<Block<S>> cache;
  for (int b = 0; b < blocks; ++b) cache.emplace_back(block_size, head_size, b + 1 == blocks ? last : block_size, rng);
  std::vector<S> values;  // the cache: blocks 2, 0, 1 in memory, so ids are not positions
  const int order[] = {2, 0, 1};
  for (int at : order) values.insert(values.end(), cache[at].values.begin(), cache[at].values.end());
  const int ids[] = {1, -1, 0};  // chunk block 0 in memory slot 1, block 2 in memory slot 0
  const int probs_stride = blocks * block_size + 5;
  std::vector<float> probs(static_cast<std::size_t>(H) * probs_stride, kNan);  // NaN past the chunk
  for (int g = 0; g < H; ++g)
    for (int t = 0; t < (blocks - 1) * block_size + last; ++t) probs[g * probs_stride + t] = uniform(rng);
  std::vector<float> o(static_cast<std::size_t>(H) * head_size);
  for (float& v : o) v = uniform(rng);
  const std::vector<float> o_before = o;
  const int begin = head_size > 5 ? 3 : 0, end = head_size;  // a range that starts off any tile
  const kpa::detail::ChunkValuesArgs<S> args{values.data(), static_cast<std::int64_t>(block_size) * head_size,
                                             ids,           blocks,
                                             last,          block_size,
                                             head_size,     probs.data(),
                                             probs_stride,  o.data()};
  kpa::detail::BlockPrefetcher idle;
  kernels.chunk_values(args, idle, begin, end);
  for (int g = 0; g < H; ++g)
    for (int d = 0; d < head_size; ++d) {
      double expected = o_before[g * head_size + d];
      if (d >= begin && d < end) {
        for (int lb : {0, 2}) {
          const int slots = lb == 2 ? last : block_size;
          for (int slot = 0; slot < slots; ++slot)
            expected += probs[g * probs_stride + lb * block_size + slot] * cache[lb].value[slot * head_size + d];
        }
      }
      EXPECT_NEAR(o[g * head_size + d], expected, 2e-5 * (1 + std::fabs(expected)))
          << name_of(isa) << " H " << H << " B " << block_size << " D " << head_size << " last " << last << " d " << d;
    }
}

template <int H, class S>
void check_shapes(HostIsa isa, const std::vector<int>& head_sizes) {
  for (Passes passes : tables(isa))
    for (int block_size : {1, 3, 8, 12, 16, 32, 64, 128})
      for (int head_size : head_sizes) {
        check_block_logits<H, S>(isa, passes, block_size, head_size);
        // The last block full, one short (a masked tail after whole vectors), one slot, and half
        // full plus one (a masked vector in the middle of the block row).
        for (int last : {block_size, block_size - 1, 1, block_size / 2 + 1}) {
          if (last >= 1 && last <= block_size) check_chunk_values<H, S>(isa, passes, block_size, head_size, last);
        }
      }
}

TEST_P(HostLoops, F32Caches) {
  check_shapes<1, float>(isa(), {4, 12, 36, 128});
  check_shapes<4, float>(isa(), {12, 64});
}
TEST_P(HostLoops, F16Caches) {
  check_shapes<1, kpa::half>(isa(), {8, 24, 128});
  check_shapes<2, kpa::half>(isa(), {40});
  check_shapes<4, kpa::half>(isa(), {64, 256});
  check_shapes<6, kpa::half>(isa(), {80});
  check_shapes<8, kpa::half>(isa(), {128});
  check_shapes<16, kpa::half>(isa(), {24});
}
TEST_P(HostLoops, Bf16Caches) {
  check_shapes<1, kpa::bfloat16>(isa(), {256});
  check_shapes<4, kpa::bfloat16>(isa(), {8, 96});
  check_shapes<6, kpa::bfloat16>(isa(), {16});
  check_shapes<16, kpa::bfloat16>(isa(), {64});
  check_shapes<32, kpa::bfloat16>(isa(), {64, 48});  // two row tiles; 48: a last group of 16 dimensions
}
TEST_P(HostLoops, Fp8Caches) {
  check_shapes<1, kpa::fp8_e4m3>(isa(), {16, 48});
  check_shapes<4, kpa::fp8_e4m3>(isa(), {128});
  check_shapes<6, kpa::fp8_e4m3>(isa(), {32});
  check_shapes<2, kpa::fp8_e5m2>(isa(), {16, 64});
  check_shapes<8, kpa::fp8_e5m2>(isa(), {32});
  check_shapes<16, kpa::fp8_e5m2>(isa(), {16});
  check_shapes<32, kpa::fp8_e4m3>(isa(), {32});
}

// Passes of one tile may share the blocks a set packed (TileKey), and only they: the same blocks
// read again with another query or other probabilities, with fewer slots (a later pass's causal
// end), with the tile's slots past the pass's (tile_slots: packed once for every pass), and after
// the cache memory changed under a new call or for another tile. Every set must give the values
// of the memory as it is at each call, and no slot past a pass's own may show in its results,
// NaN there included.
template <int H, class S>
void check_packed_blocks_reuse(HostIsa isa) {
  constexpr int B = 32, D = 64;
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const auto first_call = kpa::detail::host_loops<H, S>(isa, D, B, Passes::Several);
  const auto second_call = kpa::detail::host_loops<H, S>(isa, D, B, Passes::Several);
  ASSERT_NE(first_call.call, second_call.call);
  Block<S> block(B, D, B, rng);
  std::vector<S> keys = block.keys, values = block.values;  // the memory the loops read
  struct Step {
    const kpa::detail::HostLoops<H, S>* loops;
    int tile, slots, tile_slots;
    bool new_contents, nan_past_slots;
  };
  const Step steps[] = {{&first_call, 0, B, 0, false, false},      {&first_call, 0, B, 0, false, false},  // a new query and p
                        {&first_call, 0, B - 5, 0, false, false},  {&first_call, 0, B, 0, false, false},
                        {&second_call, 0, B, 0, true, false},      {&second_call, 1, B, 0, true, false},
                        {&second_call, 1, B - 9, 0, false, false}, {&second_call, 2, B - 7, B, false, false},
                        {&second_call, 2, B - 3, B, false, false}, {&second_call, 3, B - 6, B, true, true}};
  for (const Step& step : steps) {
    if (step.new_contents) {
      block = Block<S>(B, D, B, rng);
      std::copy(block.keys.begin(), block.keys.end(), keys.begin());
      std::copy(block.values.begin(), block.values.end(), values.begin());
    }
    if (step.nan_past_slots) {  // a slot of the tile past the pass's: its key and value hold NaN
      const int slot = step.slots + 2, X = Block<S>::X;
      keys[(static_cast<std::size_t>(3 / X) * B + slot) * X + 3 % X] = kpa::detail::from_float<S>(kNan);
      values[static_cast<std::size_t>(3) * B + slot] = kpa::detail::from_float<S>(kNan);
    }
    const kpa::detail::TileKey tile{step.loops->call, step.tile};
    const std::string where = name_of(isa) + " tile " + std::to_string(step.tile) + " slots " + std::to_string(step.slots);
    std::vector<float> q(static_cast<std::size_t>(H) * D), logits(static_cast<std::size_t>(H) * B, -1.0f);
    for (float& v : q) v = uniform(rng) - 0.5f;
    kpa::detail::BlockLogitsArgs<S> args{keys.data(), B, D, step.slots, q.data(), logits.data(), B};
    args.tile = tile;
    args.tile_slots = step.tile_slots;
    run_block_logits<H, S>(*step.loops, args);
    for (int g = 0; g < H; ++g) {
      for (int slot = 0; slot < step.slots; ++slot) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d) dot += q[g * D + d] * block.key[slot * D + d];
        EXPECT_NEAR(logits[g * B + slot], dot, 2e-5 * (1 + std::fabs(dot))) << where << " slot " << slot;
      }
    }
    std::vector<float> probs(static_cast<std::size_t>(H) * B), o(static_cast<std::size_t>(H) * D, 0.0f);
    for (float& v : probs) v = uniform(rng);
    const int id = 0;
    kpa::detail::ChunkValuesArgs<S> values_args{values.data(), static_cast<std::int64_t>(B) * D, &id, 1, step.slots, B,
                                                D, probs.data(), B, o.data()};
    values_args.tile = tile;
    values_args.last_block_tile_slots = step.tile_slots;
    kpa::detail::BlockPrefetcher idle;
    step.loops->chunk_values(values_args, idle, 0, D);
    for (int g = 0; g < H; ++g) {
      for (int d = 0; d < D; ++d) {
        double expected = 0.0;
        for (int slot = 0; slot < step.slots; ++slot) expected += probs[g * B + slot] * block.value[slot * D + d];
        EXPECT_NEAR(o[g * D + d], expected, 2e-5 * (1 + std::fabs(expected))) << where << " d " << d;
      }
    }
  }
}

TEST_P(HostLoops, PassesOfATileShareOnlyTheirOwnPackedBlocks) {
  check_packed_blocks_reuse<8, kpa::bfloat16>(isa());
  check_packed_blocks_reuse<8, kpa::fp8_e4m3>(isa());
  check_packed_blocks_reuse<32, kpa::bfloat16>(isa());  // two row tiles, and their own packing of values
}

// Where the output is 16-bit, a set may keep fewer significant bits of each probability
// (ChunkValuesArgs::probability_parts): 16 for f16 outputs, each output within 2^-17 of its sum
// of |p v|; 8 for bf16 outputs, within 2^-9 (p rounded to nearest bf16); never fewer bits.
template <class S>
void check_probabilities_of_16_bit_outputs(HostIsa isa, int parts) {
  constexpr int H = 4, B = 64, D = 64;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const auto loops = kpa::detail::host_loops<H, S>(isa, D, B, Passes::Several);
  const Block<S> block(B, D, B, rng);
  std::vector<float> probs(static_cast<std::size_t>(H) * B), o(static_cast<std::size_t>(H) * D, 0.0f);
  for (float& v : probs) v = uniform(rng);
  const int id = 0;
  kpa::detail::ChunkValuesArgs<S> args{block.values.data(), static_cast<std::int64_t>(B) * D, &id, 1, B, B, D,
                                       probs.data(), B, o.data()};
  args.probability_parts = parts;
  kpa::detail::BlockPrefetcher idle;
  loops.chunk_values(args, idle, 0, D);
  if (parts == 1 && loops.takes_bf16_probabilities) {
    // The same from the probabilities' codes as the rows' softmax leaves them: bit for bit.
    std::vector<float> rows_of_codes(static_cast<std::size_t>(H) * B, 0.0f), o_codes(o.size(), 0.0f);
    for (int g = 0; g < H; ++g) {
      for (int slot = 0; slot < B; ++slot) {
        const std::uint16_t code = kpa::detail::from_float<kpa::bfloat16>(probs[g * B + slot]).bits;
        std::memcpy(reinterpret_cast<char*>(rows_of_codes.data() + g * B) + 2 * slot, &code, 2);
      }
    }
    kpa::detail::ChunkValuesArgs<S> coded = args;
    coded.probs = rows_of_codes.data();
    coded.o = o_codes.data();
    coded.bf16_probabilities = true;
    loops.chunk_values(coded, idle, 0, D);
    for (std::size_t i = 0; i < o.size(); ++i) ASSERT_EQ(o_codes[i], o[i]) << name_of(isa) << " element " << i;
  }
  for (int g = 0; g < H; ++g) {
    for (int d = 0; d < D; ++d) {
      double expected = 0.0, magnitude = 0.0;
      for (int slot = 0; slot < B; ++slot) {
        expected += probs[g * B + slot] * block.value[slot * D + d];
        magnitude += std::fabs(probs[g * B + slot] * block.value[slot * D + d]);
      }
      const double relative = parts == 1 ? 0x1p-9 : 0x1p-17;
      EXPECT_NEAR(o[g * D + d], expected, relative * magnitude + 2e-5 * (1 + std::fabs(expected)))
          << name_of(isa) << " parts " << parts << " row " << g << " d " << d;
    }
  }
}

TEST_P(HostLoops, ProbabilitiesOf16BitOutputsKeepSixteenBits) {
  for (const int parts : {kpa::detail::probability_parts_for<kpa::half>(),
                          kpa::detail::probability_parts_for<kpa::bfloat16>()}) {
    check_probabilities_of_16_bit_outputs<kpa::bfloat16>(isa(), parts);
    check_probabilities_of_16_bit_outputs<kpa::fp8_e5m2>(isa(), parts);
  }
}

// The query and output row conversions of every instruction set against the scalar ones, bit
// for bit: rounding ties, overflow, binary16 subnormals, signed zeros, infinities, NaN payloads,
// every tail length, and nothing written past the row.
/// Stops trapping FE_INVALID while it lives. At -O3, GCC may finish a loop of float products
/// with a 4-lane instruction of which it keeps two lanes; the other two multiply leftovers
/// (inf x 0 after rows holding infinities) and raise FE_INVALID for no product of the row (GCC
/// accepts this by default: -mpartial-vector-fp-math). Rows with infinities then trap in the
/// portable conversions; their results are still checked bit for bit.
struct InvalidNotTrapped {
  int trapped = fedisableexcept(FE_INVALID);
  ~InvalidNotTrapped() {
    feclearexcept(FE_INVALID);
    if (trapped != -1 && (trapped & FE_INVALID)) feenableexcept(FE_INVALID);
  }
};

template <class T>
void check_row_conversions(HostIsa isa) {
  const InvalidNotTrapped untrapped;
  std::vector<float> values = {0.0f,           -0.0f,         1.0f,          -1.0f,      65504.0f,    65519.99f,
                               65520.0f,       -70000.0f,     1e-8f,         0x1p-24f,   0x1p-25f,    3 * 0x1p-26f,
                               0x1p-14f,       0x1.ffcp-15f,  1 + 0x1p-8f,   1 + 3 * 0x1p-8f, 1 + 0x1p-11f,
                               1 + 3 * 0x1p-11f, 3.4e38f,     -3.4e38f,      1e-40f,     kInf,        -kInf};
  // Quiet NaNs only: the rows stored are arithmetic results, and a signalling NaN would raise
  // FE_INVALID (trapped in these tests) in the multiplication already.
  for (std::uint32_t nan_bits : {0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7fe00000u, 0x7fd55555u}) {
    float nan;
    std::memcpy(&nan, &nan_bits, 4);
    values.push_back(nan);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  while (values.size() < 40) values.push_back(uniform(rng));
  const auto rows = kpa::detail::host_row_conversions<T>(isa);
  for (float factor : {1.0f, 0.5f, -3.0f}) {
    for (int n = 0; n <= static_cast<int>(values.size()); ++n) {
      std::vector<T> out(n + 9, kpa::detail::from_float<T>(-12345.0f));
      rows.store(values.data(), factor, out.data(), n);
      for (int i = 0; i < n + 9; ++i) {
        const T expected = kpa::detail::from_float<T>(i < n ? values[i] * factor : -12345.0f);
        EXPECT_EQ(std::memcmp(&out[i], &expected, sizeof(T)), 0)
            << name_of(isa) << " store n " << n << " i " << i << " value " << values[i < n ? i : 0] << " x " << factor;
      }
      std::vector<float> back(n + 9, -12345.0f);
      rows.load(out.data(), factor, back.data(), n);
      for (int i = 0; i < n + 9; ++i) {
        const float expected = i < n ? kpa::to_float(out[i]) * factor : -12345.0f;
        if (std::isnan(expected)) {
          EXPECT_TRUE(std::isnan(back[i])) << name_of(isa) << " load n " << n << " i " << i;
        } else {
          EXPECT_EQ(back[i], expected) << name_of(isa) << " load n " << n << " i " << i;
        }
      }
    }
  }
}

TEST_P(HostLoops, RowConversionsMatchTheScalarOnes) {
  check_row_conversions<float>(isa());
  check_row_conversions<kpa::half>(isa());
  check_row_conversions<kpa::bfloat16>(isa());
}

// Each code widens to its value in the vector loads (NaN codes to NaN), in every lane of the 16
// that are widened together, for the keys (q.k) and for the values (p.V) alike.
template <class S>
void check_codes(HostIsa isa, Passes passes, const std::vector<unsigned>& codes) {
  using Bits = decltype(S{}.bits);
  constexpr int kHeadSize = 32, kBlockSize = 16;  // q.k and p.V both on tiles in the tile sets
  constexpr int kX = static_cast<int>(16 / sizeof(S));  // elements of a key vector
  const auto kernels = kpa::detail::host_loops<1, S>(isa, kHeadSize, kBlockSize, passes);
  const bool tile = on_tiles(isa, passes, 1);
  kpa::detail::BlockPrefetcher idle;
  for (unsigned code : codes) {
    const S coded{static_cast<Bits>(code)};
    // The tile sets' contract (amx.hpp): values below 2^-126 count as zero; an infinity meets
    // the zero parts of the one-hot probabilities and gives NaN (the one-hot query, 1.0, is
    // one part: no zero parts there).
    float expected_logit = kpa::to_float(coded);
    if (tile && std::isless(std::fabs(expected_logit), 0x1p-126f)) expected_logit = 0.0f;
    const float expected = tile && std::isinf(expected_logit) ? kNan : expected_logit;
    for (int lane = 0; lane < 16; ++lane) {
      const std::string where = name_of(isa) + " code " + std::to_string(code) + " lane " + std::to_string(lane);
      // q.k: blocks of one slot and of 16 (whose key vectors are widened 32 codes at a time),
      // every slot's dimension `lane` holding the code; q one-hot there (0 * 0 elsewhere).
      std::vector<float> q(kHeadSize, 0.0f);
      q[lane] = 1.0f;
      for (int slots : {1, kBlockSize}) {
        std::vector<S> keys(static_cast<std::size_t>(kHeadSize) * slots, S{0});
        for (int slot = 0; slot < slots; ++slot) keys[((lane / kX) * slots + slot) * kX + lane % kX] = coded;
        std::vector<float> logits(slots, -1.0f);
        run_block_logits<1, S>(kernels, {keys.data(), slots, kHeadSize, slots, q.data(), logits.data(), slots});
        for (int slot = 0; slot < slots; ++slot) {
          if (std::isnan(expected_logit)) {
            EXPECT_TRUE(std::isnan(logits[slot])) << where << " slots " << slots << " slot " << slot;
          } else {
            EXPECT_EQ(logits[slot], expected_logit) << where << " slots " << slots << " slot " << slot;
          }
        }
      }
      // p.V: a block whose rows all hold the code in slot `lane`, p one-hot there; the block full
      // (whole rows widened, two adjacent rows at a time) and filled up to `lane` (a masked last
      // vector).
      std::vector<S> values(kHeadSize * kBlockSize, S{0});
      for (int d = 0; d < kHeadSize; ++d) values[d * kBlockSize + lane] = coded;
      std::vector<float> probs(kBlockSize, 0.0f);
      probs[lane] = 1.0f;
      const int block_id = 0;
      for (int last : {kBlockSize, lane + 1}) {
        std::vector<float> o(kHeadSize, 0.0f);
        kernels.chunk_values({values.data(), kHeadSize * kBlockSize, &block_id, 1, last, kBlockSize, kHeadSize,
                              probs.data(), kBlockSize, o.data()},
                             idle, 0, kHeadSize);
        for (int d = 0; d < kHeadSize; ++d) {
          if (std::isnan(expected)) {
            EXPECT_TRUE(std::isnan(o[d])) << where << " last " << last << " d " << d;
          } else {
            EXPECT_EQ(o[d], expected) << where << " last " << last << " d " << d;
          }
        }
      }
    }
  }
}

// The prefetcher's cursor: take() hands out runs of whole lines, within one block, of the listed
// blocks' keys and then values in list order, skipping ids < 0, from the line a block starts in
// to the one it ends in; no more than the allowance, spread by pace().
TEST(HostPrefetcher, WalksTheListedBlocks) {
  using kpa::detail::BlockPrefetcher;
  alignas(64) static char cache[2 * 4 * 256 + 64];
  const char* keys = cache + 8;  // blocks of 200 bytes every 256, starting 8 bytes into a line
  const char* values = keys + 4 * 256;
  const int ids[] = {3, -1, 0};
  std::vector<const char*> expected;
  for (int id : {3, 0}) {
    for (const char* base : {keys, values}) {
      const char* start = base + id * 256;
      for (const char* line = start - 8; line < start + 200; line += 64) expected.push_back(line);
    }
  }
  BlockPrefetcher prefetcher(keys, values, 256, 200, ids, 3);
  prefetcher.allow(1000);
  prefetcher.pace(1);
  std::vector<const char*> lines;
  for (BlockPrefetcher::Run run = prefetcher.take(3); run.first != nullptr; run = prefetcher.take(3)) {
    ASSERT_LE(run.end - run.first, 3 * 64) << "more than asked for";
    ASSERT_GT(run.end, run.first);
    for (const char* line = run.first; line < run.end; line += 64) lines.push_back(line);
    ASSERT_LE(lines.size(), expected.size());
  }
  EXPECT_EQ(lines, expected);

  // An allowance of 5 over 2 tiles: 3 lines, then the block's last one, then the next block's
  // first, then none until more is allowed; finish() asks for what is allowed at once.
  BlockPrefetcher paced(keys, values, 256, 200, ids, 3);
  paced.allow(5);
  paced.pace(2);
  const BlockPrefetcher::Run first = paced.take(10);
  EXPECT_EQ(first.first, keys + 3 * 256 - 8);
  EXPECT_EQ(first.end - first.first, 3 * 64);
  const BlockPrefetcher::Run last = paced.take(10);
  EXPECT_EQ(last.end - last.first, 64);
  const BlockPrefetcher::Run next = paced.take(10);
  EXPECT_EQ(next.first, values + 3 * 256 - 8);
  EXPECT_EQ(next.end - next.first, 64);
  EXPECT_EQ(paced.take(10).first, nullptr) << "the allowance is spent";
  paced.allow(1);
  paced.finish();  // values block 3's second line
  EXPECT_EQ(paced.take(10).first, nullptr) << "finish() spends the allowance";
  paced.allow(64);
  paced.pace(1);
  const BlockPrefetcher::Run rest = paced.take(64);
  EXPECT_EQ(rest.first, values + 3 * 256 - 8 + 128);
  EXPECT_EQ(rest.end - rest.first, 2 * 64) << "up to the block's end";
}

TEST_P(HostLoops, Fp8CodesWidenExactly) {
  std::vector<unsigned> every(256);
  for (unsigned code = 0; code < 256; ++code) every[code] = code;
  for (Passes passes : tables(isa())) {
    check_codes<kpa::fp8_e4m3>(isa(), passes, every);
    check_codes<kpa::fp8_e5m2>(isa(), passes, every);
  }
}

// bfloat16's special values: signed zeros, subnormals, the largest finite values, infinities,
// quiet and signalling NaNs. A signalling NaN is quieted by the product it enters, which raises
// FE_INVALID (as f16's conversion instruction does), so that is not trapped here.
TEST_P(HostLoops, Bf16CodesWidenExactly) {
  const InvalidNotTrapped untrapped;
  for (Passes passes : tables(isa())) {
    check_codes<kpa::bfloat16>(isa(), passes, {0x0000, 0x8000, 0x0001, 0x807f, 0x3f80, 0xbf81, 0x7f7f, 0xff7f, 0x7f80,
                                               0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xffa5, 0x7fbf});
  }
}

}  // namespace
