#pragma once
// The AVX-512 (F, BW, VL, DQ) host loops that carry the arithmetic, q.k (block_logits) and p.V
// (chunk_values), for 16- and 8-bit caches: x86_tiles.inc's register tiles over the 16-lane
// mappings below (32 zmm registers; two slots x 8 dimensions per key register for 16-bit caches,
// the query's 8 dimensions broadcast to both halves, one slot x 16 dimensions for fp8).
// host_loops.cpp pairs them with the AVX2 row loops but the softmax (row_softmax, here) and keeps
// the AVX2 set for f32 caches and, for p.V, block sizes other than 16, 32, 64 and 128.
// A tile's accumulators are reduced by a transposing tree, 8 registers into one register of sums
// in order (reduce_halves, reduce_all). Avx512 widens fp8 codes through binary16 (64 at a time
// where four registers' codes are adjacent, else 32); Avx512Vbmi (HostIsa::Avx512Vbmi) widens
// groups of 64 through byte lookups straight to floats.

#include "avx2.hpp"
#include "x86_simd.hpp"

// GCC 12's AVX-512 intrinsics start their results from `__m512 __Y = __Y;`, which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#endif

#define KPA_IMPL_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"), aligned(64)))
#define KPA_IMPL_AVX512_INLINE \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"), always_inline))

namespace kpa::detail::avx512 {

using namespace x86;

/// Cache types with AVX-512 loops (f32 caches run the AVX2 ones).
template <class CacheT>
inline constexpr bool has_loops = std::is_same_v<CacheT, half> || std::is_same_v<CacheT, bfloat16> ||
                                    std::is_same_v<CacheT, fp8_e4m3> || std::is_same_v<CacheT, fp8_e5m2>;

/// 16 consecutive cache elements as floats, times 1 / Load<CacheT>::scale.
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline __m512 load16(const CacheT* p) {
  if constexpr (std::is_same_v<CacheT, half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (std::is_same_v<CacheT, bfloat16>) {
    // The bits in place and nothing more: every caller multiplies, which quiets a signalling
    // NaN to the one to_float gives (raising FE_INVALID, as f16's conversion instruction does).
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  } else {
    return _mm512_cvtph_ps(fp8_as_half16(p));
  }
}

/// 32 consecutive fp8 codes as binary16 codes (the bits fp8_as_half16 gives, 32 lanes at
/// once: about half its integer instructions per code).
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline __m512i fp8_as_half32(const CacheT* p) {
  static_assert(sizeof(CacheT) == 1, "fp8 codes");
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  // Bits 0..6 of each code, compared as bits 15..9 of a 16-bit lane.
  const __m512i low7 = _mm512_slli_epi16(w, 9);
  const __m512i b = _mm512_slli_epi16(w, 8);
  if constexpr (std::is_same_v<CacheT, fp8_e5m2>) {
    // The upper byte of a binary16. The one signalling NaN, S.11111.01, is quieted by setting
    // bit 9 (its mantissa's top bit, clear there), as to_float does.
    const __mmask32 signalling = _mm512_cmpeq_epi16_mask(low7, _mm512_set1_epi16(static_cast<short>(0xfa00)));
    return _mm512_mask_add_epi16(b, signalling, b, _mm512_set1_epi16(0x0200));
  } else {
    // Sign to bit 15, exponent and mantissa to bits 13..7 (the value times 2^-8); the NaN
    // S.1111.111 lands on 0x3f80 (1.875) there, and adding 0x4000 makes it the quiet NaN 0x7f80.
    const __m512i h = _mm512_and_si512(_mm512_srai_epi16(b, 1), _mm512_set1_epi16(static_cast<short>(0xbfff)));
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(low7, _mm512_set1_epi16(static_cast<short>(0xfe00)));
    return _mm512_mask_add_epi16(h, nan, h, _mm512_set1_epi16(0x4000));
  }
}

/// E4M3 codes in the upper bytes of 16-bit lanes as binary16 codes (fp8_as_half32's bits).
/// Shifted right by one with the sign kept, a code gives the sign at bit 15 and exponent and
/// mantissa at bits 13..7 once bit 14 (a copy of the sign) is cleared: the value times 2^-8.
/// Adding 0x80 carries into bit 14 only from the NaN S.1111.111 (0x3f80 there), whose bit 14 set
/// makes the exponent all ones: the quiet NaN 0x7f80.
KPA_IMPL_AVX512_INLINE inline __m512i e4m3_upper_as_half(__m512i upper) {
  const __m512i t = _mm512_and_si512(_mm512_srai_epi16(upper, 1), _mm512_set1_epi16(static_cast<short>(0xbfff)));
  const __m512i carry = _mm512_add_epi16(t, _mm512_set1_epi16(0x0080));
  return _mm512_ternarylogic_epi32(t, carry, _mm512_set1_epi16(0x4000), 0xf8);  // t | (carry & 0x4000)
}

/// 64 consecutive fp8 codes as binary16 codes (the bits fp8_as_half32 gives): codes [0, 32) in
/// `lo`, [32, 64) in `hi`. The codes go to the upper bytes of 16-bit lanes by unpacking against
/// zero, 8 per 128-bit lane, after a qword permutation that makes the unpacked order the natural
/// one; that takes three shuffles for 64 codes where fp8_as_half32 widens 32 with one, and the
/// upper-byte form needs fewer integer instructions after it.
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline void fp8_as_half64(const CacheT* p, __m512i& lo, __m512i& hi) {
  static_assert(sizeof(CacheT) == 1, "fp8 codes");
  __m512i c = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), _mm512_loadu_si512(p));
  if constexpr (std::is_same_v<CacheT, fp8_e5m2>) {
    // The code is the upper byte of a binary16. The signalling NaN S.11111.01 (code x 2 = 0xfa
    // in 8 bits) is quieted by setting its mantissa's top bit, as to_float does.
    const __mmask64 signalling = _mm512_cmpeq_epi8_mask(_mm512_add_epi8(c, c), _mm512_set1_epi8(static_cast<char>(0xfa)));
    c = _mm512_mask_add_epi8(c, signalling, c, _mm512_set1_epi8(0x02));
    lo = _mm512_unpacklo_epi8(_mm512_setzero_si512(), c);
    hi = _mm512_unpackhi_epi8(_mm512_setzero_si512(), c);
  } else {
    lo = e4m3_upper_as_half(_mm512_unpacklo_epi8(_mm512_setzero_si512(), c));
    hi = e4m3_upper_as_half(_mm512_unpackhi_epi8(_mm512_setzero_si512(), c));
  }
}

/// bfloat16 bits of s * 2^x, for 0 <= s < 256 (exact: at most 8 significant bits).
constexpr std::uint16_t bfloat16_bits(int s, int x) {
  if (s == 0) return 0;
  int top = 0;  // s's highest set bit
  while ((s >> (top + 1)) != 0) ++top;
  return static_cast<std::uint16_t>(((x + top + 127) << 7) | (((s - (1 << top)) << (7 - top)) & 0x7f));
}

/// bfloat16 bits of the fp8 code with magnitude bits m (0..127, sign clear) times
/// 1 / Load<CacheT>::scale: E4M3 values times 2^-8, E5M2 values as they are. Every one
/// is exact in bfloat16 (8 exponent bits: fp8 subnormals are normal there); NaN codes give the
/// quiet NaN, E5M2's infinity infinity.
template <class CacheT>
constexpr std::uint16_t fp8_magnitude_as_bfloat16(int m) {
  if constexpr (std::is_same_v<CacheT, fp8_e4m3>) {
    const int e = m >> 3, f = m & 7;
    if (m == 0x7f) return 0x7fc0;
    return e == 0 ? bfloat16_bits(f, -17) : bfloat16_bits(8 + f, e - 18);  // f x 2^-9, (8 + f) x 2^(e-10)
  } else {
    const int e = m >> 2, f = m & 3;
    if (e == 31) return f == 0 ? 0x7f80 : 0x7fc0;
    return e == 0 ? bfloat16_bits(f, -16) : bfloat16_bits(4 + f, e - 17);  // f x 2^-16, (4 + f) x 2^(e-17)
  }
}

/// The upper and lower bytes of fp8_magnitude_as_bfloat16 for the 128 magnitudes: the tables
/// of fp8_as_float64's lookups.
template <class CacheT>
struct Fp8Bytes {
  alignas(64) std::uint8_t upper[128];
  alignas(64) std::uint8_t lower[128];
  constexpr Fp8Bytes() : upper{}, lower{} {
    for (int m = 0; m < 128; ++m) {
      upper[m] = static_cast<std::uint8_t>(fp8_magnitude_as_bfloat16<CacheT>(m) >> 8);
      lower[m] = static_cast<std::uint8_t>(fp8_magnitude_as_bfloat16<CacheT>(m) & 0xff);
    }
  }
};
template <class CacheT>
inline constexpr Fp8Bytes<CacheT> kFp8Bytes{};

/// table[index & 127] for each byte of `index`; `table` 128 bytes, 64-byte aligned. vpermi2b
/// (AVX-512 VBMI) written as assembly, so that the AVX-512 functions that inline it keep one
/// target attribute: only the Avx512Vbmi mapping, which HostIsa::Avx512Vbmi selects, runs it.
KPA_IMPL_AVX512_INLINE inline __m512i lookup_bytes(const std::uint8_t* table, __m512i index) {
  __asm__("vpermi2b %[second], %[first], %[index]"
          : [index] "+v"(index)
          : [first] "v"(_mm512_load_si512(table)), [second] "v"(_mm512_load_si512(table + 64)));
  return index;
}

/// 64 consecutive fp8 codes as floats times 1 / Load<CacheT>::scale, 16 per register in
/// order (out[0, 4)), through byte lookups: the upper and lower bytes of each code's bfloat16 (the
/// sign added to the upper), bytes to 16-bit lanes and 16-bit lanes to the upper halves of 32-bit
/// ones, a float's bits. A dword permutation first (a 4 x 4 transpose of 4-code groups) makes the
/// in-lane unpacks give the natural order. No vcvtph2ps: 10 instructions per 64 codes.
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline void fp8_as_float64(const CacheT* p, __m512* out) {
  static_assert(sizeof(CacheT) == 1, "fp8 codes");
  const __m512i c = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
                                             _mm512_loadu_si512(p));
  const __m512i lower = lookup_bytes(kFp8Bytes<CacheT>.lower, c);
  const __m512i upper = _mm512_ternarylogic_epi32(lookup_bytes(kFp8Bytes<CacheT>.upper, c), c,
                                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);  // | sign
  const __m512i first = _mm512_unpacklo_epi8(lower, upper), second = _mm512_unpackhi_epi8(lower, upper);
  const __m512i zero = _mm512_setzero_si512();
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, first));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, first));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, second));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, second));
}

/// The same for the first n (0..16) elements, zeros after; nothing past them is read.
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline __m512 load16_first(const CacheT* p, int n) {
  const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
  if constexpr (sizeof(CacheT) == 2) {
    const __m256i bits = _mm256_maskz_loadu_epi16(mask, p);
    if constexpr (std::is_same_v<CacheT, half>) {
      return _mm512_cvtph_ps(bits);
    } else {
      alignas(32) CacheT buffer[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), bits);
      return load16(buffer);
    }
  } else {
    alignas(16) CacheT buffer[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(buffer), _mm_maskz_loadu_epi8(mask, p));
    return load16(buffer);
  }
}

/// Floats reduce_halves<N> writes: whole registers of 16 sums.
template <int N>
inline constexpr int kHalvesCapacity = (2 * N + 15) / 16 * 16;

/// out[2i], out[2i + 1] = the sums of lanes [0, 8) and [8, 16) of acc[i] for i < N (two sums per
/// register), zeros after them up to kHalvesCapacity<N>; `out` 64-byte aligned. A transposing
/// tree, 8 registers into one: 15 shuffles and 7 adds, where lane-by-lane sums through 256-bit
/// halves would load the shuffle port several times as much.
template <int N>
KPA_IMPL_AVX512_INLINE inline void reduce_halves(const __m512 (&acc)[N], float* out) {
  const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 4
  for (int first = 0; first < N; first += 8) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = first + i < N ? acc[first + i] : _mm512_setzero_ps();
    // s[k]'s 128-bit quarter m: four partial sums of sum 4k + m (of this group's 16).
    __m512 s[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x88),
                           _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xdd));
    }
    // w[k]'s quarter m: two partial sums of sum 8k + m, then two of sum 8k + 4 + m.
    __m512 w[2];
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      w[k] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // Lane 4m + c: sum m + 4c; the permutation puts sum i in lane i.
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_store_ps(out + 2 * first, _mm512_permutexvar_ps(natural, z));
  }
}

/// Floats reduce_all<N> writes.
template <int N>
inline constexpr int kAllCapacity = kHalvesCapacity<(N + 1) / 2>;

/// out[i] = the sum of the 16 lanes of acc[i] for i < N, zeros after up to kAllCapacity<N>;
/// `out` 64-byte aligned. Pairs of registers fold into one of two 8-lane halves first.
template <int N>
KPA_IMPL_AVX512_INLINE inline void reduce_all(const __m512 (&acc)[N], float* out) {
  constexpr int M = (N + 1) / 2;
  __m512 halves[M];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
    const __m512 a = acc[2 * i], b = 2 * i + 1 < N ? acc[2 * i + 1] : _mm512_setzero_ps();
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  }
  reduce_halves(halves, out);
}

/// dst[i] = src[i] * scale for i < W, in registers of 16 floats, then as x86::store_scaled_span.
template <int W>
KPA_IMPL_AVX512_INLINE inline void store_scaled_span(const float* src, float scale, float* dst) {
  if constexpr (W >= 16) {
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_loadu_ps(src), _mm512_set1_ps(scale)));
    store_scaled_span<W - 16>(src + 16, scale, dst + 16);
  } else {
    x86::store_scaled_span<W>(src, scale, dst);
  }
}

/// o[i] += src[i] * scale for i < W, registers as above.
template <int W>
KPA_IMPL_AVX512_INLINE inline void add_scaled_span(const float* src, float scale, float* o) {
  if constexpr (W >= 16) {
    _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(src), _mm512_set1_ps(scale), _mm512_loadu_ps(o)));
    add_scaled_span<W - 16>(src + 16, scale, o + 16);
  } else {
    x86::add_scaled_span<W>(src, scale, o);
  }
}

// ---- The 16-lane mappings of the register tiles (x86_tiles.inc) ----

/// x86::exp8 on 16 lanes for the arguments a softmax takes, x <= 0 (a logit less its row's max),
/// -inf or NaN: the same polynomial, so the same value in every lane; 0 below -87.33 and NaN for
/// NaN, without raising floating-point exceptions. No argument overflows, so vscalefps applies
/// the exponent and only the underflow needs a mask.
KPA_IMPL_AVX512_INLINE inline __m512 exp16_nonpositive(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);  // -inf included
  const __m512 r0 = _mm512_mask_mov_ps(x, tiny, _mm512_setzero_ps());  // no infinity through the reduction
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(r0, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), r0);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), y, n);  // y * 2^n: exact, or the same rounding
}

/// The first half of row_softmax: p[i] *= scale (stored where scale is not 1); returns the
/// largest of floor and every p[i], NaN ignored.
KPA_IMPL_AVX512_INLINE inline float row_scaled_max(float* p, int n, float scale, float floor) {
  // Four running maxima, so that the compares of consecutive vectors do not wait for each other.
  __m512 m[4] = {_mm512_set1_ps(floor), _mm512_set1_ps(floor), _mm512_set1_ps(floor), _mm512_set1_ps(floor)};
  const __m512 s = _mm512_set1_ps(scale);
  const bool scaled = scale != 1.0f;  // the products stored, so that the exponent reads them rounded
  int i = 0;
  for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512 v = _mm512_loadu_ps(p + i + 16 * k);
      if (scaled) {
        v = _mm512_mul_ps(v, s);
        _mm512_storeu_ps(p + i + 16 * k, v);
      }
      m[k] = _mm512_mask_mov_ps(m[k], _mm512_cmp_ps_mask(v, m[k], _CMP_GT_OQ), v);  // NaN ignored, no FE_INVALID
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(floor), lanes, p + i);
    if (scaled) {
      v = _mm512_mask_mul_ps(v, lanes, v, s);
      _mm512_mask_storeu_ps(p + i, lanes, v);
    }
    m[0] = _mm512_mask_mov_ps(m[0], _mm512_cmp_ps_mask(v, m[0], _CMP_GT_OQ), v);
  }
  for (int k = 1; k < 4; ++k) m[0] = _mm512_mask_mov_ps(m[0], _mm512_cmp_ps_mask(m[k], m[0], _CMP_GT_OQ), m[k]);
  // The lanes' max in registers, halving with the same rule (a lane not greater leaves the other;
  // the lanes hold no NaN but from a NaN floor, which every lane then holds): a pass over the
  // lanes in memory would wait on each compare in turn.
  const __m512i halves[4] = {_mm512_set_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8),
                             _mm512_set_epi32(11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5, 4),
                             _mm512_set_epi32(13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2),
                             _mm512_set_epi32(14, 15, 12, 13, 10, 11, 8, 9, 6, 7, 4, 5, 2, 3, 0, 1)};
  for (const __m512i& order : halves) {
    const __m512 other = _mm512_permutexvar_ps(order, m[0]);
    m[0] = _mm512_mask_mov_ps(m[0], _mm512_cmp_ps_mask(other, m[0], _CMP_GT_OQ), other);
  }
  return _mm512_cvtss_f32(m[0]);
}

/// avx2::row_softmax on 16 lanes (RowLoops::softmax).
KPA_IMPL_AVX512 inline float row_softmax(float* p, int n, float scale, float floor, float* max) {
  const float row_max = row_scaled_max(p, n, scale, floor);
  *max = row_max;
  if (row_max == -__builtin_inff()) return avx2::row_softmax(p, n, 1.0f, floor, max);  // nothing attended
  const __m512 mv = _mm512_set1_ps(row_max);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p + i), mv));
    const __m512 e1 = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p + i + 16), mv));
    _mm512_storeu_ps(p + i, e0);
    _mm512_storeu_ps(p + i + 16, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, p + i), mv));
    _mm512_mask_storeu_ps(p + i, lanes, e);
    s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(lanes, e));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/// AVX-512's mapping: 32 zmm registers of 16 floats; fp8 codes widened through binary16, four
/// registers at a time where there are four, else two.
struct Avx512 {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;
  /// Rows per tile: a whole group of up to 8 (passes of 16 rows take two tiles).
  static constexpr int head_tile(int H) { return H <= 4 || H == 6 ? H : 8; }
  /// Key registers per q.k tile: HG x KR accumulators, KR key registers, one query register (at
  /// most 29 of the 32; for 8 rows, 2 key registers, so a block of 16 slots has no one-register
  /// remainder).
  static constexpr int key_tile(int HG) { return HG <= 2 ? 8 : (HG == 3 ? 6 : (HG <= 6 ? 4 : 2)); }
  /// Value registers per p.V tile: HG x R accumulators, R value registers, one probability
  /// register (at most 29 of the 32).
  static constexpr int row_tile(int HG) {
    return HG == 1 ? 16 : (HG == 2 ? 8 : (HG == 3 ? 6 : (HG == 4 || HG == 6 ? 4 : 3)));
  }
  using ValueBlockSizes = std::integer_sequence<int, 16, 32, 64, 128>;  // has_value_tiles
  static constexpr bool kAnyBlockSize = false;

  KPA_IMPL_AVX512_INLINE static Vec zero() { return _mm512_setzero_ps(); }
  KPA_IMPL_AVX512_INLINE static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  KPA_IMPL_AVX512_INLINE static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  KPA_IMPL_AVX512_INLINE static Vec load_first(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  KPA_IMPL_AVX512_INLINE static void hold(Vec& v) { KPA_IMPL_IN_REGISTER(v); }
  template <int SPR>
  KPA_IMPL_AVX512_INLINE static Vec load_query(const float* q) {
    if constexpr (SPR == 2) {
      return _mm512_broadcast_f32x8(_mm256_loadu_ps(q));
    } else {
      return _mm512_loadu_ps(q);
    }
  }
  template <class CacheT>
  static constexpr int widen_group() {
    return 1;
  }
  template <int N, class CacheT>
  KPA_IMPL_AVX512_INLINE static void widen(const CacheT* p, Vec* out) {
    int i = 0;
    if constexpr (sizeof(CacheT) == 1) {
#pragma GCC unroll 4
      for (; i + 4 <= N; i += 4) {
        __m512i lo, hi;
        fp8_as_half64(p + 16 * i, lo, hi);
        out[i] = _mm512_cvtph_ps(_mm512_castsi512_si256(lo));
        out[i + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(lo, 1));
        out[i + 2] = _mm512_cvtph_ps(_mm512_castsi512_si256(hi));
        out[i + 3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(hi, 1));
      }
    }
    widen_rest<N>(p, out, i);
  }
  /// Registers [i, N) two fp8 registers at a time where there are two, else one by one.
  template <int N, class CacheT>
  KPA_IMPL_AVX512_INLINE static void widen_rest(const CacheT* p, Vec* out, int i) {
    if constexpr (sizeof(CacheT) == 1) {
#pragma GCC unroll 2
      for (; i + 2 <= N; i += 2) {
        const __m512i h = fp8_as_half32(p + 16 * i);
        out[i] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        out[i + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
      }
    }
#pragma GCC unroll 16
    for (; i < N; ++i) out[i] = load16(p + 16 * i);
  }
  template <class CacheT>
  KPA_IMPL_AVX512_INLINE static Vec widen_first(const CacheT* p, int n) {
    return load16_first(p, n);
  }
  template <int SPR, int N>
  static constexpr int sums_capacity() {
    return SPR == 2 ? kHalvesCapacity<N> : kAllCapacity<N>;
  }
  template <int SPR, int N>
  KPA_IMPL_AVX512_INLINE static void sums(const Vec (&acc)[N], float* out) {
    if constexpr (SPR == 2) {
      reduce_halves(acc, out);
    } else {
      reduce_all(acc, out);
    }
  }
};

/// Avx512 with fp8 codes widened four registers at a time through byte lookups (AVX-512 VBMI).
struct Avx512Vbmi : Avx512 {
  template <int N, class CacheT>
  KPA_IMPL_AVX512_INLINE static void widen(const CacheT* p, Vec* out) {
    int i = 0;
    if constexpr (sizeof(CacheT) == 1) {
#pragma GCC unroll 4
      for (; i + 4 <= N; i += 4) fp8_as_float64(p + 16 * i, out + i);
    }
    widen_rest<N>(p, out, i);
  }
};

/// Block sizes chunk_values has tiles for (a block row is whole registers).
inline bool has_value_tiles(int block_size) {
  return block_size == 16 || block_size == 32 || block_size == 64 || block_size == 128;
}

/// The 16-lane loops `block_logits` and `chunk_values` (x86_tiles.inc over a 16-lane mapping) in
/// `loops`, as `isa`, where the sizes suit them.
template <int H, class CacheT>
void use_loops(HostLoops<H, CacheT>& loops, HostIsa isa, int head_size, int block_size,
               decltype(HostLoops<H, CacheT>::block_logits) block_logits,
               decltype(HostLoops<H, CacheT>::chunk_values) chunk_values) {
  if constexpr (has_loops<CacheT>) {
    if (head_size % static_cast<int>(16 / sizeof(CacheT)) == 0) {  // whole key vectors
      loops.isa = isa;
      loops.block_logits = block_logits;
    }
    if (has_value_tiles(block_size)) {
      loops.isa = isa;
      loops.chunk_values = chunk_values;
    }
  }
}

KPA_IMPL_BEGIN_TARGET("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#include "x86_tiles.inc"
KPA_IMPL_END_TARGET

}  // namespace kpa::detail::avx512

#ifdef KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#pragma GCC diagnostic pop
#undef KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#endif
