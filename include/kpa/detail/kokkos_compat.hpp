#pragma once
// Every difference between the Kokkos versions kpa supports (3.4 to 4.6; the test command builds
// the host back ends against 3.4.1 and 4.6.01, and the CUDA back end against 4.6.01, or 3.4.1 where
// 4.6.01's sources are missing) lives here; the rest of the project calls these names and never
// tests KOKKOS_VERSION itself.

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime_api.h>
#endif

// Before a function Kokkos compiles for host and device whose body only host back ends run (the
// host path's, which calls the host-only instruction-set loops): nvcc's device pass would warn
// about the host calls; the pragma exempts the next function from that check.
#if defined(__CUDACC__)
#define KPA_HOST_ONLY_BODY _Pragma("nv_exec_check_disable")
#else
#define KPA_HOST_ONLY_BODY
#endif

/// Inside a reducer with join(value_type&, const value_type&): the volatile join that Kokkos
/// before 3.7 looks for in some reductions (later versions need none, and 4.0 refuses a
/// volatile-only one). The reduced values are plain floats, so a copy through the non-volatile
/// type is exact.
#if KOKKOS_VERSION < 30700
#define KPA_COMPAT_VOLATILE_JOIN(value_type)                                                         \
  KOKKOS_INLINE_FUNCTION void join(volatile value_type& dest, const volatile value_type& src) const { \
    value_type joined = const_cast<const value_type&>(dest);                                          \
    join(joined, const_cast<const value_type&>(src));                                                 \
    const_cast<value_type&>(dest) = joined;                                                           \
  }
#else
#define KPA_COMPAT_VOLATILE_JOIN(value_type)
#endif

namespace kpa::detail::compat {

KOKKOS_INLINE_FUNCTION float exp(float v) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::exp(v);
#else
  return Kokkos::Experimental::exp(v);
#endif
}

KOKKOS_INLINE_FUNCTION float log(float v) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::log(v);
#else
  return Kokkos::Experimental::log(v);
#endif
}

KOKKOS_INLINE_FUNCTION float tanh(float v) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::tanh(v);
#else
  return Kokkos::Experimental::tanh(v);
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
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);  // Kokkos 3.4 has no fma of its own
#else
  return std::fma(a, b, c);
#endif
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

/// Host mirror of `view` holding a copy of its contents (no copy when `view` is host-accessible).
template <class View>
auto host_copy(const View& view) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
}

/// The launch property of kpa's team kernels: Kokkos passes the functor as a kernel argument on
/// CUDA rather than through constant memory, whose reuse makes the host wait for the previous
/// launch and which a CUDA graph capture cannot record. Host back ends ignore it.
using KernelArgumentLaunch = Kokkos::Experimental::WorkItemProperty::HintLightWeight_t;

/// Copies of 16-byte pieces from global memory into team scratch that may still be in flight when
/// copy16 returns: a warp issues a step's copies, commits them as one group, and before reading
/// them waits until at most `Pending` of its newest groups are in flight (then syncs its lanes).
/// Host back ends copy at once; CUDA devices of compute capability 8.0 and newer copy
/// asynchronously (cp.async), older ones through registers.
template <class Space>
struct AsyncCopy {
  KOKKOS_INLINE_FUNCTION static void copy16(void* dst, const void* src) { copy16_now(dst, src); }
  KOKKOS_INLINE_FUNCTION static void commit() {}
  template <int Pending>
  KOKKOS_INLINE_FUNCTION static void wait() {}

  KOKKOS_INLINE_FUNCTION static void copy16_now(void* dst, const void* src) {
    struct alignas(16) Piece {
      unsigned words[4];
    };
    *static_cast<Piece*>(dst) = *static_cast<const Piece*>(src);
  }
};

/// Makes a team member's lanes meet: what each wrote to scratch before is seen by all after
/// (a warp sync on CUDA; host back ends run a member's lanes in order).
template <class Member>
KOKKOS_INLINE_FUNCTION void vector_sync(const Member&) {}

/// Lane `lane ^ mask`'s value of v, among a team member's vector lanes (CUDA: a warp's lanes);
/// host back ends run a member's lanes in order and have no other lane to read: v itself.
template <class Member>
KOKKOS_INLINE_FUNCTION float lane_xor(const Member&, float v, int) {
  return v;
}

/// Whether a member's lanes run in lockstep, each holding its own registers (CUDA); host back
/// ends run them one after another in one thread.
template <class Member>
inline constexpr bool lanes_in_lockstep = false;

/// Whether two instances of a space are one (their work runs in order). Kokkos 3.4 numbers
/// every instance 0; its CUDA instances differ by stream.
template <class Space>
bool same_instance(const Space& a, const Space& b) {
  return a.impl_instance_id() == b.impl_instance_id();
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

/// Threads one team (GPU block) may have on the device behind `space`.
template <class Space>
int device_max_threads_per_team(const Space&) {
  return 1024;
}

/// Resident teams per SM of `Functor` launched with `policy` (team_size x vector_length threads and
/// `scratch_bytes` of level-0 team scratch), from the CUDA occupancy calculator: the kernel's
/// registers, its shared memory and the SM's limits. 0 where no device answers (host back ends).
template <class Functor, class Policy, class Space>
int resident_teams_per_sm(const Space&, const Policy&, std::size_t) {
  return 0;
}

#ifdef KOKKOS_ENABLE_CUDA
template <>
struct AsyncCopy<Kokkos::Cuda> {
  KOKKOS_INLINE_FUNCTION static void copy16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // cp.async.cg: 16 bytes straight to shared memory, bypassing L1 (the cache is read once).
    const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared), "l"(src) : "memory");
#else
    AsyncCopy<Kokkos::DefaultHostExecutionSpace>::copy16_now(dst, src);
#endif
  }
  KOKKOS_INLINE_FUNCTION static void commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
  }
  template <int Pending>
  KOKKOS_INLINE_FUNCTION static void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
  }
};

template <>
KOKKOS_INLINE_FUNCTION float lane_xor(const Kokkos::Impl::CudaTeamMember&, float v, int mask) {
#if defined(__CUDA_ARCH__)
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  (void)mask;
  return v;
#endif
}

template <>
inline constexpr bool lanes_in_lockstep<Kokkos::Impl::CudaTeamMember> = true;

template <>
KOKKOS_INLINE_FUNCTION void vector_sync(const Kokkos::Impl::CudaTeamMember&) {
#if defined(__CUDA_ARCH__)
  __syncwarp();
#endif
}

// Kokkos caches each instance's device properties: nothing here queries the driver per call.
inline int device_sm_count(const Kokkos::Cuda& space) { return space.cuda_device_prop().multiProcessorCount; }

inline std::string device_name(const Kokkos::Cuda& space) { return space.cuda_device_prop().name; }

inline bool same_instance(const Kokkos::Cuda& a, const Kokkos::Cuda& b) { return a.cuda_stream() == b.cuda_stream(); }

inline int device_max_threads_per_team(const Kokkos::Cuda& space) {
  return space.cuda_device_prop().maxThreadsPerBlock;
}

/// Level-0 scratch a CUDA team may have on every GPU, known without one (scripts/device_gate_plans.cu
/// plans for GPUs it does not have): Kokkos 3.4 answers a constant; Kokkos 4 asks the device for
/// its shared memory per block (48 KiB on every GPU, without opting in to more) and keeps what a
/// team of up to 1024 threads needs for its reductions.
inline std::size_t cuda_scratch_level0_max_on_any_gpu() {
#if KOKKOS_VERSION >= 40000
  return 48 * 1024 - (1024 + 2) * sizeof(double) - sizeof(std::int64_t);
#else
  return static_cast<std::size_t>(Kokkos::TeamPolicy<Kokkos::Cuda>::scratch_size_max(0));
#endif
}

template <class Functor, class Policy>
int resident_teams_per_sm(const Kokkos::Cuda&, const Policy& policy, std::size_t scratch_bytes) {
  // The kernel Kokkos launches for a team parallel_for (the same type in Kokkos 3.4 to 4.6).
  using driver = Kokkos::Impl::ParallelFor<Functor, Policy, Kokkos::Cuda>;
  using launch = Kokkos::Impl::CudaParallelLaunch<driver, typename Policy::traits::launch_bounds>;
  const int threads = policy.team_size() * policy.impl_vector_length();
  // Kokkos adds a few doubles per team member of its own shared memory (team broadcasts).
  const std::size_t shared = scratch_bytes + sizeof(double) * (policy.team_size() + 2);
  int teams = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&teams, launch::get_kernel_func(), threads, shared) !=
      cudaSuccess) {
    (void)cudaGetLastError();  // clear the error: the caller falls back to its own estimate
    return 0;
  }
  return teams;
}
#endif

}  // namespace kpa::detail::compat
