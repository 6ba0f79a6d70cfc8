#pragma once
// The AVX2 + FMA + F16C host loops (include/kpa/detail/host_loops.hpp says what each computes),
// on the x86 mapping layer (x86_simd.hpp).
//
// Register tiles (16 ymm registers):
//   q.k    rows of a pass in groups of HG, slots in groups of S; one accumulator of 8 dimension
//          lanes per (slot, row), reduced 8 at a time by a transposing hadd tree;
//   p.V    rows in groups of HG, output dimensions in groups of R; one accumulator of 8 slot
//          lanes per (row, dimension) over the whole chunk, reduced once at its end.
// Each cache vector is converted to float once and used for HG rows.

#include "x86_simd.hpp"

namespace kpa::detail::avx2 {

using namespace x86;

KPA_IMPL_AVX2 inline float row_softmax(float* p, int n, float floor, float* max) {
  __m256 m = _mm256_set1_ps(floor);
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 v = _mm256_maskload_ps(p + i, mask);
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

/// p[i] += slope * (offset + i) for i < n.
KPA_IMPL_AVX2 inline void row_add_ramp(float* p, int n, float slope, float offset) {
  const __m256 step = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int i = 0; i < n; i += 8) {
    const __m256i mask = first_lanes(n - i);
    const __m256 at = _mm256_add_ps(_mm256_set1_ps(offset + static_cast<float>(i)), step);
    _mm256_maskstore_ps(p + i, mask, _mm256_fmadd_ps(_mm256_set1_ps(slope), at, _mm256_maskload_ps(p + i, mask)));
  }
}

// ---- q.k ----

/// Head groups per register tile: at most four heads, three for groups of six.
template <int H>
inline constexpr int kHeadTile = H == 6 ? 3 : (H < 4 ? H : 4);

/// Slots per q.k register tile for HG heads: S x HG accumulators, S key vectors, one query vector
/// (for one head, 8 slots, whose key vectors go straight into their FMAs: a block of 16 has no
/// remainder for the one-slot tile).
template <int HG>
inline constexpr int kSlotTile = HG == 1 ? 8 : (HG == 2 ? 4 : (HG == 3 ? 3 : 2));

/// q.k of a block, for head sizes that are multiples of 8.
template <int H, class CacheT>
KPA_IMPL_AVX2 void block_logits(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch) {
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

/// o[g][d] += sums[g][d] for rows [g0, g0 + HG) and dimensions [d0, d0 + R), the sums times
/// 1 / Load::scale.
template <int HG, int R, class CacheT>
inline void add_values_sums(const ChunkValuesArgs<CacheT>& a, const float (&sums)[HG * R], int g0, int d0) {
  for (int g = 0; g < HG; ++g) {
    for (int r = 0; r < R; ++r) a.o[(g0 + g) * a.head_size + d0 + r] += sums[g * R + r] * Load<CacheT>::scale;
  }
}

/// add_values_sums of the tile's HG x R accumulators of 8 slot lanes each.
template <int HG, int R, class CacheT>
KPA_IMPL_AVX2 inline void finish_values_tile(const ChunkValuesArgs<CacheT>& a, const __m256 (&acc)[HG * R], int g0,
                                             int d0) {
  float sums[HG * R];
  reduce_lanes(acc, sums);
  add_values_sums<HG, R>(a, sums, g0, d0);
}

/// o[g][d] += sum over the runs of p_g * v[d] for rows [g0, g0 + HG) and dimensions
/// [d0, d0 + R). For a block size B that is a multiple of 8:
/// whole blocks fully unrolled with the accumulators in registers; the last run, if partly
/// filled, loads whole vectors of its block and zeroes the lanes past its slots (they may hold
/// NaN: a zero lane, not 0 * NaN).
template <int HG, int R, int B, class CacheT>
KPA_IMPL_AVX2 inline void values_tile_fixed(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch,
                                            const ValueRun<CacheT>* runs, int count, int g0, int d0) {
  static_assert(B % 8 == 0, "whole vectors per block row");
  const std::int64_t row0 = static_cast<std::int64_t>(d0) * B;
  const int ps = a.probs_stride;
  __m256 acc[HG * R];
#pragma GCC unroll 16
  for (int i = 0; i < HG * R; ++i) acc[i] = _mm256_setzero_ps();
  const int full = count > 0 && runs[count - 1].slots < B ? count - 1 : count;
  BlockPrefetcher::Run ahead = values_ahead(prefetch, full, B);
  for (int run = 0; run < full; ++run) {
    const CacheT* v = runs[run].values + row0;
    const float* p = runs[run].probs + g0 * ps;
    if constexpr (sizeof(CacheT) == 1 && B % 16 == 0) {  // fp8: 16 slots of a row widened at once
#pragma GCC unroll 2
      for (int j = 0; j < B; j += 16) {
        ask_ahead(ahead);
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
        if (j % 16 == 0) ask_ahead(ahead);
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
  finish_values_tile<HG, R>(a, acc, g0, d0);
}

/// values_tile_fixed for any block size: a block row may end inside a vector, so the last
/// vector of each run is read only as far as its slots.
template <int HG, int R, class CacheT>
KPA_IMPL_AVX2 inline void values_tile(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch,
                                      const ValueRun<CacheT>* runs, int count, int g0, int d0) {
  const int B = a.block_size;
  const std::int64_t row0 = static_cast<std::int64_t>(d0) * B;
  __m256 acc[HG * R];
#pragma GCC unroll 16
  for (int i = 0; i < HG * R; ++i) acc[i] = _mm256_setzero_ps();
  BlockPrefetcher::Run ahead = values_ahead(prefetch, count, B);
  for (int run = 0; run < count; ++run) {
    const CacheT* v = runs[run].values + row0;
    const float* p = runs[run].probs + g0 * a.probs_stride;
    const int slots = runs[run].slots;
    int j = 0;
    for (; j + 8 <= slots; j += 8) {
      if (j % 16 == 0) ask_ahead(ahead);
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
      if (j % 16 == 0) ask_ahead(ahead);
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
  finish_values_tile<HG, R>(a, acc, g0, d0);
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
          case 8: values_tile_fixed<HG, R, 8>(a, prefetch, runs, count, g0, d); break;
          case 16: values_tile_fixed<HG, R, 16>(a, prefetch, runs, count, g0, d); break;
          case 32: values_tile_fixed<HG, R, 32>(a, prefetch, runs, count, g0, d); break;
          default: values_tile<HG, R>(a, prefetch, runs, count, g0, d); break;
        }
      }
      for (; d < d_end; ++d) values_tile<HG, 1>(a, prefetch, runs, count, g0, d);
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
