// The launch planner: GridEvenShare bound, even shares, the single-partition decision, kernel
// path and team shape, rows per pass, wave fill, scratch level, profiles.

#include "test_spaces.hpp"

#include <kpa/kpa.hpp>

#include <cstdlib>
#include <limits>
#include <set>
#include <tuple>
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
          EXPECT_GE(plan.num_partitions * plan.partition_size, max_seq_len);
          EXPECT_LT((plan.num_partitions - 1) * plan.partition_size, std::max(max_seq_len, 1));
          EXPECT_EQ(plan.partition_size % 16, 0);
          if (partition > 0) {  // recomputed from the shape alone
            const int partitions = std::max(1, (max_seq_len + partition - 1) / partition);
            EXPECT_EQ(plan.tiles, num_seqs * kv_heads * partitions);
            EXPECT_EQ(plan.league_size, std::min(num_seqs * kv_heads * partitions, 160));
          }
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

TEST(LaunchPlan, SinglePartitionExactlyWhenEverySequenceFitsOnePartition) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  for (int max_seq_len : {1, 511, 512, 513, 1024, 1025}) {
    kpa::PlanOptions options;
    options.partition_size = 512;
    const auto plan = kpa::plan_launch(profile, shape(4, 32, 8, max_seq_len), options);
    EXPECT_EQ(plan.single_partition, max_seq_len <= 512) << max_seq_len;
    EXPECT_EQ(plan.single_partition, plan.num_partitions == 1);
  }
  // Automatic partitioning: enough (sequence, kv head) pairs to fill 160 teams means one
  // partition per sequence, however long.
  EXPECT_TRUE(kpa::plan_launch(profile, shape(32, 32, 8, 4096)).single_partition);
  EXPECT_TRUE(kpa::plan_launch(profile, shape(20, 64, 8, 131072)).single_partition);
  // Too few pairs: split sequences so the league fills the device.
  const auto long_context = kpa::plan_launch(profile, shape(1, 24, 4, 100000));
  EXPECT_FALSE(long_context.single_partition);
  EXPECT_EQ(long_context.league_size, 160);
  EXPECT_GE(long_context.tiles, 160);
  // Short sequences stay in one partition even with few of them.
  EXPECT_TRUE(kpa::plan_launch(profile, shape(2, 8, 2, 200)).single_partition);
}

TEST(LaunchPlan, HostProfileUsesOneThreadPerTeam) {
  const auto plan = kpa::plan_launch(kpa::DeviceProfile::host(2), shape(32, 32, 8, 4096));
  EXPECT_EQ(plan.kernel_path, kpa::KernelPath::Host);
  EXPECT_EQ(plan.team_size, 1);
  EXPECT_EQ(plan.vector_length, 1);
  EXPECT_EQ(plan.league_size, 8);
  EXPECT_EQ(plan.chunk_tokens, 256);
  EXPECT_TRUE(plan.single_partition);
}

// On hosts, fp8 caches read by passes of one or two rows take 128-token chunks; more rows, wider
// caches and the device path keep 256 (a chunk is never shorter than one block).
TEST(LaunchPlan, HostChunksOfFp8CachesWithFewRowsAreShorter) {
  const auto host = kpa::DeviceProfile::host(2);
  const auto gpu = kpa::DeviceProfile::bi_v100();
  for (auto [heads, kv_heads, query_len, bytes, expected] :
       {std::tuple{32, 32, 1, 1, 128}, {32, 16, 1, 1, 128}, {32, 32, 2, 1, 128}, {32, 8, 1, 1, 256},
        {32, 32, 3, 1, 256}, {32, 32, 1, 2, 256}, {32, 16, 1, 4, 256}}) {
    kpa::ProblemShape s = shape(4, heads, kv_heads, 4096);
    s.max_query_len = query_len;
    s.num_tokens = 4 * query_len;
    s.cache_element_size = bytes;
    EXPECT_EQ(kpa::plan_launch(host, s).chunk_tokens, expected) << heads << "/" << kv_heads << " x " << query_len
                                                               << ", " << bytes << " byte(s)";
  }
  kpa::ProblemShape big_blocks = shape(4, 32, 32, 4096, 256);
  big_blocks.cache_element_size = 1;
  EXPECT_EQ(kpa::plan_launch(host, big_blocks).chunk_tokens, 256);
}

// GPU profiles run the device path: a warp per team member, steps of at most 32
// tokens whose keys and values take at most 8 KiB, a power of two dividing the block size, and as
// many warps (up to 4) as fit fast scratch with two stages each.
TEST(LaunchPlan, GpuProfilesStreamInStepsThatFitFastScratch) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  for (int bytes : {1, 2, 4}) {
    for (int block_size : {8, 16, 32, 128}) {
      for (int head_size : {64, 128, 256}) {
        kpa::ProblemShape s = shape(32, 32, 8, 4096, block_size, head_size);
        s.cache_element_size = bytes;
        const auto plan = kpa::plan_launch(profile, s);
        const std::string what = std::to_string(bytes) + " B, block " + std::to_string(block_size) + ", d" +
                                 std::to_string(head_size);
        ASSERT_EQ(plan.kernel_path, kpa::KernelPath::Device) << what;
        EXPECT_EQ(plan.vector_length, 32) << what;
        EXPECT_GE(plan.team_size, 1) << what;
        EXPECT_LE(plan.team_size, 4) << what;
        EXPECT_LE(plan.chunk_tokens, 32) << what;
        EXPECT_EQ(block_size % plan.chunk_tokens, 0) << what;
        EXPECT_EQ(plan.chunk_tokens & (plan.chunk_tokens - 1), 0) << what;  // a power of two
        EXPECT_LE(plan.chunk_tokens * head_size * bytes * 2, 8 * 1024) << what;
        EXPECT_EQ(plan.scratch_level, 0) << what;
        EXPECT_LE(plan.scratch_bytes, profile.limits.max_scratch_level0_bytes) << what;
        EXPECT_EQ(plan.scratch_bytes, plan.scratch_layout.bytes()) << what;
        // A longer step, or one more warp, would not fit.
        const auto& layout = plan.scratch_layout;
        EXPECT_EQ(layout.floats, layout.ring + plan.team_size * 2 * layout.stage_floats) << what;
      }
    }
  }
  // llama (32/8 heads, d128, f16, blocks of 16): steps of one block, two warps.
  const auto llama = kpa::plan_launch(profile, shape(32, 32, 8, 4096, 16, 128));
  EXPECT_EQ(llama.chunk_tokens, 16);
  EXPECT_EQ(llama.team_size, 2);
  EXPECT_EQ(llama.rows_per_pass, 4);
  // Two stages of 16 tokens x 128 dims x 2 bytes, keys and values, per warp.
  EXPECT_EQ(llama.scratch_layout.stage_floats, 16u * 128 * 2 * 2 / 4);
  // An fp8 cache: steps of one block (half the bytes), three warps.
  kpa::ProblemShape fp8 = shape(32, 32, 8, 4096, 16, 128);
  fp8.cache_element_size = 1;
  EXPECT_EQ(kpa::plan_launch(profile, fp8).chunk_tokens, 16);
  EXPECT_EQ(kpa::plan_launch(profile, fp8).team_size, 3);
}

// Where no step fits fast scratch with the rows per pass the tile asks for, the device path takes
// fewer rows per pass (more passes over K/V); a back end without room for a step of one row, or a
// device back end asked for less than a warp of lanes, cannot run it and says so.
TEST(LaunchPlan, TheDevicePathTakesFewerRowsWhereNoStepFits) {
  auto profile = kpa::DeviceProfile::bi_v100();
  const kpa::ProblemShape group_of_8 = shape(4, 32, 4, 1000, 16, 256);  // 8 rows of 256 dims a tile
  EXPECT_EQ(kpa::plan_launch(profile, group_of_8).rows_per_pass, 8);
  // A step of one or a few tokens takes two stages of 256 x 2 bytes of keys and 256 x 16 bytes of
  // value pieces (9 KiB), besides q and o (1 KiB per row each): 24 KiB hold 4 rows, 16 KiB 2, 12 KiB 1.
  for (auto [scratch, rows] : {std::pair{24u * 1024, 4}, {16u * 1024, 2}, {12u * 1024, 1}}) {
    profile.limits.max_scratch_level0_bytes = scratch;
    const auto plan = kpa::plan_launch(profile, group_of_8);
    EXPECT_EQ(plan.kernel_path, kpa::KernelPath::Device) << scratch;
    EXPECT_EQ(plan.rows_per_pass, rows) << scratch;
    EXPECT_LE(plan.scratch_bytes, scratch) << scratch;
  }
  profile.limits.max_scratch_level0_bytes = 4 * 1024;
  try {
    kpa::plan_launch(profile, group_of_8);
    ADD_FAILURE() << "a device path without room for one row's step was planned";
  } catch (const kpa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast team scratch"), std::string::npos) << e.what();
  }
  profile = kpa::DeviceProfile::bi_v100();
  kpa::PlanOptions half_warps;
  half_warps.vector_length = 16;
  EXPECT_THROW(kpa::plan_launch(profile, shape(4, 32, 4, 1000), half_warps), kpa::Error);
  profile.limits.host_path = true;  // a host back end: lanes loop, any vector length streams
  EXPECT_EQ(kpa::plan_launch(profile, shape(4, 32, 4, 1000), half_warps).kernel_path, kpa::KernelPath::Device);
}

// Heads per pass: the fewest passes over K/V (each pass reads them once), then the least padding,
// among the values each path is compiled for.
TEST(LaunchPlan, RowsPerPassReadsKvTheFewestTimes) {
  const auto host = kpa::DeviceProfile::host(2);
  const auto gpu = kpa::DeviceProfile::bi_v100();
  for (auto [group, host_heads, device_heads] : {std::tuple{1, 1, 1}, {2, 2, 2}, {3, 4, 4}, {4, 4, 4}, {5, 6, 8},
                                                 {6, 6, 8}, {7, 8, 8}, {8, 8, 8}, {12, 16, 8}, {16, 16, 8}, {24, 16, 8}}) {
    EXPECT_EQ(kpa::plan_launch(host, shape(1, group * 2, 2, 100)).rows_per_pass, host_heads) << group;
    EXPECT_EQ(kpa::plan_launch(gpu, shape(1, group * 2, 2, 100)).rows_per_pass, device_heads) << group;
  }
}

// The AMX levels take passes of up to 32 rows (their tile loops load each cache tile once for two
// tiles of rows); the vector sets up to 16. The host path's rows of logits are an odd number of
// cache lines apart.
TEST(LaunchPlan, TileLevelsTakePassesOf32Rows) {
  for (kpa::HostIsa isa : {kpa::HostIsa::Avx512Vbmi, kpa::HostIsa::Amx, kpa::HostIsa::AmxModel}) {
    auto host = kpa::DeviceProfile::host(2);
    host.host_isa = isa;
    host.limits.best_host_isa = kpa::HostIsa::Amx;
    const bool tiles = isa != kpa::HostIsa::Avx512Vbmi;
    for (auto [group, tokens, rows] : {std::tuple{4, 1, 4}, {4, 4, 16}, {4, 8, tiles ? 32 : 16}, {4, 5, tiles ? 32 : 16},
                                       {8, 16, tiles ? 32 : 16}, {24, 1, tiles ? 32 : 16}}) {
      kpa::ProblemShape s = shape(3, group * 2, 2, 3000, 16);
      s.num_tokens = 3 * tokens;
      s.max_query_len = tokens;
      const auto plan = kpa::plan_launch(host, s);
      EXPECT_EQ(plan.rows_per_pass, rows) << kpa::to_string(isa) << ": " << group << " x " << tokens;
      const std::size_t stride = plan.scratch_layout.probs_stride;
      EXPECT_GE(stride, static_cast<std::size_t>(plan.chunk_tokens));
      EXPECT_EQ(stride % 16, 0u);
      EXPECT_EQ(stride / 16 % 2, 1u);
      EXPECT_EQ(plan.scratch_layout.running, plan.scratch_layout.probs + rows * stride);
    }
  }
}

// Several query tokens: a tile's rows are tokens x the group's heads, all in one pass where they fit.
TEST(LaunchPlan, RowsPerPassCountQueryTokens) {
  const auto host = kpa::DeviceProfile::host(2);
  const auto gpu = kpa::DeviceProfile::bi_v100();
  for (auto [group, tokens, host_rows, device_rows] :
       {std::tuple{4, 1, 4, 4}, {4, 2, 8, 8}, {4, 4, 16, 8}, {1, 3, 4, 4}, {2, 3, 6, 8}, {8, 2, 16, 8}}) {
    kpa::ProblemShape s = shape(3, group * 2, 2, 100);
    s.num_tokens = 3 * tokens;
    s.max_query_len = tokens;
    EXPECT_EQ(kpa::plan_launch(host, s).rows_per_pass, host_rows) << group << " x " << tokens;
    EXPECT_EQ(kpa::plan_launch(gpu, s).rows_per_pass, device_rows) << group << " x " << tokens;
  }
}

// A sliding window plans partitions over the window (plus the other query tokens and the block
// where the window starts), not over the sequence.
TEST(LaunchPlan, SlidingWindowPlansTheWindow) {
  const auto host = kpa::DeviceProfile::host(2);
  kpa::ProblemShape s = shape(1, 32, 8, 100000);
  kpa::PlanOptions options;
  options.partition_size = 512;
  EXPECT_EQ(kpa::plan_launch(host, s, options).num_partitions, 196);
  s.sliding_window = 4096;
  EXPECT_EQ(s.attended_span(), 4096 + 15);
  EXPECT_EQ(kpa::plan_launch(host, s, options).num_partitions, 9);
  s.max_query_len = 4;
  EXPECT_EQ(s.attended_span(), 4096 + 3 + 15);
  s.sliding_window = 200000;
  EXPECT_EQ(kpa::plan_launch(host, s, options).num_partitions, 196);
}

// On a host, automatic partitions hold at most 4096 tokens (rounded up to whole blocks) even
// where the sequences alone fill the league, so a team reads the kv heads of one stretch of
// blocks in turn; shorter sequences keep one partition. GPUs size partitions by waves instead.
TEST(LaunchPlan, HostPartitionsStayShort) {
  const auto host = kpa::DeviceProfile::host(2);
  const auto long_one = kpa::plan_launch(host, shape(1, 32, 8, 100000));
  EXPECT_EQ(long_one.partition_size, 4096);
  EXPECT_EQ(long_one.num_partitions, 25);
  EXPECT_EQ(long_one.tiles, 25 * 8);
  EXPECT_EQ(kpa::plan_launch(host, shape(64, 32, 8, 100000)).partition_size, 4096);  // many sequences too
  const auto odd_blocks = kpa::plan_launch(host, shape(1, 32, 8, 100000, 48));
  EXPECT_EQ(odd_blocks.partition_size, 4128);  // 86 blocks of 48
  EXPECT_EQ(odd_blocks.num_partitions, 25);
  for (int len : {1536, 4096}) {
    const auto plan = kpa::plan_launch(host, shape(64, 32, 8, len));
    EXPECT_TRUE(plan.single_partition) << len;
    EXPECT_EQ(plan.partition_size, len);
  }
  EXPECT_GT(kpa::plan_launch(kpa::DeviceProfile::bi_v100(), shape(1, 32, 8, 100000)).partition_size, 4096);
  kpa::PlanOptions options;  // an explicit partition size is kept
  options.partition_size = 16384;
  EXPECT_EQ(kpa::plan_launch(host, shape(1, 32, 8, 100000), options).partition_size, 16384);
}

/// The share of a league's wave slots the tiles fill.
double wave_efficiency(const kpa::LaunchPlan& plan, int league) {
  const int waves = (plan.tiles + league - 1) / league;
  return static_cast<double>(plan.tiles) / (static_cast<double>(waves) * league);
}

// On a GPU, automatic partitions fill whole waves of the league: never a worse fill than
// splitting sequences just enough to reach the league, and at least 90% where tiles are plenty.
TEST(LaunchPlan, GpuPartitionsFillWholeWaves) {
  const auto profile = kpa::DeviceProfile::from_name("gpu:132:10:1");  // 1320 resident teams
  ASSERT_EQ(profile.max_blocks(), 1320);
  for (int num_seqs : {1, 2, 3, 5, 6, 7, 11}) {
    for (int kv_heads : {1, 2, 8}) {
      for (int max_seq_len : {4096, 8192, 32768, 131072}) {
        const auto s = shape(num_seqs, 4 * kv_heads, kv_heads, max_seq_len);
        const auto plan = kpa::plan_launch(profile, s);
        SCOPED_TRACE(kpa::to_string(plan));
        // The fill a plan without the wave rule would get: just enough partitions for 1320 tiles.
        const int sequence_tiles = num_seqs * kv_heads;
        const int max_parts = (max_seq_len + 255) / 256;
        const int parts = std::min(max_parts, (1320 + sequence_tiles - 1) / sequence_tiles);
        const int tokens = std::max(256, ((max_seq_len + parts - 1) / parts + 15) / 16 * 16);
        kpa::LaunchPlan naive;
        naive.tiles = sequence_tiles * ((max_seq_len + tokens - 1) / tokens);
        EXPECT_GE(wave_efficiency(plan, 1320) + 1e-9, wave_efficiency(naive, 1320));
        EXPECT_GE(plan.partition_size, 256);
        if (sequence_tiles * max_parts >= 2 * 1320) {
          EXPECT_GE(wave_efficiency(plan, 1320), 0.9);
        }
      }
    }
  }
}

// The host path's scratch goes to level 1 where level 0 cannot hold it.
TEST(LaunchPlan, HostScratchBeyondLevelZeroGoesToLevelOne) {
  auto profile = kpa::DeviceProfile::host(2);
  const auto fits = kpa::plan_launch(profile, shape(4, 32, 4, 1000, 16, 256));
  ASSERT_EQ(fits.kernel_path, kpa::KernelPath::Host);
  EXPECT_EQ(fits.scratch_level, 0);
  // q and o for 8 heads of 256 floats, 8 x 256 probabilities, block states and ids.
  EXPECT_GT(fits.scratch_bytes, 8u * 256 * 4 * 3);
  profile.limits.max_scratch_level0_bytes = fits.scratch_bytes - 1;
  EXPECT_EQ(kpa::plan_launch(profile, shape(4, 32, 4, 1000, 16, 256)).scratch_level, 1);
}

TEST(LaunchPlan, OverridesAndBadShapes) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  kpa::PlanOptions options;
  options.team_size = 3;
  options.vector_length = 4;  // less than a warp: the device path on a host back end, whose lanes loop
  options.league_size = 7;
  auto host_lanes = profile;
  host_lanes.limits.host_path = true;
  const auto plan = kpa::plan_launch(host_lanes, shape(16, 16, 16, 1000), options);
  EXPECT_EQ(plan.team_size, 3);
  EXPECT_EQ(plan.vector_length, 4);
  EXPECT_EQ(plan.league_size, 7);
  EXPECT_EQ(plan.tiles_per_team, (plan.tiles + 6) / 7);

  options = {};
  options.team_size = 2000;  // beyond the profile's 1024 threads per team
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 100), options), kpa::Error);
  options = {};
  options.vector_length = 3;  // not a power of two
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 100), options), kpa::Error);
  options = {};
  options.kernel_path = kpa::PlanOptions::Path::Host;  // a GPU back end has no host path
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 100), options), kpa::UnsupportedError);
  auto on_a_host = profile;
  on_a_host.limits.host_path = true;
  EXPECT_EQ(kpa::plan_launch(on_a_host, shape(1, 8, 8, 100), options).kernel_path, kpa::KernelPath::Host);
  on_a_host.limits.device_path = false;  // a host back end compiled without the device path
  EXPECT_EQ(kpa::plan_launch(on_a_host, shape(1, 8, 8, 100)).kernel_path, kpa::KernelPath::Host);
  options.kernel_path = kpa::PlanOptions::Path::Device;
  EXPECT_THROW(kpa::plan_launch(on_a_host, shape(1, 8, 8, 100), options), kpa::UnsupportedError);

  options = {};
  options.partition_size = 24;  // not a multiple of 16
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 100), options), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 3, 100)), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, -1)), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, 10, 0)), kpa::Error);
  for (int bytes : {0, 3, 8}) {
    kpa::ProblemShape odd = shape(1, 8, 8, 100);
    odd.cache_element_size = bytes;
    EXPECT_THROW(kpa::plan_launch(profile, odd), kpa::Error) << bytes;
  }
  // Products and token counts that would overflow int are refused.
  EXPECT_THROW(kpa::plan_launch(profile, shape(1, 8, 8, std::numeric_limits<int>::max())), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(1 << 20, 1 << 12, 1 << 12, 16)), kpa::Error);
  options = {};
  options.partition_size = 16;
  EXPECT_THROW(kpa::plan_launch(profile, shape(1 << 16, 1 << 12, 1 << 12, 1 << 10), options), kpa::Error);  // tiles
}

TEST(LaunchPlan, PrintsTheDeviceProfile) {
  std::ostringstream os;
  os << kpa::DeviceProfile::bi_v100();
  EXPECT_EQ(os.str(), "DeviceProfile{name=bi-v100 sm_count=16 sm_occupancy=2 subscription_factor=5 max_blocks=160 gpu}");
}

TEST(LaunchPlan, PrintsEveryField) {
  const auto text = kpa::to_string(kpa::plan_launch(kpa::DeviceProfile::bi_v100(), shape(1, 24, 4, 100000)));
  for (const char* field : {"profile=bi-v100", "partition_size=", "num_partitions=", "league_size=160",
                            "tiles_per_team=", "team_size=", "vector_length=", "single_partition=no"}) {
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
  const auto limits = kpa::BackEndLimits::of(space);
  EXPECT_EQ(detected.limits.max_team_size, limits.max_team_size);
  EXPECT_EQ(detected.limits.max_vector_length, Kokkos::TeamPolicy<Space>::vector_length_max());
  if constexpr (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
    EXPECT_NE(detected.name.find(Space::name()), std::string::npos) << detected;
    EXPECT_EQ(detected.sm_count, space.concurrency());
    EXPECT_EQ(limits.max_team_size, space.concurrency());
    EXPECT_FALSE(detected.is_gpu);
    EXPECT_FALSE(detected.occupancy_from_kernel);
    EXPECT_EQ(kpa::plan_launch(space, shape(1, 24, 4, 100000)).kernel_path, kpa::KernelPath::Host);
  } else {
    EXPECT_GT(detected.sm_count, 0) << detected;
    EXPECT_TRUE(detected.is_gpu);
    EXPECT_TRUE(detected.occupancy_from_kernel);
    EXPECT_EQ(detected.subscription_factor, 1);
    EXPECT_EQ(kpa::plan_launch(space, shape(1, 24, 4, 100000)).kernel_path, kpa::KernelPath::Device);
  }

  ::setenv("KPA_DEVICE_PROFILE", "bi-v100", 1);
  const auto forced = kpa::DeviceProfile::detect(space);
  const auto plan = kpa::plan_launch(space, shape(1, 24, 4, 100000));
  ::unsetenv("KPA_DEVICE_PROFILE");
  EXPECT_EQ(forced.max_blocks(), 160);
  EXPECT_EQ(plan.profile, "bi-v100");
  EXPECT_EQ(plan.league_size, 160);
  EXPECT_EQ(plan.kernel_path, limits.device_path ? kpa::KernelPath::Device : kpa::KernelPath::Host);
  // The limits stay the back end's: on a host back end the team shape fits its threads.
  EXPECT_EQ(forced.limits.max_team_size, limits.max_team_size);
  EXPECT_LE(plan.team_size, limits.max_team_size);

}

template <int... Rows>
std::vector<int> values_of(std::integer_sequence<int, Rows...>) {
  return {Rows...};
}

// Every rows-per-pass value the planner may choose dispatches to its kernel, and no other does.
TEST(LaunchPlan, EveryPlannableRowsPerPassHasAKernel) {
  for (int heads : values_of(kpa::HostRowsPerPass{})) {
    int called = 0;
    kpa::detail::with_rows_per_pass(kpa::HostRowsPerPass{}, heads, [&](auto h) { called = decltype(h)::value; });
    EXPECT_EQ(called, heads);
  }
  for (int heads : values_of(kpa::DeviceRowsPerPass{})) {
    int called = 0;
    kpa::detail::with_rows_per_pass(kpa::DeviceRowsPerPass{}, heads, [&](auto h) { called = decltype(h)::value; });
    EXPECT_EQ(called, heads);
  }
  EXPECT_THROW(kpa::detail::with_rows_per_pass(kpa::DeviceRowsPerPass{}, 6, [](auto) {}), kpa::Error);
}

}  // namespace

// The host path's instruction set: names round-trip, KPA_HOST_ISA may ask for less than the best
// but not more, and the planner refuses an override the back end cannot run.
// check_plan_inputs refuses what plan_launch refuses, and accepts what it plans.
TEST(LaunchPlan, CheckPlanInputsValidatesWithoutPlanning) {
  const auto profile = kpa::DeviceProfile::bi_v100();
  EXPECT_NO_THROW(kpa::check_plan_inputs(profile, shape(4, 32, 8, 4096)));
  EXPECT_THROW(kpa::check_plan_inputs(profile, shape(4, 32, 3, 4096)), kpa::Error);  // 32 % 3
  EXPECT_THROW(kpa::check_plan_inputs(profile, shape(4, 32, 8, -1)), kpa::Error);
  kpa::PlanOptions options;
  options.partition_size = 24;  // not a multiple of the block size 16
  EXPECT_THROW(kpa::check_plan_inputs(profile, shape(4, 32, 8, 4096), options), kpa::Error);
  EXPECT_THROW(kpa::plan_launch(profile, shape(4, 32, 8, 4096), options), kpa::Error);
}

// A profile whose occupancy comes from the kernel asks the query once, after the team shape, and
// sizes the league with its answer; other profiles never ask.
TEST(LaunchPlan, OccupancyQuerySizesTheLeagueOnce) {
  kpa::DeviceProfile gpu = kpa::DeviceProfile::from_name("gpu:10:1:1");
  gpu.occupancy_from_kernel = true;
  int asked = 0;
  const kpa::OccupancyQuery three = [&](const kpa::LaunchPlan& plan) {
    ++asked;
    EXPECT_GT(plan.team_size, 0);
    EXPECT_GT(plan.scratch_bytes, 0u);
    return 3;
  };
  const auto many = shape(64, 32, 8, 512);  // 512 tiles of one partition each
  EXPECT_EQ(kpa::plan_launch(gpu, many, {}, three).league_size, 30);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(kpa::plan_launch(gpu, many).league_size, 10);  // no query: the profile's occupancy
  gpu.occupancy_from_kernel = false;
  EXPECT_EQ(kpa::plan_launch(gpu, many, {}, three).league_size, 10);
  EXPECT_EQ(asked, 1);
}

TEST(LaunchPlan, HostInstructionSetsParseAndAreNeverMoreThanTheBest) {
  using kpa::HostIsa;
  std::ostringstream printed;
  printed << HostIsa::Avx512Vbmi << ' ' << HostIsa::Portable;
  EXPECT_EQ(printed.str(), "avx512vbmi portable");
  for (HostIsa isa :
       {HostIsa::Portable, HostIsa::Avx2, HostIsa::Avx512, HostIsa::Avx512Vbmi, HostIsa::Amx, HostIsa::AmxModel}) {
    EXPECT_EQ(kpa::parse_host_isa(kpa::to_string(isa)), isa);
  }
  EXPECT_THROW(kpa::parse_host_isa("avx512f"), kpa::Error);
  EXPECT_THROW(kpa::parse_host_isa("sse2"), kpa::Error);
  ::setenv("KPA_HOST_ISA", "portable", 1);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx2), HostIsa::Portable);
  ::setenv("KPA_HOST_ISA", "avx2", 1);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx2), HostIsa::Avx2);
  EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Portable), kpa::Error);
  ::setenv("KPA_HOST_ISA", "avx512", 1);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx512), HostIsa::Avx512);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx512Vbmi), HostIsa::Avx512);
  EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Avx2), kpa::Error);
  ::setenv("KPA_HOST_ISA", "avx512vbmi", 1);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx512Vbmi), HostIsa::Avx512Vbmi);
  EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Avx512), kpa::Error);
  ::setenv("KPA_HOST_ISA", "amx", 1);
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Amx), HostIsa::Amx);
  EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Avx512Vbmi), kpa::Error);
  // The tile model runs wherever AVX2 does, under any better set too; never without AVX2, nor
  // where libkpa was built without its software models.
  ::setenv("KPA_HOST_ISA", "amx-model", 1);
  if (KPA_TEST_SOFTWARE_MODELS) {
    EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx2), HostIsa::AmxModel);
    EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Amx), HostIsa::AmxModel);
  } else {
    EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Avx2), kpa::Error);
    EXPECT_FALSE(kpa::detail::host_isa_runs(HostIsa::AmxModel, HostIsa::Amx));
  }
  EXPECT_THROW(kpa::detail::chosen_host_isa(HostIsa::Portable), kpa::Error);
  EXPECT_EQ(kpa::detail::vector_isa(HostIsa::AmxModel), HostIsa::Avx2);
  EXPECT_EQ(kpa::detail::vector_isa(HostIsa::Amx), HostIsa::Avx512Vbmi);
  ::unsetenv("KPA_HOST_ISA");
  EXPECT_EQ(kpa::detail::chosen_host_isa(HostIsa::Avx2), HostIsa::Avx2);

  auto profile = kpa::DeviceProfile::host(2);
  profile.limits.best_host_isa = HostIsa::Portable;
  profile.host_isa = HostIsa::Portable;
  kpa::PlanOptions options;
  options.host_isa = HostIsa::Avx2;
  EXPECT_THROW(kpa::plan_launch(profile, shape(4, 32, 8, 4096), options), kpa::UnsupportedError);
  profile.limits.best_host_isa = HostIsa::Avx2;
  EXPECT_EQ(kpa::plan_launch(profile, shape(4, 32, 8, 4096), options).host_isa, HostIsa::Avx2);
  options.host_isa = HostIsa::Portable;
  EXPECT_EQ(kpa::plan_launch(profile, shape(4, 32, 8, 4096), options).host_isa, HostIsa::Portable);
}
