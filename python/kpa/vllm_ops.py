"""vLLM's paged-attention and cache operators, with the signatures of ``vllm._custom_ops``.

Each function takes exactly the arguments of its vLLM namesake (names, order and defaults), so a
vLLM build that lacks them can use these instead::

    import vllm._custom_ops
    import kpa.vllm_ops
    kpa.vllm_ops.patch(vllm._custom_ops)   # or assign the functions one by one

Beyond vLLM's own kernels they accept ``k_scale`` / ``v_scale`` as a float or a one-element tensor
(on the CPU or with the data; only fp8 caches read them), int32 or int64 ``block_tables`` /
``seq_lens``, and a query that is a strided view of a fused qkv tensor (gathered into a
contiguous one before the call). Bad arguments raise ``ValueError``, unsupported ones
``NotImplementedError``, with kpa's message.

CUDA tensors (a package built against kpa's CUDA build) run on torch's current stream. Nothing
waits for the GPU except the index check (``kpa.set_check_indices``) and fp8 scales held on the
GPU; with the check off and the scales as floats or CPU tensors, a decode step can be captured
in a CUDA graph.
"""

import functools
from typing import List, Optional, Union

import torch

__all__ = ["paged_attention_v1", "paged_attention_v2", "reshape_and_cache", "copy_blocks", "swap_blocks", "patch",
           "PARTITION_SIZE"]

#: Tokens per partition of paged_attention_v2 (vLLM's PARTITION_SIZE): size exp_sums, max_logits
#: and tmp_out with ceil(max_seq_len / PARTITION_SIZE) partitions.
PARTITION_SIZE = 512

Scale = Union[float, torch.Tensor]


@functools.lru_cache(maxsize=64)
def _scale_tensor(value: float) -> torch.Tensor:
    # On the CPU whatever the data's device: the operators read a CPU scale without a copy.
    return torch.tensor(value, dtype=torch.float32)


def _as_tensor(scale: Scale) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling():
        # A traced graph holds the constant itself; the cache serves eager calls.
        return torch.tensor(float(scale), dtype=torch.float32)
    return _scale_tensor(float(scale))


def paged_attention_v1(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: Scale,
    v_scale: Scale,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """out[s, h] = softmax(scale * q[s, h] . K_s^T (+ ALiBi)) V_s over the cached tokens of sequence s."""
    torch.ops.kpa.paged_attention_v1(
        out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
        alibi_slopes, kv_cache_dtype, _as_tensor(k_scale), _as_tensor(v_scale), tp_rank,
        blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size, blocksparse_head_sliding_step)


def paged_attention_v2(
    out: torch.Tensor,
    exp_sum: torch.Tensor,
    max_logits: torch.Tensor,
    tmp_out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: Scale,
    v_scale: Scale,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """paged_attention_v1 in partitions of PARTITION_SIZE tokens: per partition the max logit
    (max_logits), the sum of exponentials (exp_sum) and the normalised partial output (tmp_out),
    then their reduce into out."""
    torch.ops.kpa.paged_attention_v2(
        out, exp_sum, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
        block_size, max_seq_len, alibi_slopes, kv_cache_dtype, _as_tensor(k_scale),
        _as_tensor(v_scale), tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
        blocksparse_block_size, blocksparse_head_sliding_step)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: Scale,
    v_scale: Scale,
) -> None:
    """Writes token t's key and value into cache slot slot_mapping[t] (negative: padding, skipped);
    fp8 caches receive round-to-nearest-even(value / scale), saturated."""
    torch.ops.kpa.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                    _as_tensor(k_scale), _as_tensor(v_scale))


def copy_blocks(key_caches: List[torch.Tensor], value_caches: List[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """For every layer and every row (src, dst) of block_mapping, block dst of the layer's key and
    value caches becomes a copy of block src."""
    torch.ops.kpa.copy_blocks(key_caches, value_caches, block_mapping)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """For every row (s, d) of block_mapping (a CPU tensor), block d of dst becomes a copy of block s of src."""
    torch.ops.kpa.swap_blocks(src, dst, block_mapping)


_OPS = ("paged_attention_v1", "paged_attention_v2", "reshape_and_cache", "copy_blocks", "swap_blocks")


def patch(custom_ops) -> None:
    """Replaces the five operators of a ``vllm._custom_ops``-like module with kpa's."""
    for name in _OPS:
        setattr(custom_ops, name, globals()[name])
