// The launch planner's answer for one workload on a GPU profile, asked of a CUDA build's libkpa
// (no GPU is touched), for the bytes-in-flight model of scripts/device_gates.py:
//   device_gate_plans PROFILE SEQUENCES TOKENS HEADS KV_HEADS HEAD_SIZE BLOCK_SIZE ELEMENT_BYTES
// PROFILE is a GPU profile, NAME:SMS:OCCUPANCY:SUBSCRIPTION. Prints one line:
//   PATH ROWS_PER_PASS STEP_TOKENS WARPS SCRATCH_BYTES
// The back end's limits are CUDA's, every GPU's: the team policy's vector length, the level-0
// scratch a team may have on any GPU, and 1024 threads per block.

#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/launch_plan.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s PROFILE SEQUENCES TOKENS HEADS KV_HEADS HEAD_SIZE BLOCK_SIZE ELEMENT_BYTES\n",
                 argv[0]);
    return 2;
  }
  try {
    kpa::DeviceProfile profile = kpa::DeviceProfile::from_name(argv[1]);
    using Policy = Kokkos::TeamPolicy<Kokkos::Cuda>;
    profile.limits.max_vector_length = Policy::vector_length_max();
    profile.limits.max_scratch_level0_bytes = kpa::detail::compat::cuda_scratch_level0_max_on_any_gpu();
    profile.limits.max_team_threads = 1024;
    profile.limits.max_team_size = 1024;
    kpa::ProblemShape shape;
    shape.num_seqs = std::atoi(argv[2]);
    shape.max_seq_len = std::atoi(argv[3]);
    shape.num_heads = std::atoi(argv[4]);
    shape.num_kv_heads = std::atoi(argv[5]);
    shape.head_size = std::atoi(argv[6]);
    shape.block_size = std::atoi(argv[7]);
    shape.cache_element_size = std::atoi(argv[8]);
    const kpa::LaunchPlan plan = kpa::plan_launch(profile, shape);
    std::printf("%s %d %d %d %zu\n", std::string(kpa::to_string(plan.kernel_path)).c_str(), plan.rows_per_pass,
                plan.chunk_tokens, plan.team_size, plan.scratch_bytes);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
