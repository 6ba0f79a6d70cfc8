#pragma once
// The streaming device kernel path (KernelPath::Device): how a team computes one pass over a tile
// on a GPU with many copies in flight and no team barrier while it reads the cache.
//
// A team is W members (GPU: warps) of vector_length lanes. The pass's keys are cut into steps of
// T tokens (chunk_tokens: whole blocks, or a block's equal parts); member w takes steps w, w + W,
// ... and owns a two-stage ring in team scratch. Per step it
//   1. issues the copies of the next step's keys and values into the other stage (16-byte
//      pieces in the cache's own order, so a warp's copies are contiguous; AsyncCopy keeps them
//      in flight on GPUs that can), then waits for this step's stage;
//   2. logits: lane j takes token j and computes q.k for every row of the pass from scratch (the
//      queries are read by all lanes at once); the step's softmax state for all rows comes out of
//      one vector-level parallel_reduce with SoftmaxReducer, and merges into the member's running
//      state, which every lane holds in registers;
//   3. p.V: lane d takes head dimension d, rescales the member's output rows (in scratch) by the
//      merge weight and adds the step's probabilities times the values.
// At the end of the pass the members' states merge with one team parallel_reduce (the same
// reducer) and their outputs are summed with the merge weights into member 0's rows. The same code
// runs on host back ends (members and lanes loop; copies are immediate), which is how the test
// suite covers it without a GPU.

#include <kpa/detail/device_loads.hpp>
#include <kpa/detail/kernel_params.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/numeric_types.hpp>

namespace kpa::detail {

template <int H, class CacheT>
struct StreamingPath : DeviceRowIO {
  static constexpr int rows = H;
  using cache_type = CacheT;
  /// The planner puts all of this path's scratch in level 0: a literal level lets the compiler
  /// address it as shared memory.
  static constexpr bool scratch_in_level0 = true;
  /// At most 4 warps per team (the planner's limit); one team per SM is enough for ptxas, so it
  /// never trades registers for spills (shared memory bounds the teams per SM first).
  using launch_bounds = Kokkos::LaunchBounds<128, 1>;

  /// Elements of a 16-byte piece: a key vector of vLLM's layout, or a run of a value row.
  static constexpr int kPiece = static_cast<int>(16 / sizeof(CacheT));

  template <class Member>
  KOKKOS_INLINE_FUNCTION void attend(const Member& member, const PassContext<H, CacheT>& c,
                                     SoftmaxStates<H>& running) const {
    using Space = typename Member::execution_space;
    using Copy = compat::AsyncCopy<Space>;
    const TileScratch& s = c.scratch;
    const int W = member.team_size(), w = member.team_rank();
    const int T = c.chunk_tokens, HD = H * c.head_size;
    float* o = s.o + w * HD;  // this member's output rows (member 0's are the pass's)
    float* probs = s.probs + w * H * T;
    float* ring = s.ring + static_cast<std::ptrdiff_t>(w) * 2 * s.stage_floats;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, HD), [&](int i) { o[i] = 0.0f; });
    SoftmaxStates<H> state;
    const int steps = (c.end - c.begin + T - 1) / T;
    if (w < steps) {
      issue(member, c, c.begin + w * T, ring);
      Copy::commit();
    }
    for (int step = w, k = 0; step < steps; step += W, ++k) {
      const float* stage = ring + (k & 1) * s.stage_floats;
      if (step + W < steps) {
        issue(member, c, c.begin + (step + W) * T, ring + ((k + 1) & 1) * s.stage_floats);
        Copy::commit();
        Copy::template wait<1>();
      } else {
        Copy::template wait<0>();
      }
      compat::vector_sync(member);  // every lane's copies of this stage have landed
      compute_step(member, c, c.begin + step * T, stage, probs, o, state);
      compat::vector_sync(member);  // the stage is read before the next step refills it
    }
    merge_members(member, c, state, running);
  }

  /// Bit j: token start + j is read (before the pass's end, in a block some row attends).
  KOKKOS_INLINE_FUNCTION static unsigned step_tokens(const PassContext<H, CacheT>& c, int start) {
    const int n = c.end - start < c.chunk_tokens ? c.end - start : c.chunk_tokens;
    unsigned read = n >= 32 ? ~0u : (1u << n) - 1u;
    if (c.variant.skips_blocks()) {
      for (int j = 0; j < n;) {
        const int next = ((start + j) / c.block_size + 1) * c.block_size - start;
        const int stop = next < n ? next : n;
        if (c.rows_attending_block(start + j) == 0u) {
          for (int i = j; i < stop; ++i) read &= ~(1u << i);
        }
        j = stop;
      }
    }
    return read;
  }

  /// Starts the copies of the keys and values of the step at `start` into `stage`: keys as
  /// [D / kPiece][T][kPiece], values as [ceil(T / kPiece)][D][kPiece] (a lane's run of a value row
  /// then sits next to its neighbours'). Tokens not read are not copied.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void issue(const Member& member, const PassContext<H, CacheT>& c, int start,
                                           float* stage) {
    using Copy = compat::AsyncCopy<typename Member::execution_space>;
    const int T = c.chunk_tokens, B = c.block_size, D = c.head_size;
    const unsigned read = step_tokens(c, start);
    // A step inside one block reads its page-table entry once.
    const bool one_block = T <= B;
    const int first_block = one_block ? c.block_of(start) : 0;
    char* keys = reinterpret_cast<char*>(stage);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D / kPiece * T), [&](int p) {
      const int dx = p / T, j = p % T;
      if ((read >> j & 1u) == 0u) return;
      const int key = start + j;
      const std::int64_t block = one_block ? first_block : c.block_of(key);
      // key_cache[block][head][dx][slot][:]
      Copy::copy16(keys + p * 16, c.key_head + block * c.block_stride + (dx * B + key % B) * kPiece);
    });
    char* values = keys + static_cast<std::ptrdiff_t>(T) * D * sizeof(CacheT);
    const int runs = (T + kPiece - 1) / kPiece;
    if (B % kPiece == 0 && T % kPiece == 0) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D * runs), [&](int p) {
        const int d = p / runs, run = p % runs;
        if ((read >> (run * kPiece) & 1u) == 0u) return;  // a run lies in one block
        const int key = start + run * kPiece;
        const std::int64_t block = one_block ? first_block : c.block_of(key);
        // value_cache[block][head][d][slot]
        Copy::copy16(values + (run * D + d) * 16, c.value_head + block * c.block_stride + d * B + key % B);
      });
    } else {  // value rows that are no whole number of 16-byte pieces: element by element
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D * T), [&](int p) {
        const int d = p / T, j = p % T;
        if ((read >> j & 1u) == 0u) return;
        const int key = start + j;
        const std::int64_t block = one_block ? first_block : c.block_of(key);
        CacheT* dst = reinterpret_cast<CacheT*>(values + ((j / kPiece) * D + d) * 16) + j % kPiece;
        *dst = c.value_head[block * c.block_stride + d * B + key % B];
      });
    }
  }

  /// One step of a member: logits, the running state's merge, p.V into the member's rows `o`.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void compute_step(const Member& member, const PassContext<H, CacheT>& c, int start,
                                                  const float* stage, float* probs, float* o,
                                                  SoftmaxStates<H>& state) {
    using Space = typename Member::execution_space;
    const int T = c.chunk_tokens, D = c.head_size;
    const int n = c.end - start < T ? c.end - start : T;
    const unsigned read = step_tokens(c, start);
    const CacheT* keys = reinterpret_cast<const CacheT*>(stage);
    const CacheT* values = keys + static_cast<std::ptrdiff_t>(T) * D;
    const float* q = c.scratch.q;
    const auto token_state = [&](int j, SoftmaxStates<H>& st) {
      float acc[H];
      for (int g = 0; g < H; ++g) acc[g] = 0.0f;
      const bool token_read = (read >> j & 1u) != 0u;
      if (token_read) {
        for (int dx = 0; dx < D / kPiece; ++dx) {
          float k[kPiece];
          load_floats<kPiece>(keys + (dx * T + j) * kPiece, k);
          for (int g = 0; g < H; ++g) {
            float qv[kPiece];
            load_floats<kPiece>(q + g * D + dx * kPiece, qv);
            for (int i = 0; i < kPiece; ++i) acc[g] += qv[i] * k[i];
          }
        }
      }
      const int key = start + j;
      const unsigned rows = c.variant.skips_blocks() ? c.rows_attending_block(key) : ~0u;
      for (int g = 0; g < H; ++g) {
        const bool attended = token_read && (rows >> g & 1u) != 0u && c.variant.in_window(c.row[g], key);
        const float logit = attended ? c.variant.logit(acc[g], c.row[g], key) : -compat::infinity();
        probs[g * T + j] = logit;
        st.head[g].add(logit);
      }
    };
    SoftmaxStates<H> step;
    if constexpr (compat::lanes_in_lockstep<Member>) {
      // Each lane folds its tokens, then the lanes merge pairwise through shuffles (the reducer's
      // join): every lane ends with the step's state, which never leaves registers (Kokkos'
      // vector reduction of a struct goes through local memory).
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int j) { token_state(j, step); });
      for (int mask = 1; mask < 32; mask *= 2) {
        SoftmaxStates<H> other;
        for (int g = 0; g < H; ++g) {
          other.head[g].max_logit = compat::lane_xor(member, step.head[g].max_logit, mask);
          other.head[g].exp_sum = compat::lane_xor(member, step.head[g].exp_sum, mask);
        }
        step.merge(other);
      }
    } else {
      Kokkos::parallel_reduce(Kokkos::ThreadVectorRange(member, n), token_state,
                              SoftmaxReducer<Space, SoftmaxStates<H>>(step));
    }
    float weight[H], max_logit[H];
    for (int g = 0; g < H; ++g) {
      weight[g] = state.head[g].merge(step.head[g]).self;
      max_logit[g] = state.head[g].max_logit;
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), [&](int j) {
      for (int g = 0; g < H; ++g) {
        float& p = probs[g * T + j];
        p = p != -compat::infinity() ? compat::exp(p - max_logit[g]) : 0.0f;
      }
    });
    compat::vector_sync(member);  // every lane's probabilities are in scratch
    const bool whole = n == T && T % kPiece == 0 && read == (T >= 32 ? ~0u : (1u << T) - 1u);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D), [&](int d) {
      float sums[H];
      for (int g = 0; g < H; ++g) sums[g] = 0.0f;
      if (whole) {
        for (int j0 = 0; j0 < T; j0 += kPiece) {
          float v[kPiece];
          load_floats<kPiece>(values + ((j0 / kPiece) * D + d) * kPiece, v);
          for (int g = 0; g < H; ++g) {
            float p[kPiece];
            load_floats<kPiece>(probs + g * T + j0, p);
            for (int i = 0; i < kPiece; ++i) sums[g] += p[i] * v[i];
          }
        }
      } else {  // the pass's last step, or blocks not read: those tokens must not reach o (NaN included)
        for (int j = 0; j < n; ++j) {
          if ((read >> j & 1u) == 0u) continue;
          const float v = to_float(values[((j / kPiece) * D + d) * kPiece + j % kPiece]);
          for (int g = 0; g < H; ++g) sums[g] += probs[g * T + j] * v;
        }
      }
      for (int g = 0; g < H; ++g) o[g * D + d] = o[g * D + d] * weight[g] + sums[g];
    });
  }

  /// The members' states merged into `running` (every worker of the team gets it) and their
  /// outputs summed with the merge weights into member 0's rows, the pass's o.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void merge_members(const Member& member, const PassContext<H, CacheT>& c,
                                                   const SoftmaxStates<H>& state, SoftmaxStates<H>& running) {
    using Space = typename Member::execution_space;
    const TileScratch& s = c.scratch;
    const int W = member.team_size(), w = member.team_rank();
    const int HD = H * c.head_size;
    float* states = s.running;            // [W][2][H]: max logits, then sums
    float* weights = s.running + 2 * W * H;  // [W][H]
    Kokkos::single(Kokkos::PerThread(member), [&]() {
      for (int g = 0; g < H; ++g) {
        states[(2 * w) * H + g] = state.head[g].max_logit;
        states[(2 * w + 1) * H + g] = state.head[g].exp_sum;
      }
    });
    member.team_barrier();
    SoftmaxStates<H> total;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, W),
        [&](int v, SoftmaxStates<H>& merged) {
          for (int g = 0; g < H; ++g) merged.head[g].merge(SoftmaxState{states[(2 * v) * H + g], states[(2 * v + 1) * H + g]});
        },
        SoftmaxReducer<Space, SoftmaxStates<H>>(total));
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      for (int v = 0; v < W; ++v) {
        for (int g = 0; g < H; ++g) weights[v * H + g] = merge_weights(states[(2 * v) * H + g], total.head[g].max_logit).self;
      }
    });
    member.team_barrier();
    if (W > 1) {  // one member's rows already go with its state
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, HD), [&](int i) {
        const int g = i / c.head_size;
        float sum = 0.0f;
        for (int v = 0; v < W; ++v) sum += s.o[v * HD + i] * weights[v * H + g];
        s.o[i] = sum;
      });
    }
    running = total;
  }
};

}  // namespace kpa::detail
