#pragma once
// The device kernel path's loads and row access: 16-byte vector loads turned into floats, and
// the element-per-worker access to a pass's query and output rows.

#include <kpa/numeric_types.hpp>

#include <cstddef>
#include <type_traits>

namespace kpa::detail {

/// N consecutive elements of T read as one aligned load (16 bytes at most).
template <class T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

/// out[i] = float(p[i]) for i < N, in loads of up to 16 bytes; p must be aligned to the load.
template <int N, class T>
KOKKOS_INLINE_FUNCTION void load_floats(const T* p, float (&out)[N]) {
  constexpr int piece = static_cast<int>(16 / sizeof(T)) < N ? static_cast<int>(16 / sizeof(T)) : N;
  static_assert(N % piece == 0, "load_floats: N must be a multiple of the load width");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (std::is_same_v<T, fp8_e4m3> && N % 2 == 0) {  // one conversion per pair of codes
    for (int k = 0; k < N; k += piece) {
      const Packed<unsigned short, piece / 2> pairs = *reinterpret_cast<const Packed<unsigned short, piece / 2>*>(p + k);
      for (int i = 0; i < piece / 2; ++i) {
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs.v[i], __NV_E4M3)));
        out[k + 2 * i] = f.x;
        out[k + 2 * i + 1] = f.y;
      }
    }
  } else
#endif
  {
    for (int k = 0; k < N; k += piece) {
      const Packed<T, piece> packed = *reinterpret_cast<const Packed<T, piece>*>(p + k);
      for (int i = 0; i < piece; ++i) out[k + i] = to_float(packed.v[i]);
    }
  }
}

/// Query and output rows of a pass, one element per worker: the team's workers and lanes take
/// single elements, so all of them have work even for a few rows.
struct DeviceRowIO {
  /// Calls f(r, d, d + 1) for every dimension d in [0, D) of rows [0, rows).
  template <class Member, class F>
  KOKKOS_INLINE_FUNCTION static void for_row_spans(const Member& member, int rows, int D, const F& f) {
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, rows * D), [&](int i) { f(i / D, i % D, i % D + 1); });
  }

  /// The factor the query is loaded with: the scale (q.k reads the scaled query).
  KOKKOS_INLINE_FUNCTION static float query_factor(float scale, bool /*of_several_passes*/) { return scale; }

  /// load_scaled / store_scaled (numeric_types.hpp), one element per call here.
  template <class T>
  KOKKOS_INLINE_FUNCTION void load_span(const T* src, std::size_t stride, float scale, float* dst, int n) const {
    load_scaled(src, stride, scale, dst, n);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION void store_span(const float* src, float factor, T* dst, std::size_t stride, int n) const {
    store_scaled(src, factor, dst, stride, n);
  }
};

}  // namespace kpa::detail
