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

/// Everything a PartitionKernel needs besides its views.
struct PartitionGeometry {
  Output output = Output::Final;
  int num_kv_heads = 0;
  int group_size = 0;  ///< query heads per kv head
  int head_size = 0;
  int block_size = 0;
  int x = 0;  ///< elements per 16-byte key vector
  int partition_size = 0;
  int num_partitions = 0;
  int tiles = 0;
  int league_size = 0;
  int chunk_tokens = 0;
  float scale = 1.0f;
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

  int heads_per_pass() const { return geo.group_size < kMaxHeadsPerPass ? geo.group_size : kMaxHeadsPerPass; }

  std::size_t scratch_bytes() const {
    const int chunk_blocks = geo.chunk_tokens / geo.block_size;
    return scratch_view::shmem_size(heads_per_pass() * (2 * geo.head_size + geo.chunk_tokens + 2 * chunk_blocks));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    const int hpp = geo.group_size < kMaxHeadsPerPass ? geo.group_size : kMaxHeadsPerPass;
    const int chunk_blocks = geo.chunk_tokens / geo.block_size;
    scratch_view scratch(member.team_scratch(scratch_level),
                         hpp * (2 * geo.head_size + geo.chunk_tokens + 2 * chunk_blocks));
    int first = 0, count = 0;
    even_share(geo.tiles, geo.league_size, member.league_rank(), first, count);
    for (int tile = first; tile < first + count; ++tile) run_tile(member, scratch.data(), tile);
  }

  KOKKOS_INLINE_FUNCTION void run_tile(const member_type& member, float* scratch, int tile) const {
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
      run_pass(member, scratch, seq, kv_head, kv_head * geo.group_size + head0, heads, seq_len, begin, end,
               partition);
    }
  }

  KOKKOS_INLINE_FUNCTION void run_pass(const member_type& member, float* scratch, int seq, int kv_head,
                                       int first_head, int heads, int seq_len, int begin, int end,
                                       int partition) const {
    const int D = geo.head_size;
    const int B = geo.block_size;
    const int x = geo.x;
    const int hpp = geo.group_size < kMaxHeadsPerPass ? geo.group_size : kMaxHeadsPerPass;
    const int chunk_blocks = geo.chunk_tokens / B;
    float* q = scratch;                             // [hpp][D], pre-scaled query
    float* o = q + hpp * D;                         // [hpp][D], running unnormalised output
    float* probs = o + hpp * D;                     // [hpp][chunk_tokens], logits then exp(l - block max)
    float* block_max = probs + hpp * geo.chunk_tokens;  // [hpp][chunk_blocks], later the block weights
    float* block_sum = block_max + hpp * chunk_blocks;  // [hpp][chunk_blocks]

    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, heads * D), [&](int i) {
      q[i] = to_float(query(seq, first_head + i / D, i % D)) * geo.scale;
      o[i] = 0.0f;
    });
    float alibi[kMaxHeadsPerPass];
    for (int g = 0; g < kMaxHeadsPerPass; ++g) {
      alibi[g] = (g < heads && alibi_slopes.extent(0) > 0) ? alibi_slopes(first_head + g) : 0.0f;
    }
    SoftmaxState running[kMaxHeadsPerPass];  // identical in every thread of the team
    float old_weight[kMaxHeadsPerPass];
    const CacheT* key_head = key_cache + kv_head * geo.cache_head_stride;
    const CacheT* value_head = value_cache + kv_head * geo.cache_head_stride;
    member.team_barrier();

    for (int chunk_begin = begin; chunk_begin < end; chunk_begin += geo.chunk_tokens) {
      const int chunk_end = (end - chunk_begin < geo.chunk_tokens) ? end : chunk_begin + geo.chunk_tokens;
      const int blocks = (chunk_end - chunk_begin + B - 1) / B;

      // 1. Logits and per-block softmax states.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, blocks), [&](int lb) {
        const int block_token = chunk_begin + lb * B;
        const int slots = (chunk_end - block_token < B) ? chunk_end - block_token : B;
        const CacheT* key_block = key_head + block_tables(seq, block_token / B) * geo.cache_block_stride;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, slots), [&](int slot) {
          float acc[kMaxHeadsPerPass] = {};
          for (int dx = 0; dx < D / x; ++dx) {
            const CacheT* k = key_block + (dx * B + slot) * x;  // key_cache[block][head][dx][slot][:]
            for (int i = 0; i < x; ++i) {
              const float kv = to_float(k[i]);
              const float* qd = q + dx * x + i;
              for (int g = 0; g < heads; ++g) acc[g] += qd[g * D] * kv;
            }
          }
          const float position = static_cast<float>(block_token + slot - seq_len + 1);
          for (int g = 0; g < heads; ++g) probs[g * geo.chunk_tokens + lb * B + slot] = acc[g] + alibi[g] * position;
        });
        for (int g = 0; g < heads; ++g) {
          float* p = probs + g * geo.chunk_tokens + lb * B;
          float block_max_logit = -compat::infinity();
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, slots),
              [&](int slot, float& m) { m = compat::fmax(m, p[slot]); }, Kokkos::Max<float>(block_max_logit));
          float block_exp_sum = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, slots),
              [&](int slot, float& s) {
                const float e = compat::exp(p[slot] - block_max_logit);
                p[slot] = e;
                s += e;
              },
              block_exp_sum);
          Kokkos::single(Kokkos::PerThread(member), [&]() {
            block_max[g * chunk_blocks + lb] = block_max_logit;
            block_sum[g * chunk_blocks + lb] = block_exp_sum;
          });
        }
      });
      member.team_barrier();

      // 2. Chunk state = merge of the block states; fold it into the running state.
      for (int g = 0; g < heads; ++g) {
        SoftmaxState chunk;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(member, blocks),
            [&](int lb, SoftmaxState& state) {
              state.merge(SoftmaxState{block_max[g * chunk_blocks + lb], block_sum[g * chunk_blocks + lb]});
            },
            SoftmaxReducer<Space>(chunk));
        old_weight[g] = running[g].merge(chunk).self;
      }
      member.team_barrier();  // every thread has read block_max before it becomes the block weights
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, heads * chunk_blocks), [&](int i) {
        if (i % chunk_blocks < blocks) {
          block_max[i] = compat::exp(block_max[i] - running[i / chunk_blocks].max_logit);
        }
      });
      member.team_barrier();

      // 3. o = o * old_weight + sum over blocks of weight * sum over slots of p * V.
      Kokkos::parallel_for(Kokkos::TeamVectorRange(member, D), [&](int d) {
        float acc[kMaxHeadsPerPass] = {};
        for (int lb = 0; lb < blocks; ++lb) {
          const int block_token = chunk_begin + lb * B;
          const int slots = (chunk_end - block_token < B) ? chunk_end - block_token : B;
          // value_cache[block][head][d][:]
          const CacheT* v = value_head + block_tables(seq, block_token / B) * geo.cache_block_stride + d * B;
          float part[kMaxHeadsPerPass] = {};
          for (int slot = 0; slot < slots; ++slot) {
            const float vv = to_float(v[slot]);
            for (int g = 0; g < heads; ++g) part[g] += probs[g * geo.chunk_tokens + lb * B + slot] * vv;
          }
          for (int g = 0; g < heads; ++g) acc[g] += part[g] * block_max[g * chunk_blocks + lb];
        }
        for (int g = 0; g < heads; ++g) o[g * D + d] = o[g * D + d] * old_weight[g] + acc[g];
      });
      member.team_barrier();
    }

    // Results of the pass.
    Kokkos::parallel_for(Kokkos::TeamVectorRange(member, heads * D), [&](int i) {
      const int g = i / D;
      const float inv_sum = running[g].exp_sum > 0.0f ? 1.0f / running[g].exp_sum : 0.0f;
      if (geo.output == Output::Final) {
        out(seq, first_head + g, i % D) = from_float<out_type>(o[i] * inv_sum);
      } else {
        tmp_out(seq, first_head + g, partition, i % D) = from_float<tmp_out_type>(o[i] * inv_sum);
      }
    });
    if (geo.output == Output::Partition) {
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        for (int g = 0; g < heads; ++g) {
          max_logits(seq, first_head + g, partition) = running[g].max_logit;
          exp_sums(seq, first_head + g, partition) = running[g].exp_sum;
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

  std::size_t scratch_bytes() const { return scratch_view::shmem_size(exp_sums.extent(2)); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& member) const {
    scratch_view shares(member.team_scratch(0), exp_sums.extent(2));
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
