#pragma once
// The AMX-BF16 host loops for bf16 and fp8 caches (include/kpa/detail/host_loops.hpp says what
// each computes), written once over a tile mapping (amx_tiles.hpp): AmxTiles, the instructions,
// for HostIsa::Amx, and TileModel, their software model, for HostIsa::AmxModel. The code around
// the tiles is AVX2, so the model runs on any AVX2 CPU.
//
// Tiles (tdpbf16ps: C[16][N] += A[16][2K] . B[K][N][2], f32 sums of bf16 pairs):
//   q.k    C = logits^T [16 slots][H rows], times the scale as they are stored; A = 16 slots x
//          32 dimensions of keys, repacked from vLLM's [D/x][B][x] layout (fp8 codes widened to
//          their exact bf16 values); B = the query rows, unscaled, in dimension pairs
//          (prepare_query, once per pass);
//   p.V    C = o^T [16 dimensions][H rows]; A = 16 dimension rows x KS slots of values, read in
//          place from the [D][B] layout (a partly filled block and fp8 codes through a buffer);
//          B = the chunk's probabilities in slot pairs.
// Precision: q and p are f32; each is split into bf16 parts that sum to it exactly (round to
// nearest, the remainder rounded again, the last remainder exact): p into three, the query into
// as many as it needs (one for a bf16 query, two for f16: the scale is applied to the sums, so
// the query keeps its own precision). bf16 and fp8 cache values are exact in bf16, so every
// product is exact and the sums are f32 sums, as in the FMA loops, in another order. What
// differs is the instruction's subnormal rule (inputs and sums below 2^-126 count as zero) and
// infinities: a cache value of +-inf meets the zero parts of a split operand (the probabilities;
// a query of more than one part) and gives NaN where the FMA loops give +-inf.

#include "amx_tiles.hpp"
#include "avx2.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace kpa::detail::amx {

using namespace x86;

/// Cache types with AMX loops: their values are exact in bf16.
template <class CacheT>
inline constexpr bool has_loops = std::is_same_v<CacheT, bfloat16> || std::is_same_v<CacheT, fp8_e4m3> ||
                                  std::is_same_v<CacheT, fp8_e5m2>;

/// Parts an f32 operand is split into (three bf16 hold a float's 24 significant bits).
inline constexpr int kParts = 3;

/// The bf16 bits of 8 floats rounded to nearest even, in the low halves of 32-bit lanes; NaN
/// stays a quiet NaN.
KPA_IMPL_AVX2_INLINE inline __m256i bf16_rounded(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}

KPA_IMPL_AVX2_INLINE inline __m256 bf16_value(__m256i bf16) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16, 16)); }

/// Lanes 2i and 2i + 1 of 8 bf16 (low halves of 32-bit lanes) as the 4 words of their pairs.
KPA_IMPL_AVX2_INLINE inline void store_pairs(__m256i bf16, std::uint32_t* dst, int dst_stride) {
  const __m256i words = _mm256_or_si256(bf16, _mm256_srli_epi64(bf16, 16));  // low 32 bits of each 64
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), words);
  dst[0] = lanes[0];
  dst[dst_stride] = lanes[2];
  dst[2 * dst_stride] = lanes[4];
  dst[3 * dst_stride] = lanes[6];
}

/// Rows [0, H) of `n` floats (src + g * src_stride) as kParts B-tile operands in element pairs:
/// word (i / 2) * H + g of part p holds part p of elements i and i + 1 (i even) of row g, the
/// parts summing exactly to the float; elements [n, n_padded) are zeros. part_stride: words
/// between parts.
template <int H>
KPA_IMPL_AVX2 void split_rows_in_pairs(const float* src, int src_stride, int n, int n_padded, std::uint32_t* dst,
                                       int part_stride) {
  for (int g = 0; g < H; ++g) {
    const float* row = src + static_cast<std::int64_t>(g) * src_stride;
    for (int i = 0; i < n_padded; i += 8) {
      const __m256i mask = first_lanes(n - i);
      __m256 x = _mm256_and_ps(_mm256_maskload_ps(row + i, mask), _mm256_castsi256_ps(mask));
      std::uint32_t* out = dst + (i / 2) * H + g;
#pragma GCC unroll 3
      for (int p = 0; p < kParts; ++p) {
        const __m256i part = bf16_rounded(x);
        store_pairs(part, out + p * part_stride, H);
        x = _mm256_sub_ps(x, bf16_value(part));  // exact: the remainder of a rounding
      }
    }
  }
}

/// Head sizes up to which block_logits takes q.k (its repacked keys live on the stack).
inline constexpr int kMaxHeadSize = 256;

/// Whether all n words are zero, n a multiple of 8 (a part of the query: H x head_size / 2 words,
/// head sizes multiples of 32).
KPA_IMPL_AVX2_INLINE inline bool all_zero(const std::uint32_t* words, int n) {
  __m256i any = _mm256_setzero_si256();
  for (int i = 0; i < n; i += 8) any = _mm256_or_si256(any, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i)));
  return _mm256_testz_si256(any, any) != 0;
}

/// The pass's query rows (unscaled) as q.k's B tiles, in the thread's buffer: part p of
/// dimension pair j of row g at word p * (H * head_size / 2) + j * H + g; the parts after the
/// last one with a nonzero word are left out (QueryTiles::parts).
template <int H>
KPA_IMPL_AVX2 QueryTiles prepare_query(const float* q, int head_size) {
  thread_local std::vector<std::uint32_t> tiles;
  const int part_words = H * head_size / 2;
  tiles.resize(static_cast<std::size_t>(kParts) * part_words);
  split_rows_in_pairs<H>(q, head_size, head_size, head_size, tiles.data(), part_words);
  int parts = kParts;
  while (parts > 1 && all_zero(tiles.data() + (parts - 1) * part_words, part_words)) --parts;
  return QueryTiles{tiles.data(), parts};
}

/// 8 floats holding exact bf16 values as their 8 bf16 codes.
KPA_IMPL_AVX2_INLINE inline void store_bf16(__m256 x, std::uint16_t* dst) {
  const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
}

/// Elements widen_to_bf16 takes: a key vector.
template <class CacheT>
inline constexpr int kWidened = static_cast<int>(16 / sizeof(CacheT));

/// kWidened cache elements at p as bf16 codes of their values.
template <class CacheT>
KPA_IMPL_AVX2_INLINE inline void widen_to_bf16(const CacheT* p, std::uint16_t* dst) {
  if constexpr (std::is_same_v<CacheT, bfloat16>) {
    std::memcpy(dst, p, 16);
  } else {  // fp8: 16 codes, through floats times 1 / Load::scale (a power of two: exact)
    const __m256 scale = _mm256_set1_ps(Load<CacheT>::scale);
    __m256 lo, hi;
    load_sixteen(p, lo, hi);
    store_bf16(_mm256_mul_ps(lo, scale), dst);
    store_bf16(_mm256_mul_ps(hi, scale), dst + 8);
  }
}

/// Tile numbers: the accumulator, the cache operand, and the kParts query or probability parts.
inline constexpr int kC = 0, kA = 1, kB = 2;

/// C += A . B for the first `count` (1 to kParts) parts of B, part_stride words apart.
template <class Tiles>
KPA_IMPL_AVX2_INLINE inline void dot_parts(const std::uint32_t* parts, int count, int part_stride, int b_stride) {
  static_assert(kParts == 3, "a tile per part");
  Tiles::template load<kB>(parts, b_stride);
  Tiles::template dot_bf16<kC, kA, kB>();
  if (count < 2) return;
  Tiles::template load<kB + 1>(parts + part_stride, b_stride);
  Tiles::template dot_bf16<kC, kA, kB + 1>();
  if (count < 3) return;
  Tiles::template load<kB + 2>(parts + 2 * part_stride, b_stride);
  Tiles::template dot_bf16<kC, kA, kB + 2>();
}

/// q.k of a block, for head sizes that are multiples of 32 up to kMaxHeadSize: a.q_tiles holds
/// the query as prepare_query left it, a.scale multiplies the sums.
template <int H, class CacheT, class Tiles>
KPA_IMPL_AVX2 void block_logits(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch) {
  static_assert(H <= 16, "a tile's 16 columns hold the rows of a pass");
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));  // elements of a key vector
  const int D = a.head_size, steps = D / 32, part_stride = H * D / 2;
  TileConfig config;
  config.set(kC, 16, 4 * H);
  config.set(kA, 16, 64);
  for (int p = 0; p < kParts; ++p) config.set(kB + p, 16, 4 * H);
  alignas(64) std::uint16_t keys[kMaxHeadSize / 32][16][32];  // [step][slot][dimension]
  alignas(64) float sums[16][H];
  Tiles::configure(config);
  for (int slot0 = 0; slot0 < a.slots; slot0 += 16) {
    const int n = a.slots - slot0 < 16 ? a.slots - slot0 : 16;
    for (int s = 0; s < 16; ++s) {
      for (int d = 0; d < D; d += X) {
        std::uint16_t* dst = &keys[d / 32][s][d % 32];
        if (s < n) {
          widen_to_bf16(a.key_block + static_cast<std::int64_t>(d / X) * a.block_size * X + (slot0 + s) * X, dst);
        } else {  // past the block's slots: zeros (the cache there may hold NaN)
          std::memset(dst, 0, sizeof(std::uint16_t) * X);
        }
      }
    }
    Tiles::template zero<kC>();
    for (int step = 0; step < steps; ++step) {
      Tiles::template load<kA>(keys[step], 64);
      dot_parts<Tiles>(a.q_tiles.words + step * 16 * H, a.q_tiles.parts, part_stride, 4 * H);
    }
    Tiles::template store<kC>(sums, 4 * H);
    for (int g = 0; g < H; ++g) {
      for (int s = 0; s < n; ++s) a.logits[g * a.logits_stride + slot0 + s] = sums[s][g] * a.scale;
    }
  }
  Tiles::release();
  prefetch.finish();
}

/// Block sizes chunk_values has tiles for: whole tile operands of 16 or 32 slots per block row.
inline bool has_value_tiles(int block_size) { return block_size % 16 == 0; }

/// The chunk's probabilities in B-tile form, per attended block: a thread's buffer, reused.
inline std::vector<std::uint32_t>& probability_tiles() {
  thread_local std::vector<std::uint32_t> tiles;
  return tiles;
}

/// p.V of a chunk for output dimensions [d_begin, d_end), block sizes that are multiples of 16;
/// a last range of fewer than 16 dimensions runs the AVX2 loop.
template <int H, class CacheT, class Tiles>
KPA_IMPL_AVX2 void chunk_values(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch, int d_begin, int d_end) {
  static_assert(H <= 16, "a tile's 16 columns hold the rows of a pass");
  constexpr bool kInPlace = std::is_same_v<CacheT, bfloat16>;  // cache rows are tile rows as they are
  const int B = a.block_size, KS = B % 32 == 0 ? 32 : 16, steps = B / KS;
  // Per attended block and step of KS slots: kParts parts of KS / 2 slot pairs x H rows.
  const int part_stride = KS / 2 * H, step_words = kParts * part_stride;
  std::vector<std::uint32_t>& tiles = probability_tiles();
  tiles.resize(static_cast<std::size_t>(a.blocks) * steps * step_words);
  for (int lb = 0; lb < a.blocks; ++lb) {
    if (a.block_ids[lb] < 0) continue;
    const int slots = lb + 1 == a.blocks ? a.last_block_slots : B;
    for (int step = 0; step < steps; ++step) {
      const int n = slots - step * KS;
      std::uint32_t* dst = tiles.data() + (static_cast<std::size_t>(lb) * steps + step) * step_words;
      split_rows_in_pairs<H>(a.probs + lb * B + step * KS, a.probs_stride, n < 0 ? 0 : n, KS, dst, part_stride);
    }
  }
  TileConfig config;
  config.set(kC, 16, 4 * H);
  config.set(kA, 16, 2 * KS);
  for (int p = 0; p < kParts; ++p) config.set(kB + p, KS / 2, 4 * H);
  alignas(64) std::uint16_t values[16][32];  // [dimension][slot]: a partly filled block, fp8 codes
  alignas(64) float sums[16][H];
  Tiles::configure(config);
  int d0 = d_begin;
  for (; d0 + 16 <= d_end; d0 += 16) {
    Tiles::template zero<kC>();
    for (int lb = 0; lb < a.blocks; ++lb) {
      if (a.block_ids[lb] < 0) continue;  // attended by no row of the pass: never read
      const int slots = lb + 1 == a.blocks ? a.last_block_slots : B;
      const CacheT* rows = a.value_head + a.block_ids[lb] * a.block_stride + static_cast<std::int64_t>(d0) * B;
      for (int step = 0; step * KS < slots; ++step) {
        const int n = slots - step * KS;
        if (kInPlace && n >= KS) {  // whole bf16 rows: the tile reads the cache itself
          Tiles::template load<kA>(rows + step * KS, static_cast<std::int64_t>(sizeof(CacheT)) * B);
        } else {
          for (int r = 0; r < 16; ++r) {
            const CacheT* src = rows + static_cast<std::int64_t>(r) * B + step * KS;
            if (n >= KS) {
              for (int j = 0; j < KS; j += kWidened<CacheT>) widen_to_bf16(src + j, &values[r][j]);
            } else {  // slots past the sequence may hold NaN: zeros, not 0 * NaN
              for (int j = 0; j < KS; ++j) {
                values[r][j] = j < n ? static_cast<std::uint16_t>(compat::bit_cast<std::uint32_t>(to_float(src[j])) >> 16)
                                     : std::uint16_t{0};
              }
            }
          }
          Tiles::template load<kA>(values, 64);
        }
        dot_parts<Tiles>(tiles.data() + (static_cast<std::size_t>(lb) * steps + step) * step_words, kParts,
                         part_stride, 4 * H);
      }
    }
    Tiles::template store<kC>(sums, 4 * H);
    for (int g = 0; g < H; ++g) {
      for (int r = 0; r < 16; ++r) a.o[g * a.head_size + d0 + r] += sums[r][g];
    }
  }
  Tiles::release();
  if (d0 < d_end) {
    avx2::chunk_values<H, CacheT, avx2::Avx2>(a, prefetch, d0, d_end);
  } else {
    prefetch.finish();
  }
}

/// The AMX loops over the tile mapping Tiles in `loops`, as `isa`, where the sizes suit its tiles.
template <class Tiles, int H, class CacheT>
void use_tile_loops(HostLoops<H, CacheT>& loops, HostIsa isa, int head_size, int block_size) {
  if constexpr (has_loops<CacheT>) {
    if (head_size % 32 == 0 && head_size <= kMaxHeadSize) {
      loops.isa = isa;
      loops.prepare_query = &prepare_query<H>;
      loops.block_logits = &block_logits<H, CacheT, Tiles>;
    }
    if (has_value_tiles(block_size)) {
      loops.isa = isa;
      loops.chunk_values = &chunk_values<H, CacheT, Tiles>;
    }
  }
}

}  // namespace kpa::detail::amx
