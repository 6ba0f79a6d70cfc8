#pragma once
// The host kernel path (KernelPath::Host): how a team computes one pass over a tile on a CPU.
// The tile's tokens go in chunks of whole blocks, with an online softmax across chunks; per chunk:
//   1. logits: team members take blocks; each K element is read once for every row of the pass
//      (block_logits);
//   2. members take rows: the variant's cap and row mask, ALiBi, the chunk's max against the
//      running max, one vectorised exp per logit and the sum (row_softmax); the chunk's softmax
//      states of all rows come out of one
//      team parallel_reduce with SoftmaxReducer, and the running state absorbs them, giving each
//      head's rescale weight for its running output;
//   3. o = o * weight + p . V: members take ranges of output dimensions, each V element read once
//      for every row (chunk_values).
// Software prefetch: blocks are pages in any order, each a new stream for the CPU's own
// prefetchers. During each chunk the next chunk's keys and values are asked for a line or two
// at a time from inside the register tiles (BlockPrefetcher), half during the logits and half
// during p.V; the pass's first chunk, which no chunk precedes, asks for the next block's keys
// and this block's values at once as its logits go. Measured with kpa-bench on 8 x 4096
// tokens, 32/8 heads, f16 (Xeon, AVX-512, 2 threads), against every chunk asking for its
// blocks one block ahead and at once: cold caches 7.2 ms against 9.2-9.8 ms; a tile's
// lines asked for at once as it starts: 7.8-8.6 ms.
// The inner loops are host_kernels.hpp's, for the instruction set the plan names.

#include <kpa/detail/host_kernels.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/detail/tile.hpp>

#include <cstddef>

namespace kpa::detail {

struct HostPath {
  /// Blocks of the next chunk a member's BlockPrefetcher lists (at most).
  static constexpr int kPrefetchBlocks = 64;

  /// Calls f(r, d_begin, d_end) so that the team covers dimensions [0, D) of rows [0, rows) once:
  /// members take whole rows, so per-row work is done once and the inner loops are contiguous.
  template <class Member, class F>
  KOKKOS_INLINE_FUNCTION static void for_row_spans(const Member& member, int rows, int D, const F& f) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](int r) { f(r, 0, D); });
  }

  /// load_scaled / store_scaled (numeric_types.hpp): contiguous rows through the instruction
  /// set's row kernels, strided ones element by element.
  template <class T>
  KOKKOS_INLINE_FUNCTION static void load_span(HostIsa isa, const T* src, std::size_t stride, float scale, float* dst,
                                               int n) {
    if (stride == 1) {
      host_row_kernels<T>(isa).load(src, scale, dst, n);
    } else {
      load_scaled(src, stride, scale, dst, n);
    }
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static void store_span(HostIsa isa, const float* src, float factor, T* dst,
                                                std::size_t stride, int n) {
    if (stride == 1) {
      host_row_kernels<T>(isa).store(src, factor, dst, n);
    } else {
      store_scaled(src, factor, dst, stride, n);
    }
  }

  /// A member's BlockPrefetcher over its share of the blocks of the chunk at `chunk_begin` (up
  /// to kPrefetchBlocks, listed in `ids`; blocks no row of the pass attends skipped; none past
  /// the pass), and in `lines` the lines they span.
  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static BlockPrefetcher chunk_prefetcher(const Kernel& k, const Pass& pass, int chunk_begin,
                                                                 const typename Kernel::member_type& member,
                                                                 int (&ids)[kPrefetchBlocks], int& lines) {
    using CacheT = typename Kernel::cache_type;
    const int B = k.geo.block_size, CT = k.geo.chunk_tokens;
    if (chunk_begin >= pass.end) return BlockPrefetcher();
    const int blocks = ((pass.end - chunk_begin < CT ? pass.end - chunk_begin : CT) + B - 1) / B;
    int count = 0;
    for (int lb = member.team_rank(); lb < blocks && count < kPrefetchBlocks; lb += member.team_size()) {
      const int block_token = chunk_begin + lb * B;
      bool attends[H];
      ids[count++] = k.template block_mask<H>(pass, block_token, attends) ? k.args.block_tables(pass.seq, block_token / B)
                                                                          : -1;
    }
    const int block_bytes = B * k.geo.head_size * static_cast<int>(sizeof(CacheT));
    lines = 2 * count * (block_bytes / 64 + 2);  // keys and values; a block may start and end mid-line
    return BlockPrefetcher(k.key_head(pass), k.value_head(pass),
                           k.geo.cache_block_stride * static_cast<std::int64_t>(sizeof(CacheT)), block_bytes, ids, count);
  }

  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static void attend(const Kernel& k, const typename Kernel::member_type& member,
                                            const TileScratch& s, const Pass& pass, SoftmaxStates<H>& running) {
    using Space = typename Kernel::execution_space;
    using CacheT = typename Kernel::cache_type;
    const HostKernels<H, CacheT> kernels = host_kernels<H, CacheT>(k.geo.host_isa);
    const int B = k.geo.block_size, CT = k.geo.chunk_tokens, D = k.geo.head_size;
    const CacheT* key_head = k.key_head(pass);
    const CacheT* value_head = k.value_head(pass);
    float alibi[H];   // slopes; 0: no ALiBi
    int position[H];  // each row's query position
    k.template load_rows<H>(pass, alibi, position);
    const int block_bytes = B * D * static_cast<int>(sizeof(CacheT));
    const int members = member.team_size();
    int prefetch_ids[kPrefetchBlocks];  // this member's share of the next chunk's blocks
    for (int chunk_begin = pass.begin; chunk_begin < pass.end; chunk_begin += CT) {
      const int tokens = (pass.end - chunk_begin < CT) ? pass.end - chunk_begin : CT;
      const int blocks = (tokens + B - 1) / B;
      const bool first_chunk = chunk_begin == pass.begin;

      int prefetch_lines = 0;
      BlockPrefetcher prefetcher = chunk_prefetcher<H>(k, pass, chunk_begin + CT, member, prefetch_ids, prefetch_lines);
      const int member_blocks = (blocks + members - 1) / members;
      const int logits_share = (prefetch_lines / 2 + member_blocks - 1) / member_blocks;

      // 1. Logits of every head of the pass.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, blocks), [&](int lb) {
        const int block_token = chunk_begin + lb * B;
        const int slots = (tokens - lb * B < B) ? tokens - lb * B : B;
        float* logits = s.probs + lb * B;
        bool attends[H];
        const bool any = k.template block_mask<H>(pass, block_token, attends);
        const int block_id = any ? k.args.block_tables(pass.seq, block_token / B) : -1;
        s.block_ids[lb] = block_id;
        prefetcher.allow(logits_share);
        if (any) {  // a block no head attends is not read at all
          if (first_chunk) {
            // Blocks are pages in any order, each a new stream for the CPU's prefetchers.
            const int next_token = block_token + B;
            if (k.geo.sparse.vert_stride <= 1 && next_token < pass.end) {
              const int next_id = k.args.block_tables(pass.seq, next_token / B);
              prefetch_bytes(key_head + next_id * k.geo.cache_block_stride, block_bytes);
            }
            prefetch_bytes(value_head + block_id * k.geo.cache_block_stride, block_bytes);
          }
          kernels.block_logits(BlockLogitsArgs<CacheT>{key_head + block_id * k.geo.cache_block_stride, B, D, slots,
                                                       s.q, logits, CT},
                               prefetcher);
        }
        for (int g = 0; g < H; ++g) {
          if (any && attends[g]) continue;
          for (int slot = 0; slot < slots; ++slot) logits[g * CT + slot] = -compat::infinity();  // no weight
        }
      });
      member.team_barrier();  // every member's logits and block ids are in scratch

      // 2. Each head's probabilities against its new running max (ALiBi added first), and the
      //    chunk's softmax state for all heads in one reduction; then the rescale weights.
      SoftmaxStates<H> chunk;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(member, H),
          [&](int g, SoftmaxStates<H>& state) {
            float max = 0.0f;
            if (k.geo.variant.transforms_logits()) {
              kernels.row_soft_cap(s.probs + g * CT, tokens, k.geo.variant.logits_soft_cap);
            }
            k.mask_row(s.probs + g * CT, tokens, chunk_begin, position[g]);
            const float sum = kernels.row_softmax(s.probs + g * CT, tokens, alibi[g],
                                                  static_cast<float>(chunk_begin - position[g]),
                                                  running.head[g].max_logit, &max);
            state.head[g].merge(SoftmaxState{max, sum});
          },
          SoftmaxReducer<Space, SoftmaxStates<H>>(chunk));
      member.team_barrier();
      float weight[H];
      for (int g = 0; g < H; ++g) weight[g] = running.head[g].merge(chunk.head[g]).self;

      // 3. o = o * weight + p . V, members taking ranges of output dimensions.
      prefetcher.allow(prefetch_lines);  // the rest
      const ChunkValuesArgs<CacheT> values{value_head, k.geo.cache_block_stride, s.block_ids, blocks,
                                           tokens - (blocks - 1) * B, B, D, s.probs, CT, weight, s.o};
      const int ranges = member.team_size();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, ranges), [&](int r) {
        kernels.chunk_values(values, prefetcher, D * r / ranges, D * (r + 1) / ranges);
      });
      member.team_barrier();  // the next chunk overwrites logits and block ids
    }
  }
};

}  // namespace kpa::detail
