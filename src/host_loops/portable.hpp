#pragma once
// The portable host loops (include/kpa/detail/host_loops.hpp says what each computes): plain C++
// that every CPU runs and compilers vectorise as far as they can.

#include <kpa/detail/attention_variant.hpp>
#include <kpa/detail/host_loops.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kpa::detail {

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

inline float row_softmax(float* p, int n, float scale, float floor, float* max) {
  float m = floor;
  for (int i = 0; i < n; ++i) {
    if (scale != 1.0f) p[i] *= scale;
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

inline float row_softmax_to_bf16(float* p, int n, int n_padded, float scale, float floor, float* max) {
  const float sum = row_softmax(p, n, scale, floor, max);
  // Code i's bytes [2i, 2i + 2) lie below float i's, which is read first.
  for (int i = 0; i < n; ++i) {
    const std::uint16_t code = from_float<bfloat16>(p[i]).bits;
    std::memcpy(reinterpret_cast<char*>(p) + 2 * i, &code, 2);
  }
  const std::uint16_t zero = 0;
  for (int i = n; i < n_padded; ++i) std::memcpy(reinterpret_cast<char*>(p) + 2 * i, &zero, 2);
  return sum;
}

inline void row_soft_cap(float* p, int n, float cap) {
  for (int i = 0; i < n; ++i) p[i] = AttentionVariant::soft_cap(p[i], cap);
}

inline void row_add_ramp(float* p, int n, float slope, float offset) {
  for (int i = 0; i < n; ++i) p[i] += AttentionVariant::alibi_bias(slope, offset + static_cast<float>(i));
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
      a.o[g * a.head_size + d] += sum;
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
