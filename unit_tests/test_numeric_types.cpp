// half / bfloat16 conversions against an independent bit-level reference.

#include "test_spaces.hpp"

#include <kpa/numeric_types.hpp>

#include <vector>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16 decoded with plain arithmetic.
double half_reference(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

double bfloat16_reference(std::uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  if (exponent == 0xff) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

template <class T, class Decode, class Encode, class Reference>
void check_all_codes_and_ties(Decode decode, Encode encode, Reference reference, std::uint16_t inf_bits) {
  for (std::uint32_t code = 0; code <= 0xffff; ++code) {
    const T value{static_cast<std::uint16_t>(code)};
    const double expected = reference(value.bits);
    const float got = decode(value);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << "code " << code;
      ASSERT_NE(bits_of(got) & 0x400000u, 0u) << "NaN comes back quiet, code " << code;
      ASSERT_TRUE(std::isnan(decode(encode(got)))) << "NaN must stay NaN, code " << code;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), expected) << "decode of code " << code;
    ASSERT_EQ(encode(got).bits, value.bits) << "round trip of code " << code;
  }
  // Every pair of neighbouring positive finite codes: the midpoint ties to the even code, and
  // the floats just beside it round to the nearer code.
  for (std::uint16_t code = 0; code < inf_bits; ++code) {
    const std::uint16_t next = static_cast<std::uint16_t>(code + 1);
    const float lo = decode(T{code});
    // Past the largest finite code, the next value is where the format's next code would be.
    const double hi = next == inf_bits ? 2.0 * lo - decode(T{static_cast<std::uint16_t>(code - 1)})
                                       : static_cast<double>(decode(T{next}));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoints have fewer than 24 bits";
    const std::uint16_t even = (code & 1) ? next : code;
    ASSERT_EQ(encode(mid).bits, even) << "tie between codes " << code << " and " << next;
    ASSERT_EQ(encode(std::nextafter(mid, 0.0f)).bits, code) << "below the tie above code " << code;
    ASSERT_EQ(encode(std::nextafter(mid, HUGE_VALF)).bits, next) << "above the tie above code " << code;
    ASSERT_EQ(encode(-mid).bits, static_cast<std::uint16_t>(even | 0x8000)) << "negative tie above code " << code;
  }
}

TEST(NumericTypes, HalfAllCodesAndRoundingBoundaries) {
  check_all_codes_and_ties<kpa::half>([](kpa::half h) { return kpa::to_float(h); },
                                      [](float f) { return kpa::to_half(f); }, half_reference, 0x7c00);
  EXPECT_EQ(kpa::to_half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(kpa::to_half(65519.996f).bits, 0x7bff);
  EXPECT_EQ(kpa::to_half(65520.0f).bits, 0x7c00);  // the tie past the largest finite value overflows
  EXPECT_EQ(kpa::to_half(1e10f).bits, 0x7c00);
  EXPECT_EQ(kpa::to_half(-HUGE_VALF).bits, 0xfc00);
  EXPECT_EQ(kpa::to_half(-0.0f).bits, 0x8000);
  EXPECT_EQ(kpa::to_half(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie with the smallest subnormal: even
  EXPECT_EQ(kpa::to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(kpa::to_half(1e-30f).bits, 0x0000);
  EXPECT_EQ(kpa::to_half(std::numeric_limits<float>::quiet_NaN()).bits & 0x7c00, 0x7c00);
  EXPECT_NE(kpa::to_half(std::numeric_limits<float>::quiet_NaN()).bits & 0x3ff, 0);
}

TEST(NumericTypes, BFloat16AllCodesAndRoundingBoundaries) {
  check_all_codes_and_ties<kpa::bfloat16>([](kpa::bfloat16 b) { return kpa::to_float(b); },
                                          [](float f) { return kpa::to_bfloat16(f); }, bfloat16_reference, 0x7f80);
  EXPECT_EQ(kpa::to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds past the largest finite
  EXPECT_EQ(kpa::to_bfloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(kpa::to_bfloat16(float_of(0x7f800001u)).bits & 0x7f80, 0x7f80);  // signalling NaN stays NaN
  EXPECT_NE(kpa::to_bfloat16(float_of(0x7f800001u)).bits & 0x7f, 0);
  EXPECT_EQ(bits_of(kpa::to_float(kpa::bfloat16{0x3f80})), 0x3f800000u);
}

template <class Space>
class NumericTypesOnSpace : public ::testing::Test {};
TYPED_TEST_SUITE(NumericTypesOnSpace, kpa_test::ExecutionSpaces);

// Every half and bfloat16 code converted to float and back in a kernel on Space (NaN codes are
// passed through: comparing a signalling NaN would trap; their payloads are covered on the host).
template <class Space>
Kokkos::View<std::uint32_t*, typename Space::memory_space> round_trip_in_kernel() {
  const int n = 1 << 16;
  Kokkos::View<std::uint32_t*, typename Space::memory_space> device("codes", n);
  Kokkos::parallel_for(
      "kpa_test::conversions", Kokkos::RangePolicy<Space>(0, n), KOKKOS_LAMBDA(int i) {
        const auto code = static_cast<std::uint16_t>(i);
        const float from_half = kpa::to_float(kpa::half{code});
        const float from_bf16 = kpa::to_float(kpa::bfloat16{code});
        const bool half_nan = (code & 0x7c00) == 0x7c00 && (code & 0x3ff) != 0;
        const bool bf16_nan = (code & 0x7f80) == 0x7f80 && (code & 0x7f) != 0;
        const std::uint16_t half_again = half_nan ? code : kpa::to_half(from_half).bits;
        const std::uint16_t bf16_again = bf16_nan ? code : kpa::to_bfloat16(from_bf16).bits;
        device(i) = (static_cast<std::uint32_t>(half_again) << 16) | bf16_again;
      });
  return device;
}

// The conversions are device functions: running them in a kernel gives the host's answers.
TYPED_TEST(NumericTypesOnSpace, ConversionsInKernelsMatchHost) {
  const auto host = kpa::detail::compat::host_copy(round_trip_in_kernel<TypeParam>());
  for (int i = 0; i < (1 << 16); ++i) {
    ASSERT_EQ(host(i) >> 16, static_cast<std::uint32_t>(i)) << "half code " << i;
    ASSERT_EQ(host(i) & 0xffff, static_cast<std::uint32_t>(i)) << "bfloat16 code " << i;
  }
}

}  // namespace
