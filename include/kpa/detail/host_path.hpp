#pragma once
// The host kernel path (KernelPath::Host): how a team computes one pass over a tile on a CPU.
// The pass's keys go in chunks of whole blocks, with an online softmax across chunks; per chunk:
//   1. logits: team members take blocks; each K element is read once for every row of the pass
//      (HostLoops::block_logits, on the query as HostLoops::prepare_query left it where the set
//      has that step); blocks no row attends are not read;
//   2. members take rows: the variant's rules over the row (AttentionVariant::apply_to_row), then
//      the row's softmax against its running max (RowLoops::softmax); the chunk's softmax states
//      of all rows come out of one team parallel_reduce with SoftmaxReducer, and the running
//      states absorb them, giving each row's rescale weight for its running output;
//   3. o = o * weight + p . V: members take ranges of output dimensions, each V element read once
//      for every row (HostLoops::chunk_values).
// Software prefetch: blocks are pages in any order, each a new stream for the CPU's own
// prefetchers. During each chunk the next chunk's keys and values are asked for a line or two at
// a time from inside the register tiles (BlockPrefetcher), half during the logits and half during
// p.V; the pass's first chunk, which no chunk precedes, asks for the next block's keys and this
// block's values at once as its logits go.

#include <kpa/detail/host_loops.hpp>
#include <kpa/detail/kernel_params.hpp>
#include <kpa/detail/softmax_state.hpp>

#include <cstddef>
#include <cstdint>

namespace kpa::detail {

template <int H, class CacheT>
struct HostPath {
  static constexpr int rows = H;
  using cache_type = CacheT;
  static constexpr bool scratch_in_level0 = false;  ///< the planner may put its scratch in level 1
  using launch_bounds = Kokkos::LaunchBounds<>;
  /// Where the pass's query element (row r, dimension d) sits in scratch: row after row.
  KOKKOS_INLINE_FUNCTION static int query_index(int r, int d, int D) { return r * D + d; }
  /// Blocks of the next chunk a member's BlockPrefetcher lists (at most).
  static constexpr int kPrefetchBlocks = 64;

  HostLoops<H, CacheT> one_pass;        ///< chosen once per call, for tiles of one pass
  HostLoops<H, CacheT> several_passes;  ///< and for the passes of tiles of several

  HostPath(HostIsa isa, int head_size, int block_size)
      : one_pass(host_loops<H, CacheT>(isa, head_size, block_size, Passes::One)),
        several_passes(host_loops<H, CacheT>(isa, head_size, block_size, Passes::Several)) {}

  /// Calls f(r, d_begin, d_end) so that the team covers dimensions [0, D) of rows [0, rows) once:
  /// members take whole rows, so per-row work is done once and the inner loops are contiguous.
  template <class Member, class F>
  KOKKOS_INLINE_FUNCTION static void for_row_spans(const Member& member, int rows, int D, const F& f) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](int r) { f(r, 0, D); });
  }

  /// The factor the query of a pass (of a tile of several passes or not) is loaded with
  /// (HostLoops::query_factor).
  KOKKOS_INLINE_FUNCTION float query_factor(float scale, bool of_several) const {
    return (of_several ? several_passes : one_pass).query_factor(scale);
  }

  /// load_scaled / store_scaled (numeric_types.hpp): contiguous rows through the instruction
  /// set's row conversions, strided ones element by element.
  KPA_HOST_ONLY_BODY
  template <class T>
  KOKKOS_INLINE_FUNCTION void load_span(const T* src, std::size_t stride, float scale, float* dst, int n) const {
    if (stride == 1) {
      host_row_conversions<T>(one_pass.isa).load(src, scale, dst, n);
    } else {
      load_scaled(src, stride, scale, dst, n);
    }
  }
  KPA_HOST_ONLY_BODY
  template <class T>
  KOKKOS_INLINE_FUNCTION void store_span(const float* src, float factor, T* dst, std::size_t stride, int n) const {
    if (stride == 1) {
      host_row_conversions<T>(one_pass.isa).store(src, factor, dst, n);
    } else {
      store_scaled(src, factor, dst, stride, n);
    }
  }

  /// A member's BlockPrefetcher over its share of the blocks of the chunk at `chunk_begin` (up
  /// to kPrefetchBlocks, listed in `ids`; unread blocks skipped; none past the pass), and in
  /// `lines` the lines they span.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static BlockPrefetcher chunk_prefetcher(const PassContext<H, CacheT>& c, int chunk_begin, const Member& member,
                                          int (&ids)[kPrefetchBlocks], int& lines) {
    const int B = c.block_size, CT = c.chunk_tokens;
    if (chunk_begin >= c.end) return BlockPrefetcher();
    const int blocks = ((c.end - chunk_begin < CT ? c.end - chunk_begin : CT) + B - 1) / B;
    int count = 0;
    for (int lb = member.team_rank(); lb < blocks && count < kPrefetchBlocks; lb += member.team_size()) {
      const int key = chunk_begin + lb * B;
      ids[count++] = c.rows_attending_block(key) != 0u ? c.block_of(key) : -1;
    }
    const int block_bytes = B * c.head_size * static_cast<int>(sizeof(CacheT));
    lines = 2 * count * (block_bytes / 64 + 2);  // keys and values; a block may start and end mid-line
    return BlockPrefetcher(c.key_head, c.value_head, c.block_stride * static_cast<std::int64_t>(sizeof(CacheT)),
                           block_bytes, ids, count);
  }

  /// The slots of the block whose first key is `key` that hold keys of the pass's tile.
  KOKKOS_INLINE_FUNCTION static int tile_slots_from(const PassContext<H, CacheT>& c, int key) {
    return c.tile_end - key < c.block_size ? c.tile_end - key : c.block_size;
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void attend(const Member& member, const PassContext<H, CacheT>& c, SoftmaxStates<H>& running) const {
    using Space = typename Member::execution_space;
    const TileScratch& s = c.scratch;
    const int B = c.block_size, CT = c.chunk_tokens, D = c.head_size, PS = s.probs_stride;
    const int block_bytes = B * D * static_cast<int>(sizeof(CacheT));
    const int members = member.team_size();
    const HostLoops<H, CacheT>& loops = c.tile >= 0 ? several_passes : one_pass;
    int prefetch_ids[kPrefetchBlocks];  // this member's share of the next chunk's blocks
    // The query in the form the loops' q.k reads, where their set has that step: each member
    // prepares its own copy (the pass's query is in scratch, the team past a barrier).
    const QueryTiles q_tiles = loops.prepare_query != nullptr ? loops.prepare_query(s.q, D) : QueryTiles{};
    const float logit_scale = loops.logit_factor(c.scale);
    // Probabilities of one bf16 part go to p.V as codes, where its loops take them so.
    const bool bf16_probabilities = c.probability_parts == 1 && loops.takes_bf16_probabilities;
    for (int chunk_begin = c.begin; chunk_begin < c.end; chunk_begin += CT) {
      const int tokens = (c.end - chunk_begin < CT) ? c.end - chunk_begin : CT;
      const int blocks = (tokens + B - 1) / B;
      const bool first_chunk = chunk_begin == c.begin;

      int prefetch_lines = 0;
      BlockPrefetcher prefetcher = chunk_prefetcher(c, chunk_begin + CT, member, prefetch_ids, prefetch_lines);
      const int member_blocks = (blocks + members - 1) / members;
      const int logits_share = (prefetch_lines / 2 + member_blocks - 1) / member_blocks;

      // 1. q.k of every row of the pass, for the blocks some row attends.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, blocks), [&](int lb) {
        const int key = chunk_begin + lb * B;
        const int slots = (tokens - lb * B < B) ? tokens - lb * B : B;
        const int block_id = c.rows_attending_block(key) != 0u ? c.block_of(key) : -1;
        s.block_ids[lb] = block_id;
        prefetcher.allow(logits_share);
        if (block_id < 0) return;  // its logits are masked by every row's rules below
        if (first_chunk) {
          // Blocks are pages in any order, each a new stream for the CPU's prefetchers.
          const int next_key = key + B;
          if (!c.variant.skips_blocks() && next_key < c.end) {
            prefetch_bytes(c.key_head + c.block_of(next_key) * c.block_stride, block_bytes);
          }
          prefetch_bytes(c.value_head + block_id * c.block_stride, block_bytes);
        }
        loops.block_logits(BlockLogitsArgs<CacheT>{c.key_head + block_id * c.block_stride, B, D, slots, s.q,
                                                   s.probs + lb * B, PS, q_tiles, TileKey{loops.call, c.tile},
                                                   tile_slots_from(c, key)},
                           prefetcher);
      });
      member.team_barrier();  // every member's logits and block ids are in scratch

      // 2. Each row's logits by the variant's rules, its probabilities against its new running
      //    max, and the chunk's softmax state for all rows in one reduction; then the weights.
      SoftmaxStates<H> chunk;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, H),
          [&](int g, SoftmaxStates<H>& state) {
            float* row = s.probs + g * PS;
            const float scale = c.variant.apply_to_row(loops.rows, row, tokens, chunk_begin, B, c.row[g], logit_scale);
            float max = 0.0f;
            const float floor = running.head[g].max_logit;
            const float sum = bf16_probabilities ? loops.rows.softmax_to_bf16(row, tokens, blocks * B, scale, floor, &max)
                                                 : loops.rows.softmax(row, tokens, scale, floor, &max);
            state.head[g].merge(SoftmaxState{max, sum});
          },
          SoftmaxReducer<Space, SoftmaxStates<H>>(chunk));
      member.team_barrier();
      float weight[H];
      for (int g = 0; g < H; ++g) weight[g] = running.head[g].merge(chunk.head[g]).self;

      // 3. o = o * weight + p . V, members taking ranges of output dimensions.
      prefetcher.allow(prefetch_lines);  // the rest
      const ChunkValuesArgs<CacheT> values{c.value_head, c.block_stride, s.block_ids, blocks,
                                           tokens - (blocks - 1) * B, B, D, s.probs, PS, s.o,
                                           TileKey{loops.call, c.tile}, c.probability_parts,
                                           tile_slots_from(c, chunk_begin + (blocks - 1) * B),
                                           bf16_probabilities};
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, members), [&](int r) {
        const int d_begin = D * r / members, d_end = D * (r + 1) / members;
        for (int g = 0; g < H; ++g) {
          const float w = weight[g];
          if (w == 1.0f) continue;  // the row's max held
          float* o = s.o + g * D;
          int d = d_begin;
          for (; d + 8 <= d_end; d += 8) {  // whole groups of 8, which compilers vectorise at -O2
            for (int k = 0; k < 8; ++k) o[d + k] *= w;
          }
          for (; d < d_end; ++d) o[d] *= w;
        }
        loops.chunk_values(values, prefetcher, d_begin, d_end);
      });
      member.team_barrier();  // the next chunk overwrites logits and block ids
    }
    if (loops.end_pass != nullptr) loops.end_pass();
  }
};

}  // namespace kpa::detail
