#pragma once
// The host kernel path's inner loops as the kernel sees them: their arguments, the prefetcher
// they spread their requests with, and one table of function pointers per (rows per pass, cache
// type), filled for an instruction set once per call. The loops are compiled once, into libkpa
// (src/host_loops/): a portable set every CPU runs, AVX2 and AVX-512 sets built with target
// attributes whatever the flags of the code that includes this header, and an AMX set (bf16 and
// fp8 caches) over AMX's instructions or over a software model of them.
//   block_logits  q . k for the H query rows of a pass against the slots of one cache block;
//   chunk_values  o += p . V for a range of output dimensions over a chunk (o already rescaled);
//   RowLoops      one row of a chunk's logits: the variant's soft cap and ALiBi ramp, and the
//                 softmax (the max, p = exp(logit - max), the sum);
//   RowConversions a query row into scratch floats and an output row out of them.

#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/host_isa.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>
#include <type_traits>

namespace kpa::detail {

/// Asks the caches for the 64-byte line at `p` ahead of use (into L2 and up on x86): a hint, no
/// effect on results; nothing on GPUs.
KOKKOS_INLINE_FUNCTION void prefetch_line(const void* p) {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_prefetch(p, 0, 2);
#else
  (void)p;
#endif
}

/// prefetch_line for every line of [p, p + bytes).
KOKKOS_INLINE_FUNCTION void prefetch_bytes(const void* p, int bytes) {
  for (int i = 0; i < bytes; i += 64) prefetch_line(static_cast<const char*>(p) + i);
}

/// Software prefetches (prefetch_line) of a list of cache blocks, the keys and then the
/// values of each, asked for a line or two at a time from inside the inner loops. The host path
/// lists the next chunk's blocks: spread over the arithmetic of the current chunk, the requests
/// keep the core's line fill buffers busy while it computes, where a block's lines asked for at
/// once stall the core until most of them have been given a buffer.
///
/// An inner-loop call gets an allowance (allow), spreads it over its register tiles (pace),
/// takes one run of lines per tile (take) and asks for them a line or two per iteration
/// (ask_ahead); what its tiles did not take it asks for at its end (finish).
class BlockPrefetcher {
 public:
  /// Lines [first, end) of one block, for ask_ahead.
  struct Run {
    const char* first = nullptr;
    const char* end = nullptr;
  };

  BlockPrefetcher() = default;
  /// Blocks ids[0, count) (< 0: skipped), each `block_bytes` at keys + id * block_stride and
  /// values + id * block_stride (bytes).
  KOKKOS_INLINE_FUNCTION BlockPrefetcher(const void* keys, const void* values, std::int64_t block_stride,
                                         int block_bytes, const int* ids, int count)
      : keys_(static_cast<const char*>(keys)),
        values_(static_cast<const char*>(values)),
        stride_(block_stride),
        bytes_(block_bytes),
        ids_(ids),
        segments_(2 * count) {}

  /// Lets the next inner-loop call ask for up to `lines` more lines.
  KOKKOS_INLINE_FUNCTION void allow(int lines) { allowed_ += lines; }
  /// For that call, before its loop: spreads the allowance over `tiles` calls of take().
  KOKKOS_INLINE_FUNCTION void pace(int tiles) { per_tile_ = tiles > 1 ? (allowed_ + tiles - 1) / tiles : allowed_; }
  /// A tile's share of the allowance (at most `most` lines), within one block. The tile asks
  /// for them itself, so its loop keeps only the run's pointer and bound in registers.
  KOKKOS_INLINE_FUNCTION Run take(int most) {
    int n = per_tile_ < allowed_ ? per_tile_ : allowed_;
    if (n > most) n = most;
    if (n <= 0 || (line_ >= end_ && !next_segment())) return Run{};
    const int in_block = static_cast<int>((end_ - line_ + 63) / 64);
    if (n > in_block) n = in_block;
    const Run run{line_, line_ + 64 * n};
    line_ += 64 * n;
    allowed_ -= n;
    return run;
  }
  /// After the loop: whatever it left of the allowance, at once.
  KOKKOS_INLINE_FUNCTION void finish() {
    per_tile_ = allowed_;
    for (Run run = take(allowed_); run.first != nullptr; run = take(allowed_)) {
      prefetch_bytes(run.first, static_cast<int>(run.end - run.first));
    }
    allowed_ = 0;  // what the list could not give
  }

 private:
  KOKKOS_INLINE_FUNCTION bool next_segment() {
    while (segment_ < segments_) {
      const int id = ids_[segment_ / 2];
      const char* base = (segment_ % 2 == 0) ? keys_ : values_;
      ++segment_;
      if (id < 0) continue;
      line_ = base + id * stride_;
      end_ = line_ + bytes_;
      line_ -= reinterpret_cast<std::uintptr_t>(line_) % 64;  // from the line the block starts in
      return true;
    }
    return false;
  }

  const char* keys_ = nullptr;
  const char* values_ = nullptr;
  std::int64_t stride_ = 0;
  int bytes_ = 0;
  const int* ids_ = nullptr;
  int segments_ = 0;  ///< 2 per block: keys, values
  int segment_ = 0;
  const char* line_ = nullptr;  ///< the next line of the current segment, up to end_
  const char* end_ = nullptr;
  int allowed_ = 0;
  int per_tile_ = 0;
};

/// Asks for the next two lines of `run` (nothing past its end).
KOKKOS_INLINE_FUNCTION void ask_ahead(BlockPrefetcher::Run& run) {
  if (run.first < run.end) {
    prefetch_line(run.first);
    if (run.first + 64 < run.end) prefetch_line(run.first + 64);
    run.first += 128;
  }
}

/// The pass's query in the form a set's q.k reads (HostLoops::prepare_query): its words, and the
/// bf16 parts per element they hold (as many as the query needs to be exact, 1 to 3).
struct QueryTiles {
  const std::uint32_t* words = nullptr;
  int parts = 0;
};

/// The tile a pass belongs to, for sets that repack cache blocks into their own layout: where a
/// tile has several passes over the same blocks (the rows of a prefill chunk), a thread may keep
/// the blocks it packed for the tile's later passes. Unique within a call (`call`: HostLoops::call);
/// index < 0: the tile's only pass, nothing worth keeping.
struct TileKey {
  std::uint64_t call = 0;
  int index = -1;
};

/// One block_logits call: q . k for the first `slots` slots of one cache block of one kv head.
template <class CacheT>
struct BlockLogitsArgs {
  const CacheT* key_block;  ///< key_cache[block][kv_head]: [head_size/x][block_size][x]
  int block_size;
  int head_size;
  int slots;                ///< slots to compute, <= block_size
  const float* q;           ///< [H][head_size], scale (and the fp8 key scale) applied
  float* logits;            ///< q_g . k_i at logits[g * logits_stride + i]
  int logits_stride;
  /// For the sets with HostLoops::prepare_query: the query as that step left it, unscaled; their
  /// logits are unscaled too (HostLoops::prepare_query).
  QueryTiles q_tiles{};
  TileKey tile{};
  /// The block's slots that hold keys of the tile (>= slots; 0: slots): a set that packs blocks
  /// may pack these and leave the results past `slots` unused, so that every pass of a tile packs
  /// the block alike.
  int tile_slots = 0;
};

/// The bf16 parts of each probability that keep what an output of type T can show
/// (ChunkValuesArgs::probability_parts).
template <class T>
KOKKOS_INLINE_FUNCTION constexpr int probability_parts_for() {
  return std::is_same_v<T, bfloat16> ? 1 : std::is_same_v<T, half> ? 2 : 3;
}

/// One chunk_values call: o += p . V over the chunk's blocks, for output dimensions [d_begin, d_end).
template <class CacheT>
struct ChunkValuesArgs {
  const CacheT* value_head;  ///< value_cache[0][kv_head]: block b's rows start b * block_stride later
  std::int64_t block_stride;
  const int* block_ids;      ///< the chunk's physical blocks in order; < 0: attended by no head
  int blocks;
  int last_block_slots;      ///< tokens in the chunk's last block (the others are full)
  int block_size;
  int head_size;
  const float* probs;        ///< probabilities of head g, chunk token t at probs[g * probs_stride + t]
  int probs_stride;
  float* o;                  ///< [H][head_size] running output, already rescaled for this chunk
  TileKey tile{};
  /// The bf16 parts of each probability a set that splits them keeps (1 to 3), as the output
  /// type asks (probability_parts_for): 3 hold all 24 significant bits of an f32 probability; 2
  /// hold 16 (a relative error of at most 2^-17, far below an f16 output's rounding); 1 rounds it
  /// to bf16 (at most 2^-9, a bf16 output's own rounding, as the bf16 products of FlashAttention
  /// and of vLLM's AMX kernels).
  int probability_parts = 3;
  /// The last block's slots that hold values of the tile (>= last_block_slots; 0: those), as
  /// BlockLogitsArgs::tile_slots.
  int last_block_tile_slots = 0;
  /// probs holds bf16 codes, row g's at reinterpret_cast<const std::uint16_t*>(probs) + 2 * g *
  /// probs_stride (RowLoops::softmax_to_bf16), zeros past the chunk's tokens to its last block's
  /// end: where probability_parts is 1 and the loops take them (HostLoops::takes_bf16_probabilities).
  bool bf16_probabilities = false;
};

/// The instruction-set parts of the row-wise logit rules and of the softmax (AttentionVariant
/// calls the first two through its row-wise form).
struct RowLoops {
  /// p[i] = cap * tanh(p[i] / cap) for i < n; -inf and NaN stay as they are.
  void (*soft_cap)(float* p, int n, float cap);
  /// p[i] += slope * (offset + i) for i < n (ALiBi over a row of keys).
  void (*add_ramp)(float* p, int n, float slope, float offset);
  /// p[i] *= scale (rounded, where scale is not 1); then *max = the largest of `floor` and every
  /// p[i] (NaN ignored); p[i] = exp(p[i] - *max) (when *max is -inf nothing is attended: 0, or NaN
  /// for a NaN); returns the sum of the p[i] (NaN if any p[i] is).
  float (*softmax)(float* p, int n, float scale, float floor, float* max);
  /// softmax, leaving each probability as its bf16 code (rounded to nearest even, NaN a quiet
  /// NaN) in place: code i in bytes [2i, 2i + 2) of the row, zeros for i in [n, n_padded)
  /// (n_padded a multiple of 16); the rest of the row's floats are left undefined. For loops
  /// that take the probabilities so (HostLoops::takes_bf16_probabilities).
  float (*softmax_to_bf16)(float* p, int n, int n_padded, float scale, float floor, float* max);
};

/// The loops of one instruction set for passes of H rows over a cache of CacheT.
template <int H, class CacheT>
struct HostLoops {
  HostIsa isa = HostIsa::Portable;  ///< the set the pointers below belong to
  std::uint64_t call = 0;            ///< a number of host_loops' that no other call shares (TileKey)
  /// The pass's query rows ([H][head_size] floats, without the scale, so that a bf16 or f16
  /// query stays exact) in the form block_logits reads (BlockLogitsArgs::q_tiles), once per
  /// pass, in a buffer of the calling thread's that holds them until its next call. block_logits
  /// then leaves the logits unscaled: the row loops apply the scale (RowLoops::softmax, or the
  /// variant's rules where they transform logits). Null where block_logits reads
  /// BlockLogitsArgs::q, which holds the scale.
  QueryTiles (*prepare_query)(const float* q, int head_size) = nullptr;
  void (*block_logits)(const BlockLogitsArgs<CacheT>&, BlockPrefetcher&) = nullptr;
  void (*chunk_values)(const ChunkValuesArgs<CacheT>&, BlockPrefetcher&, int d_begin, int d_end) = nullptr;
  /// What each member's thread runs once the pass is done (the tile sets: release the tiles,
  /// which their loops keep configured from call to call); null where nothing is.
  void (*end_pass)() = nullptr;
  RowLoops rows{};
  /// Whether chunk_values takes probabilities of one part as bf16 codes
  /// (ChunkValuesArgs::bf16_probabilities), which the rows' softmax then leaves
  /// (RowLoops::softmax_to_bf16) instead of floats for chunk_values to round.
  bool takes_bf16_probabilities = false;

  /// The factor a pass's query is loaded with (its q), and the one the row loops apply to the
  /// logits: the scale and 1, or, where q.k leaves the logits unscaled (prepare_query), 1 and
  /// the scale.
  KOKKOS_INLINE_FUNCTION float query_factor(float scale) const { return prepare_query != nullptr ? 1.0f : scale; }
  KOKKOS_INLINE_FUNCTION float logit_factor(float scale) const { return prepare_query != nullptr ? scale : 1.0f; }
};

/// Conversions between query / output rows of T and scratch floats.
template <class T>
struct RowConversions {
  /// dst[i] = float(src[i]) * scale for i < n.
  void (*load)(const T* src, float scale, float* dst, int n);
  /// dst[i] = from_float<T>(src[i] * factor) for i < n, bit for bit.
  void (*store)(const float* src, float factor, T* dst, int n);
};

/// Which passes loops serve: those of tiles of one pass (decode rows), or of tiles of several
/// (the rows of a prefill chunk, which read the same blocks pass after pass).
enum class Passes { One, Several };

/// Whether the AMX set's tile loops serve passes of `rows` rows (its vector set serves the
/// others). They pack cache blocks into tile operands, which pays where later passes reuse the
/// packing (Several) or where one pass fills a tile's 16 rows (a GQA group of 4 with 4 query
/// tokens, as speculative decoding brings).
constexpr bool tile_loops_serve(Passes passes, int rows) { return passes == Passes::Several || rows >= 16; }

/// The best loops of at most `isa` for passes of H rows over caches of CacheT with this head
/// and block size (a set whose tiles do not fit the sizes yields to a lesser one for that loop).
/// Defined in libkpa for every H of HostRowsPerPass and every cache storage type.
template <int H, class CacheT>
HostLoops<H, CacheT> host_loops(HostIsa isa, int head_size, int block_size, Passes passes);

/// The row loops of at most `isa`.
RowLoops host_row_loops(HostIsa isa);

/// The row conversions of at most `isa`, for T = float, half or bfloat16.
template <class T>
RowConversions<T> host_row_conversions(HostIsa isa);

}  // namespace kpa::detail
