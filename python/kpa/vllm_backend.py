"""kpa as an attention backend of vLLM's engine (vLLM 0.32, its v1 engine), for decoder layers:
prefill, chunked prefill, decode and batches mixing them, through ``kpa.paged_attention`` (several
query tokens per sequence) and ``torch.ops.kpa.reshape_and_cache``.

Installing the ``kpa`` package registers it through vLLM's plugin entry points
(:mod:`kpa.vllm_plugin`); select it with ``--attention-backend CUSTOM`` (``attention_backend=
"CUSTOM"`` in the ``LLM`` arguments).

The KV cache: vLLM allocates each layer's cache as pages of [num_kv_heads, block_size,
2 * head_size] elements per block, and leaves their interior to the backend. kpa keeps vLLM's
classic paged layout inside each page: all heads' keys ([num_kv_heads, head_size / x, block_size,
x]) and then all heads' values ([num_kv_heads, head_size, block_size]). Seen as kpa caches of
half-pages, the keys of vLLM block b are kpa key block 2b and its values kpa value block 2b of a
cache that starts one half-page later (both caches 2 num_blocks - 1 half-pages long); the block tables and slot mappings are translated
accordingly, and nothing is copied.

Supported: float32, float16 and bfloat16 models; "auto", "fp8" / "fp8_e4m3" and "fp8_e5m2" KV
caches; any head size kpa supports (a multiple of 16 / element size up to 512) and any block
size; GQA / MQA, sliding windows, soft-capping, ALiBi and sinks. Refused at backend selection
or layer construction, with the reason: encoder and cross attention, non-causal attention, MLA,
sparse attention, per-head quantisation scales, multimodal prefix attention, KV connectors and
context parallelism.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

import kpa

logger = init_logger("vllm.kpa")  # under vLLM's logger, which has the handlers

#: kpa's fp8 caches are byte tensors in vLLM's conventions.
_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def _half_pages(kv_cache: torch.Tensor, kv_cache_dtype: str, head_size: int):
    """kpa's key and value caches over vLLM's layer cache [num_blocks, num_kv_heads, block_size,
    2 * head_size] (views, nothing copied); see the module's docstring."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    if kv_cache_dtype != "auto":
        kv_cache = kv_cache.view(torch.uint8)
    x = 16 // kv_cache.element_size()
    half_page = num_kv_heads * head_size * block_size
    flat = kv_cache.view(-1)  # a view: vLLM's layer cache is one dense run of pages
    # 2 * num_blocks - 1 half-pages each: kpa's two caches have one block count.
    keys = flat[:-half_page].view(2 * num_blocks - 1, num_kv_heads, head_size // x, block_size, x)
    values = flat[half_page:].view(2 * num_blocks - 1, num_kv_heads, head_size, block_size)
    return keys, values


def _kpa_slots(slot_mapping: torch.Tensor, block_size: int) -> torch.Tensor:
    """vLLM's slot b * block_size + o as kpa's 2b * block_size + o (negative slots stay negative)."""
    return slot_mapping + torch.div(slot_mapping, block_size, rounding_mode="floor") * block_size


class KpaAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type["KpaAttentionImpl"]:
        return KpaAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["KpaMetadataBuilder"]:
        return KpaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        # Every cache element size kpa takes divides 16 bytes: a multiple of 16 fits them all.
        return head_size % 16 == 0 and 0 < head_size <= 512

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Each block's page contiguous, blocks one page apart: the half-page views need both.
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class KpaMetadata:
    num_actual_tokens: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_tables: torch.Tensor  # [num_reqs, max_blocks] int32, in kpa's half-page block ids
    max_seq_len: int


class KpaMetadataBuilder(AttentionMetadataBuilder[KpaMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> KpaMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor) or not m.causal:
            raise NotImplementedError("kpa's vLLM backend attends causally only")
        reqs = m.num_reqs
        return KpaMetadata(
            num_actual_tokens=m.num_actual_tokens,
            query_start_loc=m.query_start_loc[:reqs + 1].to(torch.int32),
            seq_lens=m.seq_lens[:reqs].to(torch.int32),
            block_tables=(m.block_table_tensor[:reqs] * 2).to(torch.int32),
            max_seq_len=m.max_seq_len,
        )


class KpaAttentionImpl(AttentionImpl[KpaMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"kpa's vLLM backend serves decoder attention, not {attn_type}")
        if kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise NotImplementedError(f"kpa's vLLM backend takes kv_cache_dtype {_KV_CACHE_DTYPES}, "
                                      f"not {kv_cache_dtype!r}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.alibi_slopes = torch.tensor(alibi_slopes, dtype=torch.float32) if alibi_slopes is not None else None
        self.sliding_window = sliding_window or 0
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or 0.0
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        logger.info_once("kpa %s serves attention (host kernels: %s)", kpa.__version__, kpa.host_isa())

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = _half_pages(kv_cache, self.kv_cache_dtype, self.head_size)
        n = slot_mapping.shape[0]
        torch.ops.kpa.reshape_and_cache(key[:n], value[:n], key_cache, value_cache,
                                        _kpa_slots(slot_mapping, kv_cache.shape[2]), self.kv_cache_dtype,
                                        layer._k_scale, layer._v_scale)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: KpaMetadata | None, output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("kpa's vLLM backend does not fuse output quantisation")
        if attn_metadata is None:  # profiling run
            return output
        tokens = attn_metadata.num_actual_tokens
        key_cache, value_cache = _half_pages(kv_cache, self.kv_cache_dtype, self.head_size)
        if self.sinks is not None and self.sinks.dtype != torch.float32:
            self.sinks = self.sinks.float()
        # [num_tokens, num_heads, head_size] (vLLM passes output 3-D; a 2-D one is viewed so).
        out = output[:tokens].view(tokens, self.num_heads, self.head_size)
        kpa.paged_attention(out, query[:tokens], key_cache, value_cache, self.num_kv_heads, self.scale,
                            attn_metadata.block_tables, attn_metadata.seq_lens, attn_metadata.query_start_loc,
                            attn_metadata.max_seq_len, self.alibi_slopes, self.kv_cache_dtype, layer._k_scale,
                            layer._v_scale, self.logits_soft_cap, self.sliding_window, self.sinks)
        return output
