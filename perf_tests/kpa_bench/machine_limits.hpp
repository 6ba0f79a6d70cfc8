#pragma once
// The machine's limits, measured by Kokkos kernels on the execution space the benchmark runs
// on, so that "% of bandwidth" and "% of roofline" mean the same on any machine:
//   read bandwidth: a reduction over a 512 MiB buffer (far larger than any cache); on hosts each
//     work item sums 1024 consecutive floats into 16 independent partial sums, on GPUs each sums
//     one 16-byte vector (neighbouring threads, neighbouring vectors); best of 5 runs;
//   FMA throughput: every work item runs 64 independent multiply-add chains in registers for
//     2^14 steps (enough chains to cover the FMA latency); best of 5 runs, 2 FLOP per FMA.

#include <kpa/detail/kokkos_compat.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>

namespace kpa_bench {

struct alignas(16) float4_like {
  float x, y, z, w;
};

struct MachineLimits {
  double read_bytes_per_s = 0.0;
  double flop_per_s = 0.0;
};

template <class Space>
double best_seconds(int runs, const Space& space, const std::function<void()>& body) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    space.fence();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

template <class Space>
MachineLimits measure_machine_limits(const Space& space) {
  MachineLimits limits;
  constexpr std::int64_t chunk = 1024;
  constexpr std::int64_t floats = (std::int64_t{512} << 20) / sizeof(float);
  Kokkos::View<float*, typename Space::memory_space> buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kpa_bench::probe"), floats);
  Kokkos::parallel_for(
      "kpa_bench::probe_fill", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, floats),
      KOKKOS_LAMBDA(std::int64_t i) { buffer(i) = static_cast<float>(i & 7); });
  float total = 0.0f;
  constexpr bool host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  const double read_seconds = best_seconds(5, space, [&] {
    if constexpr (host) {  // a core streams a contiguous chunk into vector registers
      Kokkos::parallel_reduce(
          "kpa_bench::read_bandwidth",
          Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, floats / chunk),
          KOKKOS_LAMBDA(std::int64_t c, float& sum) {
            float lanes[16] = {};
            const float* p = buffer.data() + c * chunk;
            for (int i = 0; i < chunk; i += 16)
              for (int j = 0; j < 16; ++j) lanes[j] += p[i + j];
            for (int j = 0; j < 16; ++j) sum += lanes[j];
          },
          total);
    } else {  // GPU: neighbouring threads read neighbouring 16-byte vectors (coalesced)
      Kokkos::parallel_reduce(
          "kpa_bench::read_bandwidth", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, floats / 4),
          KOKKOS_LAMBDA(std::int64_t i, float& sum) {
            const float4_like v = reinterpret_cast<const float4_like*>(buffer.data())[i];
            sum += (v.x + v.y) + (v.z + v.w);
          },
          total);
    }
  });
  limits.read_bytes_per_s = static_cast<double>(floats) * sizeof(float) / read_seconds;

  constexpr int chains = 64, steps = 1 << 14;
  // Host: many items per thread; GPU: a few per resident thread (concurrency counts those).
  const std::int64_t items = std::int64_t{space.concurrency()} * (host ? 256 : 4);
  Kokkos::View<float*, typename Space::memory_space> sink("kpa_bench::fma_sink", items);
  const double fma_seconds = best_seconds(5, space, [&] {
    Kokkos::parallel_for(
        "kpa_bench::fma_throughput", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, items),
        KOKKOS_LAMBDA(std::int64_t item) {
          float acc[chains];
          for (int j = 0; j < chains; ++j) acc[j] = static_cast<float>(item + j) * 1e-3f;
          const float a = 0.999999f, b = 1e-7f;
          for (int s = 0; s < steps; ++s)
            for (int j = 0; j < chains; ++j) acc[j] = kpa::detail::compat::fma(acc[j], a, b);
          float sum = 0.0f;
          for (int j = 0; j < chains; ++j) sum += acc[j];
          sink(item) = sum;
        });
  });
  limits.flop_per_s = 2.0 * chains * steps * static_cast<double>(items) / fma_seconds;
  return limits;
}

}  // namespace kpa_bench
