#include <kpa/error.hpp>
#include <kpa/launch_plan.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <ostream>
#include <sstream>
#include <vector>

namespace kpa {
namespace {

// Below this many tokens a partition's fixed costs (loading the query, the reduce kernel's
// extra pass) outweigh the parallelism it adds.
constexpr int kMinAutoPartitionTokens = 256;
constexpr int kGpuThreadsPerTeam = 128;
constexpr int kGpuMaxVectorLength = 32;

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }
int round_up(long long a, long long b) { return static_cast<int>(ceil_div(a, b) * b); }

int parse_positive(std::string_view text, std::string_view spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value <= 0) {
    throw Error("kpa::DeviceProfile::from_name: '" + std::string(text) + "' in '" + std::string(spec) +
                "' is not a positive integer");
  }
  return value;
}

void require_positive(const char* what, int value) {
  if (value <= 0) {
    throw Error(std::string("kpa::plan_launch: ") + what + " must be positive, got " + std::to_string(value));
  }
}

}  // namespace

DeviceProfile DeviceProfile::bi_v100() { return DeviceProfile{"bi-v100", 16, 2, 5, true}; }

DeviceProfile DeviceProfile::host(int concurrency) {
  return DeviceProfile{"host", std::max(1, concurrency), 1, 4, false};
}

DeviceProfile DeviceProfile::from_name(std::string_view spec) {
  std::string lowered(spec);
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lowered == "bi-v100" || lowered == "bi_v100" || lowered == "biv100") return bi_v100();
  std::vector<std::string_view> fields;
  for (std::string_view rest = spec;;) {
    const auto colon = rest.find(':');
    fields.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (fields.size() == 2 && lowered.rfind("host:", 0) == 0) {
    DeviceProfile profile = host(parse_positive(fields[1], spec));
    profile.name = std::string(spec);
    return profile;
  }
  if (fields.size() == 4 && !fields[0].empty()) {
    return DeviceProfile{std::string(fields[0]), parse_positive(fields[1], spec), parse_positive(fields[2], spec),
                         parse_positive(fields[3], spec), true};
  }
  throw Error("kpa::DeviceProfile::from_name: unknown device profile '" + std::string(spec) +
              "' (expected 'bi-v100', 'host:THREADS' or 'NAME:SM_COUNT:OCCUPANCY:SUBSCRIPTION')");
}

LaunchPlan plan_launch(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options) {
  if (shape.num_seqs < 0) require_positive("num_seqs", shape.num_seqs);
  require_positive("num_heads", shape.num_heads);
  require_positive("num_kv_heads", shape.num_kv_heads);
  require_positive("head_size", shape.head_size);
  require_positive("block_size", shape.block_size);
  require_positive("device profile max_blocks", profile.max_blocks());
  if (shape.max_seq_len < 0) {
    throw Error("kpa::plan_launch: max_seq_len must not be negative, got " + std::to_string(shape.max_seq_len));
  }
  if (shape.num_heads % shape.num_kv_heads != 0) {
    throw Error("kpa::plan_launch: num_heads (" + std::to_string(shape.num_heads) +
                ") is not a multiple of num_kv_heads (" + std::to_string(shape.num_kv_heads) + ")");
  }

  LaunchPlan plan;
  plan.profile = profile.name;
  const int max_blocks = profile.max_blocks();
  const long long sequence_tiles = static_cast<long long>(shape.num_seqs) * shape.num_kv_heads;
  const int sequence_tokens = round_up(std::max(shape.max_seq_len, 1), shape.block_size);

  if (options.partition_size != 0) {
    if (options.partition_size < 0 || options.partition_size % shape.block_size != 0) {
      throw Error("kpa::plan_launch: partition_size " + std::to_string(options.partition_size) +
                  " is not a positive multiple of block_size " + std::to_string(shape.block_size));
    }
    plan.partition_size = options.partition_size;
  } else if (sequence_tiles >= max_blocks) {
    plan.partition_size = sequence_tokens;  // enough (sequence, kv head) pairs to fill the device
  } else {
    const int wanted_partitions = ceil_div(max_blocks, std::max<long long>(sequence_tiles, 1));
    const int min_tokens = round_up(kMinAutoPartitionTokens, shape.block_size);
    plan.partition_size = std::min(sequence_tokens,
                                   std::max(min_tokens, round_up(ceil_div(sequence_tokens, wanted_partitions),
                                                                 shape.block_size)));
  }
  plan.num_partitions = std::max(1, ceil_div(shape.max_seq_len, plan.partition_size));
  plan.single_tile = plan.num_partitions == 1;
  const long long tiles = sequence_tiles * plan.num_partitions;
  if (tiles > std::numeric_limits<int>::max()) {
    throw Error("kpa::plan_launch: " + std::to_string(tiles) + " tiles exceed the int range");
  }
  plan.tiles = static_cast<int>(tiles);
  const int league_bound = options.league_size > 0 ? options.league_size : max_blocks;
  plan.league_size = std::min(plan.tiles, league_bound);
  plan.tiles_per_team = plan.league_size > 0 ? ceil_div(plan.tiles, plan.league_size) : 0;

  if (profile.is_gpu) {
    // Vector lanes walk the slots of one block: with vLLM's key layout each lane then reads 16
    // contiguous bytes and a warp's reads coalesce.
    int lanes = 1;
    while (lanes < shape.block_size && lanes < kGpuMaxVectorLength) lanes *= 2;
    plan.vector_length = options.vector_length > 0 ? options.vector_length : lanes;
    plan.team_size = options.team_size > 0 ? options.team_size
                                            : std::max(1, kGpuThreadsPerTeam / plan.vector_length);
  } else {
    // One thread per team: decode attention streams the cache, and a core reads it fastest alone.
    plan.vector_length = options.vector_length > 0 ? options.vector_length : 1;
    plan.team_size = options.team_size > 0 ? options.team_size : 1;
  }
  if (options.team_size < 0 || options.vector_length < 0 || options.league_size < 0) {
    throw Error("kpa::plan_launch: team_size, vector_length and league_size overrides must not be negative");
  }
  plan.reduce_league_size =
      static_cast<int>(std::min<long long>(1LL * shape.num_seqs * shape.num_heads, league_bound));
  return plan;
}

std::ostream& operator<<(std::ostream& os, const LaunchPlan& plan) {
  return os << "LaunchPlan{profile=" << plan.profile << " partition_size=" << plan.partition_size
            << " num_partitions=" << plan.num_partitions << " tiles=" << plan.tiles
            << " league_size=" << plan.league_size << " tiles_per_team=" << plan.tiles_per_team
            << " team_size=" << plan.team_size << " vector_length=" << plan.vector_length
            << " reduce_league_size=" << plan.reduce_league_size
            << " single_tile=" << (plan.single_tile ? "yes" : "no") << "}";
}

std::string to_string(const LaunchPlan& plan) {
  std::ostringstream os;
  os << plan;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const DeviceProfile& profile) {
  return os << "DeviceProfile{name=" << profile.name << " sm_count=" << profile.sm_count
            << " sm_occupancy=" << profile.sm_occupancy << " subscription_factor=" << profile.subscription_factor
            << " max_blocks=" << profile.max_blocks() << (profile.is_gpu ? " gpu" : " host") << "}";
}

}  // namespace kpa
