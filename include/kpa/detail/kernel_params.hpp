#pragma once
// The plain data of the attention kernels (the variant holds the rules): the call's views, the
// launch's sizes and scalars, the team scratch the planner laid out, and the context of one pass
// over a tile, which is all a kernel path sees.

#include <kpa/detail/attention_variant.hpp>
#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/launch_plan.hpp>

#include <cstdint>

namespace kpa::detail {

/// What the attention kernels read and write, as plain strided views: every caller's views
/// (any layout, managed or not) convert to these, so one kernel instantiation serves them all.
/// The caches are raw pointers: the kernels address them through KernelParams' strides.
template <class Space, class T, class TmpT>
struct AttentionViews {
  using memory_space = typename Space::memory_space;
  template <class Data>
  using view = Kokkos::View<Data, Kokkos::LayoutStride, memory_space, Kokkos::MemoryUnmanaged>;

  view<T***> out;                  ///< [num_tokens][num_heads][head_size] (num_tokens = num_seqs in decode)
  view<const T***> query;          ///< [num_tokens][num_heads][head_size]
  const void* key_cache = nullptr;    ///< [num_blocks][num_kv_heads][head_size/x][block_size][x]
  const void* value_cache = nullptr;  ///< [num_blocks][num_kv_heads][head_size][block_size]
  view<const int**> block_tables;  ///< [num_seqs][max_blocks_per_seq]
  view<const int*> seq_lens;       ///< [num_seqs]
  view<const float*> alibi_slopes;  ///< [num_heads] or extent 0: none
  // The automatic entry point's extras (extent 0: absent; see AttentionExtras).
  view<const int*> query_start_loc;  ///< [num_seqs + 1]
  view<const float*> sinks;          ///< [num_heads]
  view<float**> lse;                 ///< [num_tokens][num_heads]
  // vLLM v2's partition triple (Output::Partition, and the reduce's input).
  view<float***> exp_sums;         ///< [num_tokens][num_heads][max_num_partitions]
  view<float***> max_logits;       ///< [num_tokens][num_heads][max_num_partitions]
  view<TmpT****> tmp_out;          ///< [num_tokens][num_heads][max_num_partitions][head_size]
};

/// What a tile's result becomes: the normalised output (single partition, v1), or vLLM's v2
/// partition triple max_logits / exp_sums / tmp_out.
enum class Output { Final, Partition };

/// The sizes and scalars of one attention launch: everything a kernel needs besides its views
/// and its variant.
struct KernelParams {
  Output output = Output::Final;
  int num_kv_heads = 0;
  int group_size = 0;                 ///< query heads per kv head
  bool several_query_tokens = false;  ///< query_start_loc given: rows are query tokens x heads
  int head_size = 0;
  int block_size = 0;
  int partition_size = 0;
  int num_partitions = 0;
  int tiles = 0;
  int league_size = 0;
  int chunk_tokens = 0;
  float scale = 1.0f;        ///< multiplies q.k (includes the fp8 key scale)
  float value_scale = 1.0f;  ///< fp8 value scale (1 otherwise)
  std::int64_t cache_block_stride = 0;  ///< elements between consecutive physical blocks
  std::int64_t cache_head_stride = 0;   ///< elements between kv heads inside a block
  TileScratchLayout scratch;            ///< the planner's layout of a team's scratch
  int scratch_level = 0;
};

/// A team's scratch during a pass (TileScratchLayout says what each array holds).
struct TileScratch {
  float* q;          ///< [H][D]
  float* o;          ///< [H][D]
  float* probs;      ///< host path: [H][probs_stride]; device path: TileScratchLayout's
  float* running;    ///< [3][H]
  int* block_ids;    ///< [chunk_blocks]
  float* ring;       ///< device path: [team members][2][stage_floats]
  int stage_floats;  ///< device path: one stage of the ring
  int probs_stride;  ///< host path: floats from a row of probs to the next

  template <class Member>
  KOKKOS_INLINE_FUNCTION static TileScratch carve(const Member& member, int level, const TileScratchLayout& layout) {
    // Cache-line alignment (TileScratchLayout::bytes leaves room for it): the device path reads
    // scratch floats four at a time, the host path's tile loops store rows of 64 bytes.
    float* floats = static_cast<float*>(member.team_scratch(level).get_shmem_aligned(layout.floats * 4, 64));
    int* ints = static_cast<int*>(member.team_scratch(level).get_shmem_aligned(layout.ints * 4, 64));
    return TileScratch{floats + layout.q,       floats + layout.o, floats + layout.probs,
                       floats + layout.running, ints,              floats + layout.ring,
                       static_cast<int>(layout.stage_floats), static_cast<int>(layout.probs_stride)};
  }
};

/// One pass over a tile, as its kernel path sees it: a run of up to H of the tile's rows over the
/// keys [begin, end) of one kv head, with everything the path reads already resolved. A tile's
/// rows are its sequence's query tokens x the kv head's group of query heads; a pass's last rows
/// may be padding (zero queries, the last real row's rules, never stored).
template <int H, class CacheT>
struct PassContext {
  const CacheT* key_head;    ///< key_cache[0][kv_head]: block b at b * block_stride
  const CacheT* value_head;  ///< value_cache[0][kv_head]
  std::int64_t block_stride;
  const int* block_table;    ///< the sequence's row of block_tables: entry i at i * table_stride
  std::int64_t table_stride;
  int begin, end;            ///< keys of the pass (begin on a block boundary)
  int tile_end;              ///< keys of the pass's tile end here (>= end): cache slots all its passes may read
  int head_size, block_size, chunk_tokens;
  float scale;               ///< multiplies q.k (KernelParams::scale)
  QueryRow row[H];
  AttentionVariant variant;
  TileScratch scratch;
  int tile;                  ///< the pass's tile where the tile has more passes, else -1 (TileKey)
  int probability_parts;     ///< of each probability, in a set that splits them (ChunkValuesArgs)

  /// The physical block holding key `key`.
  KOKKOS_INLINE_FUNCTION int block_of(int key) const { return block_table[(key / block_size) * table_stride]; }

  /// Bit r set: row r of the pass attends the block holding key `key`; 0: no row does, and the
  /// block is not read at all.
  KOKKOS_INLINE_FUNCTION unsigned rows_attending_block(int key) const {
    if (!variant.skips_blocks()) return H == 32 ? ~0u : (1u << H) - 1u;
    unsigned rows = 0;
    for (int r = 0; r < H; ++r) rows |= variant.attends_block(row[r], key) ? 1u << r : 0u;
    return rows;
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
