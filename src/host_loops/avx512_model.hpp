#pragma once
// Avx512Model: AVX-512's 16-lane mapping of the register tiles (avx512.hpp) on pairs of AVX2
// registers, with AVX-512's tile shapes, block sizes and sums layout. HostIsa::AmxModel runs the
// tiles over it where HostIsa::Amx runs them over Avx512Vbmi, so the 16-lane instantiations of
// x86_tiles.inc (slots per key register, remainders, partly filled blocks) run on any AVX2 CPU.
// What it does not model is how AVX-512 widens and reduces: those run where the CPU has AVX-512.

#include "avx2.hpp"
#include "avx512.hpp"

namespace kpa::detail::avx2 {

struct Avx512Model {
  /// 16 lanes: [0, 8) in lo, [8, 16) in hi.
  struct Vec {
    __m256 lo, hi;
  };
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;
  static constexpr int head_tile(int H) { return avx512::Avx512::head_tile(H); }
  static constexpr int key_tile(int HG) { return avx512::Avx512::key_tile(HG); }
  static constexpr int row_tile(int HG) { return avx512::Avx512::row_tile(HG); }
  using ValueBlockSizes = avx512::Avx512::ValueBlockSizes;
  static constexpr bool kAnyBlockSize = avx512::Avx512::kAnyBlockSize;

  KPA_IMPL_AVX2_INLINE static Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  KPA_IMPL_AVX2_INLINE static Vec fmadd(Vec a, Vec b, Vec c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  KPA_IMPL_AVX2_INLINE static Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  KPA_IMPL_AVX2_INLINE static Vec load_first(const float* p, int n) {
    return {_mm256_maskload_ps(p, first_lanes(n < 8 ? n : 8)), _mm256_maskload_ps(p + 8, first_lanes(n > 8 ? n - 8 : 0))};
  }
  KPA_IMPL_AVX2_INLINE static void hold(Vec& v) {
    KPA_IMPL_IN_REGISTER(v.lo);
    KPA_IMPL_IN_REGISTER(v.hi);
  }
  template <int SPR>
  KPA_IMPL_AVX2_INLINE static Vec load_query(const float* q) {
    if constexpr (SPR == 2) {
      return {_mm256_loadu_ps(q), _mm256_loadu_ps(q)};
    } else {
      return load(q);
    }
  }
  template <class CacheT>
  static constexpr int widen_group() {
    return avx512::Avx512::widen_group<CacheT>();
  }
  template <int N, class CacheT>
  KPA_IMPL_AVX2_INLINE static void widen(const CacheT* p, Vec* out) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) {
      if constexpr (sizeof(CacheT) == 1) {
        load_sixteen(p + 16 * i, out[i].lo, out[i].hi);
      } else {
        out[i] = {Load<CacheT>::eight(p + 16 * i), Load<CacheT>::eight(p + 16 * i + 8)};
      }
    }
  }
  template <class CacheT>
  KPA_IMPL_AVX2_INLINE static Vec widen_first(const CacheT* p, int n) {
    if (n <= 8) return {x86::load_first(p, n), _mm256_setzero_ps()};
    return {Load<CacheT>::eight(p), x86::load_first(p + 8, n - 8)};
  }
  template <int SPR, int N>
  static constexpr int sums_capacity() {
    return avx512::Avx512::sums_capacity<SPR, N>();
  }
  template <int SPR, int N>
  KPA_IMPL_AVX2_INLINE static void sums(const Vec (&acc)[N], float* out) {
    if constexpr (SPR == 2) {  // the halves' sums in turn
      __m256 halves[2 * N];
#pragma GCC unroll 16
      for (int i = 0; i < N; ++i) {
        halves[2 * i] = acc[i].lo;
        halves[2 * i + 1] = acc[i].hi;
      }
      reduce_lanes(halves, out);
    } else {
      __m256 folded[N];
#pragma GCC unroll 16
      for (int i = 0; i < N; ++i) folded[i] = _mm256_add_ps(acc[i].lo, acc[i].hi);
      reduce_lanes(folded, out);
    }
    for (int i = N * SPR; i < sums_capacity<SPR, N>(); ++i) out[i] = 0.0f;
  }
};

}  // namespace kpa::detail::avx2
