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
// Software prefetch, one block ahead: the next block's keys and this block's values (measured
// on 1 x 8192 tokens, 32/8 heads, f16, warm caches: 10-20% faster; a whole chunk ahead: nothing;
// the next chunk's keys spread over the value sums instead: 5-10% slower on 32 x 4096 tokens;
// these prefetches spread over the q.k register tiles rather than issued at once: within noise).
// The inner loops are host_kernels.hpp's, for the instruction set the plan names.

#include <kpa/detail/host_kernels.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/detail/tile.hpp>

#include <cstddef>

namespace kpa::detail {

/// Asks the caches for `bytes` from `p` ahead of use (into L2 and up on x86): a hint, no effect
/// on results; nothing on GPUs.
KOKKOS_INLINE_FUNCTION void prefetch_bytes(const void* p, int bytes) {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && (defined(__GNUC__) || defined(__clang__))
  for (int i = 0; i < bytes; i += 64) __builtin_prefetch(static_cast<const char*>(p) + i, 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

struct HostPath {
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
    for (int chunk_begin = pass.begin; chunk_begin < pass.end; chunk_begin += CT) {
      const int tokens = (pass.end - chunk_begin < CT) ? pass.end - chunk_begin : CT;
      const int blocks = (tokens + B - 1) / B;

      // 1. Logits of every head of the pass.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, blocks), [&](int lb) {
        const int block_token = chunk_begin + lb * B;
        const int slots = (tokens - lb * B < B) ? tokens - lb * B : B;
        float* logits = s.probs + lb * B;
        bool attends[H];
        const bool any = k.template block_mask<H>(pass, block_token, attends);
        const int block_id = any ? k.args.block_tables(pass.seq, block_token / B) : -1;
        s.block_ids[lb] = block_id;
        if (any) {  // a block no head attends is not read at all
          // Blocks are pages in any order, each a new stream for the CPU's prefetchers: ask for
          // the next block's keys (dense patterns only: a sparse one may skip it) and this
          // block's values while this block's logits are computed.
          const int block_bytes = B * D * static_cast<int>(sizeof(CacheT));
          const int next_token = block_token + B;
          if (k.geo.sparse.vert_stride <= 1 && next_token < pass.end) {
            const int next_id = k.args.block_tables(pass.seq, next_token / B);
            prefetch_bytes(key_head + next_id * k.geo.cache_block_stride, block_bytes);
          }
          prefetch_bytes(value_head + block_id * k.geo.cache_block_stride, block_bytes);
          kernels.block_logits(BlockLogitsArgs<CacheT>{key_head + block_id * k.geo.cache_block_stride, B, D, slots,
                                                       s.q, logits, CT});
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
      const ChunkValuesArgs<CacheT> values{value_head, k.geo.cache_block_stride, s.block_ids, blocks,
                                           tokens - (blocks - 1) * B, B, D, s.probs, CT, weight, s.o};
      const int ranges = member.team_size();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, ranges), [&](int r) {
        kernels.chunk_values(values, D * r / ranges, D * (r + 1) / ranges);
      });
      member.team_barrier();  // the next chunk overwrites logits and block ids
    }
  }
};

}  // namespace kpa::detail
