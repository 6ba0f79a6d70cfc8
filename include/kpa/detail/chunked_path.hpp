#pragma once
// The chunked device kernel path (KernelPath::DeviceChunked): how a team computes one pass over a
// tile on a GPU, a chunk of tokens at a time. A team is team_size x vector_length workers (GPU:
// warps x lanes); the tile's tokens go in chunks of whole blocks; per chunk:
//   1. logits: one worker per token. Lane i of a warp takes slot i of a block, so with vLLM's
//      key layout the warp's 16-byte key loads are contiguous; the worker computes the whole
//      q.k for every row of the pass (the queries sit in scratch and are read by all lanes at
//      once), with no cross-lane sums. Its logits fold into a SoftmaxStates<H> through one team
//      parallel_reduce with SoftmaxReducer: the chunk's softmax state for all rows at once (the
//      variant's logit transform and mask applied per logit);
//   2. the chunk state merges into the running state (in scratch); each logit becomes its
//      probability against the running max;
//   3. p.V: one worker per head dimension, reading that dimension's row of each block with
//      16-byte loads (the lanes' rows are block_size elements apart) and applying it to every
//      head, after rescaling its running output by the merge weight.
// Registers per worker stay at a few floats per head: the head_size-wide output lives in team
// scratch, each element owned by one worker. The same code runs on host back ends (team members
// and lanes then loop), which is how the test suite covers it without a GPU.

#include <kpa/detail/device_loads.hpp>
#include <kpa/detail/kernel_params.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/numeric_types.hpp>

#include <cstddef>

namespace kpa::detail {

/// logits[g] = q_g . k for one cache slot: `key` points at the slot's first X-element vector,
/// the slot's `vectors` vectors are `stride` elements apart, q_g = q + g * head_size.
template <int H, int X, class CacheT>
KOKKOS_INLINE_FUNCTION void slot_dot(const CacheT* key, int stride, int vectors, const float* q, int head_size,
                                     float (&logits)[H]) {
  float acc[H];
  for (int g = 0; g < H; ++g) acc[g] = 0.0f;
  for (int dx = 0; dx < vectors; ++dx) {
    float k[X];
    load_floats<X>(key + dx * stride, k);
    for (int g = 0; g < H; ++g) {
      float qv[X];
      load_floats<X>(q + g * head_size + dx * X, qv);
      for (int i = 0; i < X; ++i) acc[g] += qv[i] * k[i];
    }
  }
  for (int g = 0; g < H; ++g) logits[g] = acc[g];
}

template <int H, class CacheT>
struct ChunkedPath : DeviceRowIO {
  static constexpr int rows = H;
  using cache_type = CacheT;
  static constexpr bool scratch_in_level0 = false;  ///< the planner may put its scratch in level 1
  using launch_bounds = Kokkos::LaunchBounds<>;
  /// Where the pass's query element (row r, dimension d) sits in scratch: row after row.
  KOKKOS_INLINE_FUNCTION static int query_index(int r, int d, int D) { return r * D + d; }

  /// Value elements per load: 16 bytes, at most 8 slots (so a block of 8 works for every type).
  static constexpr int kValueWidth = static_cast<int>(16 / sizeof(CacheT)) < 8 ? static_cast<int>(16 / sizeof(CacheT)) : 8;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void attend(const Member& member, const PassContext<H, CacheT>& c,
                                     SoftmaxStates<H>& running) const {
    using Space = typename Member::execution_space;
    const TileScratch& s = c.scratch;
    const int B = c.block_size, CT = c.chunk_tokens;
    // The running state lives in scratch (running max, sum, merge weight per row), written by
    // one worker: registers stay free for the inner loops, and no lambda captures a register array.
    float* running_max = s.running;
    float* running_sum = s.running + H;
    float* merge_weight = s.running + 2 * H;
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      for (int g = 0; g < H; ++g) {
        running_max[g] = -compat::infinity();
        running_sum[g] = 0.0f;
      }
    });
    member.team_barrier();  // a pass whose rows attend nothing here has no chunk (and no barrier) below
    for (int chunk_begin = c.begin; chunk_begin < c.end; chunk_begin += CT) {
      const int tokens = (c.end - chunk_begin < CT) ? c.end - chunk_begin : CT;
      const int blocks = (tokens + B - 1) / B;
      // 1. Logits of the chunk, and its softmax state for every row.
      SoftmaxStates<H> chunk;
      Kokkos::parallel_reduce(
          Kokkos::TeamVectorRange(member, tokens),
          [&](int i, SoftmaxStates<H>& state) { token_logits(c, chunk_begin, i, state); },
          SoftmaxReducer<Space, SoftmaxStates<H>>(chunk));
      member.team_barrier();  // logits and block ids of every worker are in scratch
      // 2. The running state absorbs the chunk's; probabilities against the new max (0 for masked
      //    and padding slots).
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        for (int g = 0; g < H; ++g) {
          SoftmaxState state{running_max[g], running_sum[g]};
          merge_weight[g] = state.merge(chunk.head[g]).self;
          running_max[g] = state.max_logit;
          running_sum[g] = state.exp_sum;
        }
      });
      member.team_barrier();
      const int padded = blocks * B;
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, H * padded), [&](int i) {
        const int g = i / padded, slot = i % padded;
        float& p = s.probs[g * CT + slot];
        p = (slot < tokens && p != -compat::infinity()) ? compat::exp(p - running_max[g]) : 0.0f;
      });
      member.team_barrier();
      // 3. o = o * merge_weight + p.V, one worker per dimension.
      const int last_block_slots = tokens - (blocks - 1) * B;
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, c.head_size),
                           [&](int d) { value_row(c, d, blocks, last_block_slots, merge_weight); });
      member.team_barrier();  // the next chunk overwrites probs, block ids and weights
    }
    for (int g = 0; g < H; ++g) running.head[g] = SoftmaxState{running_max[g], running_sum[g]};
  }

  /// Logit of chunk token i for every row of the pass, into scratch and into `state`.
  KOKKOS_INLINE_FUNCTION static void token_logits(const PassContext<H, CacheT>& c, int chunk_begin, int i,
                                                  SoftmaxStates<H>& state) {
    constexpr int X = static_cast<int>(16 / sizeof(CacheT));
    const TileScratch& s = c.scratch;
    const int B = c.block_size, CT = c.chunk_tokens;
    const int slot = i % B;  // chunks start on block boundaries
    const int block_key = chunk_begin + i - slot;
    bool attends[H];
    const bool any_attends = c.block_attended(block_key, attends);
    const int block_id = c.block_of(block_key);
    if (slot == 0) s.block_ids[i / B] = any_attends ? block_id : -1;
    float logits[H];
    for (int g = 0; g < H; ++g) logits[g] = 0.0f;
    if (any_attends) {  // a block no row attends is not read at all
      // key_cache[block][head][:][slot][:]
      slot_dot<H, X>(c.key_head + block_id * c.block_stride + slot * X, B * X, c.head_size / X, s.q, c.head_size,
                     logits);
    }
    const int key = chunk_begin + i;
    for (int g = 0; g < H; ++g) {
      const bool attended = attends[g] && c.variant.in_window(c.row[g], key);
      const float logit = attended ? c.variant.logit(logits[g], c.row[g], key) : -compat::infinity();
      s.probs[g * CT + i] = logit;
      state.head[g].add(logit);
    }
  }

  /// o[g][d] = o[g][d] * merge_weight[g] + sum over the chunk of p_g * V[d] for one dimension d.
  KOKKOS_INLINE_FUNCTION static void value_row(const PassContext<H, CacheT>& c, int d, int blocks,
                                               int last_block_slots, const float* merge_weight) {
    constexpr int W = kValueWidth;
    const TileScratch& s = c.scratch;
    const int B = c.block_size, CT = c.chunk_tokens, D = c.head_size;
    const CacheT* row = c.value_head + d * B;  // value_cache[0][head][d][:]
    float sums[H];
    for (int g = 0; g < H; ++g) sums[g] = 0.0f;
    for (int lb = 0; lb < blocks; ++lb) {
      const int block_id = s.block_ids[lb];
      if (block_id < 0) continue;  // attended by no row of the pass: never read
      const CacheT* v = row + block_id * c.block_stride;
      const float* p = s.probs + lb * B;
      const int slots = lb + 1 == blocks ? last_block_slots : B;
      if (B % W == 0) {
        for (int first = 0; first < slots; first += W) {
          float vf[W];
          load_floats<W>(v + first, vf);
          // Slots past the sequence may hold anything, NaN included: they must not reach o.
          for (int j = 0; j < W; ++j) vf[j] = first + j < slots ? vf[j] : 0.0f;
          for (int g = 0; g < H; ++g) {
            float pv[W];
            load_floats<W>(p + g * CT + first, pv);
            for (int j = 0; j < W; ++j) sums[g] += pv[j] * vf[j];
          }
        }
      } else {  // block sizes that are no multiple of the load width
        for (int slot = 0; slot < slots; ++slot) {
          const float vf = to_float(v[slot]);
          for (int g = 0; g < H; ++g) sums[g] += p[g * CT + slot] * vf;
        }
      }
    }
    for (int g = 0; g < H; ++g) s.o[g * D + d] = s.o[g * D + d] * merge_weight[g] + sums[g];
  }
};

}  // namespace kpa::detail
