#pragma once
// The machine's limits, measured by Kokkos kernels on the execution space the benchmark runs
// on, so that "% of bandwidth" and "% of roofline" mean the same on any machine:
//   read bandwidth: a reduction over a 512 MiB buffer (far larger than any cache); on hosts about
//     8 work items per thread, each summing one contiguous run of at least 256 KiB (x86: in 8
//     AVX2 or 4 AVX-512 accumulators, the widest the CPU has; elsewhere 16 partial sums), on
//     GPUs each work item sums one 16-byte vector
//     (neighbouring threads, neighbouring vectors); best of 5 runs;
//   FMA throughput: every work item runs independent multiply-add chains in registers (x86: 16
//     vector chains of the widest width; elsewhere 64 scalar chains for the compiler to
//     vectorise), enough to cover the FMA latency; best of 5 runs, 2 FLOP per FMA;
//   AMX throughput, where kpa runs its AMX level: every work item runs tdpbf16ps into 4
//     independent 16 x 16 accumulators (16 x 16 x 32 multiply-adds each) from tiles loaded
//     once, through kpa's own tile mapping (src/host_loops/amx_tiles.hpp); best of 5 runs.
// Besides these, each workload measures the paged read on hosts (Bench::paged_read_bytes_per_s
// in main.cpp): the same blocks in the same order, read by a plain loop (read_words).

#include <kpa/detail/kokkos_compat.hpp>

// The x86 probes are written with intrinsics and target attributes, whatever the flags.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__HIPCC__)
#define KPA_BENCH_X86_PROBES 1
#endif

#ifdef KPA_BENCH_X86_PROBES
#include <immintrin.h>

#include <kpa/host_isa.hpp>

#include "host_loops/amx_tiles.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace kpa_bench {

struct alignas(16) float4_like {
  float x, y, z, w;
};

struct MachineLimits {
  double read_bytes_per_s = 0.0;
  double flop_per_s = 0.0;       ///< FMA
  double tile_flop_per_s = 0.0;  ///< AMX tdpbf16ps; 0 where kpa does not run its AMX level
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

#ifdef KPA_BENCH_X86_PROBES
// Hand-vectorised probes for x86 hosts, with target attributes (whatever kpa-bench's flags): the
// limits are those of the widest vector instructions the CPU has, which is what a plain
// intrinsics loop would measure.
namespace x86 {

/// The sum of n floats (n a multiple of 64) through 8 independent vector accumulators.
__attribute__((target("avx2"))) inline float read_sum_avx2(const float* p, std::int64_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 64)
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + i + 8 * j));
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

__attribute__((target("avx512f"))) inline float read_sum_avx512(const float* p, std::int64_t n) {
  __m512 acc[4];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 64)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(p + i + 16 * j));
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/// The 32-bit words of `bytes` bytes (a multiple of 256) summed in 8 vector accumulators: integer
/// adds, so any bit pattern (f16 pairs, fp8 quads) costs the same.
__attribute__((target("avx2"))) inline std::uint32_t read_words_avx2(const char* p, std::int64_t bytes) {
  __m256i acc[8];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (std::int64_t i = 0; i < bytes; i += 256)
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32 * j)));
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

/// kChains independent vector FMA chains of `steps` steps; returns their sum (kept live).
/// The accumulator loops are unrolled explicitly: at -O2 GCC keeps acc[] in memory otherwise, and
/// the probe then measures store forwarding (less than half the FMA throughput).
constexpr int kChains = 16;
__attribute__((target("avx2,fma"))) inline float fma_chains_avx2(float seed, int steps) {
  __m256 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm256_set1_ps(seed + static_cast<float>(j));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int s = 0; s < steps; ++s)
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  for (int j = 1; j < kChains; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[7];
}

__attribute__((target("avx512f"))) inline float fma_chains_avx512(float seed, int steps) {
  __m512 acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = _mm512_set1_ps(seed + static_cast<float>(j));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int s = 0; s < steps; ++s)
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  for (int j = 1; j < kChains; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
}

/// `steps` rounds of tdpbf16ps into 4 accumulators; returns an element of their sum (kept live).
inline float tile_chains(int steps) {
  using Tiles = kpa::detail::amx::AmxTiles;
  kpa::detail::amx::TileConfig config;
  for (int t = 0; t < 6; ++t) config.set(t, 16, 64);  // accumulators 0-3, A 4, B 5
  alignas(64) std::uint16_t operand[16][32];
  for (auto& row : operand)
    for (auto& v : row) v = 0x3a80;  // 2^-10
  alignas(64) float sums[4][16][16];
  Tiles::configure(config);
  Tiles::zero<0>();
  Tiles::zero<1>();
  Tiles::zero<2>();
  Tiles::zero<3>();
  Tiles::load<4>(operand, 64);
  Tiles::load<5>(operand, 64);
  for (int s = 0; s < steps; ++s) {
    Tiles::dot_bf16<0, 4, 5>();
    Tiles::dot_bf16<1, 4, 5>();
    Tiles::dot_bf16<2, 4, 5>();
    Tiles::dot_bf16<3, 4, 5>();
  }
  Tiles::store<0>(sums[0], 64);
  Tiles::store<1>(sums[1], 64);
  Tiles::store<2>(sums[2], 64);
  Tiles::store<3>(sums[3], 64);
  Tiles::release();
  return sums[0][0][0] + sums[1][0][0] + sums[2][0][0] + sums[3][0][0];
}

/// Vector width in floats of the widest probe this CPU runs: 16 (AVX-512F), 8 (AVX2 + FMA), 0.
inline int probe_width() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
  return 0;
}

}  // namespace x86
#endif

/// How the probes ran: "avx512", "avx2" (hand-vectorised) or "kokkos" (plain Kokkos loops).
template <class Space>
std::string probe_kind() {
#ifdef KPA_BENCH_X86_PROBES
  if constexpr (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
    const int width = x86::probe_width();
    if (width > 0) return width == 16 ? "avx512" : "avx2";
  }
#endif
  return "kokkos";
}

template <class Space>
MachineLimits measure_machine_limits(const Space& space) {
  MachineLimits limits;
  constexpr std::int64_t floats = (std::int64_t{512} << 20) / sizeof(float);
  // Host work items: about 8 per thread, each one long contiguous run (with 4 KiB items the
  // prefetchers restart at every item and the probe read 75-90% of a plain loop's bandwidth).
  std::int64_t streams = 1;
  while (streams < 8 * std::int64_t{space.concurrency()} && streams < floats / 65536) streams *= 2;
  const std::int64_t chunk = floats / streams;
  Kokkos::View<float*, typename Space::memory_space> buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kpa_bench::probe"), floats);
  Kokkos::parallel_for(
      "kpa_bench::probe_fill", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, floats),
      KOKKOS_LAMBDA(std::int64_t i) { buffer(i) = static_cast<float>(i & 7); });
  float total = 0.0f;
  constexpr bool host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  [[maybe_unused]] int width = 0;  // read only where the x86 probes are compiled
#ifdef KPA_BENCH_X86_PROBES
  if constexpr (host) width = x86::probe_width();
#endif
  const double read_seconds = best_seconds(5, space, [&] {
    if constexpr (host) {  // a core streams a contiguous chunk into vector registers
      Kokkos::parallel_reduce(
          "kpa_bench::read_bandwidth",
          Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, streams),
          KOKKOS_LAMBDA(std::int64_t c, float& sum) {
            const float* p = buffer.data() + c * chunk;
#ifdef KPA_BENCH_X86_PROBES
            if (width == 16) {
              sum += x86::read_sum_avx512(p, chunk);
              return;
            }
            if (width == 8) {
              sum += x86::read_sum_avx2(p, chunk);
              return;
            }
#endif
            float lanes[16] = {};
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
  double flop_per_item = 2.0 * chains * steps;
#ifdef KPA_BENCH_X86_PROBES
  if (width > 0) flop_per_item = 2.0 * x86::kChains * width * (steps / 4);
#endif
  const double fma_seconds = best_seconds(5, space, [&] {
    Kokkos::parallel_for(
        "kpa_bench::fma_throughput", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, items),
        KOKKOS_LAMBDA(std::int64_t item) {
#ifdef KPA_BENCH_X86_PROBES
          if (width > 0) {
            const float seed = static_cast<float>(item) * 1e-3f;
            sink(item) = width == 16 ? x86::fma_chains_avx512(seed, steps / 4) : x86::fma_chains_avx2(seed, steps / 4);
            return;
          }
#endif
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
  limits.flop_per_s = flop_per_item * static_cast<double>(items) / fma_seconds;

#ifdef KPA_BENCH_X86_PROBES
  // cpu_host_isa() asks the kernel for the tile state for this process, as kpa does.
  if (host && kpa::detail::chosen_host_isa(kpa::detail::best_host_isa()) == kpa::HostIsa::Amx) {
    constexpr int tile_steps = 1 << 12;
    const std::int64_t tile_items = std::int64_t{space.concurrency()} * 16;
    const double tile_seconds = best_seconds(5, space, [&] {
      Kokkos::parallel_for(
          "kpa_bench::tile_throughput", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, tile_items),
          KOKKOS_LAMBDA(std::int64_t item) { sink(item % items) = x86::tile_chains(tile_steps); });
    });
    limits.tile_flop_per_s = 4.0 * 16 * 16 * 32 * 2 * tile_steps * static_cast<double>(tile_items) / tile_seconds;
  }
#endif
  return limits;
}

/// The 32-bit words of `bytes` bytes summed: with AVX2 when `avx2` (x86::probe_width() >= 8) and
/// bytes is a multiple of 256, else by a plain loop (which compilers vectorise).
inline std::uint32_t read_words(const char* p, std::int64_t bytes, bool avx2) {
#ifdef KPA_BENCH_X86_PROBES
  if (avx2 && bytes % 256 == 0) return x86::read_words_avx2(p, bytes);
#else
  (void)avx2;
#endif
  std::uint32_t sum = 0;
  for (std::int64_t i = 0; i + 4 <= bytes; i += 4) {
    std::uint32_t word;
    std::memcpy(&word, p + i, 4);
    sum += word;
  }
  return sum;
}

/// Evicts the caches before a timed call by rewriting a buffer far larger than any of them, so
/// every call meets its KV cache in memory, as a decode step does in serving (each layer's cache
/// is long gone from the caches by the next step).
template <class Space>
class CacheFlusher {
 public:
  explicit CacheFlusher(const Space& space)
      : space_(space),
        buffer_(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kpa_bench::cache_flush"),
                (std::int64_t{256} << 20) / sizeof(float)) {}

  void operator()() const {
    const auto buffer = buffer_;
    Kokkos::parallel_for(
        "kpa_bench::cache_flush", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space_, 0, buffer.extent(0)),
        KOKKOS_LAMBDA(std::int64_t i) { buffer(i) = static_cast<float>(i); });
    space_.fence();
  }

 private:
  Space space_;
  Kokkos::View<float*, typename Space::memory_space> buffer_;
};

}  // namespace kpa_bench
