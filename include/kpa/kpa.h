/* kpa C ABI: paged attention for LLM decode, callable from C and through dlopen (Python ctypes,
 * Julia, Rust, ...). Exported by libkpa.so.
 *
 * - Pointers address the memory of the execution space the calling thread chose with
 *   kpa_set_execution: by default the default Kokkos execution space's (host memory on CPU builds,
 *   device memory on CUDA builds); layouts are vLLM's, contiguous:
 *     out, query       [num_seqs][num_heads][head_size]
 *     key_cache        [num_blocks][num_kv_heads][head_size / x][block_size][x], x = 16 / element size
 *     value_cache      [num_blocks][num_kv_heads][head_size][block_size]
 *     block_tables     [num_seqs][max_blocks_per_seq] int32;  seq_lens [num_seqs] int32
 *     exp_sums, max_logits [num_seqs][num_heads][max_num_partitions] float
 *     tmp_out          [num_seqs][num_heads][max_num_partitions][head_size] of dtype
 *     key, value       [num_tokens][num_kv_heads][head_size];  slot_mapping [num_tokens] int64
 *     block_mapping    [num_pairs][2] int64 (source block, destination block)
 *   kpa_paged_attention_ex with query_start_loc: out and query [num_tokens][num_heads][head_size],
 *   lse [num_tokens][num_heads] float, query_start_loc [num_seqs + 1] int32.
 * - cache_dtype equals dtype for "auto" caches; KPA_FP8_E4M3 / KPA_FP8_E5M2 for one-byte caches.
 * - Calls are synchronous unless the calling thread gave a stream (kpa_set_execution). 0 (KPA_OK)
 *   is success; otherwise a kpa_status, with a message from kpa_last_error() (per thread, valid
 *   until the thread's next kpa call).
 * - Threads: after kpa_init, any thread may call, concurrently: when kpa_init started Kokkos, it
 *   did so on a thread of its own, which runs every call in turn (Kokkos' host back ends accept
 *   parallel work only from the thread that initialised them). When the host program initialised
 *   Kokkos first, calls run on the calling thread, so make them from threads Kokkos accepts.
 *   kpa_init and kpa_finalize are safe to call from several threads at once.
 */
#ifndef KPA_KPA_H
#define KPA_KPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KPA_F32 = 0, KPA_F16 = 1, KPA_BF16 = 2, KPA_FP8_E4M3 = 3, KPA_FP8_E5M2 = 4 } kpa_dtype;

typedef enum {
  KPA_OK = 0,
  KPA_ERR_INVALID_ARGUMENT = 1,
  KPA_ERR_UNSUPPORTED = 2,
  KPA_ERR_RUNTIME = 3
} kpa_status;

/* A memory space: the default execution space's, or the host's (the same on CPU builds). */
typedef enum { KPA_MEMORY_DEFAULT = 0 /* the default execution space's memory */, KPA_MEMORY_HOST = 1 } kpa_memory;

typedef struct {
  int local_blocks, vert_stride, block_size, head_sliding_step;
} kpa_block_sparse;

/* Initialises Kokkos (on a thread of kpa's own) unless the host program already did; idempotent. */
int kpa_init(void);
/* Releases kpa's workspace and finalises Kokkos if kpa_init initialised it. */
void kpa_finalize(void);
const char* kpa_last_error(void);
const char* kpa_version(void);
/* The instruction set of the host kernels (the attention calls on a host back end: every call of
 * a CPU build, KPA_MEMORY_HOST calls of a GPU build): "amx", "avx512vbmi", "avx512", "avx2" or
 * "portable", the best this CPU has whatever flags the library was built with (KPA_HOST_ISA may
 * name a lesser one, or "amx-model": the AMX level's loops over software models, on AVX2). */
const char* kpa_host_isa(void);

/* Whether calls check the indices they follow before launching (nonzero, the default) or trust
 * them (0): seq_lens and block_tables (attention), slot_mapping (kpa_reshape_and_cache),
 * block_mapping (kpa_copy_blocks). The check is a kernel plus one small copy back to the host;
 * without it a call only enqueues its kernels (and waits for them at its end unless the thread
 * gave a stream). Applies to every thread's later calls; returns the previous setting.
 * kpa_paged_attention_ex takes its own setting from its options. */
int kpa_set_check_indices(int enabled);
/* The current setting of kpa_set_check_indices (1 or 0). */
int kpa_check_indices(void);

/* Where the calling thread's later calls run (until it calls again; every thread starts with
 * KPA_MEMORY_DEFAULT, NULL):
 * - memory KPA_MEMORY_DEFAULT: on the default execution space, pointers into its memory;
 *   KPA_MEMORY_HOST: on the host back end, pointers into host memory (on a CUDA build, CPU data;
 *   on a CPU build the same as the default).
 * - stream NULL: each call waits for its kernels before it returns. A cudaStream_t (CUDA builds,
 *   KPA_MEMORY_DEFAULT only): calls enqueue their kernels on that stream and return without
 *   waiting for them; with the index check off (kpa_set_check_indices, check_indices) nothing in
 *   kpa_paged_attention_v1/_v2, kpa_reshape_and_cache or kpa_copy_blocks waits for the GPU, so
 *   they can be captured in a CUDA graph. A stream's first call sets up kpa's state for it
 *   (device allocations): make it before a capture. The caller keeps the stream alive until
 *   kpa_finalize.
 * Returns KPA_ERR_UNSUPPORTED for a stream on a build without a GPU back end or with
 * KPA_MEMORY_HOST; kpa_swap_blocks takes each cache's memory as its own arguments and runs on the
 * thread's stream. */
int kpa_set_execution(kpa_memory memory, void* stream);

int kpa_paged_attention_v1(void* out, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, float scale, const float* alibi_slopes /* NULL: none */,
                           float k_scale, float v_scale, int tp_rank,
                           const kpa_block_sparse* block_sparse /* NULL: dense */);

int kpa_paged_attention_v2(void* out, float* exp_sums, float* max_logits, void* tmp_out, int64_t max_num_partitions,
                           int64_t partition_size, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, float scale, const float* alibi_slopes, float k_scale, float v_scale,
                           int tp_rank, const kpa_block_sparse* block_sparse);

/* The launch planner decides (single pass or partitions); a library-held workspace is reused
 * (concurrent calls from several threads take turns for it). */
int kpa_paged_attention(void* out, const void* query, kpa_dtype dtype, const void* key_cache, const void* value_cache,
                        kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                        int64_t head_size, int64_t num_blocks, int64_t block_size, const int32_t* block_tables,
                        int64_t max_blocks_per_seq, const int32_t* seq_lens, int64_t max_seq_len, float scale,
                        const float* alibi_slopes, float k_scale, float v_scale, int tp_rank,
                        const kpa_block_sparse* block_sparse);

/* Options of kpa_paged_attention_ex; set them with kpa_attention_options_init first, then change
 * what the call needs. struct_size lets the struct grow: later versions of kpa accept this size. */
typedef struct {
  size_t struct_size;                   /* sizeof(kpa_attention_options) */
  float scale, k_scale, v_scale;        /* scale of q.k (default 1); fp8 dequantisation scales (1) */
  int tp_rank;                          /* tensor-parallel rank, for block-sparse head offsets (0) */
  const kpa_block_sparse* block_sparse; /* NULL: dense */
  const float* alibi_slopes;            /* [num_heads]; NULL: none */
  float logits_soft_cap;                /* c > 0: logit = c * tanh(logit / c) before ALiBi and masks; 0: off */
  int sliding_window;                   /* W > 0: a query at p attends keys p - W < j <= p; 0: off */
  const float* sinks;                   /* [num_heads] sink logits joining the denominator; NULL: none */
  const int32_t* query_start_loc;       /* [num_seqs + 1], vLLM's convention; NULL: one query token per sequence */
  int64_t num_tokens;                   /* rows of query / out: query_start_loc[num_seqs], or num_seqs */
  float* lse;                           /* [num_tokens][num_heads] log-sum-exp, written; NULL: not written */
  int check_indices;                    /* nonzero: check seq_lens, block tables, query_start_loc (default;
                                         * this call's own setting, not kpa_set_check_indices') */
} kpa_attention_options;

/* Defaults: scale 1, k_scale and v_scale 1, everything else off or NULL, num_tokens -1 (= num_seqs),
 * check_indices on. */
void kpa_attention_options_init(kpa_attention_options* options);

/* The automatic entry point with the variants: soft-capping, sliding window, sinks, several
 * query tokens per sequence (each attends the keys up to its own position), LSE output.
 * options NULL: the defaults. */
int kpa_paged_attention_ex(void* out, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, const kpa_attention_options* options);

/* vLLM's merge_attn_states: two attention results over disjoint key sets, merged by their LSEs
 * (out_lse may be NULL). All of [num_tokens][num_heads][head_size] of dtype (F32, F16, BF16),
 * the LSEs [num_tokens][num_heads] float. */
int kpa_merge_attn_states(void* out, float* out_lse, const void* prefix_out, const float* prefix_lse,
                          const void* suffix_out, const float* suffix_lse, kpa_dtype dtype, int64_t num_tokens,
                          int64_t num_heads, int64_t head_size);

int kpa_reshape_and_cache(const void* key, const void* value, kpa_dtype dtype, void* key_cache, void* value_cache,
                          kpa_dtype cache_dtype, int64_t num_tokens, int64_t num_kv_heads, int64_t head_size,
                          int64_t num_blocks, int64_t block_size, const int64_t* slot_mapping, float k_scale,
                          float v_scale);

/* vLLM's copy_blocks: for each of the num_layers layers and each pair (src, dst) of block_mapping
 * (default space's memory), block dst of key_caches[layer] and of value_caches[layer] becomes a
 * copy of block src. Every cache holds num_blocks blocks of block_elems contiguous elements of
 * cache_dtype (num_kv_heads * head_size * block_size in the layouts above), copied bit for bit.
 * Pairs are copied concurrently: a destination must not be another pair's source. */
int kpa_copy_blocks(void* const* key_caches, void* const* value_caches, int64_t num_layers, kpa_dtype cache_dtype,
                    int64_t num_blocks, int64_t block_elems, const int64_t* block_mapping, int64_t num_pairs);

/* vLLM's swap_blocks: for each pair (src, dst) of block_mapping (host memory), block dst of
 * dst_cache becomes a copy of block src of src_cache. A block is block_bytes contiguous bytes (one
 * block of a key or of a value cache); each cache lives where its kpa_memory says (on a CUDA build,
 * host <-> device offload). */
int kpa_swap_blocks(const void* src_cache, kpa_memory src_memory, int64_t src_num_blocks, void* dst_cache,
                    kpa_memory dst_memory, int64_t dst_num_blocks, int64_t block_bytes, const int64_t* block_mapping,
                    int64_t num_pairs);

#ifdef __cplusplus
}
#endif

#endif /* KPA_KPA_H */
