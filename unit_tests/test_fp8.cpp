// fp8 E4M3FN / E5M2 conversions against an independent reference: every code decoded with plain
// arithmetic, and rounding checked against a brute-force search for the nearest code.

#include "test_spaces.hpp"

#include <kpa/numeric_types.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

struct Format {
  int mantissa_bits, bias;
  bool has_infinity;
  double max_finite;
};
constexpr Format kE4M3{3, 7, false, 448.0};
constexpr Format kE5M2{2, 15, true, 57344.0};

// NaN for NaN codes, +-inf for infinity codes.
double decode(const Format& f, std::uint8_t code) {
  const int sign = (code & 0x80) ? -1 : 1;
  const int exponent_bits = 7 - f.mantissa_bits;
  const int exponent = (code & 0x7f) >> f.mantissa_bits;
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  const int max_exponent = (1 << exponent_bits) - 1;
  if (f.has_infinity && exponent == max_exponent) return mantissa ? NAN : sign * HUGE_VAL;
  if (!f.has_infinity && (code & 0x7f) == 0x7f) return NAN;
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp((1 << f.mantissa_bits) + mantissa, exponent - f.bias - f.mantissa_bits);
}

// Nearest finite code to v by search (ties to the code with an even mantissa), saturating.
std::uint8_t nearest(const Format& f, float v) {
  if (std::isnan(v)) return 0x7f | (std::signbit(v) ? 0x80 : 0);
  const double target = std::fmin(std::fabs(static_cast<double>(v)), f.max_finite);
  int best = 0;
  double best_distance = HUGE_VAL;
  for (int code = 0; code < 0x80; ++code) {
    const double value = decode(f, static_cast<std::uint8_t>(code));
    if (!std::isfinite(value)) continue;
    const double distance = std::fabs(value - target);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}

template <class T, class Encode>
void check_format(const Format& f, Encode encode) {
  std::vector<float> boundaries;
  for (int code = 0; code <= 0xff; ++code) {
    const double expected = decode(f, static_cast<std::uint8_t>(code));
    const float got = kpa::to_float(T{static_cast<std::uint8_t>(code)});
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << "code " << code;
      ASSERT_EQ(encode(got).bits & 0x7f, 0x7f) << "NaN stays NaN, code " << code;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), expected) << "decode of code " << code;
    if (std::isfinite(expected)) {
      ASSERT_EQ(encode(got).bits, code == 0x80 ? 0x80 : code) << "round trip of code " << code;
      boundaries.push_back(got);
    }
  }
  // Midpoints between neighbouring codes (ties), the floats beside them, overflow and the
  // smallest values: each against the brute-force nearest code.
  std::sort(boundaries.begin(), boundaries.end());
  std::vector<float> probes = {0.0f, -0.0f, HUGE_VALF, -HUGE_VALF, std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(), 1e-30f, -1e-30f,
                               static_cast<float>(f.max_finite) * 1.01f, static_cast<float>(f.max_finite) * 1.0625f};
  for (std::size_t i = 0; i + 1 < boundaries.size(); ++i) {
    const float mid = static_cast<float>((static_cast<double>(boundaries[i]) + boundaries[i + 1]) / 2);
    probes.insert(probes.end(), {mid, std::nextafter(mid, -HUGE_VALF), std::nextafter(mid, HUGE_VALF)});
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-20.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) probes.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  for (float v : probes) {
    ASSERT_EQ(encode(v).bits, nearest(f, v)) << "encode of " << v;
  }
  ASSERT_EQ(encode(std::numeric_limits<float>::quiet_NaN()).bits & 0x7f, 0x7f);
}

TEST(Fp8, E4M3AllCodesAndRoundingAgainstBruteForce) {
  check_format<kpa::fp8_e4m3>(kE4M3, [](float v) { return kpa::to_fp8_e4m3(v); });
  EXPECT_EQ(kpa::to_fp8_e4m3(448.0f).bits, 0x7e);
  EXPECT_EQ(kpa::to_fp8_e4m3(1e9f).bits, 0x7e);  // saturates, no infinity
  EXPECT_EQ(kpa::to_fp8_e4m3(-HUGE_VALF).bits, 0xfe);
  EXPECT_EQ(kpa::to_fp8_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(kpa::to_fp8_e4m3(std::ldexp(1.0f, -10)).bits, 0x00);  // tie with the smallest subnormal
  EXPECT_EQ(kpa::to_fp8_e4m3(std::ldexp(3.0f, -10)).bits, 0x02);  // 1.5 subnormal steps: tie to even (2)
  EXPECT_EQ(kpa::to_float(kpa::fp8_e4m3{0x01}), std::ldexp(1.0f, -9));
}

TEST(Fp8, E5M2AllCodesAndRoundingAgainstBruteForce) {
  check_format<kpa::fp8_e5m2>(kE5M2, [](float v) { return kpa::to_fp8_e5m2(v); });
  EXPECT_EQ(kpa::to_fp8_e5m2(57344.0f).bits, 0x7b);
  EXPECT_EQ(kpa::to_fp8_e5m2(HUGE_VALF).bits, 0x7b);  // saturating writes: infinity becomes the largest finite
  EXPECT_EQ(kpa::to_float(kpa::fp8_e5m2{0x7c}), HUGE_VALF);
  EXPECT_EQ(kpa::to_float(kpa::fp8_e5m2{0xfc}), -HUGE_VALF);
  EXPECT_EQ(kpa::to_float(kpa::fp8_e5m2{0x01}), std::ldexp(1.0f, -16));
}

template <class Space>
class Fp8OnSpace : public ::testing::Test {};
TYPED_TEST_SUITE(Fp8OnSpace, kpa_test::ExecutionSpaces);

inline float fp8_probe(int i) { return (i - 128) * 3.7f + 0.01f * i; }  // finite, both signs, past both maxima when scaled

// Every fp8 code decoded, and probes encoded, in a kernel on Space.
template <class Space>
void convert_in_kernel(const Kokkos::View<float* [2], typename Space::memory_space>& decoded,
                       const Kokkos::View<std::uint8_t* [2], typename Space::memory_space>& encoded) {
  Kokkos::parallel_for(
      "kpa_test::fp8", Kokkos::RangePolicy<Space>(0, 256), KOKKOS_LAMBDA(int i) {
        const auto code = static_cast<std::uint8_t>(i);
        decoded(i, 0) = kpa::to_float(kpa::fp8_e4m3{code});
        decoded(i, 1) = kpa::to_float(kpa::fp8_e5m2{code});
        const float probe = (i - 128) * 3.7f + 0.01f * i;  // fp8_probe(i), computed on the device
        encoded(i, 0) = kpa::to_fp8_e4m3(probe * 3.0f).bits;
        encoded(i, 1) = kpa::to_fp8_e5m2(probe * 300.0f).bits;
      });
}

TYPED_TEST(Fp8OnSpace, ConversionsInKernelsMatchHost) {
  using Space = TypeParam;
  Kokkos::View<float* [2], typename Space::memory_space> decoded("decoded", 256);
  Kokkos::View<std::uint8_t* [2], typename Space::memory_space> encoded("encoded", 256);
  convert_in_kernel<Space>(decoded, encoded);
  const auto d = kpa::detail::compat::host_copy(decoded);
  const auto e = kpa::detail::compat::host_copy(encoded);
  for (int i = 0; i < 256; ++i) {
    const auto code = static_cast<std::uint8_t>(i);
    const float e4 = kpa::to_float(kpa::fp8_e4m3{code}), e5 = kpa::to_float(kpa::fp8_e5m2{code});
    std::uint32_t a, b;
    std::memcpy(&a, &e4, 4);
    std::memcpy(&b, &d(i, 0), 4);
    EXPECT_EQ(a, b) << "e4m3 code " << i;
    std::memcpy(&a, &e5, 4);
    std::memcpy(&b, &d(i, 1), 4);
    EXPECT_EQ(a, b) << "e5m2 code " << i;
    const float probe = fp8_probe(i);
    EXPECT_EQ(e(i, 0), kpa::to_fp8_e4m3(probe * 3.0f).bits);
    EXPECT_EQ(e(i, 1), kpa::to_fp8_e5m2(probe * 300.0f).bits);
  }
}

}  // namespace
