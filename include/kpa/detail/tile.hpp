#pragma once
// The vocabulary both kernel paths share: what a tile is, where its team scratch lives, and how
// tiles are shared out among the teams of a league.

#include <kpa/detail/attention_variant.hpp>
#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/detail/tile_config.hpp>
#include <kpa/launch_plan.hpp>

#include <cstdint>

namespace kpa::detail {

/// What a tile's result becomes: the normalised output (single partition, v1), or vLLM's v2
/// partition triple max_logits / exp_sums / tmp_out.
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

/// The sizes and scalars of one attention launch (everything a kernel needs besides its views).
struct TileGeometry {
  Output output = Output::Final;
  int num_kv_heads = 0;
  int group_size = 0;  ///< query heads per kv head
  bool several_query_tokens = false;  ///< query_start_loc given: rows are query tokens x heads
  int head_size = 0;
  int block_size = 0;
  int partition_size = 0;
  int num_partitions = 0;
  int tiles = 0;
  int league_size = 0;
  int chunk_tokens = 0;
  HostIsa host_isa = HostIsa::Portable;  ///< the host path's inner loops
  float scale = 1.0f;        ///< multiplies q.k (includes the fp8 key scale)
  float value_scale = 1.0f;  ///< fp8 value scale (1 otherwise)
  BlockSparseGeometry sparse;
  AttentionVariant variant;
  std::int64_t cache_block_stride = 0;  ///< elements between consecutive physical blocks
  std::int64_t cache_head_stride = 0;   ///< elements between kv heads inside a block
};

/// One pass over a tile: a run of up to H of its rows over the tokens [begin, end) of one
/// partition of one sequence. The tile's rows are its sequence's query tokens x the kv head's
/// group of query heads, row r being query token r / group_size and head r % group_size of the
/// group (decode: one token, the rows are the group's heads).
struct Pass {
  int seq, kv_head;
  int first_row;    ///< the tile's row that is the pass's row 0
  int rows;         ///< real rows (<= H; the others are padding: zero queries, never stored)
  int query_start;  ///< the sequence's first row of query / out
  int query_len;    ///< its query tokens: the last query_len of its seq_len tokens
  int seq_len, begin, end, partition;
};

/// A team's scratch during a pass (see TileScratchLayout).
struct TileScratch {
  float* q;          ///< [H][D]
  float* o;          ///< [H][D]
  float* probs;      ///< [H][chunk_tokens]
  float* running;    ///< [3][H]: max, sum, merge weight
  int* block_ids;    ///< [chunk_blocks]

  template <class Member>
  KOKKOS_INLINE_FUNCTION static TileScratch carve(const Member& member, int level, const TileScratchLayout& layout) {
    // 16-byte alignment: the device path reads scratch floats four at a time.
    float* floats = static_cast<float*>(member.team_scratch(level).get_shmem_aligned(layout.floats() * 4, 16));
    int* ints = static_cast<int*>(member.team_scratch(level).get_shmem_aligned(layout.ints() * 4, 16));
    return TileScratch{floats + layout.q(), floats + layout.o(), floats + layout.probs(), floats + layout.running(),
                       ints};
  }
};

/// First tile and tile count of `team` when `tiles` are shared evenly by `teams` (GridEvenShare).
KOKKOS_INLINE_FUNCTION void even_share(int tiles, int teams, int team, int& first, int& count) {
  const int base = tiles / teams;
  const int extra = tiles % teams;
  first = team * base + (team < extra ? team : extra);
  count = base + (team < extra ? 1 : 0);
}

}  // namespace kpa::detail
