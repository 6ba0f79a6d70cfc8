// Parity between the two kernel paths on two execution spaces (test_spaces.hpp): the host path on
// a host back end against the device path on the GPU (CUDA builds), on the other host back end
// (Serial and OpenMP), or on the same one where the build has only one. The same inputs through
// both, every output of the second within the per-dtype tolerance of the first. Runs kpa-bench's
// default suite and the head-size x block-size x dtype grid; prints the largest difference of
// each workload.

#include "attention_runner.hpp"
#include "test_spaces.hpp"

#include <algorithm>
#include <cstdio>

namespace {

using namespace kpa_test;
using First = ParitySpaces::first;
using Second = ParitySpaces::second;

/// The kernel path each side runs: the host path on the first space, the device path on the
/// second (on a host back end with two team members and four vector lanes).
template <class Space>
kpa::PlanOptions path_on(bool first) {
  kpa::PlanOptions options;
  options.kernel_path = first ? kpa::PlanOptions::Path::Host : kpa::PlanOptions::Path::Device;
  if (!first && Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
    options.team_size = std::min<int>(2, static_cast<int>(Space().concurrency()));
    options.vector_length = 4;
  }
  return options;
}

/// Runs `version` of the problem on Space and returns its output on the host, as float.
template <class T, class Space, class C>
std::vector<float> output_on(const HostProblem& p, Version version, int partition_size, bool first) {
  DeviceProblem<T, Space, C> d(p);
  kpa::Workspace<Space> workspace;
  run_version(version, d, partition_size, path_on<Space>(first), workspace, p);
  const auto host = kpa::detail::compat::host_copy(d.out);
  std::vector<float> out(host.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = kpa::to_float(host.data()[i]);
  return out;
}

/// Both spaces on `spec`; fails where they differ by more than T's tolerance. Returns the max difference.
template <class T, class C = T>
double check_parity(const std::string& name, const ProblemSpec& spec, Version version, int partition_size = 512) {
  const HostProblem p = make_problem<T>(spec);
  const std::vector<float> first = output_on<T, First, C>(p, version, partition_size, true);
  const std::vector<float> second = output_on<T, Second, C>(p, version, partition_size, false);
  double worst = 0.0;
  int reported = 0;
  for (std::size_t i = 0; i < first.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(second[i]) - first[i]);
    worst = std::isnan(diff) ? diff : std::max(worst, diff);
    if (!(diff <= Tolerance<T>::atol + Tolerance<T>::rtol * std::fabs(first[i])) && reported++ < 5) {
      ADD_FAILURE() << name << ": element " << i << ": " << Second::name() << " device path " << second[i] << ", "
                    << First::name() << " host path " << first[i];
    }
  }
  std::printf("parity %-34s %-4s %-4s max |%s device path - %s host path| = %.3g (tolerance %.3g)\n", name.c_str(),
              dtype_name<T>(), version_name(version), Second::name(), First::name(), worst, Tolerance<T>::atol);
  return worst;
}

ProblemSpec shape(std::vector<int> seq_lens, int heads, int kv_heads, int head_size, int block_size = 16) {
  ProblemSpec spec;
  spec.seq_lens = std::move(seq_lens);
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_size = head_size;
  spec.block_size = block_size;
  spec.extra_columns = 0;
  return spec;
}

// kpa-bench's default suite: Llama-style batch, 100K-token context, single-partition batch, fp8 cache
// (its bf16 and block-128 rows are these shapes again; the grid below covers those dtypes and sizes).
TEST(Parity, DefaultSuite) {
  check_parity<kpa::half>("llama_32x4096", shape(std::vector<int>(32, 4096), 32, 8, 128), Version::Auto);
  check_parity<kpa::half>("long_context_1x100k", shape({100000}, 24, 4, 256), Version::Auto);
  check_parity<kpa::half>("single_tile_64x512", shape(std::vector<int>(64, 512), 32, 8, 128), Version::Auto);
  ProblemSpec fp8 = shape(std::vector<int>(32, 4096), 32, 8, 128);
  fp8.kv_cache_dtype = kpa::KVCacheDType::Fp8E4M3;
  fp8.k_scale = fp8.v_scale = 1.0f / 128;
  check_parity<kpa::half, std::uint8_t>("llama_32x4096_fp8", fp8, Version::Auto);
}

// Every head size and block size vLLM supports, in each dtype, through v1 and v2.
template <class T>
void grid() {
  for (int head_size : {32, 64, 80, 96, 112, 120, 128, 192, 256}) {
    for (int block_size : {8, 16, 32}) {
      ProblemSpec spec = shape({1, 100, 517, 1500}, 8, 2, head_size, block_size);
      spec.seed = head_size * 100 + block_size;
      const std::string name = "grid_d" + std::to_string(head_size) + "_b" + std::to_string(block_size);
      check_parity<T>(name, spec, Version::V1);
      check_parity<T>(name, spec, Version::V2, 256);
    }
  }
}

TEST(Parity, HeadSizeBlockSizeGridF32) { grid<float>(); }
TEST(Parity, HeadSizeBlockSizeGridF16) { grid<kpa::half>(); }
TEST(Parity, HeadSizeBlockSizeGridBF16) { grid<kpa::bfloat16>(); }

}  // namespace
