#pragma once
// Scalars and options of an attention call, as vLLM's paged_attention ops take them.

#include <string_view>

namespace kpa {

/// Element format of the KV cache ("kv_cache_dtype" in vLLM).
enum class KVCacheDType {
  Auto,     ///< same type as the query
  Fp8E4M3,  ///< OCP E4M3FN, one byte per element
  Fp8E5M2,  ///< OCP E5M2, one byte per element
};

/// Parses vLLM's strings: "auto", "fp8" (= "fp8_e4m3"), "fp8_e4m3", "fp8_e5m2".
/// Throws kpa::Error for anything else.
KVCacheDType parse_kv_cache_dtype(std::string_view name);

/// The name parse_kv_cache_dtype accepts for `dtype` ("auto", "fp8_e4m3", "fp8_e5m2").
std::string_view to_string(KVCacheDType dtype);

/// vLLM's blocksparse_* arguments; dense attention unless vert_stride > 1.
struct BlockSparse {
  int local_blocks = 0;
  int vert_stride = 0;
  int block_size = 64;
  int head_sliding_step = 0;
};

struct AttentionParams {
  float scale = 1.0f;  ///< multiplies q.k (usually 1/sqrt(head_size))
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  float k_scale = 1.0f;  ///< fp8 key dequantisation scale
  float v_scale = 1.0f;  ///< fp8 value dequantisation scale
  int tp_rank = 0;       ///< tensor-parallel rank, for block-sparse head offsets
  BlockSparse block_sparse{};
  /// Gemma 2's logit soft-capping: logit = c * tanh(logit / c) with c = logits_soft_cap, applied
  /// to scale * q.k before ALiBi and before any mask; 0: off.
  float logits_soft_cap = 0.0f;
  /// Causal sliding window: a query at position p attends the keys j with p - W < j <= p
  /// (W keys, its own included; FlashAttention's window_size = (W - 1, 0)); 0: no window.
  /// Blocks wholly outside the window are not read.
  int sliding_window = 0;
  /// Read block_tables and seq_lens once before the launch to check every index the kernels
  /// will follow (see README, "Using kpa from C++", Errors). Turn off only when the caller
  /// guarantees them.
  bool check_indices = true;
};

}  // namespace kpa
