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
inline constexpr bool has_kernels_for = std::is_same_v<CacheT, float> || std::is_same_v<CacheT, half> ||
                                        std::is_same_v<CacheT, bfloat16> || std::is_same_v<CacheT, fp8_e4m3> ||
                                        std::is_same_v<CacheT, fp8_e5m2>;

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

inline __m256i load8_bytes(const std::uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 load8(const fp8_e4m3* p) {
  const __m256i b = load8_bytes(&p->bits);
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 20)),
                                     _mm256_set1_ps(power_of_two(127 - 7)));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f)));
  const __m256 special = _mm256_blendv_ps(value, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
  return _mm256_or_ps(special, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
}

inline __m256 load8(const fp8_e5m2* p) {
  const __m256i b = load8_bytes(&p->bits);
  const __m256i magnitude = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 21)),
                                     _mm256_set1_ps(power_of_two(127 - 15)));
  const __m256 infinite_or_nan = _mm256_castsi256_ps(_mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7b)));
  const __m256 infinite = _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7c)));
  const __m256 special = _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                                          _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000)), infinite);
  const __m256 magnitude_value = _mm256_blendv_ps(value, special, infinite_or_nan);
  return _mm256_or_ps(magnitude_value,
                      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
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

/// Starts loading slice `part` of `parts` equal slices of [p, p + bytes) into the caches.
inline void prefetch_slice(const void* p, std::size_t bytes, int part, int parts) {
  constexpr std::size_t line = 64;
  const std::size_t lines = (bytes + line - 1) / line;
  const std::size_t first = lines * part / parts, last = lines * (part + 1) / parts;
  const char* c = static_cast<const char*>(p);
  for (std::size_t l = first; l < last; ++l) _mm_prefetch(c + l * line, _MM_HINT_T0);
}

/// See slot_logits in attention_math.hpp; computes S slots at once (slot s at key + s * X),
/// which shares each query load between them and gives the FMA units S * H independent chains.
/// Requires X * vectors to be a multiple of 8.
template <int H, int X, int S, class CacheT>
inline void slot_logits(const CacheT* key, int stride, int vectors, const float* q, int head_size,
                        float (&logits)[S][H]) {
  __m256 acc[S][H];
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < H; ++g) acc[s][g] = _mm256_setzero_ps();
  if constexpr (X >= 8) {  // 2- and 1-byte caches: one or two registers per key vector
    for (int dx = 0; dx < vectors; ++dx) {
      for (int part = 0; part < X / 8; ++part) {
        __m256 k[S];
        for (int s = 0; s < S; ++s) k[s] = load8(key + s * X + dx * stride + part * 8);
        for (int g = 0; g < H; ++g) {
          const __m256 qv = _mm256_loadu_ps(q + g * head_size + dx * X + part * 8);
          for (int s = 0; s < S; ++s) acc[s][g] = _mm256_fmadd_ps(qv, k[s], acc[s][g]);
        }
      }
    }
  } else {  // f32 caches: two 4-float key vectors per register
    static_assert(X == 4 && std::is_same_v<CacheT, float>, "x86 slot_logits: x = 4 only for f32 caches");
    for (int dx = 0; dx < vectors; dx += 2) {
      __m256 k[S];
      for (int s = 0; s < S; ++s) k[s] = load4x2(key + s * X + dx * stride, key + s * X + (dx + 1) * stride);
      for (int g = 0; g < H; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + g * head_size + dx * X);
        for (int s = 0; s < S; ++s) acc[s][g] = _mm256_fmadd_ps(qv, k[s], acc[s][g]);
      }
    }
  }
  for (int s = 0; s < S; ++s)
    for (int g = 0; g < H; ++g) logits[s][g] = horizontal_sum(acc[s][g]);
}

/// See chunk_pv in attention_math.hpp.
template <int H, class CacheT>
inline void chunk_pv(const CacheT* value_row, const int* block_ids, std::int64_t block_stride, int block_size,
                     int blocks, int last_block_slots, const float* probs, int probs_stride, float (&sums)[H]) {
  // Two accumulator sets (even and odd groups of 8 slots) halve the FMA dependency chains.
  __m256 even[H], odd[H];
  for (int g = 0; g < H; ++g) even[g] = odd[g] = _mm256_setzero_ps();
  float tail[H] = {};
  for (int lb = 0; lb < blocks; ++lb) {
    if (block_ids[lb] < 0) continue;
    const CacheT* v = value_row + block_ids[lb] * block_stride;
    const float* p = probs + lb * block_size;
    const int slots = lb + 1 == blocks ? last_block_slots : block_size;
    int slot = 0;
    for (; slot + 16 <= slots; slot += 16) {
      const __m256 v0 = load8(v + slot);
      const __m256 v1 = load8(v + slot + 8);
      for (int g = 0; g < H; ++g) {
        even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * probs_stride + slot), v0, even[g]);
        odd[g] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * probs_stride + slot + 8), v1, odd[g]);
      }
    }
    if (slot + 8 <= slots) {
      const __m256 v0 = load8(v + slot);
      for (int g = 0; g < H; ++g) even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(p + g * probs_stride + slot), v0, even[g]);
      slot += 8;
    }
    for (; slot < slots; ++slot) {
      const float vv = to_float(v[slot]);
      for (int g = 0; g < H; ++g) tail[g] += p[g * probs_stride + slot] * vv;
    }
  }
  for (int g = 0; g < H; ++g) sums[g] = horizontal_sum(_mm256_add_ps(even[g], odd[g])) + tail[g];
}

}  // namespace kpa::detail::x86

#endif
