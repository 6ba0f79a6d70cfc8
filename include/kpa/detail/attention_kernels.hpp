#pragma once
// The two kernels behind every paged-attention entry point.
//
// PartitionKernel: one team walks its even share of tiles, a tile being one (sequence, kv head,
// partition). A tile's rows are the sequence's query tokens x the GQA group's query heads; they
// are computed in passes of up to H rows (H is a compile-time constant chosen by the planner),
// so every pass reads each K/V element once for all of its rows. A pass loads the pre-scaled
// queries into team scratch, runs the kernel path's attend() over the keys its rows attend
// (HostPath: CPU-shaped, DevicePath: GPU-shaped; same online softmax, same SoftmaxReducer, the
// same AttentionVariant for caps and masks), and stores the normalised output and LSE
// (Output::Final) or vLLM's v2 partition triple max_logits / exp_sums / tmp_out
// (Output::Partition).
//
// PartitionReduceKernel: one team per (query token, query head) share; merges the partition
// states (and the sink) with the same SoftmaxReducer and sums the normalised partition outputs
// by their shares.

#include <kpa/detail/device_path.hpp>
#include <kpa/detail/host_path.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/detail/tile.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>

namespace kpa::detail {

/// What the attention kernels read and write, as plain strided views: every caller's views
/// (any layout, managed or not) convert to these, so one kernel instantiation serves them all.
/// The caches are raw pointers: the kernels address them through TileGeometry's strides.
template <class Space, class T, class TmpT>
struct AttentionArgs {
  using memory_space = typename Space::memory_space;
  template <class Data>
  using view = Kokkos::View<Data, Kokkos::LayoutStride, memory_space, Kokkos::MemoryUnmanaged>;

  view<T***> out;                  ///< [num_tokens][num_heads][head_size] (num_tokens = num_seqs in decode)
  view<const T***> query;          ///< [num_tokens][num_heads][head_size]
  const void* key_cache = nullptr;    ///< [num_blocks][num_kv_heads][head_size/x][block_size][x]
  const void* value_cache = nullptr;  ///< [num_blocks][num_kv_heads][head_size][block_size]
  view<const int**> block_tables;  ///< [num_seqs][max_blocks_per_seq]
  view<const int*> seq_lens;       ///< [num_seqs]
  view<const float*> alibi_slopes;  ///< [num_heads] or extent 0: none
  // The automatic entry point's extras (extent 0: absent; see AttentionExtras).
  view<const int*> query_start_loc;  ///< [num_seqs + 1]
  view<const float*> sinks;          ///< [num_heads]
  view<float**> lse;                 ///< [num_tokens][num_heads]
  // vLLM v2's partition triple (Output::Partition, and the reduce's input).
  view<float***> exp_sums;         ///< [num_tokens][num_heads][max_num_partitions]
  view<float***> max_logits;       ///< [num_tokens][num_heads][max_num_partitions]
  view<TmpT****> tmp_out;          ///< [num_tokens][num_heads][max_num_partitions][head_size]
};

/// A query row's final softmax state turned into its output factor (o times this is the row's
/// output) and its log-sum-exp, the sink (if any) joining the denominator. No key attended and
/// no sink: output 0, LSE -inf. A NaN sum (corrupt data) stays NaN in both.
struct FinalRow {
  float out_factor;
  float lse;

  KOKKOS_INLINE_FUNCTION FinalRow(SoftmaxState state, bool has_sink, float sink, float value_scale) {
    float weight = 1.0f;
    if (has_sink) weight = state.merge(SoftmaxState{sink, 1.0f}).self;
    out_factor = state.exp_sum == 0.0f ? 0.0f : weight * value_scale / state.exp_sum;
    lse = state.log_sum_exp();
  }
};

template <class Space, class Path, int H, class CacheT, class T, class TmpT>
struct PartitionKernel {
  using execution_space = Space;
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::Schedule<Kokkos::Dynamic>>;
  using member_type = typename policy_type::member_type;
  using cache_type = CacheT;  ///< element type the caches are read as (fp8 formats for byte caches)
  using args_type = AttentionArgs<Space, T, TmpT>;

  args_type args;  ///< the call's views (the caches as raw pointers, typed below)
  const CacheT* key_cache;
  const CacheT* value_cache;
  TileGeometry geo;
  int scratch_level;

  PartitionKernel(const args_type& call_args, const TileGeometry& geometry, int level)
      : args(call_args),
        key_cache(static_cast<const CacheT*>(call_args.key_cache)),
        value_cache(static_cast<const CacheT*>(call_args.value_cache)),
        geo(geometry),
        scratch_level(level) {}

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    const TileScratchLayout layout(H, geo.head_size, geo.chunk_tokens, geo.block_size);
    const TileScratch scratch = TileScratch::carve(member, scratch_level, layout);
    int first = 0, count = 0;
    even_share(geo.tiles, geo.league_size, member.league_rank(), first, count);
    for (int tile = first; tile < first + count; ++tile) run_tile(member, scratch, tile);
  }

  KOKKOS_INLINE_FUNCTION void run_tile(const member_type& member, const TileScratch& scratch, int tile) const {
    // Tiles go kv head fastest: a team's run of tiles takes the heads of one stretch of blocks
    // one after the other, while that stretch's page-table entries are still in the caches (on
    // a CPU, kv heads that each walked a whole 100K-token sequence alone read it 20-25% slower).
    const int kv_head = tile % geo.num_kv_heads;
    const int seq_partition = tile / geo.num_kv_heads;
    const int partition = seq_partition % geo.num_partitions;
    const int seq = seq_partition / geo.num_partitions;
    const int seq_len = args.seq_lens(seq);
    int query_start = seq, query_len = 1;
    if (geo.several_query_tokens) {
      query_start = args.query_start_loc(seq);
      query_len = args.query_start_loc(seq + 1) - query_start;
    }
    const int rows = query_len * geo.group_size;
    const int begin = geo.variant.span_begin(seq_len, query_len, geo.block_size) + partition * geo.partition_size;
    if (begin >= seq_len) {
      // Partitions past the sequence are neither written nor read; an empty sequence (whose one
      // decode row has nothing to attend) has output 0.
      if (geo.output == Output::Final && partition == 0) store_empty(member, Pass{seq, kv_head, 0, rows, query_start,
                                                                                   query_len, seq_len, 0, 0, 0});
      return;
    }
    const int end = (seq_len - begin < geo.partition_size) ? seq_len : begin + geo.partition_size;
    const int B = geo.block_size;
    for (int row0 = 0; row0 < rows; row0 += H) {
      // The last pass may have fewer real rows: its padding rows have zero queries and are never stored.
      Pass pass{seq, kv_head, row0, (rows - row0 < H) ? rows - row0 : H, query_start, query_len, seq_len, begin, end,
                partition};
      // Only the keys some row of the pass attends, from the block holding the first of them (rows
      // go by query token, so the first row has the earliest keys and the last row the latest).
      const int first = geo.variant.first_key(row_position(pass, 0));
      if (first > pass.begin) pass.begin += (first - pass.begin) / B * B;
      const int last = row_position(pass, pass.rows - 1) + 1;
      if (last < pass.end) pass.end = last;
      run_pass(member, scratch, pass);  // with nothing to attend it stores empty states
    }
  }

  KOKKOS_INLINE_FUNCTION void run_pass(const member_type& member, const TileScratch& scratch, const Pass& pass) const {
    load_query(member, scratch, pass);
    SoftmaxStates<H> running;  // identical in every worker of the team
    Path::template attend<H>(*this, member, scratch, pass, running);
    store(member, scratch, pass, running);
  }

  // A pass's row r: query token (a row of query / out), query head, and absolute position.
  KOKKOS_INLINE_FUNCTION int row_token(const Pass& pass, int r) const {
    return pass.query_start + (pass.first_row + r) / geo.group_size;
  }
  KOKKOS_INLINE_FUNCTION int row_head(const Pass& pass, int r) const {
    return pass.kv_head * geo.group_size + (pass.first_row + r) % geo.group_size;
  }
  KOKKOS_INLINE_FUNCTION int row_position(const Pass& pass, int r) const {
    return pass.seq_len - pass.query_len + (pass.first_row + r) / geo.group_size;
  }
  /// Whether rows may attend different keys (then attend() masks each row to its own range).
  KOKKOS_INLINE_FUNCTION bool masks_rows() const { return geo.several_query_tokens || geo.variant.sliding_window > 0; }
  /// Whether key `key` lies in the range of the row at `position` (the causal window).
  KOKKOS_INLINE_FUNCTION bool in_row_range(int key, int position) const {
    return key <= position && key >= geo.variant.first_key(position);
  }

  /// -inf for the keys outside the row's range in one row of chunk logits (chunk token i is key
  /// chunk_begin + i).
  KOKKOS_INLINE_FUNCTION void mask_row(float* logits, int tokens, int chunk_begin, int position) const {
    if (masks_rows()) {
      const int lo = geo.variant.first_key(position) - chunk_begin, hi = position + 1 - chunk_begin;
      for (int i = 0; i < tokens && i < lo; ++i) logits[i] = -compat::infinity();
      for (int i = hi < 0 ? 0 : hi; i < tokens; ++i) logits[i] = -compat::infinity();
    }
  }

  /// q = query * scale (zeros for padding rows) and o = 0 in scratch.
  KOKKOS_INLINE_FUNCTION void load_query(const member_type& member, const TileScratch& s, const Pass& pass) const {
    const int D = geo.head_size;
    Path::for_row_spans(member, H, D, [&](int r, int d0, int d1) {
      for (int d = d0; d < d1; ++d) s.o[r * D + d] = 0.0f;
      if (r < pass.rows) {
        Path::load_span(geo.host_isa, &args.query(row_token(pass, r), row_head(pass, r), d0), args.query.stride(2),
                        geo.scale,
                        s.q + r * D + d0, d1 - d0);
      } else {
        for (int d = d0; d < d1; ++d) s.q[r * D + d] = 0.0f;
      }
    });
    member.team_barrier();
  }

  KOKKOS_INLINE_FUNCTION FinalRow final_row(const Pass& pass, int r, const SoftmaxState& state) const {
    const float sink = geo.variant.sinks ? args.sinks(row_head(pass, r)) : 0.0f;
    return FinalRow(state, geo.variant.sinks, sink, geo.value_scale);
  }

  /// The pass's results: out (and lse when asked for), or tmp_out with max_logits and exp_sums.
  KOKKOS_INLINE_FUNCTION void store(const member_type& member, const TileScratch& s, const Pass& pass,
                                    const SoftmaxStates<H>& running) const {
    const int D = geo.head_size;
    // Each row's output factor (into scratch the kernel paths are done with): the sink and
    // fp8 value scale included; fp8 values are dequantised here, the output being linear in V.
    float* factor = s.running;
    member.team_barrier();  // every worker has read the kernel path's running state
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      for (int r = 0; r < pass.rows; ++r) {
        const int token = row_token(pass, r), head = row_head(pass, r);
        if (geo.output == Output::Partition) {
          const float exp_sum = running.head[r].exp_sum;  // a NaN sum stays NaN
          factor[r] = exp_sum == 0.0f ? 0.0f : geo.value_scale / exp_sum;
          args.max_logits(token, head, pass.partition) = running.head[r].max_logit;
          args.exp_sums(token, head, pass.partition) = exp_sum;
        } else {
          const FinalRow row = final_row(pass, r, running.head[r]);
          factor[r] = row.out_factor;
          if (args.lse.extent(0) > 0) args.lse(token, head) = row.lse;
        }
      }
    });
    member.team_barrier();
    Path::for_row_spans(member, pass.rows, D, [&](int r, int d0, int d1) {
      const int token = row_token(pass, r), head = row_head(pass, r);
      if (geo.output == Output::Final) {
        Path::store_span(geo.host_isa, s.o + r * D + d0, factor[r], &args.out(token, head, d0), args.out.stride(2),
                         d1 - d0);
      } else {
        Path::store_span(geo.host_isa, s.o + r * D + d0, factor[r], &args.tmp_out(token, head, pass.partition, d0),
                         args.tmp_out.stride(3), d1 - d0);
      }
    });
    member.team_barrier();  // the next pass reuses the scratch
  }

  /// Output 0 (and the LSE of nothing attended) for every row of `pass`.
  KOKKOS_INLINE_FUNCTION void store_empty(const member_type& member, const Pass& pass) const {
    const int D = geo.head_size;
    Path::for_row_spans(member, pass.rows, D, [&](int r, int d0, int d1) {
      for (int d = d0; d < d1; ++d) args.out(row_token(pass, r), row_head(pass, r), d) = from_float<T>(0.0f);
    });
    if (args.lse.extent(0) > 0) {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, pass.rows), [&](int r) {
        args.lse(row_token(pass, r), row_head(pass, r)) = final_row(pass, r, SoftmaxState{}).lse;
      });
    }
  }

  KOKKOS_INLINE_FUNCTION const CacheT* key_head(const Pass& pass) const {
    return key_cache + pass.kv_head * geo.cache_head_stride;
  }
  KOKKOS_INLINE_FUNCTION const CacheT* value_head(const Pass& pass) const {
    return value_cache + pass.kv_head * geo.cache_head_stride;
  }

  /// ALiBi slope of each row (0: none) and each row's position.
  template <int N>
  KOKKOS_INLINE_FUNCTION void load_rows(const Pass& pass, float (&alibi)[N], int (&position)[N]) const {
    for (int r = 0; r < N; ++r) {
      alibi[r] = (r < pass.rows && args.alibi_slopes.extent(0) > 0) ? args.alibi_slopes(row_head(pass, r)) : 0.0f;
      position[r] = row_position(pass, r < pass.rows ? r : pass.rows - 1);
    }
  }

  /// Block-sparse pattern (vLLM's blocksparse_* arguments, the query block being each row's
  /// own): which rows of the pass attend the block starting at token `block_token`; returns
  /// whether any real row does. Padding rows follow the real ones. Dense attention attends
  /// everything.
  template <int N>
  KOKKOS_INLINE_FUNCTION bool block_mask(const Pass& pass, int block_token, bool (&attends)[N]) const {
    if (geo.sparse.vert_stride <= 1) {
      for (int g = 0; g < N; ++g) attends[g] = true;
      return true;
    }
    const BlockSparseGeometry& bs = geo.sparse;
    const int key_block = block_token / bs.block_size;
    bool any = false;
    for (int r = 0; r < pass.rows; ++r) {
      const int query_block = row_position(pass, r) / bs.block_size;
      const bool local = key_block > query_block - bs.local_blocks;
      const int offset = bs.head_sliding_step >= 0
                             ? (bs.tp_rank * bs.num_heads + row_head(pass, r)) * bs.head_sliding_step + 1
                             : (bs.tp_rank * geo.num_kv_heads + pass.kv_head) * -bs.head_sliding_step + 1;
      attends[r] = local || (key_block + offset) % bs.vert_stride == 0;
      any = any || attends[r];
    }
    for (int r = pass.rows; r < N; ++r) attends[r] = any;
    return any;
  }
};

template <class Space, class T, class TmpT>
struct PartitionReduceKernel {
  using policy_type = Kokkos::TeamPolicy<Space>;
  using member_type = typename policy_type::member_type;
  using scratch_view = Kokkos::View<float*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using args_type = AttentionArgs<Space, T, TmpT>;

  args_type args;          ///< the call's views (the reduce reads the partition triple, writes out / lse)
  TileGeometry geo;        ///< the partition kernel's
  int num_heads = 0;
  int num_seqs = 0;
  int items = 0;           ///< query rows x num_heads
  int league_size = 0;
  int scratch_level = 0;

  PartitionReduceKernel(const args_type& call_args, const TileGeometry& geometry, int heads, int seqs, int rows,
                        int league, int level)
      : args(call_args),
        geo(geometry),
        num_heads(heads),
        num_seqs(seqs),
        items(rows * heads),
        league_size(league),
        scratch_level(level) {}

  /// The sequence of query row `token`: the last s with query_start_loc(s) <= token.
  KOKKOS_INLINE_FUNCTION int sequence_of(int token) const {
    if (!geo.several_query_tokens) return token;
    int lo = 0, hi = num_seqs;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      if (args.query_start_loc(mid) <= token) lo = mid; else hi = mid;
    }
    return lo;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    scratch_view shares(member.team_scratch(scratch_level), geo.num_partitions);
    int first = 0, count = 0;
    even_share(items, league_size, member.league_rank(), first, count);
    for (int item = first; item < first + count; ++item) {
      const int token = item / num_heads;
      const int head = item % num_heads;
      const int seq = sequence_of(token);
      const int query_len = geo.several_query_tokens ? args.query_start_loc(seq + 1) - args.query_start_loc(seq) : 1;
      // Bounded by the plan even when seq_lens exceeds max_seq_len (unchecked indices).
      const int seq_len = args.seq_lens(seq);
      const int span = seq_len - geo.variant.span_begin(seq_len, query_len, geo.block_size);
      const int needed = span > 0 ? (span - 1) / geo.partition_size + 1 : 0;
      const int partitions = needed < geo.num_partitions ? needed : geo.num_partitions;
      SoftmaxState total;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, partitions),
          [&](int p, SoftmaxState& state) {
            state.merge(SoftmaxState{args.max_logits(token, head, p), args.exp_sums(token, head, p)});
          },
          SoftmaxReducer<Space>(total));
      // The sink joins the denominator only: it lowers every partition's share.
      if (geo.variant.sinks) total.merge(SoftmaxState{args.sinks(head), 1.0f});
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, partitions), [&](int p) {
        shares(p) = total.share_of(SoftmaxState{args.max_logits(token, head, p), args.exp_sums(token, head, p)});
      });
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, geo.head_size), [&](int d) {
        float acc = 0.0f;
        for (int p = 0; p < partitions; ++p) acc += shares(p) * to_float(args.tmp_out(token, head, p, d));
        args.out(token, head, d) = from_float<T>(acc);
      });
      if (args.lse.extent(0) > 0) {
        Kokkos::single(Kokkos::PerTeam(member), [&]() { args.lse(token, head) = total.log_sum_exp(); });
      }
      member.team_barrier();
    }
  }
};

}  // namespace kpa::detail
