#pragma once
// The host kernel path (KernelPath::Host): how a team computes one pass over a tile on a CPU.
// The tile's tokens go in chunks of whole blocks; per chunk:
//   1. logits: team members take blocks, vector lanes take groups of slots; each K element is
//      read once for every head of the pass; every block ends as a softmax state (block max,
//      sum of exp) with its probabilities, scaled to the block max, in scratch;
//   2. a team parallel_reduce with SoftmaxReducer merges the block states of all heads into the
//      chunk's, which merges into the running state; each block's probabilities are rescaled
//      to the running max;
//   3. threads take output dimensions and accumulate p * V over the chunk, each V element read
//      once for all heads, after rescaling the running output by the merge weight.
// The inner loops are attention_math.hpp's (x86 specialisations where the compiler targets them).

#include <kpa/detail/attention_math.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/detail/tile.hpp>

namespace kpa::detail {

struct HostPath {
  /// The blocks [first_token, end) of one chunk.
  struct Chunk {
    int begin, end, blocks;
    KOKKOS_INLINE_FUNCTION int slots_in(int lb, int block_size) const {
      return (end - begin - lb * block_size < block_size) ? end - begin - lb * block_size : block_size;
    }
  };

  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static void attend(const Kernel& k, const typename Kernel::member_type& member,
                                            const TileScratch& s, const Pass& pass, SoftmaxStates<H>& running) {
    const int B = k.geo.block_size;
    for (int chunk_begin = pass.begin; chunk_begin < pass.end; chunk_begin += k.geo.chunk_tokens) {
      const int chunk_end = (pass.end - chunk_begin < k.geo.chunk_tokens) ? pass.end : chunk_begin + k.geo.chunk_tokens;
      const Chunk chunk{chunk_begin, chunk_end, (chunk_end - chunk_begin + B - 1) / B};
      block_logits<H>(k, member, s, pass, chunk);
      member.team_barrier();
      float old_weight[H];
      merge_chunk<H>(k, member, s, chunk, running, old_weight);
      member.team_barrier();
      accumulate_values<H>(k, member, s, pass, chunk, old_weight);
      member.team_barrier();
    }
  }

  /// Step 1: logits and per-block softmax states; the chunk's physical block ids go to scratch.
  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static void block_logits(const Kernel& k, const typename Kernel::member_type& member,
                                                  const TileScratch& s, const Pass& pass, const Chunk& chunk) {
    using CacheT = typename Kernel::cache_type;
    constexpr int X = static_cast<int>(16 / sizeof(CacheT));  // elements per 16-byte key vector
    constexpr int S = kSlotsPerCall;
    const int B = k.geo.block_size, D = k.geo.head_size, CT = k.geo.chunk_tokens, CB = CT / B;
    const CacheT* key_head = k.key_head(pass);
    const CacheT* value_head = k.value_head(pass);
    const std::size_t block_bytes = sizeof(CacheT) * static_cast<std::size_t>(k.geo.cache_head_stride);
    float alibi[H];
    k.template load_alibi<H>(pass, alibi);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, chunk.blocks), [&](int lb) {
      const int block_token = chunk.begin + lb * B;
      const int slots = chunk.slots_in(lb, B);
      bool attends[H];
      const bool any_attends = k.template block_mask<H>(pass, block_token, attends);
      auto set_state = [&](int g, float max_logit, float exp_sum) {
        Kokkos::single(Kokkos::PerThread(member), [&]() {
          s.block_max[g * CB + lb] = max_logit;
          s.block_sum[g * CB + lb] = exp_sum;
        });
      };
      if (!any_attends) {  // skipped for every head of the pass: not read at all
        for (int g = 0; g < H; ++g) set_state(g, -compat::infinity(), 0.0f);
        Kokkos::single(Kokkos::PerThread(member), [&]() { s.block_ids[lb] = -1; });
        return;
      }
      const int block_id = k.block_tables(pass.seq, block_token / B);
      const CacheT* key_block = key_head + block_id * k.geo.cache_block_stride;
      const CacheT* value_block = value_head + block_id * k.geo.cache_block_stride;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, (slots + S - 1) / S), [&](int group) {
        prefetch_slice(value_block, block_bytes, group, (B + S - 1) / S);  // read in step 3
        const int first_slot = group * S;
        const int count = slots - first_slot < S ? slots - first_slot : S;
        float logits[S][H];
        // key_cache[block][head][:][slot][:]
        slot_logits<H, X, S>(key_block + first_slot * X, B * X, D / X, s.q, D, count, logits);
        for (int i = 0; i < count; ++i) {
          const float position = static_cast<float>(block_token + first_slot + i - pass.seq_len + 1);
          for (int g = 0; g < H; ++g) s.probs[g * CT + lb * B + first_slot + i] = logits[i][g] + alibi[g] * position;
        }
      });
      for (int g = 0; g < H; ++g) {
        float* p = s.probs + g * CT + lb * B;
        if (!attends[g]) {  // block-sparse: no weight for this head
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots), [&](int slot) { p[slot] = 0.0f; });
          set_state(g, -compat::infinity(), 0.0f);
          continue;
        }
        float block_max_logit = -compat::infinity();
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(member, slots), [&](int slot, float& m) { m = compat::fmax(m, p[slot]); },
            Kokkos::Max<float>(block_max_logit));
        float block_exp_sum = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(member, slots),
            [&](int slot, float& sum) {
              const float e = compat::exp(p[slot] - block_max_logit);
              p[slot] = e;
              sum += e;
            },
            block_exp_sum);
        set_state(g, block_max_logit, block_exp_sum);
      }
      Kokkos::single(Kokkos::PerThread(member), [&]() { s.block_ids[lb] = block_id; });
    });
  }

  /// Step 2: chunk state = merge of the block states (one team reduction for all heads); fold it
  /// into the running state, then bring every block's probabilities to the running max.
  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static void merge_chunk(const Kernel& k, const typename Kernel::member_type& member,
                                                 const TileScratch& s, const Chunk& chunk,
                                                 SoftmaxStates<H>& running, float (&old_weight)[H]) {
    using Space = typename Kernel::execution_space;
    const int B = k.geo.block_size, CT = k.geo.chunk_tokens, CB = CT / B;
    SoftmaxStates<H> merged;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, chunk.blocks),
        [&](int lb, SoftmaxStates<H>& state) {
          for (int g = 0; g < H; ++g) state.head[g].merge(SoftmaxState{s.block_max[g * CB + lb], s.block_sum[g * CB + lb]});
        },
        SoftmaxReducer<Space, SoftmaxStates<H>>(merged));
    for (int g = 0; g < H; ++g) old_weight[g] = running.head[g].merge(merged.head[g]).self;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, H * chunk.blocks), [&](int i) {
      const int g = i / chunk.blocks;
      const int lb = i % chunk.blocks;
      float* p = s.probs + g * CT + lb * B;
      const int slots = chunk.slots_in(lb, B);
      if (s.block_sum[g * CB + lb] != 0.0f) {  // a NaN sum stays NaN: corrupt data must show
        const float weight = compat::exp(s.block_max[g * CB + lb] - running.head[g].max_logit);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots), [&](int slot) { p[slot] *= weight; });
      } else {  // a block without weight (block-sparse); the running state may still be empty
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots), [&](int slot) { p[slot] = 0.0f; });
      }
    });
  }

  /// Step 3: o = o * old_weight + sum over the chunk of p * V. Each thread or lane owns output
  /// dimensions and reads each V element once for all heads of the pass; meanwhile it prefetches
  /// a slice of the next chunk's keys.
  template <int H, class Kernel>
  KOKKOS_INLINE_FUNCTION static void accumulate_values(const Kernel& k, const typename Kernel::member_type& member,
                                                       const TileScratch& s, const Pass& pass, const Chunk& chunk,
                                                       const float (&old_weight)[H]) {
    using CacheT = typename Kernel::cache_type;
    const int B = k.geo.block_size, D = k.geo.head_size, CT = k.geo.chunk_tokens;
    const CacheT* key_head = k.key_head(pass);
    const CacheT* value_head = k.value_head(pass);
    const std::size_t block_bytes = sizeof(CacheT) * static_cast<std::size_t>(k.geo.cache_head_stride);
    const int last_block_slots = chunk.slots_in(chunk.blocks - 1, B);
    const int next_blocks = (pass.end - chunk.end < CT ? pass.end - chunk.end + B - 1 : CT) / B;
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, D), [&](int d) {
      if (next_blocks > 0 && d < (D / next_blocks) * next_blocks) {  // the next chunk's keys, read in step 1
        const int next = d % next_blocks;
        prefetch_slice(key_head + k.block_tables(pass.seq, chunk.end / B + next) * k.geo.cache_block_stride,
                       block_bytes, d / next_blocks, D / next_blocks);
      }
      float sums[H];
      chunk_pv<H>(value_head + d * B, s.block_ids, k.geo.cache_block_stride, B, chunk.blocks, last_block_slots,
                  s.probs, CT, sums);
      for (int g = 0; g < H; ++g) s.o[g * D + d] = s.o[g * D + d] * old_weight[g] + sums[g];
    });
  }
};

}  // namespace kpa::detail
