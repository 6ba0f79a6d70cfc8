#pragma once
// load_floats<N>(src, dst): N consecutive cache or activation elements converted to float.
//
// The portable loop is what device back ends run. On x86 hosts with F16C and AVX2 the 2-byte
// types get explicit 8-wide conversions: compilers do not vectorise the bit manipulation of
// to_float inside the kernels' loops by themselves, and the conversion is otherwise the
// largest cost of a host decode step. Both paths give identical bits (quiet NaNs included).

#include <kpa/numeric_types.hpp>

#include <type_traits>

#if defined(__F16C__) && defined(__AVX2__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KPA_IMPL_X86_HOST_CONVERSIONS 1
#include <immintrin.h>
#endif

// Asks host compilers to vectorise a short elementwise loop they otherwise leave scalar once it
// is inlined deep inside a team kernel. Device compilers do not see it.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KPA_IMPL_SIMD _Pragma("omp simd")
#else
#define KPA_IMPL_SIMD
#endif

namespace kpa::detail {

#ifdef KPA_IMPL_X86_HOST_CONVERSIONS
inline void load_8_floats_x86(const half* src, float* dst) {
  _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
}

inline void load_8_floats_x86(const bfloat16* src, float* dst) {
  const __m256i wide = _mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))), 16);
  const __m256i magnitude = _mm256_and_si256(wide, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(wide, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000)));
  _mm256_storeu_ps(dst, _mm256_castsi256_ps(quiet));
}
#endif

template <int N, class T>
KOKKOS_FORCEINLINE_FUNCTION void load_floats(const T* src, float* dst) {
#ifdef KPA_IMPL_X86_HOST_CONVERSIONS
  if constexpr (N % 8 == 0 && (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)) {
    for (int i = 0; i < N; i += 8) load_8_floats_x86(src + i, dst + i);
    return;
  }
#endif
  KPA_IMPL_SIMD
  for (int i = 0; i < N; ++i) dst[i] = to_float(src[i]);
}

}  // namespace kpa::detail
