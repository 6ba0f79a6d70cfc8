#pragma once
// The bytes-in-flight probe (kpa-bench --in-flight-probe): how fast a GPU reads when each warp
// keeps N independent 16-byte loads per lane in flight and W warps share each SM. Little's law
// turns each figure into the loaded memory latency: latency = bytes in flight / bandwidth, with
// bytes in flight = SMs x W warps x 32 lanes x N x 16 bytes. The attention kernels' model
// (scripts/device_gates.py's figures, README "CUDA") is calibrated with it.

#include "machine_limits.hpp"

#include <kpa/detail/kokkos_compat.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kpa_bench {

struct InFlightPoint {
  int loads_per_lane = 0;
  int warps_per_sm = 0;
  double bytes_per_s = 0.0;
  double in_flight_bytes = 0.0;  ///< per SM
  double latency_us = 0.0;
};

/// Each team (one warp) walks its share of the buffer in rounds; in a round every lane issues
/// N loads 32 vectors apart before it uses any of them.
template <class Space, int N>
struct InFlightReader {
  Kokkos::View<const float4_like*, typename Space::memory_space> buffer;
  Kokkos::View<float*, typename Space::memory_space> sink;
  std::int64_t vectors_per_team = 0;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& member) const {
    const std::int64_t first = member.league_rank() * vectors_per_team;
    float total = 0.0f;
    for (std::int64_t round = 0; round < vectors_per_team; round += 32 * N) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, 32), [&](int lane) {
        float4_like v[N];
        for (int k = 0; k < N; ++k) v[k] = buffer(first + round + k * 32 + lane);
        for (int k = 0; k < N; ++k) total += (v[k].x + v[k].y) + (v[k].z + v[k].w);
      });
    }
    Kokkos::single(Kokkos::PerTeam(member), [&]() { sink(member.league_rank()) = total; });
  }
};

template <class Space, int N>
InFlightPoint read_with_in_flight(const Space& space, const Kokkos::View<float4_like*, typename Space::memory_space>& buffer,
                                  int sms, int warps_per_sm) {
  const int teams = sms * warps_per_sm;
  InFlightReader<Space, N> reader;
  reader.buffer = buffer;
  reader.sink = Kokkos::View<float*, typename Space::memory_space>("kpa_bench::in_flight_sink", teams);
  reader.vectors_per_team = static_cast<std::int64_t>(buffer.extent(0)) / teams / (32 * N) * (32 * N);
  const Kokkos::TeamPolicy<Space> policy(space, teams, 1, 32);
  const double seconds = best_seconds(3, space, [&] { Kokkos::parallel_for("kpa_bench::in_flight", policy, reader); });
  InFlightPoint point;
  point.loads_per_lane = N;
  point.warps_per_sm = warps_per_sm;
  point.bytes_per_s = static_cast<double>(reader.vectors_per_team) * teams * 16 / seconds;
  point.in_flight_bytes = static_cast<double>(warps_per_sm) * 32 * N * 16;
  point.latency_us = point.in_flight_bytes * sms / point.bytes_per_s * 1e6;
  return point;
}

/// The probe's grid: 1, 2, 4 and 8 loads per lane x 8, 16, 32 and 64 warps per SM, over 1 GiB.
template <class Space>
std::vector<InFlightPoint> in_flight_probe(const Space& space) {
  const int sms = kpa::detail::compat::device_sm_count(space);
  std::vector<InFlightPoint> points;
  if (sms == 0) return points;  // a GPU probe: host back ends have no SMs
  Kokkos::View<float4_like*, typename Space::memory_space> buffer("kpa_bench::in_flight_buffer", std::int64_t{1} << 26);
  for (int warps : {8, 16, 32, 64}) {
    points.push_back(read_with_in_flight<Space, 1>(space, buffer, sms, warps));
    points.push_back(read_with_in_flight<Space, 2>(space, buffer, sms, warps));
    points.push_back(read_with_in_flight<Space, 4>(space, buffer, sms, warps));
    points.push_back(read_with_in_flight<Space, 8>(space, buffer, sms, warps));
  }
  return points;
}

}  // namespace kpa_bench
