#pragma once
// The device kernel path (KernelPath::Device): how a team computes one pass over a tile on a GPU,
// streaming the cache with many copies in flight and no team barrier while it reads it.
//
// A team is W members (GPU: warps) of vector_length lanes. The pass's keys are cut into steps of
// T tokens (chunk_tokens: a power of two that divides the block size); member w takes steps w, w + W,
// ... and owns a two-stage ring in team scratch. Per step it
//   1. issues the copies of the next step's keys and values into the other stage (16-byte
//      pieces in the cache's own order, so a warp's copies are contiguous; AsyncCopy keeps them
//      in flight on GPUs that can), then waits for this step's stage;
//   2. logits (step_logits): lane j takes token j and computes q.k for every row of the pass from
//      scratch (the queries are read by all lanes at once); the step's softmax state for all rows
//      comes out of one vector-level reduction with the reducer's join, and merges into the
//      member's running state, which every lane holds in registers;
//   3. probabilities (step_probabilities): each logit against the new running max;
//   4. p.V (step_values): lane d takes head dimension d, rescales the member's output rows (in
//      scratch) by the merge weight and adds the step's probabilities times the values.
// At the end of the pass the members' states merge (the same join) and their outputs are summed
// with the merge weights into member 0's rows. The same code
// runs on host back ends (members and lanes loop; copies are immediate), which is how the test
// suite covers it without a GPU.

#include <kpa/detail/device_loads.hpp>
#include <kpa/detail/kernel_params.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/numeric_types.hpp>

namespace kpa::detail {

template <int H, class CacheT>
struct DevicePath : DeviceRowIO {
  static constexpr int rows = H;
  using cache_type = CacheT;
  /// On GPUs the planner puts all of this path's scratch in level 0: a literal level lets the
  /// compiler address it as shared memory.
  static constexpr bool scratch_in_level0 = true;
  /// At most 4 warps per team (the planner's limit); one team per SM is enough for ptxas, so it
  /// never trades registers for spills (shared memory bounds the teams per SM first).
  using launch_bounds = Kokkos::LaunchBounds<128, 1>;

  /// Elements of a 16-byte piece: a key vector of vLLM's layout, or a run of a value row.
  static constexpr int kPiece = static_cast<int>(16 / sizeof(CacheT));

  /// Queries and probabilities are kept piece by piece, the pass's rows side by side:
  /// [D / kPiece][H][kPiece] and [T / kPiece][H][kPiece], so an inner loop finds every row's
  /// elements at fixed offsets from one address.
  KOKKOS_INLINE_FUNCTION static int query_index(int r, int d, int) { return piece_index(r, d); }
  KOKKOS_INLINE_FUNCTION static int piece_index(int r, int i) {
    return ((i / kPiece) * H + r) * kPiece + i % kPiece;
  }

  /// A step: T = 2^shift tokens from `start`, inside one block.
  struct Step {
    int start, tokens;  ///< tokens of the pass in the step (the last step may have fewer than T)
    int block;          ///< its physical block
    int slot;           ///< its first slot in the block
    unsigned rows;      ///< bit r: row r attends the block (0: the block is not read)
  };

  template <class Member>
  KOKKOS_INLINE_FUNCTION void attend(const Member& member, const PassContext<H, CacheT>& c,
                                     SoftmaxStates<H>& running) const {
    using Space = typename Member::execution_space;
    using Copy = compat::AsyncCopy<Space>;
    const TileScratch& s = c.scratch;
    const int W = member.team_size(), w = member.team_rank();
    const int T = c.chunk_tokens, HD = H * c.head_size;
    int shift = 0;
    while ((1 << shift) < T) ++shift;
    float* o = s.o + w * HD;  // this member's output rows (member 0's are the pass's)
    float* probs = s.probs + w * H * round_to_piece(T);
    float* ring = s.ring + static_cast<std::ptrdiff_t>(w) * 2 * s.stage_floats;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, HD), [&](int i) { o[i] = 0.0f; });
    SoftmaxStates<H> state;
    const int steps = (c.end - c.begin + T - 1) >> shift;
    // The step in the stage being computed; the next one's block and rows are found once, when
    // its copies are issued.
    Step current{};
    if (w < steps) {
      current = step_at(c, c.begin + (w << shift));
      issue(member, c, current, shift, ring);
      Copy::commit();
    }
    for (int step = w, k = 0; step < steps; step += W, ++k) {
      const float* stage = ring + (k & 1) * s.stage_floats;
      Step next{};
      if (step + W < steps) {
        next = step_at(c, c.begin + ((step + W) << shift));
        issue(member, c, next, shift, ring + ((k + 1) & 1) * s.stage_floats);
        Copy::commit();
        Copy::template wait<1>();
      } else {
        Copy::template wait<0>();
      }
      compat::vector_sync(member);  // every lane's copies of this stage have landed
      compute_step(member, c, current, shift, stage, probs, o, state);
      compat::vector_sync(member);  // the stage is read before the next step refills it
      current = next;
    }
    merge_members(member, c, state, running);
  }

  KOKKOS_INLINE_FUNCTION static int round_to_piece(int tokens) { return (tokens + kPiece - 1) / kPiece * kPiece; }

  KOKKOS_INLINE_FUNCTION static Step step_at(const PassContext<H, CacheT>& c, int start) {
    Step step;
    step.start = start;
    step.tokens = c.end - start < c.chunk_tokens ? c.end - start : c.chunk_tokens;
    step.block = c.block_of(start);
    step.slot = start % c.block_size;
    step.rows = c.rows_attending_block(start);
    return step;
  }

  /// Starts the copies of the step's keys and values into `stage`: keys as [D / kPiece][T][kPiece],
  /// values as [T / kPiece][D][kPiece] (a lane's run of a value row then sits next to its
  /// neighbours'). A block no row attends is not copied.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void issue(const Member& member, const PassContext<H, CacheT>& c, const Step& step,
                                           int shift, float* stage) {
    using Copy = compat::AsyncCopy<typename Member::execution_space>;
    if (step.rows == 0u) return;
    const int T = 1 << shift, B = c.block_size, D = c.head_size;
    char* keys = reinterpret_cast<char*>(stage);
    // key_cache[block][head][dx][slot][:]
    const CacheT* key_block = c.key_head + step.block * c.block_stride + step.slot * kPiece;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, (D / kPiece) << shift), [&](int p) {
      Copy::copy16(keys + p * 16, key_block + ((p >> shift) * B + (p & (T - 1))) * kPiece);
    });
    char* values = keys + static_cast<std::ptrdiff_t>(T) * D * sizeof(CacheT);
    // value_cache[block][head][d][slot]
    const CacheT* value_block = c.value_head + step.block * c.block_stride + step.slot;
    if (B % kPiece == 0 && T % kPiece == 0) {
      int run_shift = 0;  // runs of a row per step: T / kPiece, a power of two
      while ((kPiece << run_shift) < T) ++run_shift;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D << run_shift), [&](int p) {
        const int d = p >> run_shift, run = p & ((1 << run_shift) - 1);
        Copy::copy16(values + (run * D + d) * 16, value_block + d * B + run * kPiece);
      });
    } else {  // value rows that are no whole number of 16-byte pieces: element by element
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D << shift), [&](int p) {
        const int d = p >> shift, j = p & (T - 1);
        CacheT* dst = reinterpret_cast<CacheT*>(values + ((j / kPiece) * D + d) * 16) + j % kPiece;
        *dst = value_block[d * B + j];
      });
    }
  }

  /// One step of a member: its logits and softmax state, the running state's merge, the
  /// probabilities, p.V into the member's rows `o`.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void compute_step(const Member& member, const PassContext<H, CacheT>& c,
                                                  const Step& step, int shift, const float* stage, float* probs,
                                                  float* o, SoftmaxStates<H>& state) {
    const SoftmaxStates<H> step_state = step_logits(member, c, step, shift, stage, probs);
    float weight[H], max_logit[H];
    for (int g = 0; g < H; ++g) {
      weight[g] = state.head[g].merge(step_state.head[g]).self;
      max_logit[g] = state.head[g].max_logit;
    }
    step_probabilities(member, step, probs, max_logit);
    compat::vector_sync(member);  // every lane's probabilities are in scratch
    step_values(member, c, step, shift, stage, probs, weight, o);
  }

  /// The step's logits of every row into `probs` (masked: -inf), and their softmax state, which
  /// every lane of the member gets.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static SoftmaxStates<H> step_logits(const Member& member, const PassContext<H, CacheT>& c,
                                                             const Step& step, int shift, const float* stage,
                                                             float* probs) {
    using Space = typename Member::execution_space;
    const int T = 1 << shift, D = c.head_size;
    const CacheT* keys = reinterpret_cast<const CacheT*>(stage);
    const float* q = c.scratch.q;
    const auto token_state = [&](int j, SoftmaxStates<H>& st) {
      float acc[H];
      for (int g = 0; g < H; ++g) acc[g] = 0.0f;
      if (step.rows != 0u) {
        const CacheT* k_piece = keys + j * kPiece;
        const float* q_piece = q;
        for (int dx = 0; dx < D / kPiece; ++dx, k_piece += T * kPiece, q_piece += H * kPiece) {
          float k[kPiece];
          load_floats<kPiece>(k_piece, k);
          for (int g = 0; g < H; ++g) {
            float qv[kPiece];
            load_floats<kPiece>(q_piece + g * kPiece, qv);
            for (int i = 0; i < kPiece; ++i) acc[g] += qv[i] * k[i];
          }
        }
      }
      const int key = step.start + j;
      for (int g = 0; g < H; ++g) {
        const bool attended = (step.rows >> g & 1u) != 0u && c.variant.in_window(c.row[g], key);
        const float logit = attended ? c.variant.logit(acc[g], c.row[g], key) : -compat::infinity();
        probs[piece_index(g, j)] = logit;
        st.head[g].add(logit);
      }
    };
    SoftmaxStates<H> merged;
    if constexpr (compat::lanes_in_lockstep<Member>) {
      // Each lane folds its tokens, then the lanes merge pairwise through shuffles (the reducer's
      // join): every lane ends with the step's state, which never leaves registers (Kokkos'
      // vector reduction of a struct goes through local memory).
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, step.tokens), [&](int j) { token_state(j, merged); });
      for (int mask = 1; mask < 32; mask *= 2) {
        SoftmaxStates<H> other;
        for (int g = 0; g < H; ++g) {
          other.head[g].max_logit = compat::lane_xor(member, merged.head[g].max_logit, mask);
          other.head[g].exp_sum = compat::lane_xor(member, merged.head[g].exp_sum, mask);
        }
        merged.merge(other);
      }
    } else {
      Kokkos::parallel_reduce(Kokkos::ThreadVectorRange(member, step.tokens), token_state,
                              SoftmaxReducer<Space, SoftmaxStates<H>>(merged));
    }
    return merged;
  }

  /// The step's logits in `probs` become probabilities against each row's running max (masked: 0).
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void step_probabilities(const Member& member, const Step& step, float* probs,
                                                        const float (&max_logit)[H]) {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, step.tokens), [&](int j) {
      for (int g = 0; g < H; ++g) {
        float& p = probs[piece_index(g, j)];
        p = p != -compat::infinity() ? compat::exp(p - max_logit[g]) : 0.0f;
      }
    });
  }

  /// o = o * weight + p.V over the step, lane d taking head dimension d of every row.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static void step_values(const Member& member, const PassContext<H, CacheT>& c,
                                                 const Step& step, int shift, const float* stage, const float* probs,
                                                 const float (&weight)[H], float* o) {
    const int T = 1 << shift, D = c.head_size, n = step.tokens;
    const CacheT* values = reinterpret_cast<const CacheT*>(stage) + static_cast<std::ptrdiff_t>(T) * D;
    const bool whole = n == T && T % kPiece == 0 && step.rows != 0u;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D), [&](int d) {
      float sums[H];
      for (int g = 0; g < H; ++g) sums[g] = 0.0f;
      if (whole) {
        const CacheT* v_piece = values + d * kPiece;
        const float* p_piece = probs;
        for (int run = 0; run < T / kPiece; ++run, v_piece += D * kPiece, p_piece += H * kPiece) {
          float v[kPiece];
          load_floats<kPiece>(v_piece, v);
          for (int g = 0; g < H; ++g) {
            float p[kPiece];
            load_floats<kPiece>(p_piece + g * kPiece, p);
            for (int i = 0; i < kPiece; ++i) sums[g] += p[i] * v[i];
          }
        }
      } else if (step.rows != 0u) {  // the pass's last step: slots past it must not reach o (NaN included)
        for (int j = 0; j < n; ++j) {
          const float v = to_float(values[((j / kPiece) * D + d) * kPiece + j % kPiece]);
          for (int g = 0; g < H; ++g) sums[g] += probs[piece_index(g, j)] * v;
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
    // Every thread merges the (at most 4) members' states in member order with the reducer's join:
    // the same result everywhere, and no team reduction of a struct (Kokkos passes those through
    // local memory).
    SoftmaxStates<H> total;
    for (int v = 0; v < W; ++v) {
      for (int g = 0; g < H; ++g) total.head[g].merge(SoftmaxState{states[(2 * v) * H + g], states[(2 * v + 1) * H + g]});
    }
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
