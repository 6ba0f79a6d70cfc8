#pragma once
// Launch planning: how a paged-attention call is mapped onto a device. Every choice of the
// launch (kernel path, partition size, league, team and vector sizes, rows per pass, chunk,
// scratch level) is made here, by one pure function of the device, the back end's limits and
// the problem's shape. The league is bounded by CUB's GridEvenShare rule (resident teams x
// subscription factor) and every team takes an even, contiguous share of the tiles, a tile
// being one (sequence, kv head, partition).

#include <kpa/detail/attention_variant.hpp>
#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/error.hpp>
#include <kpa/host_isa.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kpa {

namespace detail {
/// Host back ends whose device-path kernels libkpa holds (src/device_path_on_host.cpp).
template <class Space>
inline constexpr bool device_path_in_libkpa =
#ifdef KOKKOS_ENABLE_SERIAL
    std::is_same_v<Space, Kokkos::Serial> ||
#endif
#ifdef KOKKOS_ENABLE_OPENMP
    std::is_same_v<Space, Kokkos::OpenMP> ||
#endif
#ifdef KOKKOS_ENABLE_THREADS
    std::is_same_v<Space, Kokkos::Threads> ||
#endif
    false;
}  // namespace detail

/// What an execution space can run; the planner never asks for more.
struct BackEndLimits {
  int max_team_size = 1024;      ///< team members (threads; GPU: threadIdx.y)
  int max_vector_length = 32;    ///< vector lanes per team member (GPU: threadIdx.x)
  int max_team_threads = 1024;   ///< team_size x vector_length (GPU: threads per block)
  std::size_t max_scratch_level0_bytes = 40 * 1024;  ///< fast team scratch (GPU shared memory)
  bool host_path = false;   ///< the back end runs KernelPath::Host (host back ends)
  /// The best instruction set of the host path's inner loops this process runs; every lesser
  /// one runs too.
  HostIsa best_host_isa = HostIsa::Portable;
  bool device_path = true;  ///< the back end runs KernelPath::Device (device back ends; the host
                            ///< back ends libkpa compiles it for: Serial, OpenMP, Threads)

  /// The limits of `space`'s back end (host back ends: one team member per thread).
  template <class Space>
  static BackEndLimits of(const Space& space);
};

/// What the planner knows about a device.
struct DeviceProfile {
  std::string name;
  int sm_count = 1;             ///< places a team runs: streaming multiprocessors (GPU), threads (host)
  int sm_occupancy = 1;         ///< resident teams per SM
  int subscription_factor = 1;  ///< teams per resident slot (CUB's default is 5)
  bool is_gpu = false;          ///< GPU profiles run the device kernel path
  /// detect() sets this for a real GPU: sm_occupancy is then replaced, at launch, by the resident
  /// teams per SM the CUDA occupancy calculator gives for the attention kernel that will run.
  bool occupancy_from_kernel = false;
  BackEndLimits limits;  ///< of the back end the plan runs on (detect() fills them in)
  /// Instruction set of the host path's inner loops: detect() takes limits.best_host_isa, or
  /// the environment variable KPA_HOST_ISA (parse_host_isa's names) when set.
  HostIsa host_isa = HostIsa::Portable;

  int resident_teams() const { return sm_count * sm_occupancy; }
  int max_blocks() const { return resident_teams() * subscription_factor; }

  /// The seed design's Iluvatar BI-V100 profile: 16 SMs x occupancy 2 x subscription 5 = 160.
  static DeviceProfile bi_v100();
  /// A host back end with `concurrency` threads: one resident team per thread, four teams per
  /// thread so dynamic scheduling can even out uneven sequence lengths.
  static DeviceProfile host(int concurrency);
  /// "bi-v100", "host:THREADS", or "NAME:SM_COUNT:OCCUPANCY:SUBSCRIPTION" (a GPU profile).
  /// Throws kpa::Error for anything else.
  static DeviceProfile from_name(std::string_view spec);

  /// The profile of the device behind `space`, with the back end's limits. A GPU's properties
  /// are read once per device and cached. The environment variable KPA_DEVICE_PROFILE, when
  /// set, replaces the device part with from_name(its value) (the limits stay the back end's),
  /// so a CPU run can plan as the BI-V100 for inspection. KPA_HOST_ISA names an instruction set
  /// below the best one (kpa::Error if the CPU lacks it).
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
  /// Rows of query and out with several query tokens per sequence (query_start_loc); 0: one
  /// per sequence, num_seqs rows.
  int num_tokens = 0;
  /// The most query tokens of any sequence (1: decode). A tile's rows are its sequence's query
  /// tokens x the kv head's group of query heads, computed together over each K/V chunk.
  int max_query_len = 1;
  int sliding_window = 0;  ///< AttentionParams::sliding_window (0: none)
  /// Bytes of one K/V cache element: 1 for fp8 caches, 2 for half / bfloat16, 4 for float. The
  /// host path sizes its chunks by it.
  int cache_element_size = 2;

  int query_rows() const { return num_tokens > 0 ? num_tokens : num_seqs; }

  /// Tokens of the longest attended span over sequences of up to max_seq_len tokens: from where
  /// the kernels start reading a sequence (AttentionVariant::span_begin: with a sliding window,
  /// the block of its first query row's first key) to its end. Partitions count from there.
  long long attended_span() const {
    long long longest = 0;
    // A span's length repeats with the block size as sequences grow: the last block_size
    // lengths take every value it has.
    for (long long len = std::max<long long>(0, max_seq_len - std::max(block_size, 1) + 1); len <= max_seq_len; ++len) {
      const int begin = detail::AttentionVariant::span_begin(static_cast<int>(len), max_query_len, block_size,
                                                             sliding_window);
      longest = std::max(longest, len - begin);
    }
    return longest;
  }
};

/// How a team computes a tile. The names say the shape of the code, not where it may run: the
/// host path runs on host back ends only, the device path on every back end (on host back ends
/// from libkpa, which compiles it for them once).
enum class KernelPath {
  /// CPU-shaped: team members take whole cache blocks and run register-blocked inner loops over
  /// a block's slots (the instruction set's loops from libkpa).
  Host,
  /// GPU-shaped: every team member (a warp) streams its own steps of a tile's tokens, copying
  /// each step's keys and values into a two-stage ring in team scratch (asynchronous copies where
  /// the device has them) while it computes the previous step from scratch; the warps' softmax
  /// states merge once per pass.
  Device,
};

/// Caller overrides; 0 (or Auto) leaves the choice to the planner. The automatic kernel path is
/// the device path on GPU profiles and the host path otherwise, among the paths the back end has.
struct PlanOptions {
  enum class Path { Auto, Host, Device };
  int partition_size = 0;  ///< tokens per partition, a multiple of block_size
  int team_size = 0;
  int vector_length = 0;
  int league_size = 0;  ///< still capped by the number of tiles
  Path kernel_path = Path::Auto;
  std::optional<HostIsa> host_isa;  ///< the host path's instruction set (default: the profile's)
};

/// Rows per pass (query heads of a GQA group x the sequence's query tokens) each kernel path is
/// compiled for; the planner chooses among these and the launch instantiates exactly these. Host:
/// 6 for groups of 3, 5, 6 and 12 without padding to 8, 16 for groups of 16 and 4 query tokens of
/// a group of 4 with one read of K/V, 32 for the rows of prefill chunks on the AMX levels (two
/// tile rows per load of the cache operand). Device: powers of two up to 8 keep its
/// instantiations and registers few; more rows take several passes.
using HostRowsPerPass = std::integer_sequence<int, 1, 2, 4, 6, 8, 16, 32>;
using DeviceRowsPerPass = std::integer_sequence<int, 1, 2, 4, 8>;

/// The team scratch of one tile pass, as the planner lays it out (offsets and counts in 4-byte
/// words). Host path: floats q [H][D] (pre-scaled query rows), o [H][D] (running unnormalised
/// output), probs [H][probs_stride] (the chunk's logits, then probabilities), running [3][H]
/// (each row's output factor when a pass stores); then ints: the chunk's physical block ids (-1:
/// attended by no row of the pass). Device path: q [H][D], and per team member (warp) o [W][H][D]
/// (o is warp 0's), probs [W][H][chunk_tokens], running [3][W][H], and ring [W][2][stage_floats],
/// two stages of a step's keys and values as the cache stores them.
struct TileScratchLayout {
  std::size_t q = 0;
  std::size_t o = 0;
  std::size_t probs = 0;
  std::size_t running = 0;
  std::size_t ring = 0;          ///< device path only
  std::size_t stage_floats = 0;  ///< device path: one stage (keys, then values of chunk_tokens tokens)
  /// Host path: floats from a row of probs to the next, at least chunk_tokens: an odd number of
  /// cache lines, as rows a power of two of lines apart would fall into few sets of the L1
  /// cache, which the tile loops' stores of 16 rows at a time then evict from each other.
  std::size_t probs_stride = 0;
  std::size_t floats = 0;  ///< all the floats
  std::size_t ints = 0;    ///< the block ids

  /// Bytes a team requests: both arrays plus room for the scratch allocator's alignment.
  std::size_t bytes() const { return (floats + ints) * 4 + 2 * 128; }
};

struct LaunchPlan {
  std::string profile;                   ///< name of the DeviceProfile planned for
  KernelPath kernel_path = KernelPath::Host;
  HostIsa host_isa = HostIsa::Portable;  ///< inner loops of the host path (unused by the device path)
  int partition_size = 0;                ///< tokens per partition (a multiple of block_size)
  int num_partitions = 0;                ///< ceil(attended span / partition_size), at least 1
  int tiles = 0;                         ///< num_seqs x num_kv_heads x num_partitions
  int league_size = 0;                   ///< min(tiles, max_blocks): teams of the attention kernel
  int tiles_per_team = 0;                ///< ceil(tiles / league_size): a team's even share
  int team_size = 0;
  int vector_length = 0;
  int rows_per_pass = 0;                 ///< query rows (heads x query tokens) per pass over a tile's K/V
  int chunk_tokens = 0;                  ///< tokens whose logits sit in team scratch at once (device
                                         ///< path: a warp's step)
  TileScratchLayout scratch_layout;      ///< team scratch of the attention kernel
  std::size_t scratch_bytes = 0;         ///< scratch_layout.bytes()
  int scratch_level = 0;                 ///< 0 (fast, e.g. GPU shared memory) or 1
  int reduce_league_size = 0;            ///< teams of the partition reduce (not launched when single_partition)
  std::size_t reduce_scratch_bytes = 0;  ///< team scratch of the reduce (a float per partition)
  int reduce_scratch_level = 0;
  /// Every sequence fits one partition (the seed design's single-tile fast path): one kernel
  /// writes the output, no partition temporaries, no reduce.
  bool single_partition = false;
};

/// Resident teams per SM of the kernel a plan would launch (a GPU's occupancy calculator), asked
/// once the plan's team shape and scratch are chosen; 0: unknown.
using OccupancyQuery = std::function<int(const LaunchPlan&)>;

/// Throws kpa::Error for a shape no kernel can run (non-positive sizes, a partition size that is
/// not a multiple of the block size, ...) and for overrides beyond the profile's limits.
void check_plan_inputs(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options = {});

/// Plans a call (check_plan_inputs first). With `occupancy` and a profile whose occupancy comes
/// from the kernel (DeviceProfile::occupancy_from_kernel), the league is sized with the
/// occupancy it reports for the chosen team shape.
LaunchPlan plan_launch(const DeviceProfile& profile, const ProblemShape& shape, const PlanOptions& options = {},
                       const OccupancyQuery& occupancy = {});

std::ostream& operator<<(std::ostream& os, const LaunchPlan& plan);
std::string to_string(const LaunchPlan& plan);
std::ostream& operator<<(std::ostream& os, const DeviceProfile& profile);
std::string_view to_string(KernelPath path);

template <class Space>
BackEndLimits BackEndLimits::of(const Space& space) {
  using policy = Kokkos::TeamPolicy<Space>;
  BackEndLimits limits;
  limits.max_vector_length = policy::vector_length_max();
  limits.max_scratch_level0_bytes = static_cast<std::size_t>(policy::scratch_size_max(0));
  if constexpr (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
    limits.max_team_size = static_cast<int>(space.concurrency());
    limits.max_team_threads = limits.max_team_size * limits.max_vector_length;
    limits.host_path = true;
    limits.best_host_isa = detail::best_host_isa();
    limits.device_path = detail::device_path_in_libkpa<Space>;
  } else {
    limits.max_team_threads = detail::compat::device_max_threads_per_team(space);
    limits.max_team_size = limits.max_team_threads;
  }
  return limits;
}

template <class Space>
DeviceProfile DeviceProfile::detect(const Space& space) {
  DeviceProfile profile;
  if (const char* forced = std::getenv("KPA_DEVICE_PROFILE"); forced != nullptr && *forced != '\0') {
    profile = from_name(forced);
  } else if (const int sm_count = detail::compat::device_sm_count(space); sm_count == 0) {
    profile = host(space.concurrency());
    profile.name = std::string("host:") + Space::name() + ":" + std::to_string(space.concurrency());
  } else {
    profile.name = detail::compat::device_name(space);
    profile.sm_count = sm_count;
    profile.sm_occupancy = 1;          // replaced by the kernel's measured occupancy at launch
    profile.subscription_factor = 1;   // resident teams walk their shares: no second wave
    profile.is_gpu = true;
    profile.occupancy_from_kernel = true;
  }
  profile.limits = BackEndLimits::of(space);
  profile.host_isa = detail::chosen_host_isa(profile.limits.best_host_isa);
  return profile;
}

}  // namespace kpa
