#pragma once
// The arguments of the host kernel path's inner loops (see host_kernels.hpp), and their portable
// versions: plain C++ that every CPU runs and compilers vectorise as far as they can.

#include <kpa/detail/kokkos_compat.hpp>
#include <kpa/numeric_types.hpp>

#include <cmath>
#include <cstdint>

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
/// once stall the core until most of them have been given a buffer (host_path.hpp has the
/// figures).
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
  /// for them itself: the run's pointer and bound are all its loop keeps (with the cursor's
  /// state in the loop instead, the q.k tiles ran 20-30% slower for the registers it took).
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
};

/// One chunk_values call: the chunk's blocks, and output dimensions [d_begin, d_end).
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
  const float* weight;       ///< [H] factor of the running output (online-softmax rescale)
  float* o;                  ///< [H][head_size] running output
};

/// The NaN-ignoring max (quiet comparisons: a NaN operand raises no floating-point exception).
inline float max_ignoring_nan(float a, float b) { return std::isgreater(b, a) ? b : a; }

namespace portable {

template <int H, class CacheT>
void block_logits(const BlockLogitsArgs<CacheT>& a, BlockPrefetcher& prefetch) {
  prefetch.finish();  // a hint: asked for at once
  constexpr int X = static_cast<int>(16 / sizeof(CacheT));
  const int vectors = a.head_size / X, stride = a.block_size * X;
  for (int slot = 0; slot < a.slots; ++slot) {
    float acc[H][X] = {};  // X partial sums per head: vectorisable without reassociating
    for (int dx = 0; dx < vectors; ++dx) {
      float k[X];
      for (int i = 0; i < X; ++i) k[i] = to_float(a.key_block[slot * X + dx * stride + i]);
      for (int g = 0; g < H; ++g)
        for (int i = 0; i < X; ++i) acc[g][i] += a.q[g * a.head_size + dx * X + i] * k[i];
    }
    for (int g = 0; g < H; ++g) {
      float logit = 0.0f;
      for (int i = 0; i < X; ++i) logit += acc[g][i];
      a.logits[g * a.logits_stride + slot] = logit;
    }
  }
}

inline float row_softmax(float* p, int n, float slope, float position, float floor, float* max) {
  float m = floor;
  for (int i = 0; i < n; ++i) {
    if (slope != 0.0f) p[i] += slope * (position + static_cast<float>(i));
    m = max_ignoring_nan(m, p[i]);
  }
  *max = m;
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    // With nothing attended only a NaN logit (corrupt data) may remain, and it stays NaN.
    p[i] = m == -compat::infinity() ? (p[i] != p[i] ? p[i] : 0.0f) : compat::exp(p[i] - m);
    sum += p[i];
  }
  return sum;
}

/// p[i] = cap * tanh(p[i] / cap) for i < n; -inf (masked) stays -inf, NaN stays NaN.
inline void row_soft_cap(float* p, int n, float cap) {
  for (int i = 0; i < n; ++i) {
    if (p[i] != -compat::infinity()) p[i] = cap * std::tanh(p[i] / cap);
  }
}

template <int H, class CacheT>
void chunk_values(const ChunkValuesArgs<CacheT>& a, BlockPrefetcher& prefetch, int d_begin, int d_end) {
  prefetch.finish();  // a hint: asked for at once
  constexpr int W = 8;  // partial sums per head
  const int B = a.block_size;
  for (int d = d_begin; d < d_end; ++d) {
    float part[H][W] = {};
    for (int lb = 0; lb < a.blocks; ++lb) {
      if (a.block_ids[lb] < 0) continue;  // attended by no head of the pass: never read
      const CacheT* v = a.value_head + a.block_ids[lb] * a.block_stride + static_cast<std::int64_t>(d) * B;
      const float* p = a.probs + lb * B;
      const int slots = lb + 1 == a.blocks ? a.last_block_slots : B;
      int slot = 0;
      for (; slot + W <= slots; slot += W) {
        float vf[W];
        for (int j = 0; j < W; ++j) vf[j] = to_float(v[slot + j]);
        for (int g = 0; g < H; ++g)
          for (int j = 0; j < W; ++j) part[g][j] += p[g * a.probs_stride + slot + j] * vf[j];
      }
      for (; slot < slots; ++slot) {  // never past the sequence: unused slots may hold NaN
        const float vf = to_float(v[slot]);
        for (int g = 0; g < H; ++g) part[g][0] += p[g * a.probs_stride + slot] * vf;
      }
    }
    for (int g = 0; g < H; ++g) {
      float sum = 0.0f;
      for (int j = 0; j < W; ++j) sum += part[g][j];
      float& o = a.o[g * a.head_size + d];
      o = o * a.weight[g] + sum;
    }
  }
}

template <class T>
void load_row(const T* src, float scale, float* dst, int n) {
  load_scaled(src, 1, scale, dst, n);
}

template <class T>
void store_row(const float* src, float factor, T* dst, int n) {
  store_scaled(src, factor, dst, 1, n);
}

}  // namespace portable
}  // namespace kpa::detail
