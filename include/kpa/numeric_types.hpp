#pragma once
// Storage types for 2- and 1-byte KV caches and activations. Kokkos' own half_t is a 4-byte float
// on host-only builds, 3.4 has no bfloat16 and no Kokkos has fp8, so kpa carries its own: two or
// one bytes on every back end, converted bit-exactly (round to nearest even) in host and device
// code.

#include <kpa/detail/kokkos_compat.hpp>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

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

/// Exact: every binary16 value is a float. A signalling NaN comes back quiet (NaN stays NaN; on
/// CUDA devices the hardware conversion decides the payload).
KOKKOS_INLINE_FUNCTION float to_float(half h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h.bits));
#else
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
#endif
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

/// Exact; a signalling NaN comes back quiet, as from hardware conversions (on CUDA devices NaN
/// stays NaN, the arithmetic that follows quiets it).
KOKKOS_INLINE_FUNCTION float to_float(bfloat16 b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b.bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return detail::compat::bit_cast<float>(nan ? bits | 0x400000u : bits);
#endif
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

/// OCP FP8 E4M3FN storage: bias 7, largest finite 448, no infinities, NaN = S.1111.111.
struct fp8_e4m3 {
  std::uint8_t bits;
};

/// OCP FP8 E5M2 storage: bias 15, largest finite 57344, infinities and NaNs.
struct fp8_e5m2 {
  std::uint8_t bits;
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1, "kpa fp8 types must be 1 byte");

namespace detail {

/// Decodes an fp8 code with `Mantissa` mantissa bits and exponent bias `Bias` (exact). Like
/// to_float(half): exponent and mantissa shifted into float position and scaled by 2^(127-Bias),
/// which also turns fp8 subnormals into the right floats.
KOKKOS_INLINE_FUNCTION constexpr float power_of_two(int exponent) {
  float value = 1.0f;
  for (int i = 0; i < exponent; ++i) value *= 2.0f;
  return value;
}

template <int Mantissa, int Bias>
KOKKOS_INLINE_FUNCTION float fp8_magnitude_to_float(std::uint32_t magnitude) {
  constexpr float rebias = power_of_two(127 - Bias);
  return compat::bit_cast<float>(magnitude << (23 - Mantissa)) * rebias;
}

/// Rounds |f| (given as float bits, finite, below the format's largest finite value) to the
/// nearest fp8 magnitude code, ties to even.
template <int Mantissa, int Bias>
KOKKOS_INLINE_FUNCTION std::uint8_t fp8_round_magnitude(std::uint32_t magnitude) {
  constexpr int min_exponent = 1 - Bias;  // of the smallest normal
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  if (exponent < min_exponent) {  // an fp8 subnormal, or zero
    if ((magnitude >> 23) == 0) return 0;  // float zero or subnormal: far below the fp8 grid
    // value = mantissa * 2^(exponent - 23); fp8 subnormal step = 2^(min_exponent - Mantissa)
    const int shift = 23 + min_exponent - Mantissa - exponent;
    if (shift > 24) return 0;  // below half the smallest subnormal
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    std::uint32_t rounded = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (rounded & 1u))) ++rounded;
    return static_cast<std::uint8_t>(rounded);
  }
  constexpr int shift = 23 - Mantissa;
  const std::uint32_t rebiased = magnitude - (static_cast<std::uint32_t>(127 - Bias) << 23);
  const std::uint32_t rounded = rebiased + ((1u << (shift - 1)) - 1u) + ((rebiased >> shift) & 1u);
  return static_cast<std::uint8_t>(rounded >> shift);
}

}  // namespace detail

/// Exact. NaN codes give a quiet NaN. CUDA devices of compute capability 8.9 and newer widen in
/// hardware (every E4M3 value is a binary16 value).
KOKKOS_INLINE_FUNCTION float to_float(fp8_e4m3 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v.bits, __NV_E4M3)));
#else
  const std::uint32_t magnitude = v.bits & 0x7fu;
  float value = detail::fp8_magnitude_to_float<3, 7>(magnitude);
  if (magnitude == 0x7fu) value = detail::compat::bit_cast<float>(0x7fc00000u);
  return detail::compat::bit_cast<float>(detail::compat::bit_cast<std::uint32_t>(value) |
                                         (static_cast<std::uint32_t>(v.bits & 0x80u) << 24));
#endif
}

/// Exact. Infinities stay infinite; NaN codes give a quiet NaN. On CUDA devices the code is the
/// upper byte of a binary16 value, widened in hardware.
KOKKOS_INLINE_FUNCTION float to_float(fp8_e5m2 v) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(v.bits << 8)));
#else
  const std::uint32_t magnitude = v.bits & 0x7fu;
  float value = detail::fp8_magnitude_to_float<2, 15>(magnitude);
  if (magnitude >= 0x7cu) {
    value = detail::compat::bit_cast<float>(magnitude == 0x7cu ? 0x7f800000u : 0x7fc00000u);
  }
  return detail::compat::bit_cast<float>(detail::compat::bit_cast<std::uint32_t>(value) |
                                         (static_cast<std::uint32_t>(v.bits & 0x80u) << 24));
#endif
}

/// Round to nearest even, saturated to +-448 (infinities included); NaN gives NaN (S.1111.111).
KOKKOS_INLINE_FUNCTION fp8_e4m3 to_fp8_e4m3(float f) {
  const std::uint32_t x = detail::compat::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return fp8_e4m3{static_cast<std::uint8_t>(sign | 0x7fu)};
  if (magnitude >= 0x43e00000u) return fp8_e4m3{static_cast<std::uint8_t>(sign | 0x7eu)};  // >= 448
  return fp8_e4m3{static_cast<std::uint8_t>(sign | detail::fp8_round_magnitude<3, 7>(magnitude))};
}

/// Round to nearest even, saturated to +-57344 (infinities included); NaN gives NaN.
KOKKOS_INLINE_FUNCTION fp8_e5m2 to_fp8_e5m2(float f) {
  const std::uint32_t x = detail::compat::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return fp8_e5m2{static_cast<std::uint8_t>(sign | 0x7fu)};
  if (magnitude >= 0x47600000u) return fp8_e5m2{static_cast<std::uint8_t>(sign | 0x7bu)};  // >= 57344
  return fp8_e5m2{static_cast<std::uint8_t>(sign | detail::fp8_round_magnitude<2, 15>(magnitude))};
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
template <>
KOKKOS_INLINE_FUNCTION fp8_e4m3 from_float<fp8_e4m3>(float f) {
  return to_fp8_e4m3(f);
}
template <>
KOKKOS_INLINE_FUNCTION fp8_e5m2 from_float<fp8_e5m2>(float f) {
  return to_fp8_e5m2(f);
}

template <class T>
inline constexpr bool is_activation_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// dst[i] = to_float(src[i * stride]) * scale for i < n (a query row into kernel scratch).
template <class T>
KOKKOS_INLINE_FUNCTION void load_scaled(const T* src, std::size_t stride, float scale, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = to_float(src[i * stride]) * scale;
}

/// dst[i * stride] = from_float<T>(src[i] * factor) for i < n (an output row out of scratch).
template <class T>
KOKKOS_INLINE_FUNCTION void store_scaled(const float* src, float factor, T* dst, std::size_t stride, int n) {
  for (int i = 0; i < n; ++i) dst[i * stride] = from_float<T>(src[i] * factor);
}

}  // namespace detail
}  // namespace kpa
