#pragma once
// The AVX2 + FMA + F16C host loops (include/kpa/detail/host_loops.hpp says what each computes),
// on the x86 mapping layer (x86_simd.hpp).
//
// The q.k and p.V register tiles are x86_tiles.inc's over the 8-lane mapping Avx2 (16 ymm
// registers); the row loops and the query and output conversions are AVX2's own.

#include "x86_simd.hpp"

namespace kpa::detail::avx2 {

using namespace x86;

/// row_softmax (kCodes false) or row_softmax_to_bf16 (true): the probabilities as floats, or as
/// their bf16 codes in place, code i in bytes [2i, 2i + 2) of the row, below float i's, which is
/// read before it is written over.
template <bool kCodes>
KPA_IMPL_AVX2 inline float row_softmax_as(float* p, int n, int n_padded, float scale, float floor, float* max) {
  auto* const codes = reinterpret_cast<std::uint16_t*>(p);
  __m256 m = _mm256_set1_ps(floor);
  const __m256 s = _mm256_set1_ps(scale);
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    __m256 v = _mm256_maskload_ps(p + i, mask);
    if (scale != 1.0f) {  // stored, so that the exponent below reads the rounded product
      v = _mm256_mul_ps(v, s);
      _mm256_maskstore_ps(p + i, mask, v);
    }
    m = max_ignoring_nan(m, _mm256_blendv_ps(_mm256_set1_ps(floor), v, _mm256_castsi256_ps(mask)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float row_max = floor;
  for (float lane : lanes) row_max = kpa::detail::max_ignoring_nan(row_max, lane);
  *max = row_max;
  if (row_max == -__builtin_inff()) {  // nothing attended; a NaN logit (corrupt data) stays NaN
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float x = p[i] != p[i] ? p[i] : 0.0f;
      sum += x;
      if constexpr (kCodes) {
        codes[i] = x != x ? std::uint16_t{0x7fc0} : std::uint16_t{0};
      } else {
        p[i] = x;
      }
    }
    if constexpr (kCodes) {
      for (int i = n; i < n_padded; ++i) codes[i] = 0;
    }
    return sum;
  }
  const __m256 mv = _mm256_set1_ps(row_max);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), mv));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i + 8), mv));
    if constexpr (kCodes) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), bf16_codes(e0, e1));
    } else {
      _mm256_storeu_ps(p + i, e0);
      _mm256_storeu_ps(p + i + 8, e1);
    }
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(p + i, mask), mv)), _mm256_castsi256_ps(mask));
    if constexpr (kCodes) {  // 8 codes, zeros past n (n_padded is a multiple of 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm256_castsi256_si128(bf16_codes(e, _mm256_setzero_ps())));
    } else {
      _mm256_maskstore_ps(p + i, mask, e);
    }
    s0 = _mm256_add_ps(s0, e);
  }
  if constexpr (kCodes) {
    for (i = (n + 7) / 8 * 8; i < n_padded; ++i) codes[i] = 0;
  }
  return horizontal_sum(_mm256_add_ps(s0, s1));
}

KPA_IMPL_AVX2 inline float row_softmax(float* p, int n, float scale, float floor, float* max) {
  return row_softmax_as<false>(p, n, n, scale, floor, max);
}

KPA_IMPL_AVX2 inline float row_softmax_to_bf16(float* p, int n, int n_padded, float scale, float floor, float* max) {
  return row_softmax_as<true>(p, n, n_padded, scale, floor, max);
}

/// p[i] = cap * tanh(p[i] / cap) for i < n, through one vectorised exp: tanh(y) = 1 - 2 / (e^2y + 1)
/// (absolute error below 4e-7 * cap). -inf (masked) stays -inf, NaN stays NaN.
KPA_IMPL_AVX2 inline void row_soft_cap(float* p, int n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), two_over_c = _mm256_set1_ps(2.0f / cap);
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), minus_inf = _mm256_set1_ps(-__builtin_inff());
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 x = _mm256_maskload_ps(p + i, mask);
    const __m256 e = exp8(_mm256_mul_ps(x, two_over_c));
    const __m256 capped = _mm256_mul_ps(c, _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one))));
    _mm256_maskstore_ps(p + i, mask, _mm256_blendv_ps(capped, x, _mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ)));
  }
}

/// p[i] += slope * (offset + i) for i < n.
KPA_IMPL_AVX2 inline void row_add_ramp(float* p, int n, float slope, float offset) {
  const __m256 step = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 at = _mm256_add_ps(_mm256_set1_ps(offset + static_cast<float>(i)), step);
    _mm256_maskstore_ps(p + i, mask, _mm256_fmadd_ps(_mm256_set1_ps(slope), at, _mm256_maskload_ps(p + i, mask)));
  }
}

// ---- The 8-lane mapping of the register tiles (x86_tiles.inc) ----

/// AVX2's mapping: 16 ymm registers of 8 floats; fp8 codes widened 16 at a time.
struct Avx2 {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegisters = 16;
  /// Rows per tile: at most four, three for groups of six.
  static constexpr int head_tile(int H) { return H == 6 ? 3 : (H < 4 ? H : 4); }
  /// Key registers per q.k tile: HG x KR accumulators beside KR key registers (for one row, 8,
  /// each key register going straight into its FMA).
  static constexpr int key_tile(int HG) { return HG == 1 ? 8 : (HG == 2 ? 4 : (HG == 3 ? 3 : 2)); }
  /// Value registers (dimensions) per p.V tile: HG x R accumulators, R value registers.
  static constexpr int row_tile(int HG) { return key_tile(HG); }
  using ValueBlockSizes = std::integer_sequence<int, 8, 16, 32>;  // vLLM's small block sizes
  static constexpr bool kAnyBlockSize = true;

  KPA_IMPL_AVX2_INLINE static Vec zero() { return _mm256_setzero_ps(); }
  KPA_IMPL_AVX2_INLINE static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  KPA_IMPL_AVX2_INLINE static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  KPA_IMPL_AVX2_INLINE static Vec load_first(const float* p, int n) { return _mm256_maskload_ps(p, first_lanes(n)); }
  KPA_IMPL_AVX2_INLINE static void hold(Vec& v) { KPA_IMPL_IN_REGISTER(v); }
  template <int SPR>
  KPA_IMPL_AVX2_INLINE static Vec load_query(const float* q) {
    if constexpr (SPR == 2) {
      return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q));
    } else {
      return _mm256_loadu_ps(q);
    }
  }
  template <class CacheT>
  static constexpr int widen_group() {
    return sizeof(CacheT) == 1 ? 2 : 1;
  }
  template <int N, class CacheT>
  KPA_IMPL_AVX2_INLINE static void widen(const CacheT* p, Vec* out) {
    int i = 0;
    if constexpr (sizeof(CacheT) == 1) {
#pragma GCC unroll 8
      for (; i + 2 <= N; i += 2) load_sixteen(p + 8 * i, out[i], out[i + 1]);
    }
#pragma GCC unroll 16
    for (; i < N; ++i) out[i] = Load<CacheT>::eight(p + 8 * i);
  }
  template <class CacheT>
  KPA_IMPL_AVX2_INLINE static Vec widen_first(const CacheT* p, int n) {
    return x86::load_first(p, n);
  }
  template <int SPR, int N>
  static constexpr int sums_capacity() {
    return SPR == 2 ? kHalvesCapacity8<N> : N;
  }
  template <int SPR, int N>
  KPA_IMPL_AVX2_INLINE static void sums(const Vec (&acc)[N], float* out) {
    if constexpr (SPR == 2) {
      reduce_halves8(acc, out);
    } else {
      reduce_lanes(acc, out);
    }
  }
};

KPA_IMPL_BEGIN_TARGET("avx2,fma,f16c")
#include "x86_tiles.inc"
KPA_IMPL_END_TARGET

// ---- Query and output rows ----

template <class T>
KPA_IMPL_AVX2 void load_row(const T* src, float scale, float* dst, int n) {
  const __m256 s = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(Load<T>::eight(src + i), s));
  if (i < n) _mm256_maskstore_ps(dst + i, first_lanes(n - i), _mm256_mul_ps(load_first(src + i, n - i), s));
}

/// 8 floats rounded to T as from_float<T> rounds them (to nearest even; NaN stays a quiet NaN).
template <class T>
KPA_IMPL_AVX2 inline void store_eight(__m256 x, T* dst) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(dst, x);
  } else if constexpr (std::is_same_v<T, half>) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {  // bfloat16: the upper half after adding 0x7fff plus the lowest kept bit; NaN quieted
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256i words = _mm256_blendv_epi8(rounded, quiet, nan);  // 8 x 16 bits in 32-bit lanes
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(words, words), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
  }
}

template <class T>
KPA_IMPL_AVX2 void store_row(const float* src, float factor, T* dst, int n) {
  const __m256 f = _mm256_set1_ps(factor);
  int i = 0;
  for (; i + 8 <= n; i += 8) store_eight(_mm256_mul_ps(_mm256_loadu_ps(src + i), f), dst + i);
  if (i < n) {  // the tail through a buffer: nothing written past dst[n - 1]
    T buffer[8];
    store_eight(_mm256_mul_ps(_mm256_maskload_ps(src + i, first_lanes(n - i)), f), buffer);
    std::memcpy(static_cast<void*>(dst + i), static_cast<const void*>(buffer), (n - i) * sizeof(T));
  }
}

}  // namespace kpa::detail::avx2
