#pragma once
// The AMX-BF16 host loops for bf16 and fp8 caches (include/kpa/detail/host_loops.hpp says what
// each computes), written once over a tile mapping (amx_tiles.hpp): AmxTiles, the instructions,
// for HostIsa::Amx, and TileModel, their software model, for HostIsa::AmxModel. The code around
// the tiles is AVX2, so the model runs on any AVX2 CPU, but for the splitting of rows into bf16
// parts and the softmax's rounding to bf16, which take AVX512-BF16's conversions beside the
// instructions (split_rows_for, row_softmax_to_bf16).
//
// Tiles (tdpbf16ps: C[M][N] += A[M][2K] . B[K][N][2], f32 sums of bf16 pairs), the pass's H rows
// (up to 32: one or two tiles of rows, PassTiles) as the rows of A and C, so that every operand a
// pass makes itself is read row by row, and every buffer of operands starts on a cache line:
//   q.k    C = logits [H rows][16 slots], stored unscaled (the row softmax scales them); A = the query
//          rows, unscaled, 32 dimensions per step (prepare_query, once per pass); B = 16 slots of
//          keys in dimension pairs (pack_keys: vLLM's [D/x][B][x] layout transposed, fp8 codes
//          widened to their exact bf16 values);
//   p.V    C = o [H rows][16 dimensions], loaded from o and stored back per span of blocks; A =
//          the chunk's probabilities, KS slots per step; B = 16 dimension rows of values in slot
//          pairs (pack_values: the [D][B] layout transposed).
// Packing is what costs beside the tile products, so a thread keeps the blocks it packed for the
// later passes of a tile of several (PackedBlocks: the rows of a prefill chunk read the same
// blocks pass after pass), packing the block's slots of the whole tile (tile_slots) so that the
// block at the causal edge, of which each pass reads more slots, is packed once too; a tile of
// one pass (decode) packs into a buffer it reuses.
// Precision: q and p are f32; each is split into bf16 parts (round to nearest, the remainder
// rounded again, the last remainder exact): the query into as many as it needs to be exact (one
// for a bf16 query, two for f16: the scale multiplies the sums, so the query keeps its own
// precision), p into as many as the output type shows (ChunkValuesArgs::probability_parts:
// three, exact, for f32; two, 16 significant bits, for f16; one, p rounded to bf16, for bf16,
// which the rows' softmax leaves so itself: RowLoops::softmax_to_bf16). bf16 and fp8 cache
// values are exact in bf16, so every product of the parts is exact and the sums are f32 sums, as
// in the FMA loops, in another order. What differs is the instruction's subnormal rule (inputs and sums below 2^-126 count as zero, o's
// running sums included) and infinities: a cache value of +-inf meets the zero parts of a split
// operand (the probabilities; a query of more than one part) and gives NaN where the FMA loops
// give +-inf.

#include "amx_tiles.hpp"
#include "avx2.hpp"
#include "avx512.hpp"

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

/// A thread's buffer of tile operands, starting on a 64-byte boundary: a tile row of 64 bytes is
/// then one cache line, where a row across two lines has a tile load touch twice the lines and
/// take about twice as long. It grows as asked, keeping nothing.
template <class T>
class AlignedBuffer {
 public:
  /// Room for n elements.
  T* get(std::size_t n) {
    if (n + kSlack > storage_.size()) storage_.resize(n + kSlack);
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(storage_.data());
    return reinterpret_cast<T*>((address + 63) & ~std::uintptr_t{63});
  }

 private:
  static_assert(64 % sizeof(T) == 0, "whole elements to a line");
  static constexpr std::size_t kSlack = 64 / sizeof(T);
  std::vector<T> storage_;
};

/// Rows [0, H) of `n` floats (src + g * src_stride) as `parts` (1 to kParts) rows of bf16 codes
/// each: part p of element i of row g at dst[p * part_stride + g * row_stride + i], the parts
/// summing to the float rounded to 8 x parts significant bits (exactly for kParts); elements
/// [n, n_padded) are zeros (n_padded a multiple of 16). Returns the parts up to the last one with
/// a nonzero code (at least 1).
template <int H>
KPA_IMPL_AVX2 int split_rows(const float* src, int src_stride, int n, int n_padded, int parts, std::uint16_t* dst,
                             int row_stride, int part_stride) {
  __m256i nonzero[kParts] = {};
  for (int g = 0; g < H; ++g) {
    const float* row = src + static_cast<std::int64_t>(g) * src_stride;
    for (int i = 0; i < n_padded; i += 16) {
      const __m256i mask_lo = first_lanes(n - i), mask_hi = first_lanes(n - i - 8);
      __m256 lo = _mm256_and_ps(_mm256_maskload_ps(row + i, mask_lo), _mm256_castsi256_ps(mask_lo));
      __m256 hi = _mm256_and_ps(_mm256_maskload_ps(row + i + 8, mask_hi), _mm256_castsi256_ps(mask_hi));
#pragma GCC unroll 3
      for (int p = 0; p < parts; ++p) {
        const __m256i codes = bf16_codes(lo, hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * part_stride + g * row_stride + i), codes);
        nonzero[p] = _mm256_or_si256(nonzero[p], codes);
        lo = _mm256_sub_ps(lo, bf16_value(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(codes))));  // exact: a rounding's remainder
        hi = _mm256_sub_ps(hi, bf16_value(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(codes, 1))));
      }
    }
  }
  while (parts > 1 && _mm256_testz_si256(nonzero[parts - 1], nonzero[parts - 1])) --parts;
  return parts;
}

// Not inlined, so that GCC 12's -Wmaybe-uninitialized on its AVX-512 intrinsics (GCC bug 105593,
// as avx512.hpp) is checked here, where the pragma below turns it off, and not in its callers.
#define KPA_IMPL_AVX512_BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"), aligned(64), noinline))
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// split_rows with AVX512-BF16's conversion (round to nearest even, NaN kept quiet), 16 floats
/// at a time. It reads subnormal floats as zeros, where split_rows keeps their bf16 codes: the
/// tile instruction reads those as zeros too, so the products are the same.
template <int H>
KPA_IMPL_AVX512_BF16 int split_rows_avx512_bf16(const float* src, int src_stride, int n, int n_padded, int parts,
                                                std::uint16_t* dst, int row_stride, int part_stride) {
  __m256i nonzero[kParts] = {};
  for (int g = 0; g < H; ++g) {
    const float* row = src + static_cast<std::int64_t>(g) * src_stride;
    for (int i = 0; i < n_padded; i += 16) {
      const int valid = n - i;
      const __mmask16 lanes = valid >= 16 ? __mmask16(0xffff) : valid > 0 ? __mmask16((1u << valid) - 1u) : __mmask16(0);
      __m512 x = _mm512_maskz_loadu_ps(lanes, row + i);
#pragma GCC unroll 3
      for (int p = 0; p < parts; ++p) {
        const __m256i codes = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * part_stride + g * row_stride + i), codes);
        nonzero[p] = _mm256_or_si256(nonzero[p], codes);
        x = _mm512_sub_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(codes), 16)));  // exact
      }
    }
  }
  while (parts > 1 && _mm256_testz_si256(nonzero[parts - 1], nonzero[parts - 1])) --parts;
  return parts;
}
/// RowLoops::softmax_to_bf16 with AVX512-BF16's conversion (vcvtne2ps2bf16: round to nearest
/// even, NaN kept quiet; subnormal floats as zeros, which the tiles read as zeros too), for the
/// loops of the instructions (AmxTiles::kAvx512Bf16).
KPA_IMPL_AVX512_BF16 inline float row_softmax_to_bf16(float* p, int n, int n_padded, float scale, float floor, float* max) {
  const float row_max = avx512::row_scaled_max(p, n, scale, floor);
  *max = row_max;
  if (row_max == -__builtin_inff()) return avx2::row_softmax_to_bf16(p, n, n_padded, 1.0f, floor, max);
  auto* const codes = reinterpret_cast<std::uint16_t*>(p);  // code i below float i, read first
  const __m512 mv = _mm512_set1_ps(row_max);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p + i), mv));
    const __m512 e1 = avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p + i + 16), mv));
    _mm512_storeu_si512(codes + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0)));
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; i < n; i += 16) {  // 16 codes, zeros past n (n_padded is a multiple of 16)
    const __mmask16 lanes = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e =
        _mm512_maskz_mov_ps(lanes, avx512::exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, p + i), mv)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
    s0 = _mm512_add_ps(s0, e);
  }
  for (i = (n + 15) / 16 * 16; i < n_padded; ++i) codes[i] = 0;
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif

/// split_rows as the code around the tiles of Tiles may run it.
template <int H, class Tiles>
inline int split_rows_for(const float* src, int src_stride, int n, int n_padded, int parts, std::uint16_t* dst,
                          int row_stride, int part_stride) {
  if constexpr (Tiles::kAvx512Bf16) {
    return split_rows_avx512_bf16<H>(src, src_stride, n, n_padded, parts, dst, row_stride, part_stride);
  } else {
    return split_rows<H>(src, src_stride, n, n_padded, parts, dst, row_stride, part_stride);
  }
}

/// Head sizes up to which q.k takes the tiles.
inline constexpr int kMaxHeadSize = 256;

/// The pass's query rows (unscaled) as q.k's A tiles, in the thread's buffer: part p of row g,
/// dimension d, at bf16 code p * H * head_size + g * head_size + d (two codes per word); the
/// parts after the last one with a nonzero code are left out (QueryTiles::parts).
template <int H, class Tiles>
QueryTiles prepare_query(const float* q, int head_size) {
  thread_local AlignedBuffer<std::uint32_t> tiles;
  std::uint32_t* const words = tiles.get(static_cast<std::size_t>(kParts) * H * head_size / 2);
  auto* codes = reinterpret_cast<std::uint16_t*>(words);
  const int parts = split_rows_for<H, Tiles>(q, head_size, head_size, head_size, kParts, codes, head_size, H * head_size);
  return QueryTiles{words, parts};
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

/// The bf16 code of one cache element's value.
template <class CacheT>
inline std::uint16_t bf16_code(CacheT x) {
  return static_cast<std::uint16_t>(compat::bit_cast<std::uint32_t>(to_float(x)) >> 16);
}

/// Transposes 8 rows of 4 words, rows i and i + 4 in the low and high halves of in[i]: out[j]
/// holds word j of rows 0 to 7.
KPA_IMPL_AVX2_INLINE inline void transpose_8x4(const __m256i (&in)[4], __m256i (&out)[4]) {
  const __m256i t0 = _mm256_unpacklo_epi32(in[0], in[1]), t1 = _mm256_unpackhi_epi32(in[0], in[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(in[2], in[3]), t3 = _mm256_unpackhi_epi32(in[2], in[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

/// Transposes 8 rows of 8 words (in[r], row r) into 8 columns (out[c]: word c of rows 0..7).
KPA_IMPL_AVX2_INLINE inline void transpose_8x8(const __m256i (&in)[8], __m256i (&out)[8]) {
  __m256i t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    out[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    out[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

/// Words of one key block packed for q.k (pack_keys): per group of 16 slots and step of 32
/// dimensions, a B tile of 16 dimension pairs x 16 slots.
inline int packed_key_words(int block_size, int head_size) { return (block_size + 15) / 16 * 16 * head_size / 2; }

/// The first `slots` slots of a key block as q.k's B tiles: word (group * steps + step) * 256 +
/// k * 16 + c holds dimensions 32 step + 2k and 32 step + 2k + 1 of slot 16 group + c, so that
/// the columns of C are slots in order. The columns of slots past `slots` are zeros where their
/// 8-slot half holds a slot, else left as they were: a column of C depends on its own column of B
/// alone, and q.k keeps only the slots asked for.
template <class CacheT>
KPA_IMPL_AVX2 void pack_keys(const CacheT* block, int block_size, int head_size, int slots, std::uint32_t* dst) {
  constexpr int X = kWidened<CacheT>;  // elements of a key vector
  const int steps = head_size / 32;
  alignas(32) std::uint16_t widened[8][16];  // fp8: 8 slots' 16 dimensions as bf16
  for (int s0 = 0; s0 < slots; s0 += 8) {
    const int group = s0 / 16, half = s0 / 8 % 2, valid = slots - s0;
    for (int d = 0; d < head_size; d += X) {
      const CacheT* src = block + static_cast<std::int64_t>(d / X) * block_size * X + static_cast<std::int64_t>(s0) * X;
      // Rows of 8 dimensions (4 words) for each of the 8 slots, as transpose_8x4 takes them.
      for (int h = 0; h < X / 8; ++h) {
        __m256i rows[4];
        if constexpr (std::is_same_v<CacheT, bfloat16>) {
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(2 * i, 2 * i, 2 * i, 2 * i, 2 * i + 1,
                                                                                                  2 * i + 1, 2 * i + 1, 2 * i + 1));
            rows[i] = _mm256_maskload_epi32(reinterpret_cast<const int*>(src + 16 * i), mask);
          }
          // Slots 2i and 2i + 1 in rows[i]; transpose_8x4 takes slots i and i + 4.
          const __m256i pairs[4] = {rows[0], rows[1], rows[2], rows[3]};
          rows[0] = _mm256_permute2x128_si256(pairs[0], pairs[2], 0x20);
          rows[1] = _mm256_permute2x128_si256(pairs[0], pairs[2], 0x31);
          rows[2] = _mm256_permute2x128_si256(pairs[1], pairs[3], 0x20);
          rows[3] = _mm256_permute2x128_si256(pairs[1], pairs[3], 0x31);
        } else {
          if (h == 0) {
            for (int s = 0; s < 8; ++s) {
              if (s < valid) {
                widen_to_bf16(src + s * X, widened[s]);
              } else {
                std::memset(widened[s], 0, sizeof widened[s]);
              }
            }
          }
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            rows[i] = _mm256_set_m128i(_mm_load_si128(reinterpret_cast<const __m128i*>(&widened[i + 4][8 * h])),
                                       _mm_load_si128(reinterpret_cast<const __m128i*>(&widened[i][8 * h])));
          }
        }
        __m256i words[4];
        transpose_8x4(rows, words);
        const int dim = d + 8 * h, step = dim / 32, k = dim % 32 / 2;
        std::uint32_t* out = dst + (group * steps + step) * 256 + k * 16 + half * 8;
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * 16), words[j]);
      }
    }
  }
}

/// Slots of the spans of blocks over which p.V keeps its accumulators in the tiles (chunk_values).
inline constexpr int kSpanSlots = 128;

/// Block sizes chunk_values has tiles for: whole tile operands of 16 or 32 slots per block row.
inline bool has_value_tiles(int block_size) { return block_size % 16 == 0; }

/// Slots per p.V step: a B tile's 16 rows of slot pairs, or 8 where blocks are not of 32.
inline int value_step(int block_size) { return block_size % 32 == 0 ? 32 : 16; }

/// Words of one value block's 16 dimensions packed for p.V (pack_values).
inline int packed_value_words(int block_size) { return block_size * 8; }

/// Dimensions [d0, d0 + 16) of the first `slots` slots of a value block as p.V's B tiles: word
/// step * KS * 8 + k * 16 + j holds slots KS step + 2k and KS step + 2k + 1 of dimension d0 + j
/// (KS = value_step); slots past `slots` are zeros (the cache there may hold NaN), steps past
/// the last slot are not written.
template <class CacheT>
KPA_IMPL_AVX2 void pack_values(const CacheT* block, int block_size, int d0, int slots, std::uint32_t* dst) {
  constexpr bool kInPlace = std::is_same_v<CacheT, bfloat16>;
  const int B = block_size, KS = value_step(B);
  alignas(32) std::uint16_t widened[16][32];  // [dimension][slot]: fp8 codes, a partly filled step
  for (int step = 0; step * KS < slots; ++step) {
    const int n = slots - step * KS;
    const CacheT* rows = block + static_cast<std::int64_t>(d0) * B + step * KS;
    const std::uint16_t* src = reinterpret_cast<const std::uint16_t*>(rows);
    std::int64_t stride = B;  // codes between dimension rows
    if (!kInPlace || n < KS) {
      for (int r = 0; r < 16; ++r) {
        const CacheT* row = rows + static_cast<std::int64_t>(r) * B;
        if (n >= KS) {
          for (int j = 0; j < KS; j += kWidened<CacheT>) widen_to_bf16(row + j, &widened[r][j]);
        } else {
          for (int j = 0; j < KS; ++j) widened[r][j] = j < n ? bf16_code(row[j]) : std::uint16_t{0};
        }
      }
      src = &widened[0][0];
      stride = 32;
    }
    std::uint32_t* out = dst + step * KS * 8;
    for (int dh = 0; dh < 2; ++dh) {      // dimensions 8 dh .. 8 dh + 7
      for (int kh = 0; kh < KS / 16; ++kh) {  // slot pairs 8 kh .. 8 kh + 7
        __m256i in[8], cols[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          in[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (8 * dh + r) * stride + 16 * kh));
        }
        transpose_8x8(in, cols);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (8 * kh + c) * 16 + 8 * dh), cols[c]);
        }
      }
    }
  }
}

/// The exponent bits (of a cache element's code) that are all ones in its infinities and NaNs.
template <class CacheT>
inline constexpr unsigned kNonFiniteBits = std::is_same_v<CacheT, bfloat16> ? 0x7f80u
                                           : std::is_same_v<CacheT, fp8_e5m2> ? 0x7cu
                                                                              : 0x7fu;  // e4m3: NaN only

/// Whether slots [first, last) of dimensions [d0, d0 + dims) of a value block are all finite.
template <class CacheT>
KPA_IMPL_AVX2 bool finite_values(const CacheT* block, int block_size, int d0, int dims, int first, int last) {
  constexpr int kPerVector = static_cast<int>(32 / sizeof(CacheT));
  constexpr unsigned M = kNonFiniteBits<CacheT>;
  const __m256i mask = sizeof(CacheT) == 2 ? _mm256_set1_epi16(static_cast<short>(M)) : _mm256_set1_epi8(static_cast<char>(M));
  __m256i non_finite = _mm256_setzero_si256();
  for (int d = d0; d < d0 + dims; ++d) {
    const CacheT* row = block + static_cast<std::int64_t>(d) * block_size;
    int i = first;
    for (; i + kPerVector <= last; i += kPerVector) {
      const __m256i bits = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i)), mask);
      non_finite = _mm256_or_si256(non_finite, sizeof(CacheT) == 2 ? _mm256_cmpeq_epi16(bits, mask) : _mm256_cmpeq_epi8(bits, mask));
    }
    for (; i < last; ++i) {
      if ((row[i].bits & M) == M) return false;
    }
  }
  return _mm256_testz_si256(non_finite, non_finite) != 0;
}

/// Packed cache blocks a thread keeps for the later passes of a tile of several passes
/// (TileKey): a hash table by the block's address (linear probing), each entry tagged with the
/// block, its slots and the part of it packed (the dimensions of values), so a block packed for
/// another slot count or part is packed again. A new tile or call empties it, and so does an
/// entry past half its capacity (a tile whose blocks do not fit then packs them pass by pass).
class PackedBlocks {
 public:
  /// The buffer of `words` words (a multiple of 16) for (block, slots, part), 64-byte aligned,
  /// and whether it holds them already; where not, the caller packs them into it.
  std::uint32_t* find(const TileKey& tile, const void* block, int slots, int part, int words, bool& packed) {
    packed = false;
    if (tile.index < 0) return single_.get(static_cast<std::size_t>(words));  // nothing kept: packed each time
    if (tile.call != call_ || tile.index != index_ || words != words_) {
      call_ = tile.call;
      index_ = tile.index;
      words_ = words;
      const std::size_t entries = kKeptWords / words > 2 ? kKeptWords / words : 2;
      tags_.assign(entries, Tag{});
      data_ = kept_.get(entries * static_cast<std::size_t>(words));
      used_ = 0;
    }
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(block) / 64 + static_cast<std::uintptr_t>(part);
    std::size_t entry = static_cast<std::size_t>((address * 0x9E3779B97F4A7C15ull) >> 32) % tags_.size();
    for (; tags_[entry].block != nullptr; entry = (entry + 1) % tags_.size()) {
      const Tag& tag = tags_[entry];
      if (tag.block == block && tag.slots == slots && tag.part == part) {
        packed = true;
        return data_ + entry * static_cast<std::size_t>(words);
      }
    }
    if (2 * (used_ + 1) > tags_.size()) {  // full enough that probes grow long: start again
      tags_.assign(tags_.size(), Tag{});
      used_ = 0;
      return find(tile, block, slots, part, words, packed);
    }
    ++used_;
    tags_[entry] = Tag{block, slots, part};
    return data_ + entry * static_cast<std::size_t>(words);
  }

 private:
  /// Words kept per thread and kind (keys, values): a 2,048-token tile of head size 128 whole,
  /// at half the capacity.
  static constexpr std::size_t kKeptWords = std::size_t{1} << 20;
  struct Tag {
    const void* block = nullptr;
    int slots = -1;
    int part = -1;
  };
  std::uint64_t call_ = 0;
  int index_ = -1;
  int words_ = 0;
  std::size_t used_ = 0;
  std::vector<Tag> tags_;
  AlignedBuffer<std::uint32_t> kept_;
  std::uint32_t* data_ = nullptr;  ///< kept_'s entries
  AlignedBuffer<std::uint32_t> single_;
};

inline PackedBlocks& packed_keys() {
  thread_local PackedBlocks blocks;
  return blocks;
}
inline PackedBlocks& packed_values() {
  thread_local PackedBlocks blocks;
  return blocks;
}

/// Makes `config` the tiles' configuration. A pass's calls keep the tiles configured between
/// them (release_tiles ends the pass), so a configuration is loaded only where the last call of
/// the thread's had another: q.k and p.V alternate, each over several blocks. Whatever else ran
/// on the thread in between (another library's tiles) shows in the configuration it left.
template <class Tiles>
void use_configuration(const TileConfig& config) {
  if (!Tiles::configured_as(config)) Tiles::configure(config);
}

/// HostLoops::end_pass of the tile loops: the tiles back to their initial state.
template <class Tiles>
void release_tiles() {
  Tiles::release();
}

/// The tiles of a pass of H rows, which fill one or two row tiles of up to 16 rows each: per row
/// tile, accumulators for kGroups groups (C: 16 slots of logits, or 16 dimensions of o, each),
/// the A operand (the pass's rows of the query or of the probabilities, bf16 parts) and the cache
/// operand B of each group. Every load serves as many products as the 8 tiles allow:
///   one row tile (H <= 16): C j = tile j (4 groups), the parts of A tiles 4-6, loaded once a
///     step for all groups; B tile 7, loaded per group for all parts;
///   two row tiles (H <= 32): C (r, j) = tile 2r + j (2 groups), A of row tile r tile 4 + r, one
///     part at a time; B of group j tile 6 + j, loaded once a step for both row tiles and all
///     parts: the cache operand, which comes from farther than the pass's own rows, is read
///     half as often per product.
template <class Tiles, int H>
struct PassTiles {
  static constexpr int kRowTiles = (H + 15) / 16;
  static_assert(kRowTiles == 1 || kRowTiles == 2, "a pass of up to 32 rows");
  static_assert(kParts == 3, "one row tile holds an A tile per part");
  static constexpr int kGroups = kRowTiles == 1 ? 4 : 2;
  /// Rows of row tile r.
  static constexpr int rows_of(int r) { return r + 1 < kRowTiles ? 16 : H - 16 * (kRowTiles - 1); }

  /// The configuration for A operands of `parts` parts and a_bytes per row, and B operands of
  /// b_rows rows (of 64 bytes).
  static TileConfig config(int parts, int a_bytes, int b_rows) {
    TileConfig c;
    if constexpr (kRowTiles == 1) {
      for (int j = 0; j < 4; ++j) c.set(j, H, 64);
      for (int p = 0; p < parts; ++p) c.set(4 + p, H, a_bytes);
      c.set(7, b_rows, 64);
    } else {
      for (int r = 0; r < 2; ++r) {
        c.set(2 * r, rows_of(r), 64);
        c.set(2 * r + 1, rows_of(r), 64);
        c.set(4 + r, rows_of(r), a_bytes);
        c.set(6 + r, b_rows, 64);
      }
    }
    return c;
  }

  /// Zeroes the accumulators of the first `groups` groups.
  KPA_IMPL_AVX2_INLINE static void zero(int groups) {
    if constexpr (kRowTiles == 1) {
      zero_from<0>(groups);
    } else {
      Tiles::template zero<0>();
      Tiles::template zero<2>();
      if (groups > 1) {
        Tiles::template zero<1>();
        Tiles::template zero<3>();
      }
    }
  }

  /// Stores the accumulators of the first `groups` groups: row g of group j to c + g *
  /// row_stride + j * group_stride (floats).
  KPA_IMPL_AVX2_INLINE static void store(int groups, float* c, int row_stride, int group_stride) {
    move<true>(groups, c, row_stride, group_stride);
  }
  /// Loads them from there.
  KPA_IMPL_AVX2_INLINE static void load(int groups, float* c, int row_stride, int group_stride) {
    move<false>(groups, c, row_stride, group_stride);
  }

  /// Adds to the accumulators of the first `groups` groups the products of one step: A's part
  /// p, row g at bf16 code a + p * part_codes + g * row_codes; group j's B at b(j).
  template <class BAt>
  KPA_IMPL_AVX2_INLINE static void dot(int groups, int parts, const std::uint16_t* a, int part_codes, int row_codes,
                                       const BAt& b) {
    const std::int64_t a_stride = 2 * static_cast<std::int64_t>(row_codes);
    if constexpr (kRowTiles == 1) {
      Tiles::template load<4>(a, a_stride);
      if (parts > 1) Tiles::template load<5>(a + part_codes, a_stride);
      if (parts > 2) Tiles::template load<6>(a + 2 * part_codes, a_stride);
      dot_from<0>(groups, parts, b);
    } else {
      Tiles::template load<6>(b(0), 64);
      if (groups > 1) Tiles::template load<7>(b(1), 64);
      for (int p = 0; p < parts; ++p) {
        const std::uint16_t* part = a + static_cast<std::int64_t>(p) * part_codes;
        Tiles::template load<4>(part, a_stride);
        Tiles::template load<5>(part + 16 * static_cast<std::int64_t>(row_codes), a_stride);
        Tiles::template dot_bf16<0, 4, 6>();
        Tiles::template dot_bf16<2, 5, 6>();
        if (groups > 1) {
          Tiles::template dot_bf16<1, 4, 7>();
          Tiles::template dot_bf16<3, 5, 7>();
        }
      }
    }
  }

 private:
  template <bool kStore, int T>
  KPA_IMPL_AVX2_INLINE static void move_tile(float* p, std::int64_t stride) {
    if constexpr (kStore) {
      Tiles::template store<T>(p, stride);
    } else {
      Tiles::template load<T>(p, stride);
    }
  }
  template <bool kStore>
  KPA_IMPL_AVX2_INLINE static void move(int groups, float* c, int row_stride, int group_stride) {
    const std::int64_t stride = 4 * static_cast<std::int64_t>(row_stride);
    if constexpr (kRowTiles == 1) {
      move_from<kStore, 0>(groups, c, stride, group_stride);
    } else {
      float* const lower = c + 16 * static_cast<std::int64_t>(row_stride);
      move_tile<kStore, 0>(c, stride);
      move_tile<kStore, 2>(lower, stride);
      if (groups > 1) {
        move_tile<kStore, 1>(c + group_stride, stride);
        move_tile<kStore, 3>(lower + group_stride, stride);
      }
    }
  }
  template <bool kStore, int J>
  KPA_IMPL_AVX2_INLINE static void move_from(int groups, float* c, std::int64_t stride, int group_stride) {
    if constexpr (J < 4) {
      if (J < groups) move_tile<kStore, J>(c + J * group_stride, stride);
      move_from<kStore, J + 1>(groups, c, stride, group_stride);
    }
  }
  template <int J>
  KPA_IMPL_AVX2_INLINE static void zero_from(int groups) {
    if constexpr (J < 4) {
      if (J < groups) Tiles::template zero<J>();
      zero_from<J + 1>(groups);
    }
  }
  template <int J, class BAt>
  KPA_IMPL_AVX2_INLINE static void dot_from(int groups, int parts, const BAt& b) {
    if constexpr (J < 4) {
      if (J < groups) {
        Tiles::template load<7>(b(J), 64);
        Tiles::template dot_bf16<J, 4, 7>();
        if (parts > 1) Tiles::template dot_bf16<J, 5, 7>();
        if (parts > 2) Tiles::template dot_bf16<J, 6, 7>();
      }
      dot_from<J + 1>(groups, parts, b);
    }
  }
};

/// Row g of a C tile (16 floats) into dst[0, n).
KPA_IMPL_AVX2_INLINE inline void copy_logits(const float* c_row, float* dst, int n) {
  _mm256_maskstore_ps(dst, first_lanes(n), _mm256_loadu_ps(c_row));
  _mm256_maskstore_ps(dst + 8, first_lanes(n - 8), _mm256_loadu_ps(c_row + 8));
}

/// q.k of a block, for head sizes that are multiples of 32 up to kMaxHeadSize: a.q_tiles holds
/// the query as prepare_query left it; the logits are the sums, unscaled. PassTiles' groups of
/// 16 slots at a time.
template <int H, class CacheT, class Tiles>
KPA_IMPL_AVX2 void block_logits(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch) {
  using Pass = PassTiles<Tiles, H>;
  constexpr int kGroups = Pass::kGroups;
  const int D = a.head_size, steps = D / 32, parts = a.q_tiles.parts;
  // Every pass of a tile packs the block's slots of the tile: a column of C depends on its own
  // column of B alone, and only the pass's slots are kept.
  const int pack_slots = a.tile.index >= 0 && a.tile_slots > a.slots ? a.tile_slots : a.slots;
  bool packed = false;
  std::uint32_t* keys = packed_keys().find(a.tile, a.key_block, pack_slots, 0, packed_key_words(a.block_size, D), packed);
  if (!packed) pack_keys(a.key_block, a.block_size, D, pack_slots, keys);
  alignas(64) float sums[kGroups][H][16];
  const auto* query = reinterpret_cast<const std::uint16_t*>(a.q_tiles.words);
  use_configuration<Tiles>(Pass::config(parts, 64, 16));
  for (int slot0 = 0; slot0 < a.slots; slot0 += 16 * kGroups) {
    const int left = (a.slots - slot0 + 15) / 16, groups = left < kGroups ? left : kGroups;
    Pass::zero(groups);
    for (int step = 0; step < steps; ++step) {
      Pass::dot(groups, parts, query + step * 32, H * D, D,
                [&](int j) { return keys + ((slot0 / 16 + j) * steps + step) * 256; });
    }
    if (a.slots - slot0 >= 16 * groups) {  // whole groups: the tiles store the logits themselves
      Pass::store(groups, a.logits + slot0, a.logits_stride, 16);
    } else {
      Pass::store(groups, &sums[0][0][0], 16, H * 16);
      for (int j = 0; j < groups; ++j) {
        for (int g = 0; g < H; ++g) {
          copy_logits(sums[j][g], a.logits + g * a.logits_stride + slot0 + 16 * j, a.slots - slot0 - 16 * j);
        }
      }
    }
  }
  // A tile of several passes reads the cache once, as it packs; later passes read what it packed.
  if (a.tile.index < 0) prefetch.finish();
}

/// The chunk's probabilities as p.V's A tiles (kParts parts of H rows of the chunk's slots, bf16
/// codes): a thread's buffer, reused.
inline AlignedBuffer<std::uint16_t>& probability_tiles() {
  thread_local AlignedBuffer<std::uint16_t> tiles;
  return tiles;
}

/// p.V of a chunk for output dimensions [d_begin, d_end), block sizes that are multiples of 16:
/// PassTiles' groups of 16 dimensions at a time; a last range of fewer than 16 dimensions runs
/// the AVX2 loop.
template <int H, class CacheT, class Tiles>
KPA_IMPL_AVX2 void chunk_values(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch, int d_begin, int d_end) {
  using Pass = PassTiles<Tiles, H>;
  constexpr int kGroups = Pass::kGroups;
  const int B = a.block_size, KS = value_step(B), group_words = packed_value_words(B);
  const int parts = a.bf16_probabilities || a.probability_parts < 1 ? 1
                    : a.probability_parts > kParts                ? kParts
                                                                  : a.probability_parts;
  // The A tiles: the rows' softmax left the codes in place (a row of floats holds twice as many),
  // or the floats are split here, a row of codes per chunk slot and 32 more: rows a power of two
  // of lines apart would share a few sets of the L1 cache, which the A tiles' rows then evict
  // from each other.
  const std::uint16_t* probs = reinterpret_cast<const std::uint16_t*>(a.probs);
  int row_codes = 2 * a.probs_stride, part_codes = 0;
  if (!a.bf16_probabilities) {
    row_codes = a.blocks * B + 32;
    part_codes = H * row_codes;
    // A local: the tile instructions' memory clobbers reload no TLS.
    std::uint16_t* const split = probability_tiles().get(static_cast<std::size_t>(kParts) * part_codes);
    // Every part, even where the chunk's probabilities need fewer: which results an infinite
    // value turns into NaN (amx.hpp's header) does not depend on the other probabilities.
    split_rows_for<H, Tiles>(a.probs, a.probs_stride, (a.blocks - 1) * B + a.last_block_slots, a.blocks * B, parts,
                             split, row_codes, part_codes);
    probs = split;
  }
  PackedBlocks& kept = packed_values();
  use_configuration<Tiles>(Pass::config(parts, 2 * KS, KS / 2));
  // The accumulators live in o, span of blocks by span: each group of dimensions loads them,
  // adds the span's products and stores them back, so that the span's probabilities stay in L1
  // from one group to the next.
  const int span = B < kSpanSlots ? kSpanSlots / B : 1;
  const int d_tiles = d_begin + (d_end - d_begin) / 16 * 16;  // the dimensions the tiles take
  for (int lb0 = 0; lb0 < a.blocks; lb0 += span) {
    const int lb_end = lb0 + span < a.blocks ? lb0 + span : a.blocks;
    for (int d0 = d_begin; d0 < d_tiles; d0 += 16 * kGroups) {
      const int left = (d_tiles - d0) / 16, groups = left < kGroups ? left : kGroups;
      Pass::load(groups, a.o + d0, a.head_size, 16);
      for (int lb = lb0; lb < lb_end; ++lb) {
        if (a.block_ids[lb] < 0) continue;  // attended by no row of the pass: never read
        const int slots = lb + 1 == a.blocks ? a.last_block_slots : B;
        const CacheT* block = a.value_head + a.block_ids[lb] * a.block_stride;
        // A pass may take the packing of the block's slots of the tile where the slots past its
        // own are finite: their probabilities are zeros, and zero times a finite value adds nothing.
        int pack_slots = slots;
        if (a.tile.index >= 0 && slots < B && a.last_block_tile_slots > slots &&
            finite_values(block, B, d0, 16 * groups, slots, a.last_block_tile_slots)) {
          pack_slots = a.last_block_tile_slots;
        }
        bool packed = false;
        std::uint32_t* values = kept.find(a.tile, block, pack_slots, d0, kGroups * group_words, packed);
        if (!packed) {
          for (int j = 0; j < groups; ++j) pack_values(block, B, d0 + 16 * j, pack_slots, values + j * group_words);
        }
        for (int step = 0; step * KS < slots; ++step) {
          Pass::dot(groups, parts, probs + lb * B + step * KS, part_codes, row_codes,
                    [&](int j) { return values + j * group_words + step * KS * 8; });
        }
      }
      Pass::store(groups, a.o + d0, a.head_size, 16);
    }
  }
  if (d_tiles < d_end) {
    avx2::chunk_values<H, CacheT, avx2::Avx2>(a, prefetch, d_tiles, d_end);
  } else if (a.tile.index < 0) {
    prefetch.finish();
  }
}

/// The AMX loops over the tile mapping Tiles in `loops`, as `isa`, where the sizes suit its tiles.
template <class Tiles, int H, class CacheT>
void use_tile_loops(HostLoops<H, CacheT>& loops, HostIsa isa, int head_size, int block_size) {
  if constexpr (has_loops<CacheT>) {
    const bool logits = head_size % 32 == 0 && head_size <= kMaxHeadSize, values = has_value_tiles(block_size);
    if (!logits && !values) return;
    loops.isa = isa;
    loops.end_pass = &release_tiles<Tiles>;
    if (logits) {
      loops.prepare_query = &prepare_query<H, Tiles>;
      loops.block_logits = &block_logits<H, CacheT, Tiles>;
    }
    if (values) {
      loops.chunk_values = &chunk_values<H, CacheT, Tiles>;
      // Not where the AVX2 loop takes the last dimensions (chunk_values): it reads floats.
      loops.takes_bf16_probabilities = head_size % 16 == 0;
      if constexpr (Tiles::kAvx512Bf16) loops.rows.softmax_to_bf16 = &row_softmax_to_bf16;
    }
  }
}

}  // namespace kpa::detail::amx
