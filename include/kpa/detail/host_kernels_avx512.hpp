#pragma once
// AVX-512 (F, BW, VL, DQ) versions of the two inner loops that carry the host path's arithmetic,
// q.k (block_logits) and p.V (chunk_values), for 16- and 8-bit caches; host_kernels.hpp pairs
// them with the AVX2 softmax and row conversions, which cost a few percent of a step, and keeps
// the AVX2 set for f32 caches. Target attributes as in host_kernels_x86.hpp, whose AVX2 helpers
// (conversions, lane reductions, one-slot tiles) these functions inline.
//
// Register tiles (32 zmm registers), each register 16 cache elements widened to float:
//   q.k    a key register holds 16 consecutive elements of one key-vector row of the block: two
//          slots x 8 dimensions for 16-bit caches (the query's 8 dimensions broadcast to both
//          halves), one slot x 16 dimensions for fp8; accumulators per (key register, head) over
//          the head size, for HG heads x KR key registers;
//   p.V    a value register holds 16 slots of one output row (block sizes 16 and 32, vLLM's
//          usual ones; others run the AVX2 tiles); accumulators per (head, row) over the chunk,
//          reduced once at its end.
// A tile takes all heads of a GQA group of up to 8 (kHeadTile), so each cache element is widened
// once per pass: widening a register takes the FMA ports for two instructions (fp8: about five),
// and with the AVX2 tiles' groups of at most 4 a group of 6 or 8 widened each element twice. fp8
// codes widen 32 at a time (fp8_as_half32) wherever two registers' codes are adjacent.

#include <kpa/detail/host_kernels_x86.hpp>

#ifdef KPA_IMPL_X86_KERNELS

// GCC 12's AVX-512 intrinsics start their results from `__m512 __Y = __Y;`, which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#endif

#define KPA_IMPL_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define KPA_IMPL_AVX512_INLINE \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"), always_inline))

namespace kpa::detail::avx512 {

/// Cache types with AVX-512 loops (f32 caches run the AVX2 ones).
template <class CacheT>
inline constexpr bool has_kernels = std::is_same_v<CacheT, half> || std::is_same_v<CacheT, bfloat16> ||
                                    std::is_same_v<CacheT, fp8_e4m3> || std::is_same_v<CacheT, fp8_e5m2>;

/// 16 consecutive cache elements as floats, times 1 / avx2::Load<CacheT>::scale.
template <class CacheT>
KPA_IMPL_AVX512_INLINE inline __m512 load16(const CacheT* p) {
  if constexpr (std::is_same_v<CacheT, half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (std::is_same_v<CacheT, bfloat16>) {
    const __m512i wide =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
    // Quiet any signalling NaN, as to_float does.
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(wide, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(wide, nan, wide, _mm512_set1_epi32(0x400000)));
  } else {
    return _mm512_cvtph_ps(avx2::fp8_as_half16(p));
  }
}

/// 32 consecutive fp8 codes as binary16 codes (the bits avx2::fp8_as_half16 gives, 32 lanes at
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

/// out[i] = the 16 cache elements at p + 16 i as floats (times 1 / avx2::Load<CacheT>::scale);
/// fp8 codes two registers at a time.
template <int N, class CacheT>
KPA_IMPL_AVX512_INLINE inline void load_consecutive(const CacheT* p, __m512 (&out)[N]) {
  int i = 0;
  if constexpr (sizeof(CacheT) == 1) {
#pragma GCC unroll 8
    for (; i + 2 <= N; i += 2) {
      const __m512i h = fp8_as_half32(p + 16 * i);
      out[i] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
      out[i + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    }
  }
#pragma GCC unroll 16
  for (; i < N; ++i) out[i] = load16(p + 16 * i);
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

/// out[2i], out[2i + 1] = the sums of lanes [0, 8) and [8, 16) of acc[i] (two slots per register).
template <int N>
KPA_IMPL_AVX512_INLINE inline void reduce_halves(const __m512 (&acc)[N], float (&out)[2 * N]) {
  __m256 halves[2 * N];
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) {
    halves[2 * i] = _mm512_castps512_ps256(acc[i]);
    halves[2 * i + 1] = _mm512_extractf32x8_ps(acc[i], 1);
  }
  avx2::reduce_lanes(halves, out);
}

/// out[i] = the sum of the 16 lanes of acc[i].
template <int N>
KPA_IMPL_AVX512_INLINE inline void reduce_all(const __m512 (&acc)[N], float (&out)[N]) {
  __m256 folded[N];
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) folded[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[i]), _mm512_extractf32x8_ps(acc[i], 1));
  avx2::reduce_lanes(folded, out);
}

/// Heads per register tile: a whole group of up to 8 (passes of 16 rows take two tiles).
template <int H>
inline constexpr int kHeadTile = H <= 4 || H == 6 ? H : 8;

// ---- q.k ----

/// Key registers per q.k tile for HG heads: KR x HG accumulators, KR key registers, one query
/// register (at most 29 of the 32).
template <int HG>
inline constexpr int kKeyTile = HG <= 2 ? 8 : (HG == 3 ? 6 : (HG <= 6 ? 4 : 2));

/// Logits of the slots in KR key registers (the first slot `slot`) for heads [g0, g0 + HG).
template <int KR, int HG, class CacheT>
KPA_IMPL_AVX512_INLINE inline void logits_tile(const BlockLogitsArgs<CacheT>& a, int g0, int slot) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));  // elements of a key vector
  constexpr int SPR = 16 / X;                                // slots per key register
  const int stride = a.block_size * X, vectors = a.head_size / X;
  const CacheT* key = a.key_block + slot * X;
  const float* q = a.q + g0 * a.head_size;
  __m512 acc[KR * HG];
#pragma GCC unroll 32
  for (int i = 0; i < KR * HG; ++i) acc[i] = _mm512_setzero_ps();
  for (int v = 0; v < vectors; ++v) {
    __m512 k[KR];
    load_consecutive(key + v * stride, k);
#pragma GCC unroll 8
    for (int g = 0; g < HG; ++g) {
      const float* qg = q + g * a.head_size + v * X;
      __m512 qv = SPR == 2 ? _mm512_broadcast_f32x8(_mm256_loadu_ps(qg)) : _mm512_loadu_ps(qg);
      KPA_IMPL_IN_REGISTER(qv);
#pragma GCC unroll 8
      for (int j = 0; j < KR; ++j) acc[j * HG + g] = _mm512_fmadd_ps(qv, k[j], acc[j * HG + g]);
    }
  }
  float sums[KR * HG * SPR];
  if constexpr (SPR == 2) {
    reduce_halves(acc, sums);
  } else {
    reduce_all(acc, sums);
  }
  // sums[(j * HG + g) * SPR + h] is slot slot + j * SPR + h, head g0 + g.
#pragma GCC unroll 8
  for (int j = 0; j < KR; ++j) {
#pragma GCC unroll 8
    for (int g = 0; g < HG; ++g) {
#pragma GCC unroll 2
      for (int h = 0; h < SPR; ++h) {
        a.logits[(g0 + g) * a.logits_stride + slot + j * SPR + h] =
            sums[(j * HG + g) * SPR + h] * avx2::Load<CacheT>::scale;
      }
    }
  }
}

template <int H, class CacheT>
KPA_IMPL_AVX512 void block_logits(const BlockLogitsArgs<CacheT>& a) {
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));
  constexpr int HG = kHeadTile<H>;
  constexpr int KR = kKeyTile<HG>;
  constexpr int SPR = 16 / X;
  static_assert(H % HG == 0, "head tiles divide the heads of a pass");
  if (a.head_size % X != 0) {
    portable::block_logits<H, CacheT>(a);
    return;
  }
  for (int g0 = 0; g0 < H; g0 += HG) {
    int slot = 0;
    for (; slot + KR * SPR <= a.slots; slot += KR * SPR) logits_tile<KR, HG>(a, g0, slot);
    for (; slot + SPR <= a.slots; slot += SPR) logits_tile<1, HG>(a, g0, slot);
    for (; slot < a.slots; ++slot) avx2::logits_slots<1, HG>(a, g0, slot);  // an odd last slot
  }
}

// ---- p.V ----

/// Output rows per p.V tile for HG heads: HG x R accumulators, R value registers, one
/// probability register. Groups of 6 and 8 take 2 rows: with 6 x 4 accumulators the p.V of a
/// 256-token chunk of d256 (16 blocks of 16, resident in L2) took 61-63 ns per token, with 6 x 2
/// 38-55 ns (four runs each).
template <int HG>
inline constexpr int kRowTile = HG == 1 ? 16 : (HG == 2 ? 8 : (HG == 3 ? 6 : (HG == 4 ? 4 : 2)));

/// o[g][d] = o[g][d] * weight[g] (with `rescale`) + sum over the runs of p_g * v[d] for heads
/// [g0, g0 + HG) and rows [d0, d0 + R), for a block size B that is a multiple of 16. Lanes past
/// a run's slots are zero in both operands (the cache there may hold NaN: a zero lane, not
/// 0 * NaN).
template <int HG, int R, int B, class CacheT>
KPA_IMPL_AVX512_INLINE inline void values_tile(const ChunkValuesArgs<CacheT>& a, const avx2::ValueRun<CacheT>* runs,
                                               int count, int g0, int d0, bool rescale) {
  static_assert(B % 16 == 0, "whole registers per block row");
  const std::int64_t row0 = static_cast<std::int64_t>(d0) * B;
  const int ps = a.probs_stride;
  __m512 acc[HG * R];
#pragma GCC unroll 32
  for (int i = 0; i < HG * R; ++i) acc[i] = _mm512_setzero_ps();
  for (int run = 0; run < count; ++run) {
    const CacheT* v = runs[run].values + row0;
    const float* p = runs[run].probs + g0 * ps;
    const int slots = runs[run].slots;
    if (slots == B) {
#pragma GCC unroll 2
      for (int j = 0; j < B; j += 16) {
        __m512 vv[R];
        if constexpr (B == 16) {  // the tile's rows are adjacent
          load_consecutive(v + j, vv);
        } else {
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) vv[r] = load16(v + r * B + j);
        }
#pragma GCC unroll 8
        for (int g = 0; g < HG; ++g) {
          __m512 pv = _mm512_loadu_ps(p + g * ps + j);
          KPA_IMPL_IN_REGISTER(pv);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) acc[g * R + r] = _mm512_fmadd_ps(pv, vv[r], acc[g * R + r]);
        }
      }
    } else {  // the chunk's last block, partly filled
      for (int j = 0; j < slots; j += 16) {
        const int n = slots - j < 16 ? slots - j : 16;
        const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
        __m512 vv[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) vv[r] = load16_first(v + r * B + j, n);
#pragma GCC unroll 8
        for (int g = 0; g < HG; ++g) {
          const __m512 pv = _mm512_maskz_loadu_ps(mask, p + g * ps + j);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) acc[g * R + r] = _mm512_fmadd_ps(pv, vv[r], acc[g * R + r]);
        }
      }
    }
  }
  float sums[HG * R];
  reduce_all(acc, sums);
  avx2::add_values_sums<HG, R>(a, sums, g0, d0, rescale);
}

template <int HG, int R, int B, class CacheT>
KPA_IMPL_AVX512_INLINE inline void values_rows(const ChunkValuesArgs<CacheT>& a, const avx2::ValueRun<CacheT>* runs,
                                               int count, int g0, int d_begin, int d_end, bool rescale) {
  int d = d_begin;
  for (; d + R <= d_end; d += R) values_tile<HG, R, B>(a, runs, count, g0, d, rescale);
  for (; d < d_end; ++d) values_tile<HG, 1, B>(a, runs, count, g0, d, rescale);
}

template <int H, class CacheT>
KPA_IMPL_AVX512 void chunk_values(const ChunkValuesArgs<CacheT>& a, int d_begin, int d_end) {
  if (a.block_size != 16 && a.block_size != 32) {  // rows of 8 (or any) slots: the AVX2 tiles
    avx2::chunk_values<H, CacheT>(a, d_begin, d_end);
    return;
  }
  constexpr int HG = kHeadTile<H>;
  constexpr int R = kRowTile<HG>;
  avx2::ValueRun<CacheT> runs[avx2::kMaxRuns];
  for (int first = 0; first < a.blocks; first += avx2::kMaxRuns) {
    const int count = avx2::attended_runs(a, first, runs);
    for (int g0 = 0; g0 < H; g0 += HG) {
      if (a.block_size == 16) {
        values_rows<HG, R, 16>(a, runs, count, g0, d_begin, d_end, first == 0);
      } else {
        values_rows<HG, R, 32>(a, runs, count, g0, d_begin, d_end, first == 0);
      }
    }
  }
}

}  // namespace kpa::detail::avx512

#ifdef KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#pragma GCC diagnostic pop
#undef KPA_IMPL_AVX512_DIAGNOSTICS_PUSHED
#endif

#endif
