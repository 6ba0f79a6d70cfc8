#pragma once
// Launch planning: how many teams of what shape run a paged-attention call, and whether the
// sequence is split into partitions. The league is bounded by CUB's GridEvenShare rule
// (sm_occupancy x sm_count x subscription_factor resident teams) and every team takes an even,
// contiguous share of the tiles, a tile being one (sequence, kv head, partition).

#include <kpa/detail/kokkos_compat.hpp>

#include <cstdlib>
#include <iosfwd>
#include <string>
#include <string_view>

namespace kpa {

/// What the planner knows about a device.
struct DeviceProfile {
  std::string name;
  int sm_count = 1;             ///< streaming multiprocessors (GPU) or threads (host)
  int sm_occupancy = 1;         ///< resident teams per SM
  int subscription_factor = 1;  ///< teams per resident slot (CUB's default is 5)
  bool is_gpu = false;          ///< GPU profiles spread a team over vector lanes

  int max_blocks() const { return sm_count * sm_occupancy * subscription_factor; }

  /// The seed design's Iluvatar BI-V100 profile: 16 SMs x occupancy 2 x subscription 5 = 160.
  static DeviceProfile bi_v100();
  /// A host back end with `concurrency` threads: one resident team per thread, four teams per
  /// thread so dynamic scheduling can even out uneven sequence lengths.
  static DeviceProfile host(int concurrency);
  /// "bi-v100", "host:THREADS", or "NAME:SM_COUNT:OCCUPANCY:SUBSCRIPTION" (a GPU profile).
  /// Throws kpa::Error for anything else.
  static DeviceProfile from_name(std::string_view spec);

  /// The profile of the device behind `space`. The environment variable KPA_DEVICE_PROFILE,
  /// when set, overrides detection with from_name(its value), so a CPU run can plan as the
  /// BI-V100 for inspection.
  template <class Space>
  static DeviceProfile detect(const Space& space);
};

/// The shape of one decode batch, as far as planning cares.
struct ProblemShape {
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  int max_seq_len = 0;
};

/// Caller overrides; 0 leaves the choice to the planner.
struct PlanOptions {
  int partition_size = 0;  ///< tokens per partition, a multiple of block_size
  int team_size = 0;
  int vector_length = 0;
  int league_size = 0;  ///< still capped by the number of tiles
};

struct LaunchPlan {
  std::string profile;     ///< name of the DeviceProfile planned for
  int partition_size = 0;  ///< tokens per partition (a multiple of block_size)
  int num_partitions = 0;  ///< ceil(max_seq_len / partition_size), at least 1
  int tiles = 0;           ///< num_seqs x num_kv_heads x num_partitions
  int league_size = 0;     ///< min(tiles, max_blocks): teams of the attention kernel
  int tiles_per_team = 0;  ///< ceil(tiles / league_size): a team's even share
  int team_size = 0;
  int vector_length = 0;
  int reduce_league_size = 0;  ///< teams of the partition reduce (not launched when single_tile)
  bool single_tile = false;    ///< every sequence fits one partition: one kernel, no temporaries
};

/// Plans a call. Throws kpa::Error for a shape no kernel can run (non-positive sizes,
/// a partition size that is not a multiple of the block size, ...).
LaunchPlan plan_launch(const DeviceProfile& profile, const ProblemShape& shape,
                       const PlanOptions& options = {});

std::ostream& operator<<(std::ostream& os, const LaunchPlan& plan);
std::string to_string(const LaunchPlan& plan);
std::ostream& operator<<(std::ostream& os, const DeviceProfile& profile);

template <class Space>
DeviceProfile DeviceProfile::detect(const Space& space) {
  if (const char* forced = std::getenv("KPA_DEVICE_PROFILE"); forced != nullptr && *forced != '\0') {
    return from_name(forced);
  }
  const int sm_count = detail::compat::device_sm_count(space);
  if (sm_count == 0) {
    DeviceProfile profile = host(space.concurrency());
    profile.name = std::string("host:") + Space::name() + ":" + std::to_string(space.concurrency());
    return profile;
  }
  DeviceProfile profile = bi_v100();  // occupancy and subscription of the seed design
  profile.name = detail::compat::device_name(space);
  profile.sm_count = sm_count;
  return profile;
}

}  // namespace kpa
