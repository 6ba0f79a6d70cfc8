#pragma once
// The two kernels behind every paged-attention entry point.
//
// PartitionKernel: one team walks its even share of tiles, a tile being one (sequence, kv head,
// partition). A tile's rows are the sequence's query tokens x the GQA group's query heads; they
// are computed in passes of up to Path::rows rows (a compile-time constant the planner chose), so
// every pass reads each K/V element once for all of its rows. A pass loads the pre-scaled
// queries into team scratch, hands its kernel path a PassContext (HostPath: CPU-shaped; DevicePath:
// GPU-shaped; the same online softmax, SoftmaxReducer and AttentionVariant), and stores the
// normalised output and LSE (Output::Final) or vLLM's v2 partition triple max_logits / exp_sums /
// tmp_out (Output::Partition). The paths never see the kernel.
//
// PartitionReduceKernel: one team per (query token, query head) share; merges the partition
// states (and the sink) with the same SoftmaxReducer and sums the normalised partition outputs
// by their shares.

#include <kpa/detail/device_path.hpp>
#include <kpa/detail/host_path.hpp>
#include <kpa/detail/kernel_params.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/numeric_types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace kpa::detail {

/// A query row's final softmax state turned into its output factor (o times this is the row's
/// output) and its log-sum-exp, the variant's sink (if any) joining the denominator. No key
/// attended and no sink: output 0, LSE -inf. A NaN sum (corrupt data) stays NaN in both.
struct FinalRow {
  float out_factor;
  float lse;

  KOKKOS_INLINE_FUNCTION FinalRow(const AttentionVariant& variant, SoftmaxState state, int head, float value_scale) {
    const float weight = variant.join_sink(state, head);
    out_factor = state.exp_sum == 0.0f ? 0.0f : weight * value_scale / state.exp_sum;
    lse = state.log_sum_exp();
  }
};

template <class Space, class Path, class T, class TmpT>
struct PartitionKernel {
  static constexpr int H = Path::rows;
  using CacheT = typename Path::cache_type;  ///< element type the caches are read as (fp8 formats for byte caches)
  using execution_space = Space;
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::Schedule<Kokkos::Dynamic>, compat::KernelArgumentLaunch,
                                         typename Path::launch_bounds>;
  using member_type = typename policy_type::member_type;
  using views_type = AttentionViews<Space, T, TmpT>;

  // What a kernel path is (HostPath, DevicePath): H rows of a pass over caches read as CacheT;
  // whether its team scratch is always level 0; its launch bounds; where query element (r, d) of
  // the pass sits in scratch; which members and lanes load and store which spans of the rows; and
  // attend(), one pass over a tile's keys into the rows' states and their outputs in scratch.
  static_assert(H >= 1 && H <= 32, "a kernel path computes 1 to 32 rows per pass");
  static_assert(std::is_same_v<decltype(Path::scratch_in_level0), const bool>, "Path::scratch_in_level0");
  static_assert(std::is_same_v<decltype(&Path::query_index), int (*)(int, int, int)>, "Path::query_index(r, d, D)");
  static_assert(std::is_void_v<decltype(Path::for_row_spans(std::declval<const member_type&>(), 0, 0,
                                                            std::declval<void (*)(int, int, int)>()))>,
                "Path::for_row_spans(member, rows, D, f(r, d_begin, d_end))");
  static_assert(std::is_void_v<decltype(std::declval<const Path&>().load_span(
                    std::declval<const T*>(), std::size_t{}, 0.0f, std::declval<float*>(), 0))>,
                "Path::load_span(src, stride, scale, dst, n)");
  static_assert(std::is_same_v<decltype(std::declval<const Path&>().query_factor(0.0f, false)), float>,
                "Path::query_factor(scale, of_several_passes)");
  static_assert(std::is_void_v<decltype(std::declval<const Path&>().store_span(
                    std::declval<const float*>(), 0.0f, std::declval<T*>(), std::size_t{}, 0))>,
                "Path::store_span(src, factor, dst, stride, n)");
  static_assert(std::is_void_v<decltype(std::declval<const Path&>().attend(
                    std::declval<const member_type&>(), std::declval<const PassContext<H, CacheT>&>(),
                    std::declval<SoftmaxStates<H>&>()))>,
                "Path::attend(member, pass context, running states)");

  views_type views;  ///< the call's views (the caches as raw pointers, typed below)
  const CacheT* key_cache;
  const CacheT* value_cache;
  KernelParams params;
  AttentionVariant variant;
  Path path;

  PartitionKernel(const views_type& call_views, const KernelParams& kernel_params, const AttentionVariant& rules,
                  const Path& kernel_path)
      : views(call_views),
        key_cache(static_cast<const CacheT*>(call_views.key_cache)),
        value_cache(static_cast<const CacheT*>(call_views.value_cache)),
        params(kernel_params),
        variant(rules),
        path(kernel_path) {}

  /// One pass's rows and keys, the kernel's own bookkeeping (its path gets a PassContext).
  struct Pass {
    int seq, kv_head;
    int first_row;    ///< the tile's row that is the pass's row 0
    int rows;         ///< real rows (<= H)
    int query_start;  ///< the sequence's first row of query / out
    int query_len;    ///< its query tokens: the last query_len of its seq_len tokens
    int seq_len, begin, end, partition;
    int tile_end;  ///< end before the pass's rows narrowed it: what every pass of the tile may read
  };

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    // A literal level 0 lets a GPU compiler address the path's scratch as shared memory; host back
    // ends, whose levels are all memory alike, take the plan's level.
    constexpr bool fixed_level0 =
        Path::scratch_in_level0 && !Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
    const TileScratch scratch = fixed_level0 ? TileScratch::carve(member, 0, params.scratch)
                                             : TileScratch::carve(member, params.scratch_level, params.scratch);
    int first = 0, count = 0;
    even_share(params.tiles, params.league_size, member.league_rank(), first, count);
    for (int tile = first; tile < first + count; ++tile) run_tile(member, scratch, tile);
  }

  KOKKOS_INLINE_FUNCTION void run_tile(const member_type& member, const TileScratch& scratch, int tile) const {
    // Tiles go kv head fastest: a team's run of tiles takes the heads of one stretch of blocks
    // one after the other, while that stretch's page-table entries are still in the caches.
    const int kv_head = tile % params.num_kv_heads;
    const int seq_partition = tile / params.num_kv_heads;
    const int partition = seq_partition % params.num_partitions;
    const int seq = seq_partition / params.num_partitions;
    const int seq_len = views.seq_lens(seq);
    int query_start = seq, query_len = 1;
    if (params.several_query_tokens) {
      query_start = views.query_start_loc(seq);
      query_len = views.query_start_loc(seq + 1) - query_start;
    }
    const int rows = query_len * params.group_size;
    const int begin = variant.span_begin(seq_len, query_len, params.block_size) + partition * params.partition_size;
    if (begin >= seq_len) {
      // Partitions past the sequence are neither written nor read; an empty sequence (whose one
      // decode row has nothing to attend) has output 0.
      if (params.output == Output::Final && partition == 0) {
        store_empty(member, Pass{seq, kv_head, 0, rows, query_start, query_len, seq_len, 0, 0, 0, 0});
      }
      return;
    }
    const int end = (seq_len - begin < params.partition_size) ? seq_len : begin + params.partition_size;
    const int B = params.block_size;
    for (int row0 = 0; row0 < rows; row0 += H) {
      // The last pass may have fewer real rows: its padding rows have zero queries and are never stored.
      Pass pass{seq, kv_head, row0, (rows - row0 < H) ? rows - row0 : H, query_start, query_len, seq_len, begin, end,
                partition, end};
      // Only the keys some row of the pass attends, from the block holding the first of them (rows
      // go by query token, so the first row has the earliest keys and the last row the latest).
      const int first = variant.first_key(row_position(pass, 0));
      if (first > pass.begin) pass.begin += (first - pass.begin) / B * B;
      const int last = row_position(pass, pass.rows - 1) + 1;
      if (last < pass.end) pass.end = last;
      run_pass(member, scratch, pass, rows > H ? tile : -1);  // with nothing to attend it stores empty states
    }
  }

  KOKKOS_INLINE_FUNCTION void run_pass(const member_type& member, const TileScratch& scratch, const Pass& pass,
                                       int tile_of_passes) const {
    load_query(member, scratch, pass, tile_of_passes >= 0);
    SoftmaxStates<H> running;  // identical in every worker of the team
    path.attend(member, context(scratch, pass, tile_of_passes), running);
    store(member, scratch, pass, running);
  }

  /// What the kernel path sees of a pass.
  KOKKOS_INLINE_FUNCTION PassContext<H, CacheT> context(const TileScratch& scratch, const Pass& pass, int tile) const {
    PassContext<H, CacheT> c;
    c.key_head = key_cache + pass.kv_head * params.cache_head_stride;
    c.value_head = value_cache + pass.kv_head * params.cache_head_stride;
    c.block_stride = params.cache_block_stride;
    c.block_table = views.block_tables.data() + pass.seq * views.block_tables.stride(0);
    c.table_stride = static_cast<std::int64_t>(views.block_tables.stride(1));
    c.begin = pass.begin;
    c.end = pass.end;
    c.tile_end = pass.tile_end;
    c.head_size = params.head_size;
    c.block_size = params.block_size;
    c.chunk_tokens = params.chunk_tokens;
    c.scale = params.scale;
    for (int r = 0; r < H; ++r) {
      const int real = r < pass.rows ? r : pass.rows - 1;  // padding rows follow the last real row's rules
      c.row[r] = variant.row(row_head(pass, real), row_position(pass, real));
    }
    c.variant = variant;
    c.scratch = scratch;
    c.tile = tile;
    c.probability_parts = probability_parts_for<T>();
    return c;
  }

  // A pass's row r: query token (a row of query / out), query head, and absolute position.
  KOKKOS_INLINE_FUNCTION int row_token(const Pass& pass, int r) const {
    return pass.query_start + (pass.first_row + r) / params.group_size;
  }
  KOKKOS_INLINE_FUNCTION int row_head(const Pass& pass, int r) const {
    return pass.kv_head * params.group_size + (pass.first_row + r) % params.group_size;
  }
  KOKKOS_INLINE_FUNCTION int row_position(const Pass& pass, int r) const {
    return pass.seq_len - pass.query_len + (pass.first_row + r) / params.group_size;
  }

  /// q = query * Path::query_factor(scale, ...) (zeros for padding rows) and o = 0 in scratch.
  KOKKOS_INLINE_FUNCTION void load_query(const member_type& member, const TileScratch& s, const Pass& pass,
                                         bool of_several_passes) const {
    const int D = params.head_size;
    Path::for_row_spans(member, H, D, [&](int r, int d0, int d1) {
      for (int d = d0; d < d1; ++d) s.o[r * D + d] = 0.0f;
      // A span's elements are consecutive in every path's query layout.
      if (r < pass.rows) {
        path.load_span(&views.query(row_token(pass, r), row_head(pass, r), d0), views.query.stride(2),
                       path.query_factor(params.scale, of_several_passes), s.q + Path::query_index(r, d0, D), d1 - d0);
      } else {
        for (int d = d0; d < d1; ++d) s.q[Path::query_index(r, d, D)] = 0.0f;
      }
    });
    member.team_barrier();
  }

  KOKKOS_INLINE_FUNCTION FinalRow final_row(const Pass& pass, int r, const SoftmaxState& state) const {
    return FinalRow(variant, state, row_head(pass, r), params.value_scale);
  }

  /// The pass's results: out (and lse when asked for), or tmp_out with max_logits and exp_sums.
  KOKKOS_INLINE_FUNCTION void store(const member_type& member, const TileScratch& s, const Pass& pass,
                                    const SoftmaxStates<H>& running) const {
    const int D = params.head_size;
    // Each row's output factor (into scratch the kernel paths are done with): the sink and
    // fp8 value scale included; fp8 values are dequantised here, the output being linear in V.
    float* factor = s.running;
    member.team_barrier();  // every worker has read the kernel path's running state
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      for (int r = 0; r < pass.rows; ++r) {
        const int token = row_token(pass, r), head = row_head(pass, r);
        if (params.output == Output::Partition) {
          const float exp_sum = running.head[r].exp_sum;  // a NaN sum stays NaN
          factor[r] = exp_sum == 0.0f ? 0.0f : params.value_scale / exp_sum;
          views.max_logits(token, head, pass.partition) = running.head[r].max_logit;
          views.exp_sums(token, head, pass.partition) = exp_sum;
        } else {
          const FinalRow row = final_row(pass, r, running.head[r]);
          factor[r] = row.out_factor;
          if (views.lse.extent(0) > 0) views.lse(token, head) = row.lse;
        }
      }
    });
    member.team_barrier();
    Path::for_row_spans(member, pass.rows, D, [&](int r, int d0, int d1) {
      const int token = row_token(pass, r), head = row_head(pass, r);
      if (params.output == Output::Final) {
        path.store_span(s.o + r * D + d0, factor[r], &views.out(token, head, d0), views.out.stride(2), d1 - d0);
      } else {
        path.store_span(s.o + r * D + d0, factor[r], &views.tmp_out(token, head, pass.partition, d0),
                        views.tmp_out.stride(3), d1 - d0);
      }
    });
    member.team_barrier();  // the next pass reuses the scratch
  }

  /// Output 0 (and the LSE of nothing attended) for every row of `pass`.
  KOKKOS_INLINE_FUNCTION void store_empty(const member_type& member, const Pass& pass) const {
    const int D = params.head_size;
    Path::for_row_spans(member, pass.rows, D, [&](int r, int d0, int d1) {
      for (int d = d0; d < d1; ++d) views.out(row_token(pass, r), row_head(pass, r), d) = from_float<T>(0.0f);
    });
    if (views.lse.extent(0) > 0) {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, pass.rows), [&](int r) {
        views.lse(row_token(pass, r), row_head(pass, r)) = final_row(pass, r, SoftmaxState{}).lse;
      });
    }
  }
};

template <class Space, class T, class TmpT>
struct PartitionReduceKernel {
  using policy_type = Kokkos::TeamPolicy<Space, compat::KernelArgumentLaunch>;
  using member_type = typename policy_type::member_type;
  using scratch_view = Kokkos::View<float*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using views_type = AttentionViews<Space, T, TmpT>;

  views_type views;        ///< the call's views (the reduce reads the partition triple, writes out / lse)
  KernelParams params;     ///< the partition kernel's
  AttentionVariant variant;
  int num_heads = 0;
  int num_seqs = 0;
  int items = 0;           ///< query rows x num_heads
  int league_size = 0;
  int scratch_level = 0;

  PartitionReduceKernel(const views_type& call_views, const KernelParams& kernel_params, const AttentionVariant& rules,
                        int heads, int seqs, int rows, int league, int level)
      : views(call_views),
        params(kernel_params),
        variant(rules),
        num_heads(heads),
        num_seqs(seqs),
        items(rows * heads),
        league_size(league),
        scratch_level(level) {}

  /// The sequence of query row `token`: the last s with query_start_loc(s) <= token.
  KOKKOS_INLINE_FUNCTION int sequence_of(int token) const {
    if (!params.several_query_tokens) return token;
    int lo = 0, hi = num_seqs;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      if (views.query_start_loc(mid) <= token) lo = mid; else hi = mid;
    }
    return lo;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    scratch_view shares(member.team_scratch(scratch_level), params.num_partitions);
    int first = 0, count = 0;
    even_share(items, league_size, member.league_rank(), first, count);
    for (int item = first; item < first + count; ++item) {
      const int token = item / num_heads;
      const int head = item % num_heads;
      const int seq = sequence_of(token);
      const int query_len = params.several_query_tokens ? views.query_start_loc(seq + 1) - views.query_start_loc(seq) : 1;
      // Bounded by the plan even when seq_lens exceeds max_seq_len (unchecked indices).
      const int seq_len = views.seq_lens(seq);
      const int span = seq_len - variant.span_begin(seq_len, query_len, params.block_size);
      const int needed = span > 0 ? (span - 1) / params.partition_size + 1 : 0;
      const int partitions = needed < params.num_partitions ? needed : params.num_partitions;
      SoftmaxState total;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, partitions),
          [&](int p, SoftmaxState& state) {
            state.merge(SoftmaxState{views.max_logits(token, head, p), views.exp_sums(token, head, p)});
          },
          SoftmaxReducer<Space>(total));
      // The sink joins the denominator only: it lowers every partition's share.
      variant.join_sink(total, head);
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, partitions), [&](int p) {
        shares(p) = total.share_of(SoftmaxState{views.max_logits(token, head, p), views.exp_sums(token, head, p)});
      });
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, params.head_size), [&](int d) {
        float acc = 0.0f;
        for (int p = 0; p < partitions; ++p) acc += shares(p) * to_float(views.tmp_out(token, head, p, d));
        views.out(token, head, d) = from_float<T>(acc);
      });
      if (views.lse.extent(0) > 0) {
        Kokkos::single(Kokkos::PerTeam(member), [&]() { views.lse(token, head) = total.log_sum_exp(); });
      }
      member.team_barrier();
    }
  }
};

}  // namespace kpa::detail
