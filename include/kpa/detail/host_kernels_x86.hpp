#pragma once
// AVX2 + FMA + F16C versions of the host kernel path's inner loops (host_kernels.hpp says what
// each computes). Every function carries a target attribute instead of relying on the
// translation unit's flags: a binary built for baseline x86-64 contains them, and the planner
// runs them only on CPUs that have the instructions (BackEndLimits::best_host_isa). Compiled
// where host_isa.hpp says.
//
// Register tiles (16 ymm registers):
//   q.k    heads of a pass in groups of HG, slots in groups of S; one accumulator of 8 dimension
//          lanes per (slot, head), reduced 8 at a time by a transposing hadd tree;
//   p.V    heads in groups of HG, output rows in groups of R; one accumulator of 8 slot lanes per
//          (head, row) over the whole chunk, reduced once at its end.
// Each cache vector is converted to float once and used for HG heads; fp8 codes widen through
// binary16, 16 at a time where whole key vectors or block rows allow (E4M3 with its exponent
// rebiased by a factor folded into the sums).

#include <kpa/detail/host_isa.hpp>
#include <kpa/detail/host_kernels_portable.hpp>

#ifdef KPA_IMPL_X86_KERNELS

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#define KPA_IMPL_AVX2 __attribute__((target("avx2,fma,f16c")))
// For the helpers of the register tiles: a call would spill the tile's registers.
#define KPA_IMPL_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))

namespace kpa::detail::avx2 {

template <class CacheT>
inline constexpr bool has_kernels = std::is_same_v<CacheT, float> || std::is_same_v<CacheT, half> ||
                                    std::is_same_v<CacheT, bfloat16> || std::is_same_v<CacheT, fp8_e4m3> ||
                                    std::is_same_v<CacheT, fp8_e5m2>;

// ---- Loads: 8 cache elements as 8 floats, times 1 / Load<CacheT>::scale ----

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
    const __m256i wide =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
    // Quiet any signalling NaN, as to_float does: arithmetic on one would raise FE_INVALID.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_castsi256_ps(_mm256_or_si256(wide, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000))));
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

/// Dimensions [8v, 8v + 8) of one cache slot whose X-element key vectors are `stride` apart.
template <class CacheT>
KPA_IMPL_AVX2 inline __m256 key_dims(const CacheT* slot, int stride, int v) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));
  if constexpr (X == 4) {  // f32: two key vectors per register
    const float* lo = slot + 2 * v * stride;
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(lo + stride), 1);
  } else if constexpr (X == 8) {
    return Load<CacheT>::eight(slot + v * stride);
  } else {  // fp8: a key vector is two registers
    return Load<CacheT>::eight(slot + (v >> 1) * stride + (v & 1) * 8);
  }
}

/// out[i] = the sum of the 8 lanes of acc[i], for N accumulators: hadd trees reduce eight at
/// once, lanes crossing only at the end.
template <int N>
KPA_IMPL_AVX2_INLINE inline void reduce_lanes(const __m256 (&acc)[N], float (&out)[N]) {
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

/// Lane mask of the first n (0..8) lanes.
KPA_IMPL_AVX2 inline __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// max(m, v) lane by lane, ignoring NaN in v, with quiet comparisons (MAXPS would raise
/// FE_INVALID on a NaN).
KPA_IMPL_AVX2 inline __m256 max_ignoring_nan(__m256 m, __m256 v) {
  return _mm256_blendv_ps(m, v, _mm256_cmp_ps(v, m, _CMP_GT_OQ));
}

KPA_IMPL_AVX2 inline float row_softmax(float* p, int n, float slope, float position, float floor, float* max) {
  const __m256 step = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 m = _mm256_set1_ps(floor);
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    __m256 v = _mm256_maskload_ps(p + i, mask);
    if (slope != 0.0f) {  // ALiBi: slope * (position + i)
      const __m256 at = _mm256_add_ps(_mm256_set1_ps(position + static_cast<float>(i)), step);
      v = _mm256_fmadd_ps(_mm256_set1_ps(slope), at, v);
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
      p[i] = p[i] != p[i] ? p[i] : 0.0f;
      sum += p[i];
    }
    return sum;
  }
  const __m256 mv = _mm256_set1_ps(row_max);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), mv));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i + 8), mv));
    _mm256_storeu_ps(p + i, e0);
    _mm256_storeu_ps(p + i + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(p + i, mask), mv)), _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(p + i, mask, e);
    s0 = _mm256_add_ps(s0, e);
  }
  return horizontal_sum(_mm256_add_ps(s0, s1));
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

/// Keeps a loaded vector in a register: compilers otherwise fold the load into every FMA that
/// uses it, and the loads, not the FMAs, limit the loop. "v": any vector register the target
/// has (all 32 under AVX-512; "x" admits only the first 16, which costs a copy per use there).
#define KPA_IMPL_IN_REGISTER(v) __asm__("" : "+v"(v))

// ---- q.k ----

/// Head groups per register tile: at most four heads, three for groups of six.
template <int H>
inline constexpr int kHeadTile = H == 6 ? 3 : (H < 4 ? H : 4);

/// Logits of S consecutive slots (the first at `key`) for HG heads (the first at q).
template <int S, int HG, class CacheT>
KPA_IMPL_AVX2_INLINE inline void logits_tile(const CacheT* key, int stride, int vectors, const float* q, int head_size,
                                             BlockPrefetcher::Run& ahead, float (&out)[S * HG]) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));
  __m256 acc[S * HG];
#pragma GCC unroll 16
  for (int i = 0; i < S * HG; ++i) acc[i] = _mm256_setzero_ps();
  if constexpr (X == 16) {  // fp8: a key vector is 16 dimensions, widened at once
    for (int u = 0; u < vectors / 2; ++u) {
      ask_ahead(ahead);
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) {
        __m256 lo, hi;
        load_sixteen(key + s * X + u * stride, lo, hi);
#pragma GCC unroll 4
        for (int g = 0; g < HG; ++g) {
          const float* qg = q + g * head_size + 16 * u;
          acc[s * HG + g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg), lo, acc[s * HG + g]);
          acc[s * HG + g] = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8), hi, acc[s * HG + g]);
        }
      }
    }
    reduce_lanes(acc, out);
    return;
  }
  for (int v = 0; v < vectors; ++v) {
    ask_ahead(ahead);
    if constexpr (HG == 1) {  // each key vector used once: converted straight into its FMA
      __m256 qv = _mm256_loadu_ps(q + 8 * v);
      KPA_IMPL_IN_REGISTER(qv);
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) acc[s] = _mm256_fmadd_ps(qv, key_dims(key + s * X, stride, v), acc[s]);
    } else {
      __m256 k[S];
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) k[s] = key_dims(key + s * X, stride, v);
#pragma GCC unroll 4
      for (int g = 0; g < HG; ++g) {
        __m256 qv = _mm256_loadu_ps(q + g * head_size + 8 * v);
        KPA_IMPL_IN_REGISTER(qv);
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) acc[s * HG + g] = _mm256_fmadd_ps(qv, k[s], acc[s * HG + g]);
      }
    }
  }
  reduce_lanes(acc, out);
}

template <int S, int HG, class CacheT>
KPA_IMPL_AVX2_INLINE inline void logits_slots(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch, int g0,
                                              int slot) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));
  float sums[S * HG];
  BlockPrefetcher::Run ahead = prefetch.take(a.head_size / 8);
  logits_tile<S, HG>(a.key_block + slot * X, a.block_size * X, a.head_size / 8, a.q + g0 * a.head_size, a.head_size,
                     ahead, sums);
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
    for (int g = 0; g < HG; ++g) a.logits[(g0 + g) * a.logits_stride + slot + s] = sums[s * HG + g] * Load<CacheT>::scale;
  }
}

/// Slots per q.k register tile for HG heads: S x HG accumulators, S key vectors, one query vector
/// (for one head, 8 slots, whose key vectors go straight into their FMAs: a block of 16 has no
/// remainder for the one-slot tile).
template <int HG>
inline constexpr int kSlotTile = HG == 1 ? 8 : (HG == 2 ? 4 : (HG == 3 ? 3 : 2));

template <int H, class CacheT>
KPA_IMPL_AVX2 void block_logits(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch) {
  if (a.head_size % 8 != 0) {  // f32 caches with head sizes of 4 (mod 8)
    portable::block_logits<H, CacheT>(a, prefetch);
    return;
  }
  constexpr int HG = kHeadTile<H>;
  constexpr int S = kSlotTile<HG>;
  static_assert(H % HG == 0, "head tiles divide the heads of a pass");
  prefetch.pace(H / HG * ((a.slots + S - 1) / S));
  for (int g0 = 0; g0 < H; g0 += HG) {
    int slot = 0;
    for (; slot + S <= a.slots; slot += S) logits_slots<S, HG>(a, prefetch, g0, slot);
    for (; slot < a.slots; ++slot) logits_slots<1, HG>(a, prefetch, g0, slot);
  }
  prefetch.finish();
}

// ---- p.V ----

/// Output rows per register tile for HG heads: HG x R accumulators, R value rows, one
/// probability register (for one head, 8 rows: head sizes are multiples of 8).
template <int HG>
inline constexpr int kRowTile = HG == 1 ? 8 : (HG == 2 ? 4 : (HG == 3 ? 3 : 2));

/// Lanes [0, n) of 8 values at p (n < 8): no read past them (the cache may end there), zeros after.
template <class CacheT>
KPA_IMPL_AVX2 inline __m256 load_first(const CacheT* p, int n) {
  CacheT buffer[8];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), static_cast<const void*>(p), n * sizeof(CacheT));
  return Load<CacheT>::eight(buffer);
}

/// One attended block of a chunk for p.V: its values (row 0) and probabilities (head 0).
template <class CacheT>
struct ValueRun {
  const CacheT* values;  ///< value_cache[block][kv_head][0]
  const float* probs;    ///< the block's first probability of the pass's first head
  int slots;
};

/// o[g][d] += sums[g][d] (after o[g][d] *= weight[g] with `rescale`) for heads [g0, g0 + HG)
/// and rows [d0, d0 + R), the sums times 1 / Load::scale.
template <int HG, int R, class CacheT>
inline void add_values_sums(const ChunkValuesArgs<CacheT>& a, const float (&sums)[HG * R], int g0, int d0,
                            bool rescale) {
  for (int g = 0; g < HG; ++g) {
    for (int r = 0; r < R; ++r) {
      float& o = a.o[(g0 + g) * a.head_size + d0 + r];
      o = (rescale ? o * a.weight[g0 + g] : o) + sums[g * R + r] * Load<CacheT>::scale;
    }
  }
}

/// add_values_sums of the tile's HG x R accumulators of 8 slot lanes each.
template <int HG, int R, class CacheT>
KPA_IMPL_AVX2 inline void finish_values_tile(const ChunkValuesArgs<CacheT>& a, const __m256 (&acc)[HG * R], int g0,
                                             int d0, bool rescale) {
  float sums[HG * R];
  reduce_lanes(acc, sums);
  add_values_sums<HG, R>(a, sums, g0, d0, rescale);
}

/// o[g][d] = o[g][d] * weight[g] + sum over the runs of p_g * v[d] for heads [g0, g0 + HG) and
/// rows [d0, d0 + R); without `rescale`, weight 1. For a block size B that is a multiple of 8:
/// whole blocks fully unrolled with the accumulators in registers; the last run, if partly
/// filled, loads whole vectors of its block and zeroes the lanes past its slots (they may hold
/// NaN: a zero lane, not 0 * NaN).
template <int HG, int R, int B, class CacheT>
KPA_IMPL_AVX2 inline void values_tile_fixed(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch,
                                            const ValueRun<CacheT>* runs, int count, int g0, int d0, bool rescale) {
  static_assert(B % 8 == 0, "whole vectors per block row");
  const std::int64_t row0 = static_cast<std::int64_t>(d0) * B;
  const int ps = a.probs_stride;
  __m256 acc[HG * R];
#pragma GCC unroll 16
  for (int i = 0; i < HG * R; ++i) acc[i] = _mm256_setzero_ps();
  const int full = count > 0 && runs[count - 1].slots < B ? count - 1 : count;
  BlockPrefetcher::Run ahead = prefetch.take(2 * full);
  for (int run = 0; run < full; ++run) {
    ask_ahead(ahead);
    const CacheT* v = runs[run].values + row0;
    const float* p = runs[run].probs + g0 * ps;
    if constexpr (sizeof(CacheT) == 1 && B % 16 == 0) {  // fp8: 16 slots of a row widened at once
#pragma GCC unroll 2
      for (int j = 0; j < B; j += 16) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m256 lo, hi;
          load_sixteen(v + r * B + j, lo, hi);
#pragma GCC unroll 4
          for (int g = 0; g < HG; ++g) {
            acc[g * R + r] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * ps + j), lo, acc[g * R + r]);
            acc[g * R + r] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * ps + j + 8), hi, acc[g * R + r]);
          }
        }
      }
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < B; j += 8) {
        __m256 vv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) vv[r] = Load<CacheT>::eight(v + r * B + j);
#pragma GCC unroll 4
        for (int g = 0; g < HG; ++g) {
          __m256 pv = _mm256_loadu_ps(p + g * ps + j);
          KPA_IMPL_IN_REGISTER(pv);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[g * R + r] = _mm256_fmadd_ps(pv, vv[r], acc[g * R + r]);
        }
      }
    }
  }
  if (full < count) {
    const CacheT* v = runs[full].values + row0;
    const float* p = runs[full].probs + g0 * ps;
    const int slots = runs[full].slots;
    for (int j = 0; j < slots; j += 8) {
      const __m256i mask = first_lanes(slots - j);
      __m256 vv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) vv[r] = _mm256_and_ps(Load<CacheT>::eight(v + r * B + j), _mm256_castsi256_ps(mask));
#pragma GCC unroll 4
      for (int g = 0; g < HG; ++g) {
        const __m256 pv = _mm256_maskload_ps(p + g * ps + j, mask);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[g * R + r] = _mm256_fmadd_ps(pv, vv[r], acc[g * R + r]);
      }
    }
  }
  finish_values_tile<HG, R>(a, acc, g0, d0, rescale);
}

/// values_tile_fixed for any block size: a block row may end inside a vector, so the last
/// vector of each run is read only as far as its slots.
template <int HG, int R, class CacheT>
KPA_IMPL_AVX2 inline void values_tile(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch,
                                      const ValueRun<CacheT>* runs, int count, int g0, int d0, bool rescale) {
  const int B = a.block_size;
  const std::int64_t row0 = static_cast<std::int64_t>(d0) * B;
  __m256 acc[HG * R];
#pragma GCC unroll 16
  for (int i = 0; i < HG * R; ++i) acc[i] = _mm256_setzero_ps();
  BlockPrefetcher::Run ahead = prefetch.take(2 * count);
  for (int run = 0; run < count; ++run) {
    ask_ahead(ahead);
    const CacheT* v = runs[run].values + row0;
    const float* p = runs[run].probs + g0 * a.probs_stride;
    const int slots = runs[run].slots;
    int j = 0;
    for (; j + 8 <= slots; j += 8) {
      __m256 vv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) vv[r] = Load<CacheT>::eight(v + r * B + j);
#pragma GCC unroll 4
      for (int g = 0; g < HG; ++g) {
        __m256 pv = _mm256_loadu_ps(p + g * a.probs_stride + j);
        KPA_IMPL_IN_REGISTER(pv);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[g * R + r] = _mm256_fmadd_ps(pv, vv[r], acc[g * R + r]);
      }
    }
    if (j < slots) {  // slots past the sequence or the block may hold NaN: zero lanes, not 0 * NaN
      const int n = slots - j;
      const __m256i mask = first_lanes(n);
      __m256 vv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) vv[r] = load_first(v + r * B + j, n);
#pragma GCC unroll 4
      for (int g = 0; g < HG; ++g) {
        const __m256 pv = _mm256_maskload_ps(p + g * a.probs_stride + j, mask);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[g * R + r] = _mm256_fmadd_ps(pv, vv[r], acc[g * R + r]);
      }
    }
  }
  finish_values_tile<HG, R>(a, acc, g0, d0, rescale);
}

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

template <int H, class CacheT>
KPA_IMPL_AVX2 void chunk_values(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch, int d_begin, int d_end) {
  constexpr int HG = kHeadTile<H>;
  constexpr int R = kRowTile<HG>;
  prefetch.pace(H / HG * ((d_end - d_begin + R - 1) / R));
  ValueRun<CacheT> runs[kMaxRuns];
  for (int first = 0; first < a.blocks; first += kMaxRuns) {
    const int count = attended_runs(a, first, runs);
    for (int g0 = 0; g0 < H; g0 += HG) {
      int d = d_begin;
      for (; d + R <= d_end; d += R) {
        switch (a.block_size) {  // vLLM's block sizes
          case 8: values_tile_fixed<HG, R, 8>(a, prefetch, runs, count, g0, d, first == 0); break;
          case 16: values_tile_fixed<HG, R, 16>(a, prefetch, runs, count, g0, d, first == 0); break;
          case 32: values_tile_fixed<HG, R, 32>(a, prefetch, runs, count, g0, d, first == 0); break;
          default: values_tile<HG, R>(a, prefetch, runs, count, g0, d, first == 0); break;
        }
      }
      for (; d < d_end; ++d) values_tile<HG, 1>(a, prefetch, runs, count, g0, d, first == 0);
    }
  }
  prefetch.finish();
}

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

#endif
