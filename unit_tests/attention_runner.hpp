#pragma once
// Runs one decode batch through v1, v2 or the automatic entry point and compares the result with
// the float64 reference.

#include "problem.hpp"

#include <kpa/kpa.hpp>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace kpa_test {

/// Expects call() to throw kpa::Error whose message contains `expected`.
template <class Call>
void expect_error(Call&& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no kpa::Error; expected one mentioning '" << expected << "'";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << expected << "'";
  }
}

enum class Version { V1, V2, Auto };

inline const char* version_name(Version v) { return v == Version::V1 ? "v1" : v == Version::V2 ? "v2" : "auto"; }

inline constexpr Version kAllVersions[] = {Version::V1, Version::V2, Version::Auto};

/// v2 intermediates sized for a problem, filled with a sentinel so unwritten entries show.
template <class TmpT, class Space>
struct Partials {
  Kokkos::View<float***, Kokkos::LayoutRight, typename Space::memory_space> exp_sums, max_logits;
  Kokkos::View<TmpT****, Kokkos::LayoutRight, typename Space::memory_space> tmp_out;
  static constexpr float sentinel = -7.25f;

  Partials(const HostProblem& p, int partition_size)
      : exp_sums("exp_sums", p.num_seqs, p.num_heads, partitions(p, partition_size)),
        max_logits("max_logits", p.num_seqs, p.num_heads, partitions(p, partition_size)),
        tmp_out("tmp_out", p.num_seqs, p.num_heads, partitions(p, partition_size), p.head_size) {
    Kokkos::deep_copy(exp_sums, sentinel);
    Kokkos::deep_copy(max_logits, sentinel);
    Kokkos::deep_copy(tmp_out, kpa::detail::from_float<TmpT>(sentinel));
  }
  static int partitions(const HostProblem& p, int partition_size) {
    return std::max(1, (p.max_seq_len() + partition_size - 1) / partition_size);
  }
};

template <class T, class Space, class C>
void run_version(Version version, DeviceProblem<T, Space, C>& d, int partition_size, const kpa::PlanOptions& options,
                 kpa::Workspace<Space>& workspace, const HostProblem& p) {
  const Space space;
  switch (version) {
    case Version::V1:
      kpa::paged_attention_v1(space, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                              d.max_seq_len, d.alibi, d.params, options);
      break;
    case Version::V2: {
      Partials<T, Space> partials(p, partition_size);
      kpa::paged_attention_v2(space, d.out, partials.exp_sums, partials.max_logits, partials.tmp_out, d.query,
                              d.key_cache, d.value_cache, d.block_tables, d.seq_lens, d.max_seq_len, d.alibi,
                              d.params, partition_size, options);
      break;
    }
    case Version::Auto: {
      kpa::PlanOptions auto_options = options;
      auto_options.partition_size = partition_size;  // 0: the planner's choice
      kpa::paged_attention(space, workspace, d.out, d.query, d.key_cache, d.value_cache, d.block_tables, d.seq_lens,
                           d.max_seq_len, d.alibi, d.params, d.extras(), auto_options);
      break;
    }
  }
  space.fence();
}

/// The plans every attention test runs on Space over caches of C: the back end's default; on
/// host back ends whose best host instruction set is not the portable one, the host path's
/// portable loops too (and every lesser vector set down to AVX2: AVX-512 without VBMI where the
/// best has it, VBMI where the best is AMX); for bf16 and fp8 caches on CPUs without AMX, the
/// AMX loops over the tile model (HostIsa::AmxModel), so the tile code runs on every machine;
/// and on host back ends the device kernel path (libkpa's) with several team members (OpenMP)
/// and vector lanes, so the GPU-shaped code runs on every machine.
/// `base` carries a test's own overrides.
template <class Space, class C>
std::vector<kpa::PlanOptions> kernel_paths(const kpa::PlanOptions& base) {
  std::vector<kpa::PlanOptions> paths{base};
  if (!Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) return paths;
  const kpa::BackEndLimits limits = kpa::BackEndLimits::of(Space());
  if (base.kernel_path != kpa::PlanOptions::Path::Device) {  // every lesser instruction set
    std::vector<kpa::HostIsa> isas;
    for (kpa::HostIsa isa : {kpa::HostIsa::Portable, kpa::HostIsa::Avx2, kpa::HostIsa::Avx512, kpa::HostIsa::Avx512Vbmi}) {
      if (isa >= limits.best_host_isa) break;
      if (isa == kpa::HostIsa::Avx512Vbmi && sizeof(C) != 1) continue;  // VBMI serves fp8 only
      isas.push_back(isa);
    }
    constexpr bool tiled = std::is_same_v<C, kpa::bfloat16> || sizeof(C) == 1;
    if (tiled && limits.best_host_isa != kpa::HostIsa::Amx &&
        kpa::detail::host_isa_runs(kpa::HostIsa::AmxModel, limits.best_host_isa)) {
      isas.push_back(kpa::HostIsa::AmxModel);
    }
    for (kpa::HostIsa isa : isas) {
      kpa::PlanOptions lesser = base;
      lesser.kernel_path = kpa::PlanOptions::Path::Host;
      lesser.host_isa = isa;
      paths.push_back(lesser);
    }
  }
  if (limits.device_path) {
    kpa::PlanOptions device = base;
    device.kernel_path = kpa::PlanOptions::Path::Device;
    if (device.team_size == 0) device.team_size = std::min<int>(2, static_cast<int>(Space().concurrency()));
    if (device.vector_length == 0) device.vector_length = 4;
    paths.push_back(device);
  }
  return paths;
}

inline std::string path_name(const kpa::PlanOptions& options) {
  switch (options.kernel_path) {
    case kpa::PlanOptions::Path::Host:
      return std::string("host path (") + (options.host_isa ? std::string(kpa::to_string(*options.host_isa)) : "default") +
             " loops)";
    case kpa::PlanOptions::Path::Device:
      return "device path (team " + std::to_string(options.team_size) + " x vector " +
             std::to_string(options.vector_length) + ")";
    default: return "default path";
  }
}

template <class T, class Space, class C>
void check_versions(DeviceProblem<T, Space, C>& d, const HostProblem& p, int partition_size,
                    const kpa::PlanOptions& options = {}, bool auto_partition = true);

/// Automatic-entry-point runs checked so far whose plan took the device path.
inline int& device_path_runs() {
  static int runs = 0;
  return runs;
}

/// Runs every version of `p` on every kernel path (kernel_paths) and compares each with the
/// reference. v2 uses `partition_size`; the automatic path uses it too when `auto_partition` is
/// set, and the planner's choice otherwise.
template <class T, class Space, class C = T>
void check_attention_on(const HostProblem& p, int partition_size, const kpa::PlanOptions& options = {},
                        bool auto_partition = true) {
  DeviceProblem<T, Space, C> d(p);
  check_versions(d, p, partition_size, options, auto_partition);
}

/// The same for a problem already on the device (whose views a test may have replaced).
template <class T, class Space, class C>
void check_versions(DeviceProblem<T, Space, C>& d, const HostProblem& p, int partition_size,
                    const kpa::PlanOptions& options, bool auto_partition) {
  const ReferenceResult ref = reference_rows(p);
  kpa::Workspace<Space> workspace;
  // Several query tokens and sinks are extras of the automatic entry point only.
  const bool extras_only = !p.query_start_loc.empty() || !p.sinks.empty();
  for (const kpa::PlanOptions& path : kernel_paths<Space, C>(options)) {
    for (Version version : kAllVersions) {
      if (extras_only && version != Version::Auto) continue;
      Kokkos::deep_copy(d.out, kpa::detail::from_float<T>(std::numeric_limits<float>::quiet_NaN()));
      Kokkos::deep_copy(d.lse, std::numeric_limits<float>::quiet_NaN());
      run_version(version, d, version == Version::Auto && !auto_partition ? 0 : partition_size, path, workspace, p);
      const std::string what = std::string(version_name(version)) + ", " + path_name(path) + ", head_size " +
                               std::to_string(p.head_size) + " block_size " + std::to_string(p.block_size);
      expect_close_to_reference<T>(d.out, ref.out, what);
      if (version == Version::Auto) {
        expect_close_to_reference<float>(d.lse, ref.lse, what + ", lse");
        if (workspace.last_plan().kernel_path == kpa::KernelPath::Device) ++device_path_runs();
      }
    }
  }
}

/// The same for the problem `spec` describes.
template <class T, class Space, class C = T>
void check_attention(const ProblemSpec& spec, int partition_size, const kpa::PlanOptions& options = {},
                     bool auto_partition = true) {
  check_attention_on<T, Space, C>(make_problem<T>(spec), partition_size, options, auto_partition);
}

}  // namespace kpa_test
