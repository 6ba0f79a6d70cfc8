#pragma once
// Storage types for 2-byte KV caches and activations. Kokkos' own half_t is a 4-byte float on
// host-only builds and 3.4 has no bfloat16, so kpa carries its own: two bytes on every back end,
// converted bit-exactly (round to nearest even) in host and device code.

#include <kpa/detail/kokkos_compat.hpp>

#include <cstdint>

namespace kpa {

/// IEEE 754 binary16 storage.
struct half {
  std::uint16_t bits;
};

/// bfloat16 storage (the upper half of an IEEE binary32).
struct bfloat16 {
  std::uint16_t bits;
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2, "kpa storage types must be 2 bytes");

/// Exact: every binary16 value is a float. A signalling NaN comes back quiet.
KOKKOS_INLINE_FUNCTION float to_float(half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t magnitude = h.bits & 0x7fffu;
  // Shifting exponent and mantissa into float position and scaling by 2^112 rebiases the
  // exponent (15 -> 127) and turns binary16 subnormals into the right normal floats, without
  // a branch, so the conversion vectorises inside kernel loops.
  float value = detail::compat::bit_cast<float>(magnitude << 13) * 0x1p112f;
  if (magnitude >= 0x7c00u) {  // infinity, or NaN: keep the payload, quiet it as hardware does
    const std::uint32_t payload = (magnitude & 0x3ffu) << 13;
    value = detail::compat::bit_cast<float>(0x7f800000u | payload | (payload != 0u ? 0x400000u : 0u));
  }
  return detail::compat::bit_cast<float>(detail::compat::bit_cast<std::uint32_t>(value) | sign);
}

/// Round to nearest even; overflow goes to infinity, NaN stays NaN.
KOKKOS_INLINE_FUNCTION half to_half(float f) {
  const std::uint32_t x = detail::compat::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return half{static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520 rounds past the largest finite value (65504)
    return half{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  if (magnitude < 0x38800000u) {  // below 2^-14: a binary16 subnormal or zero
    if (magnitude < 0x33000000u) return half{sign};  // below 2^-25: rounds to zero
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // value / 2^-24 = mantissa >> shift
    std::uint32_t rounded = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (rounded & 1u))) ++rounded;
    return half{static_cast<std::uint16_t>(sign | rounded)};
  }
  const std::uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
  const std::uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
  return half{static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

/// Exact; a signalling NaN comes back quiet, as from hardware conversions.
KOKKOS_INLINE_FUNCTION float to_float(bfloat16 b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b.bits) << 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return detail::compat::bit_cast<float>(nan ? bits | 0x400000u : bits);
}

/// Round to nearest even; overflow goes to infinity, NaN stays NaN.
KOKKOS_INLINE_FUNCTION bfloat16 to_bfloat16(float f) {
  const std::uint32_t x = detail::compat::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return bfloat16{static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  }
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

KOKKOS_INLINE_FUNCTION float to_float(float f) { return f; }

namespace detail {

/// Converts a float to the storage type T (float, half or bfloat16).
template <class T>
KOKKOS_INLINE_FUNCTION T from_float(float f);

template <>
KOKKOS_INLINE_FUNCTION float from_float<float>(float f) {
  return f;
}
template <>
KOKKOS_INLINE_FUNCTION half from_float<half>(float f) {
  return to_half(f);
}
template <>
KOKKOS_INLINE_FUNCTION bfloat16 from_float<bfloat16>(float f) {
  return to_bfloat16(f);
}

template <class T>
inline constexpr bool is_activation_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

}  // namespace detail
}  // namespace kpa
