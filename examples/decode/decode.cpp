// Decodes one step of a batch of sequences with kpa's automatic paged attention: fills a paged
// f16 KV cache with random keys and values, times the call, and checks the result against
// paged_attention_v1 on the same inputs.
//
//   kpa-decode [--batch N] [--seq-len L] [--heads H] [--kv-heads K] [--head-size D]
//              [--block-size B] [--iters I]

#include <kpa/kpa.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

struct Options {
  int batch = 8;
  int seq_len = 1000;
  int heads = 32;
  int kv_heads = 8;
  int head_size = 128;
  int block_size = 16;
  int iters = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kpa-decode: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: kpa-decode [--batch N] [--seq-len L] [--heads H] [--kv-heads K] [--head-size D]\n"
          "                  [--block-size B] [--iters I]\n"
          "Decodes one step of N sequences of L tokens (f16 paged cache) with kpa::paged_attention,\n"
          "checks the result against paged_attention_v1 and prints the plan and the time per call.\n");
      std::exit(0);
    } else if (arg == "--batch") o.batch = next();
    else if (arg == "--seq-len") o.seq_len = next();
    else if (arg == "--heads") o.heads = next();
    else if (arg == "--kv-heads") o.kv_heads = next();
    else if (arg == "--head-size") o.head_size = next();
    else if (arg == "--block-size") o.block_size = next();
    else if (arg == "--iters") o.iters = next();
    else if (arg.rfind("--kokkos", 0) == 0) continue;
    else {
      std::fprintf(stderr, "kpa-decode: unknown option %s\n", arg.c_str());
      std::exit(2);
    }
  }
  return o;
}

int run(const Options& o) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Memory = Space::memory_space;
  const Space space;
  const int x = 16 / sizeof(kpa::half);
  const int blocks_per_seq = (o.seq_len + o.block_size - 1) / o.block_size;
  const int num_blocks = o.batch * blocks_per_seq;

  Kokkos::View<kpa::half***, Kokkos::LayoutRight, Memory> query("query", o.batch, o.heads, o.head_size);
  Kokkos::View<kpa::half***, Kokkos::LayoutRight, Memory> out("out", o.batch, o.heads, o.head_size);
  Kokkos::View<kpa::half***, Kokkos::LayoutRight, Memory> out_v1("out_v1", o.batch, o.heads, o.head_size);
  Kokkos::View<kpa::half*****, Kokkos::LayoutRight, Memory> key_cache("key_cache", num_blocks, o.kv_heads,
                                                                      o.head_size / x, o.block_size, x);
  Kokkos::View<kpa::half****, Kokkos::LayoutRight, Memory> value_cache("value_cache", num_blocks, o.kv_heads,
                                                                       o.head_size, o.block_size);
  Kokkos::View<int**, Kokkos::LayoutRight, Memory> block_tables("block_tables", o.batch, blocks_per_seq);
  Kokkos::View<int*, Memory> seq_lens("seq_lens", o.batch);
  Kokkos::View<float*, Memory> no_alibi("alibi", 0);

  // Random contents; blocks handed out in a shuffled order, as a serving engine's allocator would.
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Space>(space, 0, key_cache.size()), KOKKOS_LAMBDA(std::size_t i) {
        const auto hash = [](std::size_t v) { return ((v * 2654435761u) % 20011u) / 10005.5f - 1.0f; };
        key_cache.data()[i] = kpa::to_half(hash(i));
        value_cache.data()[i] = kpa::to_half(hash(i + 7919));
        if (i < query.size()) query.data()[i] = kpa::to_half(hash(i + 104729));
      });
  std::vector<int> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(42));
  auto tables = Kokkos::create_mirror_view(block_tables);
  auto lens = Kokkos::create_mirror_view(seq_lens);
  for (int s = 0; s < o.batch; ++s) {
    lens(s) = o.seq_len;
    for (int b = 0; b < blocks_per_seq; ++b) tables(s, b) = order[s * blocks_per_seq + b];
  }
  Kokkos::deep_copy(block_tables, tables);
  Kokkos::deep_copy(seq_lens, lens);

  kpa::AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(o.head_size));
  kpa::Workspace<Space> workspace;
  auto decode = [&]() {
    kpa::paged_attention(space, workspace, out, query, key_cache, value_cache, block_tables, seq_lens, o.seq_len,
                         no_alibi, params);
  };
  decode();  // warm-up (and workspace allocation)
  space.fence();
  std::vector<double> times;
  for (int i = 0; i < o.iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    decode();
    space.fence();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  kpa::paged_attention_v1(space, out_v1, query, key_cache, value_cache, block_tables, seq_lens, o.seq_len, no_alibi,
                          params);
  space.fence();

  const auto result = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  const auto check = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out_v1);
  double max_diff = 0.0, checksum = 0.0;
  for (std::size_t i = 0; i < result.size(); ++i) {
    const double a = kpa::to_float(result.data()[i]);
    max_diff = std::max(max_diff, std::fabs(a - kpa::to_float(check.data()[i])));
    checksum += a;
  }
  const double kv_bytes = 2.0 * o.batch * o.seq_len * o.kv_heads * o.head_size * sizeof(kpa::half);
  const double median = times[times.size() / 2];
  std::printf("kpa %s on %s, Kokkos %d\n", kpa::version_string, Space::name(), KOKKOS_VERSION);
  std::printf("batch %d x %d tokens, %d/%d heads, head_size %d, block_size %d, f16 cache\n", o.batch, o.seq_len,
              o.heads, o.kv_heads, o.head_size, o.block_size);
  std::printf("plan: %s\n", kpa::to_string(workspace.last_plan()).c_str());
  std::printf("out[0][0][0:4] = %.5f %.5f %.5f %.5f   checksum %.6f\n", kpa::to_float(result(0, 0, 0)),
              kpa::to_float(result(0, 0, 1)), kpa::to_float(result(0, 0, 2)), kpa::to_float(result(0, 0, 3)),
              checksum);
  std::printf("max |auto - v1| = %.3g\n", max_diff);
  std::printf("time per call: median %.1f us, min %.1f us over %d calls; KV read %.2f GB/s (median)\n", median,
              times.front(), o.iters, kv_bytes / median / 1e3);
  return max_diff <= 1e-3 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  Kokkos::initialize(argc, argv);
  int status = 0;
  try {
    status = run(options);
  } catch (const kpa::Error& e) {
    std::fprintf(stderr, "kpa-decode: %s\n", e.what());
    status = 2;
  }
  Kokkos::finalize();
  return status;
}
