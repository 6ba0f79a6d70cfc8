#pragma once
// Every difference between the Kokkos versions kpa supports (3.4 to 5.x) lives here;
// the rest of the project calls these names and never tests KOKKOS_VERSION itself.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstring>
#include <string>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kpa::detail::compat {

KOKKOS_INLINE_FUNCTION float exp(float v) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::exp(v);
#else
  return Kokkos::Experimental::exp(v);
#endif
}

KOKKOS_INLINE_FUNCTION float fmax(float a, float b) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::fmax(a, b);
#else
  return Kokkos::Experimental::fmax(a, b);
#endif
}

KOKKOS_INLINE_FUNCTION float fma(float a, float b, float c) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::fma(a, b, c);
#else
  return std::fma(a, b, c);  // Kokkos 3.4 builds here are host-only (CUDA 13 needs Kokkos 4.7+)
#endif
}

KOKKOS_INLINE_FUNCTION constexpr float infinity() {
  return Kokkos::Experimental::infinity<float>::value;
}

template <class To, class From>
KOKKOS_INLINE_FUNCTION To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<To>(from);
#else
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
#endif
}

template <class Space>
void fence(const Space& space, const std::string& label) {
#if KOKKOS_VERSION >= 40000
  space.fence(label);
#else
  (void)label;
  space.fence();
#endif
}

/// Host mirror of `view` holding a copy of its contents (no copy when `view` is host-accessible).
template <class View>
auto host_copy(const View& view) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
}

/// Streaming multiprocessor count of the device behind `space`; 0 for host back ends.
template <class Space>
int device_sm_count(const Space&) {
  return 0;
}

/// Device name behind `space`; the back end's name for host back ends.
template <class Space>
std::string device_name(const Space&) {
  return Space::name();
}

#ifdef KOKKOS_ENABLE_CUDA
inline int device_sm_count(const Kokkos::Cuda& space) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, space.cuda_device()) == cudaSuccess ? prop.multiProcessorCount
                                                                             : 0;
}

inline std::string device_name(const Kokkos::Cuda& space) {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, space.cuda_device()) == cudaSuccess ? std::string(prop.name)
                                                                             : std::string("Cuda");
}
#endif

}  // namespace kpa::detail::compat
