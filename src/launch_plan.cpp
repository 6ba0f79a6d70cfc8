#include <kpa/error.hpp>
#include <kpa/launch_plan.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <sstream>
#include <vector>


namespace kpa {
namespace {

// Below this many tokens a partition's fixed costs (loading the query, the reduce kernel's
// extra pass) outweigh the parallelism it adds.
constexpr int kMinAutoPartitionTokens = 256;
// On hosts, the automatic entry point's partitions hold at most this many tokens, however few
// the sequences: the tiles of one stretch of blocks (its kv heads) then run one after another
// while the stretch's page-table entries are still cached, where one long sequence per kv head
// would walk its whole table alone.
constexpr int kHostMaxPartitionTokens = 4096;
// Tokens per chunk: the host path keeps a chunk's logits in L1 (16 rows x 256 tokens: 16 KiB)
// and reduces its p.V accumulators once per chunk.
constexpr int kHostChunkTokens = 256;
// Tiles of several passes (prefill rows) take twice that: their loops work on packed blocks kept
// in the caches (the AMX set's), and a longer chunk pays the per-chunk rescaling and the tile
// accumulators' loads and stores half as often.
constexpr int kHostSeveralPassesChunkTokens = 512;
// Rows per pass on the host path: up to 16, a tile's rows; 32 on the AMX levels, whose tile loops
// then load each tile of the cache operand once for two tiles of rows. The vector sets gain
// nothing from passes of more than 16 rows: their register tiles hold far fewer rows, and a
// chunk's blocks stay in their caches from one pass to the next.
constexpr int kHostMaxRowsPerPass = 16;
constexpr int kHostTileMaxRowsPerPass = 32;
// fp8 caches read by passes of one or two rows (MHA, groups of 2) take half that: their steps are
// bound by the widening arithmetic and the reads alike, and the shorter chunk overlaps the two
// better. With more rows, or 16-bit caches, the longer chunk is the faster.
constexpr int kHostFewRowsFp8ChunkTokens = 128;
constexpr int kHostFewRows = 2;
// Device path: a warp of lanes per team member, up to four warps a team, each streaming its own
// steps of at most 32 tokens (a lane each) whose keys and values take at most 8 KiB: two stages
// per warp and two warps then fit a GPU team's shared memory beside the queries and outputs.
constexpr int kDeviceVectorLength = 32;
constexpr int kDeviceMaxWarps = 4;
constexpr int kDeviceMaxStepTokens = 32;
constexpr std::size_t kDeviceMaxStepBytes = 8 * 1024;

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
long long round_up(long long a, long long b) { return ceil_div(a, b) * b; }
bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

[[noreturn]] void plan_error(const std::string& what) { throw Error("kpa::plan_launch: " + what); }

int parse_positive(std::string_view text, std::string_view spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value <= 0) {
    throw Error("kpa::DeviceProfile::from_name: '" + std::string(text) + "' in '" + std::string(spec) +
                "' is not a positive integer");
  }
  return value;
}

void require_positive(const char* what, long long value) {
  if (value <= 0) plan_error(std::string(what) + " must be positive, got " + std::to_string(value));
}

template <int... Rows>
constexpr std::array<int, sizeof...(Rows)> values_of(std::integer_sequence<int, Rows...>) {
  return {Rows...};
}

/// The rows per pass among `candidates` up to `most` that reads a tile's K/V the fewest times for
/// its `rows` (query heads x query tokens), and pads the fewest rows among those.
template <std::size_t N>
int rows_per_pass_for(int rows, const std::array<int, N>& candidates, int most = std::numeric_limits<int>::max()) {
  int best = candidates[0];
  long long best_passes = ceil_div(rows, best), best_padding = best_passes * best - rows;
  for (int h : candidates) {
    if (h > most) continue;
    const long long passes = ceil_div(rows, h), padding = passes * h - rows;
    if (passes < best_passes || (passes == best_passes && padding < best_padding)) {
      best = h;
      best_passes = passes;
      best_padding = padding;
    }
  }
  return best;
}

/// Tokens per partition for the automatic entry point: one partition when the (sequence,
/// kv head) pairs already fill the league, else split sequences into partitions of at least
/// kMinAutoPartitionTokens until they do. On hosts no partition exceeds kHostMaxPartitionTokens;
/// on GPUs the partition count is chosen so the tiles fill whole waves of the league (no tail
/// wave leaving most teams idle).
int auto_partition_size(const DeviceProfile& profile, const ProblemShape& shape, long long league_bound) {
  const long long sequence_tiles = static_cast<long long>(shape.num_seqs) * shape.num_kv_heads;
  const long long sequence_tokens = round_up(std::max(shape.attended_span(), 1LL), shape.block_size);
  const long long min_tokens = round_up(kMinAutoPartitionTokens, shape.block_size);
  const long long host_max_tokens = round_up(kHostMaxPartitionTokens, shape.block_size);
  if (sequence_tiles == 0 || sequence_tiles >= league_bound || sequence_tokens <= min_tokens) {
    return static_cast<int>(profile.is_gpu ? sequence_tokens : std::min(sequence_tokens, host_max_tokens));
  }
  const long long max_parts = ceil_div(sequence_tokens, min_tokens);
  const long long wanted = std::min(max_parts, ceil_div(league_bound, sequence_tiles));
  auto partition_for = [&](long long parts) {
    return std::max(min_tokens, round_up(ceil_div(sequence_tokens, parts), shape.block_size));
  };
  if (!profile.is_gpu) {  // dynamic scheduling evens out tails
    return static_cast<int>(std::min(partition_for(wanted), host_max_tokens));
  }
  long long best_tokens = partition_for(wanted);
  double best_efficiency = -1.0;
  // Fewer partitions than `wanted` leave some teams idle in one wave; more may fill two waves.
  for (long long parts = std::max(1LL, wanted / 2); parts <= std::min(max_parts, 2 * wanted); ++parts) {
    const long long tokens = partition_for(parts);
    const long long tiles = sequence_tiles * ceil_div(shape.attended_span(), tokens);
    const double efficiency = static_cast<double>(tiles) / (ceil_div(tiles, league_bound) * league_bound);
    if (efficiency > best_efficiency + 1e-9) {
      best_efficiency = efficiency;
      best_tokens = tokens;
    }
  }
  return static_cast<int>(best_tokens);
}

}  // namespace

DeviceProfile DeviceProfile::bi_v100() {
  DeviceProfile profile;
  profile.name = "bi-v100";
  profile.sm_count = 16;
  profile.sm_occupancy = 2;
  profile.subscription_factor = 5;
  profile.is_gpu = true;
  return profile;
}

DeviceProfile DeviceProfile::host(int concurrency) {
  DeviceProfile profile;
  profile.name = "host";
  profile.sm_count = std::max(1, concurrency);
  profile.sm_occupancy = 1;
  profile.subscription_factor = 4;
  profile.limits.max_team_size = profile.sm_count;
  profile.limits.max_vector_length = 1024;
  profile.limits.max_team_threads = profile.sm_count * 1024;
  profile.limits.max_scratch_level0_bytes = 32 * 1024;
  profile.limits.host_path = true;
  return profile;
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
    DeviceProfile profile;
    profile.name = std::string(fields[0]);
    profile.sm_count = parse_positive(fields[1], spec);
    profile.sm_occupancy = parse_positive(fields[2], spec);
    profile.subscription_factor = parse_positive(fields[3], spec);
    profile.is_gpu = true;
    return profile;
  }
  throw Error("kpa::DeviceProfile::from_name: unknown device profile '" + std::string(spec) +
              "' (expected 'bi-v100', 'host:THREADS' or 'NAME:SM_COUNT:OCCUPANCY:SUBSCRIPTION')");
}

void check_plan_inputs(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options) {
  if (shape.num_seqs < 0) plan_error("num_seqs must not be negative, got " + std::to_string(shape.num_seqs));
  require_positive("num_heads", shape.num_heads);
  require_positive("num_kv_heads", shape.num_kv_heads);
  require_positive("head_size", shape.head_size);
  require_positive("block_size", shape.block_size);
  if (shape.cache_element_size != 1 && shape.cache_element_size != 2 && shape.cache_element_size != 4) {
    plan_error("cache_element_size must be 1 (fp8), 2 or 4 bytes, got " + std::to_string(shape.cache_element_size));
  }
  require_positive("device profile max_blocks", static_cast<long long>(profile.sm_count) * profile.sm_occupancy *
                                                    profile.subscription_factor);
  if (profile.max_blocks() > std::numeric_limits<int>::max() / 2) plan_error("device profile max_blocks is too large");
  if (shape.max_seq_len < 0) plan_error("max_seq_len must not be negative, got " + std::to_string(shape.max_seq_len));
  if (shape.max_seq_len > std::numeric_limits<int>::max() - shape.block_size) {
    plan_error("max_seq_len " + std::to_string(shape.max_seq_len) + " exceeds the supported maximum INT_MAX - block_size");
  }
  if (shape.num_tokens < 0 || shape.max_query_len < 0 || shape.sliding_window < 0) {
    plan_error("num_tokens, max_query_len and sliding_window must not be negative");
  }
  if (static_cast<long long>(std::max(shape.num_seqs, shape.num_tokens)) * shape.num_heads >
      std::numeric_limits<int>::max()) {
    plan_error("num_tokens x num_heads exceeds the int range");
  }
  if (shape.num_heads % shape.num_kv_heads != 0) {
    plan_error("num_heads (" + std::to_string(shape.num_heads) + ") is not a multiple of num_kv_heads (" +
               std::to_string(shape.num_kv_heads) + ")");
  }
  if (static_cast<long long>(shape.num_heads / shape.num_kv_heads) * std::max(shape.max_query_len, 1) >
      std::numeric_limits<int>::max()) {
    plan_error("max_query_len x query heads per kv head exceeds the int range");
  }
  if (options.team_size < 0 || options.vector_length < 0 || options.league_size < 0 || options.partition_size < 0) {
    plan_error("partition_size, team_size, vector_length and league_size overrides must not be negative");
  }
  if (options.partition_size != 0 && options.partition_size % shape.block_size != 0) {
    plan_error("partition_size " + std::to_string(options.partition_size) + " is not a positive multiple of block_size " +
               std::to_string(shape.block_size));
  }
}

namespace {

/// The kernel path and, for the host path, its instruction set.
void plan_kernel_path(const DeviceProfile& profile, const PlanOptions& options, LaunchPlan& plan) {
  const BackEndLimits& limits = profile.limits;
  bool device_path = false;
  switch (options.kernel_path) {
    case PlanOptions::Path::Device: device_path = true; break;
    case PlanOptions::Path::Host: device_path = false; break;
    case PlanOptions::Path::Auto: device_path = limits.device_path && (profile.is_gpu || !limits.host_path); break;
  }
  if (device_path ? !limits.device_path : !limits.host_path) {
    throw UnsupportedError(std::string("kpa::plan_launch: the ") + (device_path ? "device" : "host") +
                           " kernel path is not compiled for this back end");
  }
  plan.kernel_path = device_path ? KernelPath::Device : KernelPath::Host;
  plan.host_isa = options.host_isa.value_or(profile.host_isa);
  if (!device_path && !detail::host_isa_runs(plan.host_isa, limits.best_host_isa)) {
    throw UnsupportedError("kpa::plan_launch: host instruction set " + std::string(to_string(plan.host_isa)) +
                           " is not available here (best: " + std::string(to_string(limits.best_host_isa)) + ")");
  }
}

/// Team and vector sizes, rows per pass and chunk length of the plan's kernel path.
void plan_team_shape(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options,
                     LaunchPlan& plan) {
  const BackEndLimits& limits = profile.limits;
  // A tile's rows: its sequence's query tokens x the group's query heads.
  const int tile_rows = shape.num_heads / shape.num_kv_heads * std::max(shape.max_query_len, 1);
  if (plan.kernel_path == KernelPath::Device) {
    plan.vector_length = options.vector_length > 0 ? options.vector_length
                                                   : std::min(kDeviceVectorLength, limits.max_vector_length);
    // The warps per team, steps and scratch are plan_device_steps'.
    plan.team_size = options.team_size > 0 ? options.team_size : 1;
    plan.rows_per_pass = rows_per_pass_for(tile_rows, values_of(DeviceRowsPerPass{}));
  } else {
    // One thread per team by default: decode attention streams the cache, and a core reads it fastest alone.
    plan.vector_length = options.vector_length > 0 ? options.vector_length : 1;
    plan.team_size = options.team_size > 0 ? options.team_size : 1;
    const bool tile_level = plan.host_isa == HostIsa::Amx || plan.host_isa == HostIsa::AmxModel;
    plan.rows_per_pass = rows_per_pass_for(tile_rows, values_of(HostRowsPerPass{}),
                                           tile_level ? kHostTileMaxRowsPerPass : kHostMaxRowsPerPass);
    const int chunk = tile_rows > plan.rows_per_pass ? kHostSeveralPassesChunkTokens
                      : shape.cache_element_size == 1 && plan.rows_per_pass <= kHostFewRows ? kHostFewRowsFp8ChunkTokens
                                                                                           : kHostChunkTokens;
    plan.chunk_tokens = static_cast<int>(
        std::max<long long>(shape.block_size, (chunk / shape.block_size) * static_cast<long long>(shape.block_size)));
  }
  if (!is_power_of_two(plan.vector_length) || plan.vector_length > limits.max_vector_length) {
    plan_error("vector_length " + std::to_string(plan.vector_length) + " is not a power of two up to " +
               std::to_string(limits.max_vector_length));
  }
  if (plan.team_size > limits.max_team_size ||
      static_cast<long long>(plan.team_size) * plan.vector_length > limits.max_team_threads) {
    plan_error("team_size " + std::to_string(plan.team_size) + " x vector_length " +
               std::to_string(plan.vector_length) + " exceeds the back end's limits (team_size <= " +
               std::to_string(limits.max_team_size) + ", threads per team <= " +
               std::to_string(limits.max_team_threads) + ")");
  }
}

/// The device path's team scratch for steps of `tokens` tokens and `warps` team members
/// (TileScratchLayout); 16-byte alignment of the ring is the kernel's carve's.
TileScratchLayout device_layout(const ProblemShape& shape, int rows, int tokens, int warps) {
  const std::size_t H = static_cast<std::size_t>(rows), D = static_cast<std::size_t>(shape.head_size);
  const std::size_t W = static_cast<std::size_t>(warps), T = static_cast<std::size_t>(tokens);
  const std::size_t e = static_cast<std::size_t>(shape.cache_element_size);
  const std::size_t vector_elements = 16 / e;  // a 16-byte piece of a key or value row
  const std::size_t value_groups = (T + vector_elements - 1) / vector_elements;
  TileScratchLayout layout;
  layout.q = 0;
  layout.o = H * D;
  layout.probs = layout.o + W * H * D;
  layout.running = layout.probs + W * H * value_groups * vector_elements;
  layout.ring = round_up(static_cast<long long>(layout.running + 3 * W * H), 4);
  layout.stage_floats = (T * D * e + value_groups * D * 16) / 4;
  layout.floats = layout.ring + W * 2 * layout.stage_floats;
  layout.ints = 0;
  return layout;
}

/// The device path's step (chunk_tokens), warps (team_size), rows per pass and scratch, in fast
/// scratch. A step's tokens are a power of two that divides the block size (a step reads one
/// page-table entry and indexes its pieces with shifts), the most that keep its keys and values
/// within kDeviceMaxStepBytes, then the most warps that fit. Where no step fits with the rows
/// per pass the tile's rows ask for, a GPU takes fewer rows per pass (more passes over K/V); a
/// host back end, whose team scratch is all memory alike, puts the scratch in level 1.
void plan_device_steps(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options,
                       LaunchPlan& plan) {
  const BackEndLimits& limits = profile.limits;
  const int e = shape.cache_element_size;
  if (shape.head_size % (16 / e) != 0) {
    plan_error("head_size " + std::to_string(shape.head_size) + " is not a multiple of " + std::to_string(16 / e) +
               " (the device path reads keys in 16-byte vectors)");
  }
  // A warp's lanes sync with the warp's mask: device back ends need whole warps.
  if (!limits.host_path && plan.vector_length != kDeviceVectorLength) {
    plan_error("vector_length " + std::to_string(plan.vector_length) + ": the device path runs whole warps (" +
               std::to_string(kDeviceVectorLength) + " lanes) on this back end");
  }
  const int max_warps = std::min({kDeviceMaxWarps, limits.max_team_size, limits.max_team_threads / plan.vector_length});
  const auto step_fits = [&](int tokens) {
    const std::size_t step_bytes = static_cast<std::size_t>(tokens) * shape.head_size * e * 2;
    return shape.block_size % tokens == 0 && (step_bytes <= kDeviceMaxStepBytes || tokens == 1);
  };
  const int fewest_rows = limits.host_path ? plan.rows_per_pass : 1;
  for (int rows = plan.rows_per_pass; rows >= fewest_rows; rows /= 2) {  // DeviceRowsPerPass: powers of two
    for (int tokens = kDeviceMaxStepTokens; tokens >= 1; tokens /= 2) {
      if (!step_fits(tokens)) continue;
      for (int warps = options.team_size > 0 ? options.team_size : max_warps; warps >= 1; --warps) {
        const TileScratchLayout layout = device_layout(shape, rows, tokens, warps);
        if (layout.bytes() <= limits.max_scratch_level0_bytes) {
          plan.rows_per_pass = rows;
          plan.chunk_tokens = tokens;
          plan.team_size = warps;
          plan.scratch_layout = layout;
          plan.scratch_bytes = layout.bytes();
          plan.scratch_level = 0;
          return;
        }
        if (options.team_size > 0) break;
      }
    }
  }
  if (limits.host_path) {
    int tokens = kDeviceMaxStepTokens;
    while (!step_fits(tokens)) tokens /= 2;
    plan.chunk_tokens = tokens;
    plan.team_size = options.team_size > 0 ? options.team_size : max_warps;
    plan.scratch_layout = device_layout(shape, plan.rows_per_pass, tokens, plan.team_size);
    plan.scratch_bytes = plan.scratch_layout.bytes();
    plan.scratch_level = 1;
    return;
  }
  plan_error("the device path needs " + std::to_string(device_layout(shape, 1, 1, std::max(options.team_size, 1)).bytes()) +
             " bytes of fast team scratch for a step of one row at head size " + std::to_string(shape.head_size) +
             "; this back end has " + std::to_string(limits.max_scratch_level0_bytes));
}

/// The host path's team scratch of a tile pass (the kernel carves it as laid out here).
void plan_host_scratch(const DeviceProfile& profile, const ProblemShape& shape, LaunchPlan& plan) {
  TileScratchLayout& layout = plan.scratch_layout;
  const std::size_t rows = static_cast<std::size_t>(plan.rows_per_pass);
  layout.q = 0;
  layout.o = rows * shape.head_size;
  layout.probs = 2 * layout.o;
  layout.probs_stride = static_cast<std::size_t>(round_up(plan.chunk_tokens, 32) + 16);
  layout.running = layout.probs + rows * layout.probs_stride;
  layout.floats = layout.running + 3 * rows;
  layout.ints = static_cast<std::size_t>(plan.chunk_tokens / shape.block_size);
  plan.scratch_bytes = layout.bytes();
  plan.scratch_level = plan.scratch_bytes <= profile.limits.max_scratch_level0_bytes ? 0 : 1;
}

/// Partitions, tiles and the two leagues, for teams of which `profile` holds the given number.
void plan_league(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options,
                 LaunchPlan& plan) {
  const long long league_bound = options.league_size > 0 ? options.league_size : profile.max_blocks();
  plan.partition_size = options.partition_size != 0 ? options.partition_size
                                                    : auto_partition_size(profile, shape, league_bound);
  plan.num_partitions = static_cast<int>(std::max(1LL, ceil_div(shape.attended_span(), plan.partition_size)));
  plan.single_partition = plan.num_partitions == 1;
  const long long tiles = static_cast<long long>(shape.num_seqs) * shape.num_kv_heads * plan.num_partitions;
  if (tiles > std::numeric_limits<int>::max()) {
    plan_error(std::to_string(tiles) + " tiles (num_seqs x num_kv_heads x partitions) exceed the int range");
  }
  plan.tiles = static_cast<int>(tiles);
  plan.league_size = static_cast<int>(std::min<long long>(plan.tiles, league_bound));
  plan.tiles_per_team = plan.league_size > 0 ? static_cast<int>(ceil_div(plan.tiles, plan.league_size)) : 0;
  plan.reduce_league_size =
      static_cast<int>(std::min<long long>(static_cast<long long>(shape.query_rows()) * shape.num_heads, league_bound));
  plan.reduce_scratch_bytes = static_cast<std::size_t>(plan.num_partitions) * sizeof(float) + 128;
  plan.reduce_scratch_level = plan.reduce_scratch_bytes <= profile.limits.max_scratch_level0_bytes ? 0 : 1;
}

}  // namespace

LaunchPlan plan_launch(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options,
                       const OccupancyQuery& occupancy) {
  check_plan_inputs(profile, shape, options);
  LaunchPlan plan;
  plan.profile = profile.name;
  plan_kernel_path(profile, options, plan);
  plan_team_shape(profile, shape, options, plan);
  if (plan.kernel_path == KernelPath::Device) {
    plan_device_steps(profile, shape, options, plan);
  } else {
    plan_host_scratch(profile, shape, plan);
  }
  if (profile.occupancy_from_kernel && occupancy) {
    // The team shape does not depend on occupancy; the league does.
    if (const int resident = occupancy(plan); resident > 0 && resident != profile.sm_occupancy) {
      DeviceProfile measured = profile;
      measured.sm_occupancy = resident;
      plan_league(measured, shape, options, plan);
      return plan;
    }
  }
  plan_league(profile, shape, options, plan);
  return plan;
}

std::string_view to_string(KernelPath path) {
  switch (path) {
    case KernelPath::Host: return "host";
    case KernelPath::Device: return "device";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, const LaunchPlan& plan) {
  os << "LaunchPlan{profile=" << plan.profile << " kernel_path=" << to_string(plan.kernel_path);
  if (plan.kernel_path == KernelPath::Host) os << " host_isa=" << to_string(plan.host_isa);
  return os
            << " partition_size=" << plan.partition_size << " num_partitions=" << plan.num_partitions
            << " tiles=" << plan.tiles << " league_size=" << plan.league_size
            << " tiles_per_team=" << plan.tiles_per_team << " team_size=" << plan.team_size
            << " vector_length=" << plan.vector_length << " rows_per_pass=" << plan.rows_per_pass
            << " chunk_tokens=" << plan.chunk_tokens << " scratch_bytes=" << plan.scratch_bytes
            << " scratch_level=" << plan.scratch_level << " reduce_league_size=" << plan.reduce_league_size
            << " reduce_scratch_bytes=" << plan.reduce_scratch_bytes
            << " single_partition=" << (plan.single_partition ? "yes" : "no") << "}";
}

std::string to_string(const LaunchPlan& plan) {
  std::ostringstream os;
  os << plan;
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const DeviceProfile& profile) {
  return os << "DeviceProfile{name=" << profile.name << " sm_count=" << profile.sm_count
            << " sm_occupancy=" << profile.sm_occupancy << " subscription_factor=" << profile.subscription_factor
            << " max_blocks=" << profile.max_blocks() << (profile.is_gpu ? " gpu" : " host")
            << (profile.occupancy_from_kernel ? " occupancy_from_kernel" : "") << "}";
}

}  // namespace kpa
