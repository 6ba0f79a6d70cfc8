// kpa-bench: decode-step paged attention measured against the machine's limits and against the
// baselines a user would otherwise write, in one run. See `kpa-bench --help`.

#include "baselines.hpp"
#include "fill_random.hpp"
#ifdef KPA_BENCH_DENSE_BASELINE
#include "dense_baseline.hpp"
#endif
#include "in_flight_probe.hpp"
#include "machine_limits.hpp"
#include "reference.hpp"

#include <kpa/kpa.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kpa_bench {
namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Memory = Space::memory_space;

struct Workload {
  std::string name;
  std::string version = "auto";  // v1, v2, auto
  int batch_size = 8, seq_len = 1024, num_query_heads = 32, num_kv_heads = 8, head_size = 128, block_size = 16;
  bool use_alibi = false;
  std::string dtype = "half";            // float, half, bfloat16
  std::string kv_cache_dtype = "auto";   // auto, fp8, fp8_e4m3, fp8_e5m2
  int partition_size = 0;                // 0: 512 for v2, the planner's choice for auto
  // Variants (README, "Attention variants").
  float soft_cap = 0.0f;
  int sliding_window = 0;
  bool sinks = false;
  int query_len = 1;  // query tokens per sequence

  bool decode_only() const { return soft_cap == 0.0f && sliding_window == 0 && !sinks && query_len == 1; }
  /// Keys a sequence's query rows attend together (the blocks read), and (row, key) pairs.
  long long keys_read() const {
    return sliding_window > 0 ? std::min<long long>(seq_len, sliding_window + query_len - 1) : seq_len;
  }
  long long row_keys() const {
    long long pairs = 0;
    for (int i = 0; i < query_len; ++i) {
      const long long position = seq_len - query_len + i;
      pairs += sliding_window > 0 ? std::min<long long>(position + 1, sliding_window) : position + 1;
    }
    return pairs;
  }
};

struct Options {
  std::vector<Workload> workloads;
  bool custom = false;
  std::uint64_t seed = 0;
  int warmup = 2, iters = 10, baseline_iters = 3;
  bool check = false, baselines = true, warm_cache = false;
  bool in_flight_probe = false;
  std::string json, csv;
};

struct Result {
  Workload w;
  double median_us = 0, min_us = 0, kv_bytes = 0, flops = 0, kv_gbps = 0, bandwidth_pct = 0, gflops = 0,
         roofline_pct = 0;
  std::optional<double> max_abs_err, naive_us, dense_us;
  std::optional<double> paged_read_gbps, paged_pct;  ///< the paged-read probe (hosts)
  std::string plan;
  bool on_tiles = false;  ///< the arithmetic on AMX tiles (host_loops' Passes::Several): their peak limits it
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "kpa-bench: %s (see --help)\n", message.c_str());
  std::exit(2);
}

std::vector<int> parse_int_list(const std::string& text, const char* what) {
  auto to_int = [&](const std::string& s) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v <= 0 || v > (1L << 30)) usage_error(std::string("bad ") + what + " '" + s + "'");
    return static_cast<int>(v);
  };
  std::vector<int> values;
  if (text.find(':') != std::string::npos) {
    std::vector<std::string> parts;
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
    if (parts.size() < 2 || parts.size() > 3) usage_error(std::string("bad range for ") + what + " '" + text + "'");
    const int start = to_int(parts[0]), stop = to_int(parts[1]);
    const bool geometric = parts.size() == 3 && !parts[2].empty() && parts[2][0] == 'x';
    const int step = parts.size() == 3 ? to_int(geometric ? parts[2].substr(1) : parts[2]) : 1;
    if (geometric && step < 2) usage_error("a geometric step must be at least x2");
    for (long v = start; v <= stop; v = geometric ? v * step : v + step) values.push_back(static_cast<int>(v));
  } else {
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, ',');) values.push_back(to_int(part));
  }
  if (values.empty()) usage_error(std::string("empty ") + what);
  return values;
}

std::vector<Workload> default_suite() {
  Workload llama;
  llama.name = "llama_32x4096";
  llama.batch_size = 32;
  llama.seq_len = 4096;
  Workload long_context;
  long_context.name = "long_context_1x100k";
  long_context.batch_size = 1;
  long_context.seq_len = 100000;
  long_context.num_query_heads = 24;
  long_context.num_kv_heads = 4;
  long_context.head_size = 256;
  Workload single_tile;
  single_tile.name = "single_tile_64x512";
  single_tile.batch_size = 64;
  single_tile.seq_len = 512;
  Workload fp8 = llama;
  fp8.name = "llama_32x4096_fp8";
  fp8.kv_cache_dtype = "fp8_e4m3";
  std::vector<Workload> suite{llama, long_context, single_tile, fp8};
  // Models served in bf16, and the large blocks CPU serving engines use (vLLM's CPU default: 128).
  for (Workload w : {llama, long_context, single_tile}) {
    w.name += "_bf16";
    w.dtype = "bfloat16";
    suite.push_back(w);
  }
  for (const char* dtype : {"half", "bfloat16"}) {
    Workload w = llama;
    w.dtype = dtype;
    w.block_size = 128;
    w.name = std::string("llama_32x4096") + (w.dtype == "half" ? "" : "_bf16") + "_block128";
    suite.push_back(w);
  }
  return suite;
}

/// Prefill as serving engines chunk it: the last 512-token chunk of 2,048-token prompts (each
/// query token attends the chunks before it and, causally, its own), bf16, blocks of 128, with
/// Llama's 32/8 heads and a smaller model's 16/4.
std::vector<Workload> prefill_suite() {
  std::vector<Workload> suite;
  for (auto [heads, kv_heads] : {std::pair{32, 8}, std::pair{16, 4}}) {
    Workload w;
    w.name = "prefill_4x2048_q512_" + std::to_string(heads) + "x" + std::to_string(kv_heads) + "_bf16_block128";
    w.batch_size = 4;
    w.seq_len = 2048;
    w.query_len = 512;
    w.num_query_heads = heads;
    w.num_kv_heads = kv_heads;
    w.dtype = "bfloat16";
    w.block_size = 128;
    suite.push_back(w);
  }
  return suite;
}

/// CLI11's check of a whole number of at least `least`.
CLI::Validator whole_number(long least) {
  return CLI::Validator(
      [least](std::string& value) {
        char* end = nullptr;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || v < least || v > (1L << 30)) {
          return "'" + value + "' is not a whole number from " + std::to_string(least) + " to 2^30";
        }
        return std::string();
      },
      least > 0 ? "POSITIVE" : "NONNEGATIVE");
}

/// CLI11's check of a positive float.
CLI::Validator positive_float() {
  return CLI::Validator(
      [](std::string& value) {
        char* end = nullptr;
        const float v = std::strtof(value.c_str(), &end);
        return value.empty() || *end != '\0' || !(v > 0.0f) ? "'" + value + "' is not a positive number" : std::string();
      },
      "POSITIVE");
}

/// CLI11's check of a value through one of kpa's parsers (its kpa::Error message on failure).
template <class Parse>
CLI::Validator parsed_by(const char* name, Parse parse) {
  return CLI::Validator(
      [parse](std::string& value) {
        try {
          parse(value);
          return std::string();
        } catch (const kpa::Error& e) {
          return std::string(e.what());
        }
      },
      name);
}

Options parse(int argc, char** argv) {
  Options o;
  Workload w;
  std::string seq_len = std::to_string(w.seq_len), device_profile;
  CLI::App app("kpa-bench: paged attention against the machine's limits and the baselines.\n"
               "With no workload option it runs a suite: the decode suite by default (a Llama-style batch,\n"
               "the 100K-token long-context case, a single-tile batch, the Llama batch with an fp8 cache; the\n"
               "first three again in bf16; the Llama batch in blocks of 128, f16 and bf16), or with --suite\n"
               "prefill the last 512-token chunk of four 2,048-token prompts (32/8 and 16/4 heads, bf16,\n"
               "blocks of 128).");
  app.allow_extras();  // Kokkos' own --kokkos-* options
  const std::string workload = "Workload (any of these selects a custom run; lists and ranges make a sweep)";
  const std::vector<CLI::Option*> workload_options = {
      app.add_option("--version", w.version, "entry point")->check(CLI::IsMember({"v1", "v2", "auto"})),
      app.add_option("--batch-size", w.batch_size, "sequences")->check(whole_number(1)),
      app.add_option("--seq-len", seq_len,
                     "tokens per sequence: 4096, a list 1024,4096 or a range START:STOP[:STEP] (STEP xF "
                     "multiplies: 128:131072:x4)"),
      app.add_option("--num-query-heads", w.num_query_heads)->check(whole_number(1)),
      app.add_option("--num-kv-heads", w.num_kv_heads)->check(whole_number(1)),
      app.add_option("--head-size", w.head_size)->check(whole_number(1)),
      app.add_option("--block-size", w.block_size)->check(whole_number(1)),
      app.add_flag("--use-alibi", w.use_alibi, "ALiBi slopes"),
      app.add_option("--dtype", w.dtype, "query / output / auto cache type")
          ->check(CLI::IsMember({"float", "half", "bfloat16"})),
      app.add_option("--kv-cache-dtype", w.kv_cache_dtype, "auto|fp8|fp8_e4m3|fp8_e5m2")
          ->check(parsed_by("KV_CACHE_DTYPE", [](const std::string& v) { kpa::parse_kv_cache_dtype(v); })),
      app.add_option("--partition-size", w.partition_size, "v2 / auto partition size (default: 512 for v2, the "
                                                           "planner for auto)")
          ->check(whole_number(1)),
      app.add_option("--soft-cap", w.soft_cap, "logits soft-capping C * tanh(logit / C), C > 0")
          ->check(positive_float()),
      app.add_option("--sliding-window", w.sliding_window, "each query attends its last W keys")
          ->check(whole_number(1)),
      app.add_flag("--sinks", w.sinks, "a sink logit per query head (auto only)"),
      app.add_option("--query-len", w.query_len, "query tokens per sequence, causal among themselves (auto only)")
          ->check(whole_number(1)),
  };
  for (CLI::Option* option : workload_options) {
    option->group(workload);
    // Options whose default is a value (not "off") show it.
    if (option->get_name() != "--partition-size" && option->get_name() != "--soft-cap" &&
        option->get_name() != "--sliding-window") {
      option->capture_default_str();
    }
  }
  const std::string run = "Run";
  std::string suite = "decode";
  app.add_option("--suite", suite, "the suite run when no workload option is given")
      ->check(CLI::IsMember({"decode", "prefill"}))
      ->group(run)
      ->capture_default_str();
  app.add_option("--device-profile", device_profile,
                 "plan as bi-v100, host:N or NAME:SMS:OCC:SUB (sets KPA_DEVICE_PROFILE)")
      ->check(parsed_by("PROFILE", [](const std::string& v) { kpa::DeviceProfile::from_name(v); }))
      ->group(run);
  app.add_option("--seed", o.seed)->group(run)->capture_default_str();
  app.add_option("--warmup", o.warmup)->check(whole_number(0))->group(run)->capture_default_str();
  app.add_option("--iters", o.iters)->check(whole_number(1))->group(run)->capture_default_str();
  app.add_option("--baseline-iters", o.baseline_iters)->check(whole_number(1))->group(run)->capture_default_str();
  bool no_baselines = false;
  app.add_flag("--no-baselines", no_baselines, "skip the naive and dense baselines")->group(run);
  app.add_flag("--warm-cache", o.warm_cache,
               "do not evict the caches before each timed call (by default a 256 MiB buffer is rewritten first, "
               "as serving meets a cold cache)")
      ->group(run);
  app.add_flag("--check", o.check, "compare a sample with the float64 reference, print the max error")->group(run);
  app.add_flag("--in-flight-probe", o.in_flight_probe,
               "GPU: read bandwidth with 1-8 independent 16-byte loads per lane x 8-64 warps per SM, and the "
               "memory latency each implies (no workloads run)")
      ->group(run);
  app.add_option("--json", o.json, "write the results as JSON")->group(run);
  app.add_option("--csv", o.csv, "write the results as CSV")->group(run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e) == 0 ? 0 : 2);
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("--kokkos", 0) != 0) usage_error("unknown option " + extra);
  }
  o.baselines = !no_baselines;
  if (!device_profile.empty()) ::setenv("KPA_DEVICE_PROFILE", device_profile.c_str(), 1);
  o.custom = std::any_of(workload_options.begin(), workload_options.end(),
                         [](const CLI::Option* option) { return option->count() > 0; });
  if (o.custom) {
    if ((w.sinks || w.query_len > 1) && w.version != "auto") usage_error("--sinks and --query-len need --version auto");
    for (int len : parse_int_list(seq_len, "--seq-len")) {
      Workload one = w;
      one.seq_len = len;
      if (one.query_len > len) usage_error("--query-len exceeds --seq-len");
      one.name = "custom_" + std::to_string(one.batch_size) + "x" + std::to_string(len);
      if (one.query_len > 1) one.name += "_q" + std::to_string(one.query_len);
      if (one.sliding_window > 0) one.name += "_w" + std::to_string(one.sliding_window);
      if (one.soft_cap > 0.0f) one.name += "_cap";
      if (one.sinks) one.name += "_sinks";
      o.workloads.push_back(one);
    }
  } else {
    o.workloads = suite == "prefill" ? prefill_suite() : default_suite();
  }
  return o;
}

template <class T, class C>
class Bench {
 public:
  Bench(const Workload& w, std::uint64_t seed) : w_(w) {
    const int x = static_cast<int>(16 / sizeof(C));
    blocks_per_seq_ = (w.seq_len + w.block_size - 1) / w.block_size;
    const int num_blocks = w.batch_size * blocks_per_seq_;
    const int rows = w.batch_size * w.query_len;
    query_ = decltype(query_)("query", rows, w.num_query_heads, w.head_size);
    out_ = decltype(out_)("out", rows, w.num_query_heads, w.head_size);
    baseline_out_ = decltype(baseline_out_)("baseline_out", w.batch_size, w.num_query_heads, w.head_size);
    key_cache_ = decltype(key_cache_)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "key_cache"), num_blocks,
                                      w.num_kv_heads, w.head_size / x, w.block_size, x);
    value_cache_ = decltype(value_cache_)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "value_cache"), num_blocks,
                                          w.num_kv_heads, w.head_size, w.block_size);
    block_tables_ = decltype(block_tables_)("block_tables", w.batch_size, blocks_per_seq_);
    seq_lens_ = decltype(seq_lens_)("seq_lens", w.batch_size);
    alibi_ = decltype(alibi_)("alibi", w.use_alibi ? w.num_query_heads : 0);
    params_.scale = 1.0f / std::sqrt(static_cast<float>(w.head_size));
    params_.kv_cache_dtype = kpa::parse_kv_cache_dtype(w.kv_cache_dtype);
    params_.check_indices = false;  // the tables are built valid below; time the kernels
    params_.logits_soft_cap = w.soft_cap;
    params_.sliding_window = w.sliding_window;
    if (w.query_len > 1) {
      query_start_loc_ = decltype(query_start_loc_)("query_start_loc", w.batch_size + 1);
      auto starts = Kokkos::create_mirror_view(query_start_loc_);
      for (int s = 0; s <= w.batch_size; ++s) starts(s) = s * w.query_len;
      Kokkos::deep_copy(query_start_loc_, starts);
      extras_.query_start_loc = query_start_loc_;
      extras_.max_query_len = w.query_len;
    }
    if (w.sinks) {
      sinks_ = decltype(sinks_)("sinks", w.num_query_heads);
      auto values = Kokkos::create_mirror_view(sinks_);
      for (int h = 0; h < w.num_query_heads; ++h) values(h) = 0.25f * (h % 4);
      Kokkos::deep_copy(sinks_, values);
      extras_.sinks = sinks_;
    }
    if (params_.kv_cache_dtype != kpa::KVCacheDType::Auto) params_.k_scale = params_.v_scale = 1.0f / 128;

    kpa::detail::with_cache_storage<C>(params_.kv_cache_dtype, [&](auto storage) {
      using S = typename decltype(storage)::type;
      fill_random<S>(Space(), key_cache_, value_cache_, query_, seed, params_.k_scale);
    });
    std::vector<int> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    auto tables = Kokkos::create_mirror_view(block_tables_);
    auto lens = Kokkos::create_mirror_view(seq_lens_);
    for (int s = 0; s < w.batch_size; ++s) {
      lens(s) = w.seq_len;
      for (int b = 0; b < blocks_per_seq_; ++b) tables(s, b) = order[s * blocks_per_seq_ + b];
    }
    Kokkos::deep_copy(block_tables_, tables);
    Kokkos::deep_copy(seq_lens_, lens);
    auto slopes = Kokkos::create_mirror_view(alibi_);
    for (std::size_t h = 0; h < slopes.extent(0); ++h) slopes(h) = std::exp2(-8.0f * (h + 1) / w.num_query_heads);
    Kokkos::deep_copy(alibi_, slopes);
    if (w.version == "v2") {
      partition_ = w.partition_size > 0 ? w.partition_size : 512;
      const int partitions = (w.seq_len + partition_ - 1) / partition_;
      exp_sums_ = decltype(exp_sums_)("exp_sums", w.batch_size, w.num_query_heads, partitions);
      max_logits_ = decltype(max_logits_)("max_logits", w.batch_size, w.num_query_heads, partitions);
      tmp_out_ = decltype(tmp_out_)("tmp_out", w.batch_size, w.num_query_heads, partitions, w.head_size);
    }
  }

  void run_kpa() {
    const Space space;
    if (w_.version == "v1") {
      kpa::paged_attention_v1(space, out_, query_, key_cache_, value_cache_, block_tables_, seq_lens_, w_.seq_len,
                              alibi_, params_);
    } else if (w_.version == "v2") {
      kpa::paged_attention_v2(space, out_, exp_sums_, max_logits_, tmp_out_, query_, key_cache_, value_cache_,
                              block_tables_, seq_lens_, w_.seq_len, alibi_, params_, partition_);
    } else {
      kpa::PlanOptions options;
      options.partition_size = w_.partition_size;
      kpa::paged_attention(space, workspace_, out_, query_, key_cache_, value_cache_, block_tables_, seq_lens_,
                           w_.seq_len, alibi_, params_, extras_, options);
    }
  }

  /// The plan of the last call: the workspace's for auto; v1 and v2 plan with their fixed
  /// partition size (one partition, or partition_), as they do inside.
  /// Whether the call's multiply-adds ran on AMX tiles: the AMX level, and tiles of several passes.
  bool on_tiles() const {
    if (w_.version != "auto") return false;
    const kpa::LaunchPlan& p = workspace_.last_plan();
    const int tile_rows = w_.num_query_heads / w_.num_kv_heads * std::max(w_.query_len, 1);
    return p.kernel_path == kpa::KernelPath::Host && p.host_isa == kpa::HostIsa::Amx && tile_rows > p.rows_per_pass;
  }

  std::string plan() const {
    kpa::ProblemShape shape{w_.batch_size, w_.num_query_heads, w_.num_kv_heads, w_.head_size, w_.block_size, w_.seq_len};
    shape.sliding_window = w_.sliding_window;
    shape.cache_element_size = static_cast<int>(sizeof(C));
    kpa::PlanOptions options;
    options.partition_size = w_.version == "v1" ? blocks_per_seq_ * w_.block_size : partition_;
    const kpa::LaunchPlan p = w_.version == "auto" ? workspace_.last_plan() : kpa::plan_launch(Space(), shape, options);
    std::ostringstream os;
    os << "P" << p.partition_size << "x" << p.num_partitions << " L" << p.league_size << " T" << p.team_size
       << (p.single_partition ? " single" : "");
    if (p.kernel_path == kpa::KernelPath::Host) os << " C" << p.chunk_tokens << " " << kpa::to_string(p.host_isa);
    return os.str();
  }

  /// The paged-read probe: what a plain loop reads per second from this workload's cache in
  /// the step's order. Every (sequence, kv head) reads the key block and the value block of each
  /// table entry its rows attend, asking for the next entry's two blocks one ahead as kpa does
  /// (read_words: 32-bit integer sums, AVX2 on x86); items of up to 64 blocks, dynamically
  /// scheduled over the threads; before_each() first, best of 5. Blocks are 4 KiB pages in table
  /// order (shuffled, as after a serving engine's churn), which the CPU's prefetchers stream far
  /// worse than one long run: this is the bandwidth the paged layout leaves. 0 on device spaces.
  double paged_read_bytes_per_s() {
    if constexpr (!Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) {
      return 0.0;
    } else {
      constexpr int kBlocksPerItem = 64;
      const int B = w_.block_size, heads = w_.num_kv_heads;
      const long long first_token = w_.seq_len - w_.keys_read();
      const int first_block = static_cast<int>(first_token / B), blocks = (w_.seq_len - 1) / B + 1 - first_block;
      const int pieces = (blocks + kBlocksPerItem - 1) / kBlocksPerItem;
      const std::int64_t block_bytes = static_cast<std::int64_t>(w_.head_size) * B * sizeof(C);
      const char* keys = reinterpret_cast<const char*>(key_cache_.data());
      const char* values = reinterpret_cast<const char*>(value_cache_.data());
      const auto tables = block_tables_;
#ifdef KPA_BENCH_X86_PROBES
      const bool avx2 = x86::probe_width() >= 8;
#else
      const bool avx2 = false;
#endif
      std::uint64_t sink = 0;
      double best = 1e30;
      for (int run = 0; run < 5; ++run) {
        before_each();
        const auto start = std::chrono::steady_clock::now();
        Kokkos::parallel_reduce(
            "kpa_bench::paged_read",
            Kokkos::RangePolicy<Space, Kokkos::Schedule<Kokkos::Dynamic>>(0, w_.batch_size * heads * pieces),
            [&](int item, std::uint64_t& sum) {
              // kv head fastest, as kpa orders its tiles
              const int head = item % heads, seq_piece = item / heads;
              const int seq = seq_piece / pieces, piece = seq_piece % pieces;
              const int begin = first_block + piece * kBlocksPerItem;
              const int end = std::min(first_block + blocks, begin + kBlocksPerItem);
              auto offset = [&](int b) { return (static_cast<std::int64_t>(tables(seq, b)) * heads + head) * block_bytes; };
              for (int b = begin; b < end; ++b) {
                if (b + 1 < end) {  // as kpa's host path does
                  kpa::detail::prefetch_bytes(keys + offset(b + 1), static_cast<int>(block_bytes));
                  kpa::detail::prefetch_bytes(values + offset(b + 1), static_cast<int>(block_bytes));
                }
                const std::int64_t at = offset(b);
                sum += read_words(keys + at, block_bytes, avx2) + read_words(values + at, block_bytes, avx2);
              }
            },
            sink);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      if (sink == 1) std::fprintf(stderr, " ");  // keeps the sums live
      return 2.0 * block_bytes * blocks * w_.batch_size * heads / best;
    }
  }

  /// Called before every timed call (CacheFlusher unless --warm-cache).
  std::function<void()> before_each = [] {};

  template <class Body>
  std::vector<double> time_us(int warmup, int iters, Body&& body) {
    for (int i = 0; i < warmup; ++i) body();
    Space().fence();
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      before_each();
      const auto start = std::chrono::steady_clock::now();
      body();
      Space().fence();
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    return times;
  }

  Result run(const Options& o, const MachineLimits& limits) {
    Result r;
    r.w = w_;
    const auto times = time_us(o.warmup, o.iters, [&] { run_kpa(); });
    r.plan = plan();
    r.median_us = times[times.size() / 2];
    r.min_us = times.front();
    // Bytes: the keys and values of the blocks the sequences' rows attend, read once; FLOP: two
    // multiply-adds per (query row, attended key, head, dimension).
    r.kv_bytes = 2.0 * w_.batch_size * static_cast<double>(w_.keys_read()) * w_.num_kv_heads * w_.head_size * sizeof(C);
    r.flops = 4.0 * w_.batch_size * static_cast<double>(w_.row_keys()) * w_.num_query_heads * w_.head_size;
    r.kv_gbps = r.kv_bytes / r.median_us / 1e3;
    r.gflops = r.flops / r.median_us / 1e3;
    r.bandwidth_pct = 100.0 * r.kv_bytes / r.median_us * 1e6 / limits.read_bytes_per_s;
    // The roofline time is the larger of the two lower bounds: reading the KV cache once at the
    // measured bandwidth, and the multiply-adds at the measured throughput of the instructions
    // that do them (AMX tiles for the passes of tiles of several passes where kpa runs AMX, FMA
    // otherwise).
    r.on_tiles = on_tiles();
    const double peak = r.on_tiles && limits.tile_flop_per_s > 0.0 ? limits.tile_flop_per_s : limits.flop_per_s;
    const double roofline_us = std::max(r.kv_bytes / limits.read_bytes_per_s, r.flops / peak) * 1e6;
    r.roofline_pct = 100.0 * roofline_us / r.median_us;
    if (const double paged = paged_read_bytes_per_s(); paged > 0.0) {
      r.paged_read_gbps = paged / 1e9;
      r.paged_pct = 100.0 * r.kv_bytes / r.median_us * 1e6 / paged;
    }
    if (o.check) r.max_abs_err = check_sample();
    if (o.baselines && w_.decode_only()) {  // the baselines know plain decode only
      const int iters = o.baseline_iters;
      kpa::detail::with_cache_storage<C>(params_.kv_cache_dtype, [&](auto storage) {
        using S = typename decltype(storage)::type;
        r.naive_us = time_us(0, iters, [&] {
          naive_attention<Space, S>(Space(), baseline_out_, query_, key_cache_, value_cache_, block_tables_, seq_lens_,
                                    params_);
        })[iters / 2];
#ifdef KPA_BENCH_DENSE_BASELINE
        DenseAttention<Space, S> dense;
        r.dense_us = time_us(1, iters, [&] {
          dense(Space(), baseline_out_, query_, key_cache_, value_cache_, block_tables_, seq_lens_, params_);
        })[iters / 2];
#endif
      });
    }
    return r;
  }

 private:
  /// Max |kpa - float64 reference| over 16 sampled (sequence, head) pairs, with the tests'
  /// reference (unit_tests/reference.hpp) run on the sampled sequences as the cache holds them.
  double check_sample() {
    const auto q = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), query_);
    const auto out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out_);
    const auto k = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), key_cache_);
    const auto v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), value_cache_);
    const auto bt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), block_tables_);
    const auto slopes = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), alibi_);
    const int x = static_cast<int>(16 / sizeof(C)), D = w_.head_size, B = w_.block_size;
    std::mt19937 rng(3);
    std::vector<std::pair<int, int>> samples;  // (sequence, head)
    for (int i = 0; i < 16; ++i) samples.emplace_back(rng() % w_.batch_size, rng() % w_.num_query_heads);
    double worst = 0.0;
    kpa::detail::with_cache_storage<C>(params_.kv_cache_dtype, [&](auto storage) {
      using S = typename decltype(storage)::type;
      for (const auto& [s, h] : samples) {
        // A one-sequence problem holding sequence s, its blocks renumbered 0, 1, ...
        kpa_test::HostProblem p;
        p.num_seqs = 1;
        p.num_heads = w_.num_query_heads;
        p.num_kv_heads = w_.num_kv_heads;
        p.head_size = D;
        p.block_size = B;
        p.num_blocks = p.max_blocks_per_seq = blocks_per_seq_;
        p.scale = params_.scale;
        p.seq_lens = {w_.seq_len};
        p.query_start_loc = {0, w_.query_len};
        p.soft_cap = w_.soft_cap;
        p.window = w_.sliding_window;
        if (w_.sinks) {
          const auto sinks = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sinks_);
          for (int hh = 0; hh < w_.num_query_heads; ++hh) p.sinks.push_back(sinks(hh));
        }
        p.block_tables.resize(blocks_per_seq_);
        std::iota(p.block_tables.begin(), p.block_tables.end(), 0);
        for (int i = 0; i < w_.query_len; ++i)
          for (int hh = 0; hh < p.num_heads; ++hh)
            for (int d = 0; d < D; ++d) p.query.push_back(kpa::to_float(q(s * w_.query_len + i, hh, d)));
        for (std::size_t hh = 0; hh < slopes.extent(0); ++hh) p.alibi.push_back(slopes(hh));
        p.keys.resize(static_cast<std::size_t>(blocks_per_seq_) * p.num_kv_heads * B * D);
        p.values.resize(p.keys.size());
        for (int b = 0; b < blocks_per_seq_; ++b)
          for (int g = 0; g < p.num_kv_heads; ++g)
            for (int o = 0; o < B; ++o)
              for (int d = 0; d < D; ++d) {
                p.keys[p.kv_index(b, g, o, d)] = cache_value<S>(k(bt(s, b), g, d / x, o, d % x), params_.k_scale);
                p.values[p.kv_index(b, g, o, d)] = cache_value<S>(v(bt(s, b), g, d, o), params_.v_scale);
              }
        const kpa_test::ReferenceResult ref = kpa_test::reference_rows(p, h);
        for (int i = 0; i < w_.query_len; ++i)
          for (int d = 0; d < D; ++d) {
            const double want = ref.out[(static_cast<std::size_t>(i) * p.num_heads + h) * D + d];
            worst = std::max(worst, std::fabs(kpa::to_float(out(s * w_.query_len + i, h, d)) - want));
          }
      }
    });
    return worst;
  }

  Workload w_;
  int blocks_per_seq_ = 0, partition_ = 0;
  Kokkos::View<T***, Kokkos::LayoutRight, Memory> query_, out_, baseline_out_;
  Kokkos::View<C*****, Kokkos::LayoutRight, Memory> key_cache_;
  Kokkos::View<C****, Kokkos::LayoutRight, Memory> value_cache_;
  Kokkos::View<int**, Kokkos::LayoutRight, Memory> block_tables_;
  Kokkos::View<int*, Memory> seq_lens_;
  Kokkos::View<float*, Memory> alibi_;
  Kokkos::View<float***, Kokkos::LayoutRight, Memory> exp_sums_, max_logits_;
  Kokkos::View<T****, Kokkos::LayoutRight, Memory> tmp_out_;
  Kokkos::View<int*, Memory> query_start_loc_;
  Kokkos::View<float*, Memory> sinks_;
  kpa::AttentionExtras<Space> extras_;
  kpa::AttentionParams params_;
  kpa::Workspace<Space> workspace_;
};

Result run_workload(const Workload& w, const Options& o, const MachineLimits& limits,
                    const std::shared_ptr<CacheFlusher<Space>>& flush) {
  const bool fp8 = w.kv_cache_dtype != "auto";
  auto go = [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    auto run = [&](auto&& bench) {
      if (flush) bench.before_each = [flush] { (*flush)(); };
      return bench.run(o, limits);
    };
    if (fp8) return run(Bench<T, std::uint8_t>(w, o.seed));
    return run(Bench<T, T>(w, o.seed));
  };
  if (w.dtype == "float") return go(static_cast<float*>(nullptr));
  if (w.dtype == "bfloat16") return go(static_cast<kpa::bfloat16*>(nullptr));
  return go(static_cast<kpa::half*>(nullptr));
}

std::string fixed(double v, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

void print_table(const std::vector<Result>& results, const MachineLimits& limits) {
  std::printf("\nmachine: %s, %d threads; measured read bandwidth %.1f GB/s, FMA throughput %.1f GFLOP/s (%s probes)",
              Space::name(), static_cast<int>(Space().concurrency()), limits.read_bytes_per_s / 1e9,
              limits.flop_per_s / 1e9, probe_kind<Space>().c_str());
  if (limits.tile_flop_per_s > 0.0) std::printf(", AMX throughput %.1f GFLOP/s", limits.tile_flop_per_s / 1e9);
  std::printf("\n%%roof: of the larger lower bound, the KV read at the bandwidth or the multiply-adds at the throughput "
              "of what runs them (AMX for the passes of prefill rows on the AMX level, FMA otherwise)\n");
  std::printf("%-22s %-4s %-5s %-8s %10s %10s %8s %6s %8s %6s %6s %-22s %9s %9s %9s\n", "workload", "ver", "dtype",
              "kv", "median_us", "min_us", "KV_GB/s", "%bw", "paged", "%paged", "%roof", "plan", "vs_naive",
              "vs_dense", "max_err");
  for (const Result& r : results) {
    std::printf("%-22s %-4s %-5s %-8s %10.1f %10.1f %8.2f %6.1f %8s %6s %6.1f %-22s %9s %9s %9s\n", r.w.name.c_str(),
                r.w.version.c_str(), r.w.dtype == "bfloat16" ? "bf16" : r.w.dtype == "half" ? "f16" : "f32",
                r.w.kv_cache_dtype.c_str(), r.median_us, r.min_us, r.kv_gbps, r.bandwidth_pct,
                r.paged_read_gbps ? fixed(*r.paged_read_gbps, 2).c_str() : "-",
                r.paged_pct ? fixed(*r.paged_pct, 1).c_str() : "-", r.roofline_pct, r.plan.c_str(),
                r.naive_us ? (fixed(*r.naive_us / r.median_us, 1) + "x").c_str() : "-",
                r.dense_us ? (fixed(*r.dense_us / r.median_us, 1) + "x").c_str() : "-",
                r.max_abs_err ? fixed(*r.max_abs_err, 6).c_str() : "-");
  }
}

/// One workload's record, as JSON and CSV write it (the machine's measured limits ride along).
nlohmann::ordered_json record(const Result& r, const MachineLimits& limits) {
  auto optional = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  auto speedup = [&](const std::optional<double>& us) {
    return us ? nlohmann::json(*us / r.median_us) : nlohmann::json(nullptr);
  };
  return {{"name", r.w.name},
          {"version", r.w.version},
          {"batch_size", r.w.batch_size},
          {"seq_len", r.w.seq_len},
          {"num_query_heads", r.w.num_query_heads},
          {"num_kv_heads", r.w.num_kv_heads},
          {"head_size", r.w.head_size},
          {"block_size", r.w.block_size},
          {"use_alibi", r.w.use_alibi},
          {"dtype", r.w.dtype},
          {"kv_cache_dtype", r.w.kv_cache_dtype},
          {"median_us", r.median_us},
          {"min_us", r.min_us},
          {"kv_bytes", r.kv_bytes},
          {"kv_gbps", r.kv_gbps},
          {"bandwidth_pct", r.bandwidth_pct},
          {"gflops", r.gflops},
          {"roofline_pct", r.roofline_pct},
          {"paged_read_gbps", optional(r.paged_read_gbps)},
          {"paged_pct", optional(r.paged_pct)},
          {"max_abs_err", optional(r.max_abs_err)},
          {"speedup_vs_naive", speedup(r.naive_us)},
          {"speedup_vs_dense", speedup(r.dense_us)},
          {"plan", r.plan},
          {"execution_space", Space::name()},
          {"machine_read_gbps", limits.read_bytes_per_s / 1e9},
          {"machine_fma_gflops", limits.flop_per_s / 1e9},
          {"machine_amx_gflops", limits.tile_flop_per_s > 0.0 ? nlohmann::json(limits.tile_flop_per_s / 1e9)
                                                              : nlohmann::json(nullptr)},
          {"compute_limit", r.on_tiles && limits.tile_flop_per_s > 0.0 ? "amx" : "fma"},
          {"machine_probes", probe_kind<Space>()},
          {"kpa_version", kpa::version_string}};
}

void write_json(const std::string& path, const std::vector<nlohmann::ordered_json>& records) {
  std::ofstream(path) << nlohmann::ordered_json(records).dump(2) << "\n";
}

/// The same records, one line each; null fields empty, strings unquoted (none holds a comma).
void write_csv(const std::string& path, const std::vector<nlohmann::ordered_json>& records) {
  std::ofstream out(path);
  if (records.empty()) return;
  const char* separator = "";
  for (const auto& field : records.front().items()) out << std::exchange(separator, ",") << field.key();
  out << "\n";
  for (const auto& record : records) {
    separator = "";
    for (const auto& field : record.items()) {
      out << std::exchange(separator, ",");
      if (field.value().is_string()) {
        out << field.value().get<std::string>();
      } else if (!field.value().is_null()) {
        out << field.value().dump();
      }
    }
    out << "\n";
  }
}

int run(const Options& o) {
  if (o.in_flight_probe) {
    const std::vector<InFlightPoint> points = in_flight_probe(Space());
    if (points.empty()) {
      std::fprintf(stderr, "[kpa-bench] --in-flight-probe needs a GPU back end (%s has no SMs)\n", Space::name());
      return 2;
    }
    std::printf("loads/lane  warps/SM  in flight/SM (KiB)  read (GB/s)  implied latency (us)\n");
    nlohmann::json rows = nlohmann::json::array();
    for (const InFlightPoint& p : points) {
      std::printf("%10d  %8d  %18.1f  %11.1f  %20.2f\n", p.loads_per_lane, p.warps_per_sm, p.in_flight_bytes / 1024,
                  p.bytes_per_s / 1e9, p.latency_us);
      rows.push_back({{"loads_per_lane", p.loads_per_lane}, {"warps_per_sm", p.warps_per_sm},
                      {"in_flight_bytes_per_sm", p.in_flight_bytes}, {"read_gbps", p.bytes_per_s / 1e9},
                      {"latency_us", p.latency_us}});
    }
    if (!o.json.empty()) std::ofstream(o.json) << nlohmann::json{{"in_flight_probe", rows}}.dump(2) << "\n";
    return 0;
  }
  std::fprintf(stderr, "[kpa-bench] measuring the machine's read bandwidth and FMA throughput\n");
  const MachineLimits limits = measure_machine_limits(Space());
  const auto flush = o.warm_cache ? std::shared_ptr<CacheFlusher<Space>>() : std::make_shared<CacheFlusher<Space>>(Space());
  std::vector<Result> results;
  for (std::size_t i = 0; i < o.workloads.size(); ++i) {
    const Workload& w = o.workloads[i];
    std::fprintf(stderr, "[kpa-bench] %zu/%zu %s: %s, %d x %d tokens, %d/%d heads, head %d, %s cache\n", i + 1,
                 o.workloads.size(), w.name.c_str(), w.version.c_str(), w.batch_size, w.seq_len, w.num_query_heads,
                 w.num_kv_heads, w.head_size, w.kv_cache_dtype == "auto" ? w.dtype.c_str() : w.kv_cache_dtype.c_str());
    try {
      results.push_back(run_workload(w, o, limits, flush));
    } catch (const kpa::Error& e) {
      std::fprintf(stderr, "kpa-bench: %s: %s\n", w.name.c_str(), e.what());
      return 2;
    }
  }
  std::fflush(stderr);
  print_table(results, limits);
  std::vector<nlohmann::ordered_json> records;
  for (const Result& r : results) records.push_back(record(r, limits));
  if (!o.json.empty()) write_json(o.json, records);
  if (!o.csv.empty()) write_csv(o.csv, records);
  return 0;
}

}  // namespace
}  // namespace kpa_bench

int main(int argc, char** argv) {
  const kpa_bench::Options options = kpa_bench::parse(argc, argv);
  Kokkos::initialize(argc, argv);
  const int status = kpa_bench::run(options);
  Kokkos::finalize();
  return status;
}
