// The launch planner: GridEvenShare bound, even shares, the single-tile decision, profiles.

#include "test_spaces.hpp"

#include <kpa/kpa.hpp>

#include <cstdlib>
#include <set>
#include <sstream>

namespace {

kpa::ProblemShape shape(int num_seqs, int num_heads, int num_kv_heads, int max_seq_len, int block_size = 16,
                        int head_size = 128) {
  kpa::ProblemShape s;
  s.num_seqs = num_seqs;
  s.num_heads = num_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_size = head_size;
  s.block_size = block_size;
  s.max_seq_len = max_seq_len;
  return s;
}

TEST(LaunchPlan, BiV100ProfileIsTheSeedDesign) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  EXPECT_EQ(profile.sm_count, 16);
  EXPECT_EQ(profile.sm_occupancy, 2);
  EXPECT_EQ(profile.subscription_factor, 5);
  EXPECT_EQ(profile.max_blocks(), 160);
  EXPECT_TRUE(profile.is_gpu);
  EXPECT_EQ(kpa::DeviceProfile::from_name("bi-v100").max_blocks(), 160);
  EXPECT_EQ(kpa::DeviceProfile::from_name("BI-V100").max_blocks(), 160);
}

TEST(LaunchPlan, ProfilesFromNames) {
  const auto host = kpa::DeviceProfile::from_name("host:6");
  EXPECT_FALSE(host.is_gpu);
  EXPECT_EQ(host.sm_count, 6);
  EXPECT_EQ(host.max_blocks(), 6 * 4);
  const auto custom = kpa::DeviceProfile::from_name("a100:108:2:5");
  EXPECT_EQ(custom.name, "a100");
  EXPECT_EQ(custom.max_blocks(), 1080);
  for (const char* bad : {"", "v100", "host:", "host:0", "x:1:2", "x:1:2:-5", "x:1:2:5:6", "host:2x"}) {
    EXPECT_THROW(kpa::DeviceProfile::from_name(bad), kpa::Error) << bad;
  }
}

// Over a sweep of shapes: never more than 160 teams on the BI-V100, every tile owned by exactly
// one team, shares differing by at most one tile.
TEST(LaunchPlan, BiV100LeagueNeverExceeds160AndSharesAreEven) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  for (int num_seqs : {0, 1, 3, 7, 32, 64, 256}) {
    for (int kv_heads : {1, 4, 8}) {
      for (int max_seq_len : {0, 1, 15, 16, 17, 511, 512, 513, 4096, 100000, 131072}) {
        for (int partition : {0, 512, 1024}) {
          kpa::PlanOptions options;
          options.partition_size = partition;
          const auto plan = kpa::plan_launch(profile, shape(num_seqs, 8 * kv_heads, kv_heads, max_seq_len), options);
          SCOPED_TRACE(kpa::to_string(plan));
          EXPECT_LE(plan.league_size, 160);
          EXPECT_LE(plan.reduce_league_size, 160);
          EXPECT_EQ(plan.tiles, num_seqs * kv_heads * plan.num_partitions);
          EXPECT_EQ(plan.league_size, std::min(plan.tiles, 160));
          EXPECT_GE(plan.num_partitions * plan.partition_size, max_seq_len);
          EXPECT_EQ(plan.partition_size % 16, 0);
          if (plan.tiles == 0) continue;
          std::vector<int> owner(plan.tiles, -1);
          int smallest = plan.tiles, largest = 0;
          for (int team = 0; team < plan.league_size; ++team) {
            int first = 0, count = 0;
            kpa::detail::even_share(plan.tiles, plan.league_size, team, first, count);
            smallest = std::min(smallest, count);
            largest = std::max(largest, count);
            for (int t = first; t < first + count; ++t) {
              ASSERT_EQ(owner[t], -1) << "tile " << t << " owned twice";
              owner[t] = team;
            }
          }
          EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
          EXPECT_LE(largest - smallest, 1);
          EXPECT_EQ(largest, plan.tiles_per_team);
        }
      }
    }
  }
}

TEST(LaunchPlan, SingleTileExactlyWhenEverySequenceFitsOnePartition) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  for (int max_seq_len : {1, 511, 512, 513, 1024, 1025}) {
    kpa::PlanOptions options;
    options.partition_size = 512;
    const auto plan = kpa::plan_launch(profile, shape(4, 32, 8, max_seq_len), options);
    EXPECT_EQ(plan.single_tile, max_seq_len <= 512) << max_seq_len;
    EXPECT_EQ(plan.single_tile, plan.num_partitions == 1);
  }
  // Automatic partitioning: enough (sequence, kv head) pairs to fill 160 teams means one
  // partition per sequence, however long.
  EXPECT_TRUE(kpa::plan_launch(profile, shape(32, 32, 8, 4096)).single_tile);
  EXPECT_TRUE(kpa::plan_launch(profile, shape(20, 64, 8, 131072)).single_tile);
  // Too few pairs: split sequences so the league fills the device.
  const auto long_context = kpa::plan_launch(profile, shape(1, 24, 4, 100000));
  EXPECT_FALSE(long_context.single_tile);
  EXPECT_EQ(long_context.league_size, 160);
  EXPECT_GE(long_context.tiles, 160);
  // Short sequences stay single-tile even with few of them.
  EXPECT_TRUE(kpa::plan_launch(profile, shape(2, 8, 2, 200)).single_tile);
}

TEST(LaunchPlan, HostProfileUsesOneThreadPerTeam) {
  const auto plan = kpa::plan_launch(kpa::DeviceProfile::host(2), shape(32, 32, 8, 4096));
  EXPECT_EQ(plan.team_size, 1);
  EXPECT_EQ(plan.vector_length, 1);
  EXPECT_EQ(plan.league_size, 8);
  EXPECT_TRUE(plan.single_tile);
  const auto gpu = kpa::plan_launch(kpa::DeviceProfile::bi_v100(), shape(32, 32, 8, 4096, 16));
  EXPECT_EQ(gpu.vector_length, 16);
  EXPECT_EQ(gpu.team_size * gpu.vector_length, 128);
}

TEST(LaunchPlan, OverridesAndBadShapes) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  kpa::PlanOptions options;
  options.team_size = 3;
  options.vector_length = 4;
  options.league_size = 7;
  const auto plan = kpa::plan_launch(profile, shape(16, 16, 16, 1000), options);
  EXPECT_EQ(plan.team_size, 3);
  EXPECT_EQ(plan.vector_length, 4);
  EXPECT_EQ(plan.league_size, 7);
  EXPECT_EQ(plan.tiles_per_team, (plan.tiles + 6) / 7);

  options = {};
  options.partition_size = 24;  // not a multiple of 16
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 100), options), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 3, 100)), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, -1)), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 10, 0)), kpa::Error);
}

TEST(LaunchPlan, PrintsTheDeviceProfile) {
  std::ostringstream os;
  os << kpa::DeviceProfile::bi_v100();
  EXPECT_EQ(os.str(), "DeviceProfile{name=bi-v100 sm_count=16 sm_occupancy=2 subscription_factor=5 max_blocks=160 gpu}");
}

TEST(LaunchPlan, PrintsEveryField) {
  const auto text = kpa::to_string(kpa::plan_launch(kpa::DeviceProfile::bi_v100(), shape(1, 24, 4, 100000)));
  for (const char* field : {"profile=bi-v100", "partition_size=", "num_partitions=", "league_size=160",
                            "tiles_per_team=", "team_size=", "vector_length=", "single_tile=no"}) {
    EXPECT_NE(text.find(field), std::string::npos) << field << " missing in " << text;
  }
}

template <class Space>
class LaunchPlanOnSpace : public ::testing::Test {};
TYPED_TEST_SUITE(LaunchPlanOnSpace, kpa_test::ExecutionSpaces);

TYPED_TEST(LaunchPlanOnSpace, DetectsTheBackEndAndHonoursTheEnvironment) {
  using Space = TypeParam;
  const Space space;
  ::unsetenv("KPA_DEVICE_PROFILE");
  const auto detected = kpa::DeviceProfile::detect(space);
  EXPECT_NE(detected.name.find(Space::name()), std::string::npos) << detected;
  EXPECT_EQ(detected.sm_count, space.concurrency());

  ::setenv("KPA_DEVICE_PROFILE", "bi-v100", 1);
  const auto forced = kpa::DeviceProfile::detect(space);
  const auto plan = kpa::plan_launch(space, shape(1, 24, 4, 100000));
  ::unsetenv("KPA_DEVICE_PROFILE");
  EXPECT_EQ(forced.max_blocks(), 160);
  EXPECT_EQ(plan.profile, "bi-v100");
  EXPECT_EQ(plan.league_size, 160);
  // Run on a host back end, the team shape is clamped to what it can run.
  EXPECT_LE(plan.team_size, static_cast<int>(space.concurrency()));
}

}  // namespace
