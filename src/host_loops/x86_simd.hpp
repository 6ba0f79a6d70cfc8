#pragma once
// The x86 mapping layer under the AVX2 and AVX-512 host loops: cache elements widened to floats
// 8 at a time (fp8 codes through binary16, E4M3 with its exponent rebiased by a factor the sums
// undo: Load::scale), lane reductions, the vectorised exp, masks, the chunk's attended value
// runs, and the one-slot q.k that finishes a block's odd last slot. Every function
// carries a target attribute instead of relying on the translation unit's flags: libkpa is built
// for baseline x86-64, and the loops that use these run only on CPUs that have the instructions
// (host_loops.cpp).

#include "portable.hpp"

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// Loops start on a cache line, so where an edit elsewhere in libkpa moves them, their alignment,
// and with it the decoded-instruction cache's view of them, stays.
#define KPA_IMPL_AVX2 __attribute__((target("avx2,fma,f16c"), aligned(64)))
// For the helpers of the register tiles: a call would spill the tile's registers.
#define KPA_IMPL_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))

// Every function defined between KPA_IMPL_BEGIN_TARGET(t) and KPA_IMPL_END_TARGET takes the target
// attribute t: the region in which a set includes the tiles written once for all (x86_tiles.inc).
#define KPA_IMPL_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KPA_IMPL_BEGIN_TARGET(t) KPA_IMPL_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define KPA_IMPL_END_TARGET _Pragma("clang attribute pop")
#else
#define KPA_IMPL_BEGIN_TARGET(t) _Pragma("GCC push_options") KPA_IMPL_PRAGMA(GCC target(t))
#define KPA_IMPL_END_TARGET _Pragma("GCC pop_options")
#endif

namespace kpa::detail::x86 {

template <class CacheT>
struct Load;

template <>
struct Load<float> {
  static constexpr float scale = 1.0f;
  KPA_IMPL_AVX2 static __m256 eight(const float* p) { return _mm256_loadu_ps(p); }
};

template <>
struct Load<half> {
  static constexpr float scale = 1.0f;
  KPA_IMPL_AVX2 static __m256 eight(const half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

template <>
struct Load<bfloat16> {
  static constexpr float scale = 1.0f;
  KPA_IMPL_AVX2 static __m256 eight(const bfloat16* p) {
    // The bits in place and nothing more: every caller multiplies, which quiets a signalling
    // NaN to the one to_float gives (raising FE_INVALID, as f16's conversion instruction does).
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
};

/// OCP E5M2 is the upper byte of a binary16: widen, quiet NaNs, convert.
template <>
struct Load<fp8_e5m2> {
  static constexpr float scale = 1.0f;
  KPA_IMPL_AVX2 static __m256 eight(const fp8_e5m2* p) {
    const __m128i h = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    return _mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x0200))));
  }
};

/// OCP E4M3FN: sign, 4 exponent and 3 mantissa bits moved into binary16 position give the value
/// times 2^-8 (normal and subnormal alike; Load::scale undoes it); S.1111.111 becomes NaN.
template <>
struct Load<fp8_e4m3> {
  static constexpr float scale = 256.0f;
  KPA_IMPL_AVX2 static __m256 eight(const fp8_e4m3* p) {
    const __m128i b = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_and_si128(_mm_srai_epi16(b, 1), _mm_set1_epi16(static_cast<short>(0xbfff)));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f00)), _mm_set1_epi16(0x7f00));
    return _mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7e00))));
  }
};

/// 16 consecutive fp8 codes as the binary16 codes of their values times 1 / Load::scale (the
/// bits Load::eight converts), with the integer work done on 16 lanes of 16 bits at once.
template <class CacheT>
KPA_IMPL_AVX2_INLINE inline __m256i fp8_as_half16(const CacheT* p) {
  static_assert(sizeof(CacheT) == 1, "fp8 codes");
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i h;
  if constexpr (std::is_same_v<CacheT, fp8_e5m2>) {  // the upper byte of a binary16; NaNs quieted
    h = _mm256_slli_epi16(w, 8);
    const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7c00));
    h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x0200)));
  } else {
    // t: sign at bit 14, exponent and mantissa at bits 13..7; adding the sign bit to itself
    // carries it to bit 15. A magnitude of 0x3f80 (S.1111.111, NaN) plus 0x80 sets bit 14, which
    // makes the exponent all ones: the quiet NaN 0x7f80 that Load::eight gives.
    const __m256i t = _mm256_slli_epi16(w, 7);
    const __m256i magnitude = _mm256_and_si256(t, _mm256_set1_epi16(0x3f80));
    h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
    h = _mm256_or_si256(h, _mm256_and_si256(_mm256_add_epi16(magnitude, _mm256_set1_epi16(0x80)),
                                            _mm256_set1_epi16(0x4000)));
  }
  return h;
}

/// 16 consecutive fp8 codes as two registers of 8 floats (codes [0, 8) and [8, 16)), times
/// 1 / Load::scale: the same values as two Load::eight, in about half the instructions per code.
template <class CacheT>
KPA_IMPL_AVX2_INLINE inline void load_sixteen(const CacheT* p, __m256& lo, __m256& hi) {
  const __m256i h = fp8_as_half16(p);
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/// out[i] = the sum of the 8 lanes of acc[i], for N accumulators: hadd trees reduce eight at
/// once, lanes crossing only at the end.
template <int N>
KPA_IMPL_AVX2_INLINE inline void reduce_lanes(const __m256 (&acc)[N], float* out) {
#pragma GCC unroll 4
  for (int first = 0; first < N; first += 8) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = first + i < N ? acc[first + i] : _mm256_setzero_ps();
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    // u0 = [a0..a3 low-half sums | a0..a3 high-half sums], u1 likewise for a4..a7.
    const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sums);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if (first + i < N) out[first + i] = lanes[i];
    }
  }
}

KPA_IMPL_AVX2 inline float horizontal_sum(__m256 v) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

/// exp(x) to about 1 ulp (Cephes' polynomial after reducing by ln 2): 0 below -87.33 (and for
/// -inf), +inf above 88.37, NaN for NaN, without raising floating-point exceptions.
KPA_IMPL_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
  const __m256 huge = _mm256_cmp_ps(x, _mm256_set1_ps(88.3762626647949f), _CMP_GT_OQ);
  const __m256 special = _mm256_or_ps(nan, _mm256_or_ps(tiny, huge));
  const __m256 r0 = _mm256_andnot_ps(special, x);  // 0 in special lanes: no conversion of NaN or inf
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(r0, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), r0);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 result = _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
  result = _mm256_andnot_ps(tiny, result);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), huge);
  return _mm256_blendv_ps(result, x, nan);
}

/// The bf16 bits of 8 floats rounded to nearest even, in the low halves of 32-bit lanes; NaN
/// stays a quiet NaN.
KPA_IMPL_AVX2_INLINE inline __m256i bf16_rounded(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}

KPA_IMPL_AVX2_INLINE inline __m256 bf16_value(__m256i bf16) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16, 16)); }

/// The bf16 codes of 16 floats (bf16_rounded), in order.
KPA_IMPL_AVX2_INLINE inline __m256i bf16_codes(__m256 lo, __m256 hi) {
  // packus keeps each 128-bit half's order: lo0-3 hi0-3 lo4-7 hi4-7, then the quarters in place.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_rounded(lo), bf16_rounded(hi)), 0xd8);
}

/// Lane mask of the first n (0..8) lanes.
KPA_IMPL_AVX2 inline __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// max(m, v) lane by lane, ignoring NaN in v, with quiet comparisons (MAXPS would raise
/// FE_INVALID on a NaN).
KPA_IMPL_AVX2 inline __m256 max_ignoring_nan(__m256 m, __m256 v) {
  return _mm256_blendv_ps(m, v, _mm256_cmp_ps(v, m, _CMP_GT_OQ));
}

/// Keeps a loaded vector in a register: compilers otherwise fold the load into every FMA that
/// uses it, and the loads, not the FMAs, limit the loop. "v": any vector register the target
/// has (all 32 under AVX-512; "x" admits only the first 16, which costs a copy per use there).
#define KPA_IMPL_IN_REGISTER(v) __asm__("" : "+v"(v))

/// dst[i] = src[i] * scale for i < W, in registers of 8 and 4 floats and single floats.
template <int W>
KPA_IMPL_AVX2_INLINE inline void store_scaled_span(const float* src, float scale, float* dst) {
  if constexpr (W >= 8) {
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_loadu_ps(src), _mm256_set1_ps(scale)));
    store_scaled_span<W - 8>(src + 8, scale, dst + 8);
  } else if constexpr (W >= 4) {
    _mm_storeu_ps(dst, _mm_mul_ps(_mm_loadu_ps(src), _mm_set1_ps(scale)));
    store_scaled_span<W - 4>(src + 4, scale, dst + 4);
  } else if constexpr (W >= 1) {
    dst[0] = src[0] * scale;
    store_scaled_span<W - 1>(src + 1, scale, dst + 1);
  }
}

/// o[i] += src[i] * scale for i < W, registers as above.
template <int W>
KPA_IMPL_AVX2_INLINE inline void add_scaled_span(const float* src, float scale, float* o) {
  if constexpr (W >= 8) {
    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(src), _mm256_set1_ps(scale), _mm256_loadu_ps(o)));
    add_scaled_span<W - 8>(src + 8, scale, o + 8);
  } else if constexpr (W >= 4) {
    _mm_storeu_ps(o, _mm_fmadd_ps(_mm_loadu_ps(src), _mm_set1_ps(scale), _mm_loadu_ps(o)));
    add_scaled_span<W - 4>(src + 4, scale, o + 4);
  } else if constexpr (W >= 1) {
    o[0] += src[0] * scale;
    add_scaled_span<W - 1>(src + 1, scale, o + 1);
  }
}

/// Floats reduce_halves8<N> writes: whole registers of 8 sums.
template <int N>
inline constexpr int kHalvesCapacity8 = (2 * N + 7) / 8 * 8;

/// out[2i], out[2i + 1] = the sums of lanes [0, 4) and [4, 8) of acc[i] for i < N, zeros after
/// them up to kHalvesCapacity8<N>; `out` 16-byte aligned.
template <int N>
KPA_IMPL_AVX2_INLINE inline void reduce_halves8(const __m256 (&acc)[N], float* out) {
#pragma GCC unroll 8
  for (int first = 0; first < N; first += 4) {
    __m256 a[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) a[i] = first + i < N ? acc[first + i] : _mm256_setzero_ps();
    // Low 128 bits: the lower-half sums of a[0..3]; high: their upper-half sums.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m128 lower = _mm256_castps256_ps128(h), upper = _mm256_extractf128_ps(h, 1);
    _mm_store_ps(out + 2 * first, _mm_unpacklo_ps(lower, upper));
    _mm_store_ps(out + 2 * first + 4, _mm_unpackhi_ps(lower, upper));
  }
}

/// Lanes [0, n) of 8 values at p (n < 8): no read past them (the cache may end there), zeros after.
template <class CacheT>
KPA_IMPL_AVX2 inline __m256 load_first(const CacheT* p, int n) {
  CacheT buffer[8];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), static_cast<const void*>(p), n * sizeof(CacheT));
  return Load<CacheT>::eight(buffer);
}

/// Logits of one slot for rows [g0, g0 + HG), 8 dimensions at a time: the odd last slot where a
/// tile's key registers hold two slots (x86_tiles.inc; f32 and 16-bit caches).
template <int HG, class CacheT>
KPA_IMPL_AVX2_INLINE inline void logits_slot(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch, int g0,
                                             int slot) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));  // elements of a key vector
  static_assert(X == 4 || X == 8, "fp8 key registers hold one slot each");
  const int stride = a.block_size * X, steps = a.head_size / 8;
  const CacheT* key = a.key_block + slot * X;
  __m256 acc[HG];
#pragma GCC unroll 8
  for (int g = 0; g < HG; ++g) acc[g] = _mm256_setzero_ps();
  BlockPrefetcher::Run ahead = prefetch.take(steps);
  for (int v = 0; v < steps; ++v) {
    ask_ahead(ahead);
    __m256 k;  // dimensions [8v, 8v + 8)
    if constexpr (X == 4) {  // two key vectors
      const float* lo = key + 2 * v * stride;
      k = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(lo + stride), 1);
    } else {
      k = Load<CacheT>::eight(key + v * stride);
    }
#pragma GCC unroll 8
    for (int g = 0; g < HG; ++g) {
      acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(a.q + (g0 + g) * a.head_size + 8 * v), k, acc[g]);
    }
  }
  float sums[HG];
  reduce_lanes(acc, sums);
#pragma GCC unroll 8
  for (int g = 0; g < HG; ++g) a.logits[(g0 + g) * a.logits_stride + slot] = sums[g] * Load<CacheT>::scale;
}

/// The prefetch run of a p.V tile over `runs` block runs of `block_size` slots: two lines for every
/// 16 slots, the tile calling ask_ahead once per 16 slots, so the next chunk's lines keep coming
/// at any block size (per block, large blocks would leave most of them to finish()).
inline BlockPrefetcher::Run values_ahead(BlockPrefetcher& prefetch, int runs, int block_size) {
  return prefetch.take(2 * runs * ((block_size + 15) / 16));
}

/// One attended block of a chunk for p.V: its values (row 0) and probabilities (head 0).
template <class CacheT>
struct ValueRun {
  const CacheT* values;  ///< value_cache[block][kv_head][0]
  const float* probs;    ///< the block's first probability of the pass's first head
  int slots;
};

/// The chunk's value runs are taken kMaxRuns blocks at a time (one batch for chunks of 256
/// tokens in blocks of 8 or more).
inline constexpr int kMaxRuns = 64;

/// The attended blocks among the chunk's blocks [first, first + kMaxRuns) into runs; their count.
template <class CacheT>
inline int attended_runs(const ChunkValuesArgs<CacheT>& a, int first, ValueRun<CacheT> (&runs)[kMaxRuns]) {
  int count = 0;
  for (int lb = first; lb < a.blocks && lb < first + kMaxRuns; ++lb) {
    if (a.block_ids[lb] < 0) continue;  // attended by no head of the pass: never read
    runs[count++] = {a.value_head + a.block_ids[lb] * a.block_stride, a.probs + lb * a.block_size,
                     lb + 1 == a.blocks ? a.last_block_slots : a.block_size};
  }
  return count;
}

}  // namespace kpa::detail::x86
