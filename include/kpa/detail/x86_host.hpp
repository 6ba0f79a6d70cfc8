#pragma once
// x86 host specialisations (AVX2 + FMA + F16C) of the two inner loops of the attention kernel.
// Compilers keep the portable loops' per-head accumulators in memory once those loops are
// inlined deep inside a team kernel; here they live in registers. Used only when the translation
// unit targets these instructions (e.g. -march=native) and never in device code. Defining
// KPA_PORTABLE_KERNELS before including kpa turns them off (the tests build both ways).

#if !defined(KPA_PORTABLE_KERNELS) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
#define KPA_IMPL_X86_HOST_KERNELS 1

#include <kpa/numeric_types.hpp>

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

namespace kpa::detail::x86 {

template <class CacheT>
inline constexpr bool has_kernels_for =
    std::is_same_v<CacheT, float> || std::is_same_v<CacheT, half> || std::is_same_v<CacheT, bfloat16>;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load8(const bfloat16* p) {
  const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  const __m256i magnitude = _mm256_and_si256(wide, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  return _mm256_castsi256_ps(_mm256_or_si256(wide, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000))));
}

/// Two 4-float key vectors (x = 4 for f32 caches) as one register.
inline __m256 load4x2(const float* lo, const float* hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

inline float horizontal_sum(__m256 v) {
  const __m128 folded = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(folded, _mm_movehl_ps(folded, folded));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

/// See slot_logits in attention_math.hpp. Requires X * vectors to be a multiple of 8.
template <int H, int X, class CacheT>
inline void slot_logits(const CacheT* key, int stride, int vectors, const float* q, int head_size, float (&logits)[H]) {
  __m256 acc[H];
  for (int g = 0; g < H; ++g) acc[g] = _mm256_setzero_ps();
  if constexpr (X == 8) {
    for (int dx = 0; dx < vectors; ++dx) {
      const __m256 k = load8(key + dx * stride);
      for (int g = 0; g < H; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * head_size + dx * 8), k, acc[g]);
    }
  } else {
    static_assert(X == 4 && std::is_same_v<CacheT, float>, "x86 slot_logits handles x = 8 and f32 x = 4");
    for (int dx = 0; dx < vectors; dx += 2) {
      const __m256 k = load4x2(key + dx * stride, key + (dx + 1) * stride);
      for (int g = 0; g < H; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * head_size + dx * 4), k, acc[g]);
    }
  }
  for (int g = 0; g < H; ++g) logits[g] = horizontal_sum(acc[g]);
}

/// See chunk_pv in attention_math.hpp.
template <int H, class CacheT>
inline void chunk_pv(const CacheT* value_row, const int* block_ids, std::int64_t block_stride, int block_size,
                     int blocks, int last_block_slots, const float* probs, int probs_stride, float (&sums)[H]) {
  __m256 part[H];
  for (int g = 0; g < H; ++g) part[g] = _mm256_setzero_ps();
  float tail[H] = {};
  for (int lb = 0; lb < blocks; ++lb) {
    const CacheT* v = value_row + block_ids[lb] * block_stride;
    const float* p = probs + lb * block_size;
    const int slots = lb + 1 == blocks ? last_block_slots : block_size;
    int slot = 0;
    for (; slot + 8 <= slots; slot += 8) {
      const __m256 vv = load8(v + slot);
      for (int g = 0; g < H; ++g) part[g] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * probs_stride + slot), vv, part[g]);
    }
    for (; slot < slots; ++slot) {
      const float vv = to_float(v[slot]);
      for (int g = 0; g < H; ++g) tail[g] += p[g * probs_stride + slot] * vv;
    }
  }
  for (int g = 0; g < H; ++g) sums[g] = horizontal_sum(part[g]) + tail[g];
}

}  // namespace kpa::detail::x86

#endif
