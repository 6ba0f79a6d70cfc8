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
  std::vector<float> query;       // [num_seqs][num_heads][head_size]
  std::vector<float> keys;        // [num_blocks][num_kv_heads][block_size][head_size]
  std::vector<float> values;      // [num_blocks][num_kv_heads][block_size][head_size]
  std::vector<float> alibi;       // [num_heads] or empty
  // Cache format: keys and values above are the dequantised values the kernels must see.
  kpa::KVCacheDType kv_cache_dtype = kpa::KVCacheDType::Auto;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Block-sparse pattern (dense unless sparse.vert_stride > 1), for tensor-parallel rank tp_rank.
  kpa::BlockSparse sparse;
  int tp_rank = 0;

  int max_seq_len() const {
    int m = 0;
    for (int len : seq_lens) m = len > m ? len : m;
    return m;
  }
  std::size_t kv_index(int block, int kv_head, int slot, int d) const {
    return ((static_cast<std::size_t>(block) * num_kv_heads + kv_head) * block_size + slot) * head_size + d;
  }
  double logit(int seq, int head, int token) const {
    const int kv_head = head / (num_heads / num_kv_heads);
    const int block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + token / block_size];
    double dot = 0.0;
    for (int d = 0; d < head_size; ++d) {
      dot += static_cast<double>(query[(static_cast<std::size_t>(seq) * num_heads + head) * head_size + d]) *
             keys[kv_index(block, kv_head, token % block_size, d)];
    }
    double l = static_cast<double>(scale) * dot;
    if (!alibi.empty()) l += static_cast<double>(alibi[head]) * (token - seq_lens[seq] + 1);
    return l;
  }
  /// vLLM's block-sparse rule, read from its kernel's description: whether query head `head`
  /// of sequence `seq` attends `token`.
  bool attends(int seq, int head, int token) const {
    if (sparse.vert_stride <= 1) return true;
    const int query_sparse_block = (seq_lens[seq] - 1) / sparse.block_size;
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

/// out[seq][head][d] of the whole batch.
inline std::vector<double> reference_attention(const HostProblem& p) {
  std::vector<double> out(static_cast<std::size_t>(p.num_seqs) * p.num_heads * p.head_size, 0.0);
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int h = 0; h < p.num_heads; ++h) {
      const ReferencePart part = reference_part(p, s, h, 0, p.seq_lens[s]);
      for (int d = 0; d < p.head_size; ++d) out[(static_cast<std::size_t>(s) * p.num_heads + h) * p.head_size + d] = part.out[d];
    }
  }
  return out;
}

}  // namespace kpa_test
