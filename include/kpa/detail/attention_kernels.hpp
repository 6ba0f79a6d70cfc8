#pragma once
// The two kernels behind every paged-attention entry point.
//
// PartitionKernel: one team walks its even share of tiles, a tile being one (sequence, kv head,
// partition). For each tile and each pass over up to kMaxHeadsPerPass query heads of the GQA
// group, the tile's tokens are processed in chunks of a few blocks:
//   1. logits: team threads take blocks, vector lanes take the slots of a block; each K element
//      is read once and applied to every query head of the pass; each block ends as a softmax
//      state (block max, sum of exp) with its probabilities left in scratch;
//   2. a team parallel_reduce with SoftmaxReducer merges the block states into the chunk state,
//      which is merged into the tile's running state;
//   3. team threads and lanes take output dimensions and accumulate p * V over the chunk, each V
//      element read once for all heads of the pass, rescaling the running output by the merge
//      weights.
// The tile ends as the normalised output (Output::Final) or as vLLM's v2 partition triple
// max_logits / exp_sums / tmp_out (Output::Partition).
//
// PartitionReduceKernel: one team per (sequence, query head) share; merges the partition states
// with the same SoftmaxReducer and sums the normalised partition outputs by their shares.

#include <kpa/detail/attention_math.hpp>
#include <kpa/detail/softmax_state.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>

namespace kpa::detail {

/// Query heads of one GQA group computed together per pass over a tile's K/V. Larger groups
/// take several passes (their K/V is then read once per pass).
inline constexpr int kMaxHeadsPerPass = 8;
/// Tokens whose logits sit in team scratch at once (rounded down to whole blocks).
inline constexpr int kChunkTokens = 128;

inline int chunk_tokens_for(int block_size) {
  return block_size >= kChunkTokens ? block_size : (kChunkTokens / block_size) * block_size;
}

enum class Output { Final, Partition };

/// vLLM's block-sparse pattern, in the kernel's terms.
struct BlockSparseGeometry {
  int vert_stride = 0;  ///< <= 1: dense
  int local_blocks = 0;
  int block_size = 1;  ///< tokens per sparse block (a multiple of the cache block size)
  int head_sliding_step = 0;
  int tp_rank = 0;
  int num_heads = 0;  ///< query heads on this rank
};

/// Everything a PartitionKernel needs besides its views.
struct PartitionGeometry {
  Output output = Output::Final;
  int num_kv_heads = 0;
  int group_size = 0;  ///< query heads per kv head
  int head_size = 0;
  int block_size = 0;
  int partition_size = 0;
  int num_partitions = 0;
  int tiles = 0;
  int league_size = 0;
  int chunk_tokens = 0;
  float scale = 1.0f;        ///< multiplies q.k (includes the fp8 key scale)
  float value_scale = 1.0f;  ///< fp8 value scale (1 otherwise)
  BlockSparseGeometry sparse;
  std::int64_t cache_block_stride = 0;  ///< elements between consecutive physical blocks
  std::int64_t cache_head_stride = 0;   ///< elements between kv heads inside a block
};

/// First tile and tile count of `team` when `tiles` are shared evenly by `teams` (GridEvenShare).
KOKKOS_INLINE_FUNCTION void even_share(int tiles, int teams, int team, int& first, int& count) {
  const int base = tiles / teams;
  const int extra = tiles % teams;
  first = team * base + (team < extra ? team : extra);
  count = base + (team < extra ? 1 : 0);
}

template <class Space, class CacheT, class OutView, class QueryView, class BlockTableView, class SeqLenView,
          class AlibiView, class PartialView, class TmpOutView>
struct PartitionKernel {
  using policy_type = Kokkos::TeamPolicy<Space, Kokkos::Schedule<Kokkos::Dynamic>>;
  using member_type = typename policy_type::member_type;
  using scratch_view = Kokkos::View<float*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using block_id_view = Kokkos::View<int*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using out_type = typename OutView::non_const_value_type;
  using tmp_out_type = typename TmpOutView::non_const_value_type;

  OutView out;
  QueryView query;
  const CacheT* key_cache;
  const CacheT* value_cache;
  BlockTableView block_tables;
  SeqLenView seq_lens;
  AlibiView alibi_slopes;  // extent 0: no ALiBi
  PartialView exp_sums;    // Output::Partition only
  PartialView max_logits;  // Output::Partition only
  TmpOutView tmp_out;      // Output::Partition only
  PartitionGeometry geo;
  int scratch_level = 0;

  /// Scratch floats of a team: room for the largest pass (kMaxHeadsPerPass heads).
  KOKKOS_INLINE_FUNCTION std::size_t scratch_floats() const {
    const int chunk_blocks = geo.chunk_tokens / geo.block_size;
    return static_cast<std::size_t>(kMaxHeadsPerPass) * (2 * geo.head_size + geo.chunk_tokens + 2 * chunk_blocks);
  }
  std::size_t scratch_bytes() const {
    return scratch_view::shmem_size(scratch_floats()) + block_id_view::shmem_size(geo.chunk_tokens / geo.block_size);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    const scratch_view floats(member.team_scratch(scratch_level), scratch_floats());
    const block_id_view block_ids(member.team_scratch(scratch_level), geo.chunk_tokens / geo.block_size);
    const Scratch scratch{floats.data(), block_ids.data()};
    int first = 0, count = 0;
    even_share(geo.tiles, geo.league_size, member.league_rank(), first, count);
    for (int tile = first; tile < first + count; ++tile) run_tile(member, scratch, tile);
  }

  struct Scratch {
    float* floats;
    int* block_ids;  ///< physical blocks of the current chunk
  };

  KOKKOS_INLINE_FUNCTION void run_tile(const member_type& member, const Scratch& scratch, int tile) const {
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
          out(seq, kv_head * geo.group_size + i / D, i % D) = from_float<out_type>(0.0f);
        });
      }
      return;
    }
    const int end = (seq_len - begin < geo.partition_size) ? seq_len : begin + geo.partition_size;
    for (int head0 = 0; head0 < geo.group_size; head0 += kMaxHeadsPerPass) {
      const int heads = (geo.group_size - head0 < kMaxHeadsPerPass) ? geo.group_size - head0 : kMaxHeadsPerPass;
      const Pass pass{seq, kv_head, kv_head * geo.group_size + head0, heads, seq_len, begin, end, partition};
      // Head counts become compile-time constants so the inner loops unroll and vectorise;
      // a pass of 3, 5 or 7 heads runs with zero-query padding heads that are never stored.
      if (heads == 1) {
        run_pass<1>(member, scratch, pass);
      } else if (heads == 2) {
        run_pass<2>(member, scratch, pass);
      } else if (heads <= 4) {
        run_pass<4>(member, scratch, pass);
      } else if (heads <= 6) {
        run_pass<6>(member, scratch, pass);
      } else {
        run_pass<8>(member, scratch, pass);
      }
    }
  }

  struct Pass {
    int seq, kv_head, first_head, heads, seq_len, begin, end, partition;
  };

  /// Block-sparse pattern (vLLM's blocksparse_* arguments): which heads of the pass attend the
  /// block starting at token `block_token`; returns whether any real head does. Padding heads
  /// follow the real ones. Dense attention attends everything.
  template <int H>
  KOKKOS_INLINE_FUNCTION bool block_mask(const Pass& pass, int block_token, bool (&attends)[H]) const {
    if (geo.sparse.vert_stride <= 1) {
      for (int g = 0; g < H; ++g) attends[g] = true;
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
    for (int g = pass.heads; g < H; ++g) attends[g] = any;
    return any;
  }

  template <int H>
  KOKKOS_INLINE_FUNCTION void run_pass(const member_type& member, const Scratch& scratch, const Pass& pass) const {
    constexpr int X = static_cast<int>(16 / sizeof(CacheT));  // elements per 16-byte key vector
    const int D = geo.head_size;
    const int B = geo.block_size;
    const int CT = geo.chunk_tokens;
    const int CB = CT / B;
    const int seq = pass.seq;
    float* q = scratch.floats;           // [H][D], pre-scaled query
    float* o = q + H * D;                // [H][D], running unnormalised output
    float* probs = o + H * D;            // [H][CT], logits, then probabilities scaled to the running max
    float* block_max = probs + H * CT;   // [H][CB]
    float* block_sum = block_max + H * CB;  // [H][CB]

    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, H * D), [&](int i) {
      const int g = i / D;
      q[i] = g < pass.heads ? to_float(query(seq, pass.first_head + g, i % D)) * geo.scale : 0.0f;
      o[i] = 0.0f;
    });
    float alibi[H];
    for (int g = 0; g < H; ++g) {
      alibi[g] = (g < pass.heads && alibi_slopes.extent(0) > 0) ? alibi_slopes(pass.first_head + g) : 0.0f;
    }
    SoftmaxState running[H];  // identical in every thread of the team
    float old_weight[H];
    const CacheT* key_head = key_cache + pass.kv_head * geo.cache_head_stride;
    const CacheT* value_head = value_cache + pass.kv_head * geo.cache_head_stride;
    const std::size_t block_bytes = sizeof(CacheT) * static_cast<std::size_t>(geo.cache_head_stride);
    member.team_barrier();

    for (int chunk_begin = pass.begin; chunk_begin < pass.end; chunk_begin += CT) {
      const int chunk_end = (pass.end - chunk_begin < CT) ? pass.end : chunk_begin + CT;
      const int blocks = (chunk_end - chunk_begin + B - 1) / B;
      auto slots_in = [&](int lb) { return (chunk_end - chunk_begin - lb * B < B) ? chunk_end - chunk_begin - lb * B : B; };

      // 1. Logits and per-block softmax states; the chunk's physical block ids go to scratch.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, blocks), [&](int lb) {
        const int block_token = chunk_begin + lb * B;
        const int slots = slots_in(lb);
        const int block_id = block_tables(seq, block_token / B);
        bool attends[H];
        const bool any_attends = block_mask<H>(pass, block_token, attends);
        if (!any_attends) {  // skipped for every head of the pass: not read at all
          for (int g = 0; g < H; ++g) {
            Kokkos::single(Kokkos::PerThread(member), [&]() {
              block_max[g * CB + lb] = -compat::infinity();
              block_sum[g * CB + lb] = 0.0f;
            });
          }
          Kokkos::single(Kokkos::PerThread(member), [&]() { scratch.block_ids[lb] = -1; });
          return;
        }
        const CacheT* key_block = key_head + block_id * geo.cache_block_stride;
        constexpr int S = kSlotsPerCall;
        const CacheT* value_block = value_head + block_id * geo.cache_block_stride;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, (slots + S - 1) / S), [&](int group) {
          prefetch_slice(value_block, block_bytes, group, (B + S - 1) / S);  // read in step 3
          const int first_slot = group * S;
          const int count = slots - first_slot < S ? slots - first_slot : S;
          float logits[S][H];
          // key_cache[block][head][:][slot][:]
          slot_logits<H, X, S>(key_block + first_slot * X, B * X, D / X, q, D, count, logits);
          for (int s = 0; s < count; ++s) {
            const float position = static_cast<float>(block_token + first_slot + s - pass.seq_len + 1);
            for (int g = 0; g < H; ++g) probs[g * CT + lb * B + first_slot + s] = logits[s][g] + alibi[g] * position;
          }
        });
        for (int g = 0; g < H; ++g) {
          float* p = probs + g * CT + lb * B;
          if (!attends[g]) {  // block-sparse: no weight for this head
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots), [&](int slot) { p[slot] = 0.0f; });
            Kokkos::single(Kokkos::PerThread(member), [&]() {
              block_max[g * CB + lb] = -compat::infinity();
              block_sum[g * CB + lb] = 0.0f;
            });
            continue;
          }
          float block_max_logit = -compat::infinity();
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, slots),
              [&](int slot, float& m) { m = compat::fmax(m, p[slot]); }, Kokkos::Max<float>(block_max_logit));
          float block_exp_sum = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, slots),
              [&](int slot, float& sum) {
                const float e = compat::exp(p[slot] - block_max_logit);
                p[slot] = e;
                sum += e;
              },
              block_exp_sum);
          Kokkos::single(Kokkos::PerThread(member), [&]() {
            block_max[g * CB + lb] = block_max_logit;
            block_sum[g * CB + lb] = block_exp_sum;
          });
        }
        Kokkos::single(Kokkos::PerThread(member), [&]() { scratch.block_ids[lb] = block_id; });
      });
      member.team_barrier();

      // 2. Chunk state = merge of the block states; fold it into the running state, then bring
      //    every block's probabilities to the running max.
      for (int g = 0; g < H; ++g) {
        SoftmaxState chunk;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, blocks),
            [&](int lb, SoftmaxState& state) { state.merge(SoftmaxState{block_max[g * CB + lb], block_sum[g * CB + lb]}); },
            SoftmaxReducer<Space>(chunk));
        old_weight[g] = running[g].merge(chunk).self;
      }
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, H * blocks), [&](int i) {
        const int g = i / blocks;
        const int lb = i % blocks;
        float* p = probs + g * CT + lb * B;
        if (block_sum[g * CB + lb] > 0.0f) {
          const float weight = compat::exp(block_max[g * CB + lb] - running[g].max_logit);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots_in(lb)), [&](int slot) { p[slot] *= weight; });
        } else {  // a block without weight (block-sparse); the running state may still be empty
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots_in(lb)), [&](int slot) { p[slot] = 0.0f; });
        }
      });
      member.team_barrier();

      // 3. o = o * old_weight + sum over the chunk of p * V. Each thread or lane owns output
      //    dimensions and reads each V element once for all heads of the pass.
      const int last_block_slots = slots_in(blocks - 1);
      const int next_blocks = (pass.end - chunk_end < CT ? pass.end - chunk_end + B - 1 : CT) / B;
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, D), [&](int d) {
        if (next_blocks > 0 && d < (D / next_blocks) * next_blocks) {  // the next chunk's keys, read in step 1
          const int next = d % next_blocks;
          prefetch_slice(key_head + block_tables(seq, chunk_end / B + next) * geo.cache_block_stride, block_bytes,
                         d / next_blocks, D / next_blocks);
        }
        float sums[H];
        chunk_pv<H>(value_head + d * B, scratch.block_ids, geo.cache_block_stride, B, blocks, last_block_slots, probs,
                    CT, sums);
        for (int g = 0; g < H; ++g) o[g * D + d] = o[g * D + d] * old_weight[g] + sums[g];
      });
      member.team_barrier();
    }

    // Results of the pass.
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, pass.heads * D), [&](int i) {
      const int g = i / D;
      // fp8 values are dequantised here: the output is linear in V.
      const float inv_sum = running[g].exp_sum > 0.0f ? geo.value_scale / running[g].exp_sum : 0.0f;
      if (geo.output == Output::Final) {
        out(seq, pass.first_head + g, i % D) = from_float<out_type>(o[i] * inv_sum);
      } else {
        tmp_out(seq, pass.first_head + g, pass.partition, i % D) = from_float<tmp_out_type>(o[i] * inv_sum);
      }
    });
    if (geo.output == Output::Partition) {
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        for (int g = 0; g < pass.heads; ++g) {
          max_logits(seq, pass.first_head + g, pass.partition) = running[g].max_logit;
          exp_sums(seq, pass.first_head + g, pass.partition) = running[g].exp_sum;
        }
      });
    }
    member.team_barrier();  // the next pass reuses the scratch
  }
};

template <class Space, class OutView, class SeqLenView, class PartialView, class TmpOutView>
struct PartitionReduceKernel {
  using policy_type = Kokkos::TeamPolicy<Space>;
  using member_type = typename policy_type::member_type;
  using scratch_view = Kokkos::View<float*, typename Space::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using out_type = typename OutView::non_const_value_type;

  OutView out;
  SeqLenView seq_lens;
  PartialView exp_sums;
  PartialView max_logits;
  TmpOutView tmp_out;
  int num_heads = 0;
  int head_size = 0;
  int partition_size = 0;
  int items = 0;  ///< num_seqs * num_heads
  int league_size = 0;
  int scratch_level = 0;

  std::size_t scratch_bytes() const { return scratch_view::shmem_size(exp_sums.extent(2)); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    scratch_view shares(member.team_scratch(scratch_level), exp_sums.extent(2));
    int first = 0, count = 0;
    even_share(items, league_size, member.league_rank(), first, count);
    for (int item = first; item < first + count; ++item) {
      const int seq = item / num_heads;
      const int head = item % num_heads;
      const int partitions = (seq_lens(seq) + partition_size - 1) / partition_size;
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
        out(seq, head, d) = from_float<out_type>(acc);
      });
      member.team_barrier();
    }
  }
};

}  // namespace kpa::detail
