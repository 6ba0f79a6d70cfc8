#pragma once
// The two kernels behind every paged-attention entry point.
//
// PartitionKernel: one team walks its even share of tiles, a tile being one (sequence, kv head,
// partition). A tile is computed in passes over up to H query heads of its GQA group (H is a
// compile-time constant chosen by the planner); a pass loads the pre-scaled queries into team
// scratch, runs the kernel path's attend() over the tile's tokens (HostPath: CPU-shaped,
// DevicePath: GPU-shaped; same online softmax, same SoftmaxReducer), and stores the normalised
// output (Output::Final) or vLLM's v2 partition triple max_logits / exp_sums / tmp_out
// (Output::Partition).
//
// PartitionReduceKernel: one team per (sequence, query head) share; merges the partition states
// with the same SoftmaxReducer and sums the normalised partition outputs by their shares.

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

  view<T***> out;                  ///< [num_seqs][num_heads][head_size]
  view<const T***> query;          ///< [num_seqs][num_heads][head_size]
  const void* key_cache = nullptr;    ///< [num_blocks][num_kv_heads][head_size/x][block_size][x]
  const void* value_cache = nullptr;  ///< [num_blocks][num_kv_heads][head_size][block_size]
  view<const int**> block_tables;  ///< [num_seqs][max_blocks_per_seq]
  view<const int*> seq_lens;       ///< [num_seqs]
  view<const float*> alibi_slopes;  ///< [num_heads] or extent 0: none
  // vLLM v2's partition triple (Output::Partition, and the reduce's input).
  view<float***> exp_sums;         ///< [num_seqs][num_heads][max_num_partitions]
  view<float***> max_logits;       ///< [num_seqs][num_heads][max_num_partitions]
  view<TmpT****> tmp_out;          ///< [num_seqs][num_heads][max_num_partitions][head_size]
};

template <class Space, class Path, int H, class CacheT, class T, class TmpT>
struct PartitionKernel {
  using execution_space = Space;
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::Schedule<Kokkos::Dynamic>>;
  using member_type = typename policy_type::member_type;
  using cache_type = CacheT;  ///< element type the caches are read as (fp8 formats for byte caches)
  using args_type = AttentionArgs<Space, T, TmpT>;
  static constexpr int heads_per_pass = H;

  typename args_type::template view<T***> out;
  typename args_type::template view<const T***> query;
  const CacheT* key_cache;
  const CacheT* value_cache;
  typename args_type::template view<const int**> block_tables;
  typename args_type::template view<const int*> seq_lens;
  typename args_type::template view<const float*> alibi_slopes;
  typename args_type::template view<float***> exp_sums;    // Output::Partition only
  typename args_type::template view<float***> max_logits;  // Output::Partition only
  typename args_type::template view<TmpT****> tmp_out;     // Output::Partition only
  TileGeometry geo;
  int scratch_level;

  PartitionKernel(const args_type& args, const TileGeometry& geometry, int level)
      : out(args.out),
        query(args.query),
        key_cache(static_cast<const CacheT*>(args.key_cache)),
        value_cache(static_cast<const CacheT*>(args.value_cache)),
        block_tables(args.block_tables),
        seq_lens(args.seq_lens),
        alibi_slopes(args.alibi_slopes),
        exp_sums(args.exp_sums),
        max_logits(args.max_logits),
        tmp_out(args.tmp_out),
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
    const int partition = tile % geo.num_partitions;
    const int seq_head = tile / geo.num_partitions;
    const int kv_head = seq_head % geo.num_kv_heads;
    const int seq = seq_head / geo.num_kv_heads;
    const int seq_len = seq_lens(seq);
    const int begin = partition * geo.partition_size;
    if (begin >= seq_len) {
      // Partitions past the sequence are neither written nor read; an empty sequence has output 0.
      if (geo.output == Output::Final && partition == 0) {
        const int D = geo.head_size;
        Kokkos::parallel_for(Kokkos::TeamVectorRange(member, geo.group_size * D), [&](int i) {
          out(seq, kv_head * geo.group_size + i / D, i % D) = from_float<T>(0.0f);
        });
      }
      return;
    }
    const int end = (seq_len - begin < geo.partition_size) ? seq_len : begin + geo.partition_size;
    for (int head0 = 0; head0 < geo.group_size; head0 += H) {
      // The last pass of a group may have fewer real heads: its padding heads have zero queries
      // and are never stored.
      const int heads = (geo.group_size - head0 < H) ? geo.group_size - head0 : H;
      run_pass(member, scratch, Pass{seq, kv_head, kv_head * geo.group_size + head0, heads, seq_len, begin, end,
                                     partition});
    }
  }

  KOKKOS_INLINE_FUNCTION void run_pass(const member_type& member, const TileScratch& scratch, const Pass& pass) const {
    load_query(member, scratch, pass);
    SoftmaxStates<H> running;  // identical in every worker of the team
    Path::template attend<H>(*this, member, scratch, pass, running);
    store(member, scratch, pass, running);
  }

  /// q = query * scale (zeros for padding heads) and o = 0 in scratch.
  KOKKOS_INLINE_FUNCTION void load_query(const member_type& member, const TileScratch& s, const Pass& pass) const {
    const int D = geo.head_size;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, H * D), [&](int i) {
      const int g = i / D;
      s.q[i] = g < pass.heads ? to_float(query(pass.seq, pass.first_head + g, i % D)) * geo.scale : 0.0f;
      s.o[i] = 0.0f;
    });
    member.team_barrier();
  }

  /// The pass's results: out, or tmp_out with max_logits and exp_sums.
  KOKKOS_INLINE_FUNCTION void store(const member_type& member, const TileScratch& s, const Pass& pass,
                                    const SoftmaxStates<H>& running) const {
    const int D = geo.head_size;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, pass.heads * D), [&](int i) {
      const int g = i / D;
      // fp8 values are dequantised here: the output is linear in V. A NaN sum stays NaN.
      const float exp_sum = running.head[g].exp_sum;
      const float inv_sum = exp_sum == 0.0f ? 0.0f : geo.value_scale / exp_sum;
      if (geo.output == Output::Final) {
        out(pass.seq, pass.first_head + g, i % D) = from_float<T>(s.o[i] * inv_sum);
      } else {
        tmp_out(pass.seq, pass.first_head + g, pass.partition, i % D) = from_float<TmpT>(s.o[i] * inv_sum);
      }
    });
    if (geo.output == Output::Partition) {
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        for (int g = 0; g < pass.heads; ++g) {
          max_logits(pass.seq, pass.first_head + g, pass.partition) = running.head[g].max_logit;
          exp_sums(pass.seq, pass.first_head + g, pass.partition) = running.head[g].exp_sum;
        }
      });
    }
    member.team_barrier();  // the next pass reuses the scratch
  }

  KOKKOS_INLINE_FUNCTION const CacheT* key_head(const Pass& pass) const {
    return key_cache + pass.kv_head * geo.cache_head_stride;
  }
  KOKKOS_INLINE_FUNCTION const CacheT* value_head(const Pass& pass) const {
    return value_cache + pass.kv_head * geo.cache_head_stride;
  }

  template <int N>
  KOKKOS_INLINE_FUNCTION void load_alibi(const Pass& pass, float (&alibi)[N]) const {
    for (int g = 0; g < N; ++g) {
      alibi[g] = (g < pass.heads && alibi_slopes.extent(0) > 0) ? alibi_slopes(pass.first_head + g) : 0.0f;
    }
  }

  /// Block-sparse pattern (vLLM's blocksparse_* arguments): which heads of the pass attend the
  /// block starting at token `block_token`; returns whether any real head does. Padding heads
  /// follow the real ones. Dense attention attends everything.
  template <int N>
  KOKKOS_INLINE_FUNCTION bool block_mask(const Pass& pass, int block_token, bool (&attends)[N]) const {
    if (geo.sparse.vert_stride <= 1) {
      for (int g = 0; g < N; ++g) attends[g] = true;
      return true;
    }
    const BlockSparseGeometry& bs = geo.sparse;
    const int query_block = (pass.seq_len - 1) / bs.block_size;
    const int key_block = block_token / bs.block_size;
    const bool local = key_block > query_block - bs.local_blocks;
    bool any = false;
    for (int g = 0; g < pass.heads; ++g) {
      const int offset = bs.head_sliding_step >= 0
                             ? (bs.tp_rank * bs.num_heads + pass.first_head + g) * bs.head_sliding_step + 1
                             : (bs.tp_rank * geo.num_kv_heads + pass.kv_head) * -bs.head_sliding_step + 1;
      attends[g] = local || (key_block + offset) % bs.vert_stride == 0;
      any = any || attends[g];
    }
    for (int g = pass.heads; g < N; ++g) attends[g] = any;
    return any;
  }
};

template <class Space, class T, class TmpT>
struct PartitionReduceKernel {
  using policy_type = Kokkos::TeamPolicy<Space>;
  using member_type = typename policy_type::member_type;
  using scratch_view = Kokkos::View<float*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using args_type = AttentionArgs<Space, T, TmpT>;

  typename args_type::template view<T***> out;
  typename args_type::template view<const int*> seq_lens;
  typename args_type::template view<float***> exp_sums;
  typename args_type::template view<float***> max_logits;
  typename args_type::template view<TmpT****> tmp_out;
  int num_heads = 0;
  int head_size = 0;
  int partition_size = 0;
  int num_partitions = 0;  ///< the plan's; never more than exp_sums.extent(2)
  int items = 0;           ///< num_seqs * num_heads
  int league_size = 0;
  int scratch_level = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    scratch_view shares(member.team_scratch(scratch_level), num_partitions);
    int first = 0, count = 0;
    even_share(items, league_size, member.league_rank(), first, count);
    for (int item = first; item < first + count; ++item) {
      const int seq = item / num_heads;
      const int head = item % num_heads;
      // Bounded by the plan even when seq_lens exceeds max_seq_len (unchecked indices).
      const int seq_len = seq_lens(seq);
      const int needed = seq_len > 0 ? (seq_len - 1) / partition_size + 1 : 0;
      const int partitions = needed < num_partitions ? needed : num_partitions;
      SoftmaxState total;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, partitions),
          [&](int p, SoftmaxState& state) {
            state.merge(SoftmaxState{max_logits(seq, head, p), exp_sums(seq, head, p)});
          },
          SoftmaxReducer<Space>(total));
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, partitions), [&](int p) {
        shares(p) = total.share_of(SoftmaxState{max_logits(seq, head, p), exp_sums(seq, head, p)});
      });
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, head_size), [&](int d) {
        float acc = 0.0f;
        for (int p = 0; p < partitions; ++p) acc += shares(p) * to_float(tmp_out(seq, head, p, d));
        out(seq, head, d) = from_float<T>(acc);
      });
      member.team_barrier();
    }
  }
};

}  // namespace kpa::detail
