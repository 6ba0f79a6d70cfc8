#pragma once
// The float64 reference for paged attention, written plainly and apart from the kernels: it
// reads keys and values by (block, kv head, slot, dim) from its own logical arrays, so it does
// not share the kernels' knowledge of vLLM's cache layout.

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include <kpa/attention_params.hpp>

namespace kpa_test {

/// A decode batch on the host. Values are stored as the kernels will see them (already rounded
/// to the storage type), as float.
struct HostProblem {
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  float scale = 1.0f;
  std::vector<int> seq_lens;      // [num_seqs]
  std::vector<int> block_tables;  // [num_seqs][max_blocks_per_seq]
  std::vector<float> query;       // [num_tokens][num_heads][head_size]
  std::vector<float> keys;        // [num_blocks][num_kv_heads][block_size][head_size]
  std::vector<float> values;      // [num_blocks][num_kv_heads][block_size][head_size]
  std::vector<float> alibi;       // [num_heads] or empty
  // Cache format: keys and values above are the dequantised values the kernels must see.
  kpa::KVCacheDType kv_cache_dtype = kpa::KVCacheDType::Auto;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Block-sparse pattern (dense unless sparse.vert_stride > 1), for tensor-parallel rank tp_rank.
  kpa::BlockSparse sparse;
  int tp_rank = 0;
  // Variants (README, "Attention variants").
  std::vector<int> query_start_loc;  // [num_seqs + 1]; empty: one query token per sequence
  float soft_cap = 0.0f;             // 0: off
  int window = 0;                    // 0: off
  std::vector<float> sinks;          // [num_heads] or empty

  int num_tokens() const { return query_start_loc.empty() ? num_seqs : query_start_loc[num_seqs]; }
  int query_start(int seq) const { return query_start_loc.empty() ? seq : query_start_loc[seq]; }
  int query_len(int seq) const { return query_start_loc.empty() ? 1 : query_start_loc[seq + 1] - query_start_loc[seq]; }

  int max_seq_len() const {
    int m = 0;
    for (int len : seq_lens) m = len > m ? len : m;
    return m;
  }
  std::size_t kv_index(int block, int kv_head, int slot, int d) const {
    return ((static_cast<std::size_t>(block) * num_kv_heads + kv_head) * block_size + slot) * head_size + d;
  }
  /// The logit of query row `row` (of sequence `seq`, at `position`), head `head`, against key
  /// `token`: scale * q.k, soft-capped, plus ALiBi.
  double logit_at(int row, int seq, int head, int token, int position) const {
    const int kv_head = head / (num_heads / num_kv_heads);
    const int block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + token / block_size];
    double dot = 0.0;
    for (int d = 0; d < head_size; ++d) {
      dot += static_cast<double>(query[(static_cast<std::size_t>(row) * num_heads + head) * head_size + d]) *
             keys[kv_index(block, kv_head, token % block_size, d)];
    }
    double l = static_cast<double>(scale) * dot;
    if (soft_cap > 0.0f) l = soft_cap * std::tanh(l / soft_cap);
    if (!alibi.empty()) l += static_cast<double>(alibi[head]) * (token - position);
    return l;
  }
  /// The same for a sequence's single (decode) query token.
  double logit(int seq, int head, int token) const { return logit_at(seq, seq, head, token, seq_lens[seq] - 1); }
  /// vLLM's block-sparse rule, read from its kernel's description: whether query head `head`
  /// of sequence `seq` attends `token`.
  bool attends(int seq, int head, int token) const { return attends_at(seq, head, token, seq_lens[seq] - 1); }
  /// The same for a query at `position`, and the causal window.
  bool attends_at(int /*seq*/, int head, int token, int position) const {
    if (token > position || (window > 0 && token <= position - window)) return false;
    if (sparse.vert_stride <= 1) return true;
    const int query_sparse_block = position / sparse.block_size;
    const int key_sparse_block = (token / block_size) * block_size / sparse.block_size;
    const int kv_head = head / (num_heads / num_kv_heads);
    const int offset = sparse.head_sliding_step >= 0
                           ? (tp_rank * num_heads + head) * sparse.head_sliding_step + 1
                           : (tp_rank * num_kv_heads + kv_head) * (-sparse.head_sliding_step) + 1;
    return (key_sparse_block + offset) % sparse.vert_stride == 0 ||
           key_sparse_block > query_sparse_block - sparse.local_blocks;
  }
  double value(int seq, int head, int token, int d) const {
    const int kv_head = head / (num_heads / num_kv_heads);
    const int block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + token / block_size];
    return values[kv_index(block, kv_head, token % block_size, d)];
  }
};

/// Softmax attention of one query head over tokens [begin, end): max logit, sum of exp and
/// the normalised output (zeros for an empty range).
struct ReferencePart {
  double max_logit = -std::numeric_limits<double>::infinity();
  double exp_sum = 0.0;
  std::vector<double> out;
};

inline ReferencePart reference_part(const HostProblem& p, int seq, int head, int begin, int end) {
  ReferencePart part;
  part.out.assign(p.head_size, 0.0);
  if (begin >= end) return part;
  std::vector<double> logits(end - begin);
  bool nan_logit = false;
  for (int t = begin; t < end; ++t) {
    if (!p.attends(seq, head, t)) continue;
    logits[t - begin] = p.logit(seq, head, t);
    nan_logit = nan_logit || std::isnan(logits[t - begin]);
    part.max_logit = std::fmax(part.max_logit, logits[t - begin]);
  }
  if (part.max_logit == -std::numeric_limits<double>::infinity()) {  // nothing attended but corrupt data
    if (nan_logit) part.exp_sum = std::numeric_limits<double>::quiet_NaN();
    for (double& o : part.out) o = nan_logit ? std::numeric_limits<double>::quiet_NaN() : 0.0;
    return part;
  }
  for (int t = begin; t < end; ++t) {
    if (!p.attends(seq, head, t)) continue;
    const double w = std::exp(logits[t - begin] - part.max_logit);
    part.exp_sum += w;
    for (int d = 0; d < p.head_size; ++d) part.out[d] += w * p.value(seq, head, t, d);
  }
  for (double& o : part.out) o /= part.exp_sum;
  return part;
}

/// out[token][head][d] and lse[token][head] of the whole batch, with every variant, written from
/// the README's semantics: query token i of sequence s sits at p = seq_len - n_s + i and attends
/// the keys j <= p (p - W < j with a window W) its block-sparse pattern allows; the logits are
/// capped, then ALiBi is added; a sink adds exp(sink - m) to the denominator and no value;
/// lse = m + log(denominator), -inf with nothing attended (and no sink).
struct ReferenceResult {
  std::vector<double> out;
  std::vector<double> lse;
};

/// `only_head` >= 0: that head alone (the others stay 0).
inline ReferenceResult reference_rows(const HostProblem& p, int only_head = -1) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(p.num_tokens()) * p.num_heads * p.head_size, 0.0);
  r.lse.assign(static_cast<std::size_t>(p.num_tokens()) * p.num_heads, -inf);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int n = p.query_len(s);
    for (int i = 0; i < n; ++i) {
      const int row = p.query_start(s) + i, position = p.seq_lens[s] - n + i;
      for (int h = 0; h < p.num_heads; ++h) {
        if (only_head >= 0 && h != only_head) continue;
        std::vector<double> logits(p.seq_lens[s], -inf);
        double m = p.sinks.empty() ? -inf : p.sinks[h];
        bool nan_logit = false;
        for (int t = 0; t < p.seq_lens[s]; ++t) {
          if (!p.attends_at(s, h, t, position)) continue;
          logits[t] = p.logit_at(row, s, h, t, position);
          nan_logit = nan_logit || std::isnan(logits[t]);
          m = std::fmax(m, logits[t]);
        }
        double* out = &r.out[(static_cast<std::size_t>(row) * p.num_heads + h) * p.head_size];
        double& lse = r.lse[static_cast<std::size_t>(row) * p.num_heads + h];
        if (nan_logit) {
          for (int d = 0; d < p.head_size; ++d) out[d] = nan;
          lse = nan;
          continue;
        }
        if (m == -inf) continue;  // nothing attended: 0 and -inf
        double sum = p.sinks.empty() ? 0.0 : std::exp(p.sinks[h] - m);
        for (int t = 0; t < p.seq_lens[s]; ++t) {
          if (logits[t] == -inf) continue;
          const double w = std::exp(logits[t] - m);
          sum += w;
          for (int d = 0; d < p.head_size; ++d) out[d] += w * p.value(s, h, t, d);
        }
        for (int d = 0; d < p.head_size; ++d) out[d] /= sum;
        lse = m + std::log(sum);
      }
    }
  }
  return r;
}

/// out[seq][head][d] of the whole batch.
inline std::vector<double> reference_attention(const HostProblem& p) { return reference_rows(p).out; }

}  // namespace kpa_test
