"""kpa's PyTorch operators against float64 references: kpa.vllm_ops (vLLM's signatures) and
torch.ops.kpa (vLLM's schemas), on the tensors of reference.DEVICE (CPU, or CUDA with
KPA_TEST_DEVICE=cuda)."""

import inspect
import math
import os
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
import torch

import kpa
from kpa import vllm_ops

from reference import (DEVICE, Problem, assert_close, bitwise_equal, decode_inputs, decode_step, fp8_decode, fp8_kind,
                       host, nearest_fp8_distance, partitions_for, x_of, write_auto_cache)

ON_GPU = DEVICE.type == "cuda"

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEAD_SIZES = [32, 64, 80, 96, 112, 120, 128, 192, 256]
BLOCK_SIZES = [8, 16, 32]


def run(version, p, out=None, query=None, block_tables=None, seq_lens=None, max_seq_len=None, partitions=None, **kw):
    """Calls kpa.vllm_ops.paged_attention_v1 / v2 on a Problem; returns out (and v2's intermediates)."""
    query = p.query if query is None else query
    out = torch.full(tuple(query.shape), float("nan"), dtype=p.dtype, device=DEVICE) if out is None else out
    block_tables = p.block_tables if block_tables is None else block_tables
    seq_lens = p.seq_lens_tensor if seq_lens is None else seq_lens
    max_seq_len = max(p.seq_lens, default=0) if max_seq_len is None else max_seq_len
    args = dict(num_kv_heads=p.num_kv_heads, scale=p.scale, block_tables=block_tables, seq_lens=seq_lens,
                block_size=p.block_size, max_seq_len=max_seq_len, alibi_slopes=p.alibi_slopes,
                kv_cache_dtype=p.kv_cache_dtype, k_scale=p.k_scale, v_scale=p.v_scale)
    args.update(kw)
    if version == "v1":
        vllm_ops.paged_attention_v1(out, query, p.key_cache, p.value_cache, **args)
        return out, None
    parts = partitions_for(max_seq_len) if partitions is None else partitions
    seqs, heads = query.shape[0], query.shape[1]
    exp_sums = torch.full((seqs, heads, parts), -7.0, device=DEVICE)
    max_logits = torch.full((seqs, heads, parts), -7.0, device=DEVICE)
    tmp_out = torch.full((seqs, heads, parts, p.head_size), -7.0, dtype=p.dtype, device=DEVICE)
    vllm_ops.paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, p.key_cache, p.value_cache, **args)
    return out, (exp_sums, max_logits, tmp_out)


# --- attention ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_head_block_dtype_grid(head_size, block_size, dtype, version):
    p = Problem([1, 0, block_size + 1, 77], num_heads=4, num_kv_heads=2, head_size=head_size, block_size=block_size,
                dtype=dtype, seed=head_size * 100 + block_size)
    out, _ = run(version, p)
    expected, _ = p.reference()
    assert_close(out.float(), expected, dtype, f"{version} d{head_size} b{block_size} {dtype}")


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_gqa_groups_and_long_sequences(group, version):
    p = Problem([1300, 513, 2], num_heads=2 * group, num_kv_heads=2, head_size=128, block_size=16, seed=group)
    out, _ = run(version, p)
    assert_close(out.float(), p.reference()[0], p.dtype, f"{version} group {group}")


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_caches(dtype, kv_cache_dtype, version):
    # k_scale as a float, v_scale as a 0-d tensor: vLLM has passed both over its versions.
    p = Problem([5, 600, 33], num_heads=8, num_kv_heads=2, head_size=128, block_size=16, dtype=dtype,
                kv_cache_dtype=kv_cache_dtype, k_scale=0.05, v_scale=torch.tensor(0.03), seed=3)
    out, _ = run(version, p)
    assert_close(out.float(), p.reference()[0], dtype, f"{version} {kv_cache_dtype}")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_alibi(version):
    p = Problem([1, 40, 700], num_heads=8, num_kv_heads=8, head_size=64, block_size=16, alibi=True, seed=5)
    out, _ = run(version, p)
    assert_close(out.float(), p.reference()[0], p.dtype, f"{version} alibi")


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("step,tp_rank", [(1, 0), (2, 1), (-1, 0), (-2, 1)])
def test_block_sparse(step, tp_rank, version):
    sparse = dict(local_blocks=2, vert_stride=3, block_size=32, head_sliding_step=step)
    p = Problem([1, 100, 1000], num_heads=8, num_kv_heads=2, head_size=64, block_size=16, seed=11)
    out, _ = run(version, p, tp_rank=tp_rank, blocksparse_local_blocks=2, blocksparse_vert_stride=3,
                 blocksparse_block_size=32, blocksparse_head_sliding_step=step)
    assert_close(out.float(), p.reference(sparse, tp_rank)[0], p.dtype, f"{version} sparse step {step} rank {tp_rank}")
    dense, _ = run(version, p)
    assert not torch.equal(out, dense), "the sparse pattern changes the result"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_query_as_strided_view_of_fused_qkv(version):
    p = Problem([3, 50, 200], num_heads=8, num_kv_heads=2, head_size=64, block_size=16, seed=13)
    seqs, heads, kv_heads, d = 3, 8, 2, 64
    qkv = torch.randn(seqs, (heads + 2 * kv_heads) * d).to(p.dtype).to(DEVICE)
    qkv[:, :heads * d] = p.query.reshape(seqs, heads * d)
    query = qkv[:, :heads * d].view(seqs, heads, d)
    assert not query.is_contiguous()
    out, _ = run(version, p, query=query)
    contiguous, _ = run(version, p)
    assert torch.equal(out, contiguous)
    assert_close(out.float(), p.reference()[0], p.dtype, f"{version} strided query")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_int64_tables_and_lengths(version):
    p = Problem([7, 0, 300], seed=17)
    expected, _ = run(version, p)
    out, _ = run(version, p, block_tables=p.block_tables.long(), seq_lens=p.seq_lens_tensor.long())
    assert torch.equal(out, expected)
    wide = p.block_tables.long()
    wide[2, 0] = 2 ** 33
    with pytest.raises(ValueError, match="block_tables holds 8589934592, outside int32"):
        run(version, p, block_tables=wide)


def test_v2_intermediates_per_partition():
    p = Problem([1100, 5, 512, 513], num_heads=4, num_kv_heads=1, head_size=64, block_size=16, dtype=torch.float32,
                seed=19)
    parts = partitions_for(1100) + 1  # one more than needed: it is left untouched
    out, (exp_sums, max_logits, tmp_out) = run("v2", p, partitions=parts)
    expected, partitions = p.reference()
    assert_close(out, expected, torch.float32, "v2 out")
    for s, n in enumerate(p.seq_lens):
        for h in range(p.num_heads):
            used = partitions_for(n)
            for k in range(parts):
                if k < used:
                    m, e, partial = partitions[s][h][k]
                    assert abs(max_logits[s, h, k].item() - m) <= 1e-5 + 8 * 1.2e-7 * abs(m), (s, h, k)
                    assert abs(exp_sums[s, h, k].item() - e) <= 1e-5 * max(1.0, e), (s, h, k)
                    assert_close(tmp_out[s, h, k], partial, torch.float32, f"tmp_out[{s}, {h}, {k}]")
                else:
                    assert max_logits[s, h, k].item() == -7.0 and exp_sums[s, h, k].item() == -7.0, (s, h, k)
                    assert torch.all(tmp_out[s, h, k] == -7.0), (s, h, k)


def test_empty_batch_and_empty_sequences():
    p = Problem([0, 0], seed=23)
    out, _ = run("v1", p)
    assert torch.all(out == 0)
    empty = Problem([], seed=23)
    out, _ = run("v2", empty)
    assert out.shape == (0, 4, 64)


# --- cache operators -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache_auto_layout_and_padding(dtype):
    tokens, kv_heads, d, block, blocks = 21, 2, 64, 8, 6
    x = x_of(dtype)
    # key and value as views of a fused qkv tensor, as vLLM passes them.
    qkv = torch.randn(tokens, (4 + 2 * kv_heads) * d).to(dtype).to(DEVICE)
    key = qkv[:, 4 * d:(4 + kv_heads) * d].view(tokens, kv_heads, d)
    value = qkv[:, (4 + kv_heads) * d:].view(tokens, kv_heads, d)
    slots = torch.randperm(blocks * block)[:tokens]
    slots[3] = -1  # padding: skipped
    key_cache = torch.full((blocks, kv_heads, d // x, block, x), float("nan"), dtype=dtype, device=DEVICE)
    value_cache = torch.full((blocks, kv_heads, d, block), float("nan"), dtype=dtype, device=DEVICE)
    vllm_ops.reshape_and_cache(key, value, key_cache, value_cache, slots.int().to(DEVICE), "auto", 1.0, 1.0)
    expected_k = torch.full_like(host(key_cache), float("nan"))
    expected_v = torch.full_like(host(value_cache), float("nan"))
    write_auto_cache(expected_k, expected_v, host(key).contiguous(), host(value).contiguous(), slots)
    key_cache, value_cache = host(key_cache), host(value_cache)
    assert torch.equal(key_cache.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       expected_k.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert torch.equal(value_cache.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       expected_v.view(torch.int16 if dtype != torch.float32 else torch.int32))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_reshape_and_cache_fp8_rounds_to_nearest(kv_cache_dtype):
    tokens, kv_heads, d, block, blocks = 9, 2, 32, 16, 2
    key = (torch.randn(tokens, kv_heads, d) * 300).to(torch.bfloat16)  # beyond E4M3's 448: saturates
    value = (torch.randn(tokens, kv_heads, d) / 50).to(torch.bfloat16)  # subnormals
    key_cache = torch.zeros((blocks, kv_heads, d // 16, block, 16), dtype=torch.uint8, device=DEVICE)
    value_cache = torch.zeros((blocks, kv_heads, d, block), dtype=torch.uint8, device=DEVICE)
    slots = torch.arange(tokens) * 3
    # k_scale a CPU tensor (also with CUDA data), v_scale a float.
    vllm_ops.reshape_and_cache(key.to(DEVICE), value.to(DEVICE), key_cache, value_cache, slots.to(DEVICE),
                               kv_cache_dtype, torch.tensor(2.0), 0.5)
    kind = fp8_kind(kv_cache_dtype)
    b, o = (slots // block).numpy(), (slots % block).numpy()
    k_codes = host(key_cache).numpy()[b, :, :, o, :].reshape(tokens, kv_heads, d)
    v_codes = host(value_cache).numpy()[b, :, :, o]
    for codes, source, scale in ((k_codes, key, 2.0), (v_codes, value, 0.5)):
        target = source.double().numpy() / scale
        distance = np.abs(fp8_decode(codes, kind) - target)
        assert np.array_equal(distance, nearest_fp8_distance(target, kind))


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8, torch.float32])
def test_copy_blocks_every_layer(dtype):
    layers, blocks = 3, 10
    if dtype == torch.uint8:
        key_caches = [torch.randint(0, 256, (blocks, 2, 4, 16, 16), dtype=dtype) for _ in range(layers)]
        value_caches = [torch.randint(0, 256, (blocks, 2, 64, 16), dtype=dtype) for _ in range(layers)]
    else:
        key_caches = [torch.randn(blocks, 2, 64 // x_of(dtype), 16, x_of(dtype)).to(dtype) for _ in range(layers)]
        value_caches = [torch.randn(blocks, 2, 64, 16).to(dtype) for _ in range(layers)]
    before = [(k.clone(), v.clone()) for k, v in zip(key_caches, value_caches)]
    key_caches = [k.to(DEVICE) for k in key_caches]
    value_caches = [v.to(DEVICE) for v in value_caches]
    mapping = torch.tensor([[1, 4], [7, 0], [1, 9]], dtype=torch.int64, device=DEVICE)
    vllm_ops.copy_blocks(key_caches, value_caches, mapping)
    for (k0, v0), k, v in zip(before, key_caches, value_caches):
        k, v = host(k), host(v)
        for b in range(blocks):
            source = {4: 1, 0: 7, 9: 1}.get(b, b)
            assert torch.equal(k[b], k0[source]) and torch.equal(v[b], v0[source]), b
    with pytest.raises(ValueError, match=r"block_mapping\[1\]\[0\] = 10 is outside"):
        vllm_ops.copy_blocks(key_caches, value_caches, torch.tensor([[0, 1], [10, 2]], device=DEVICE))


@pytest.mark.parametrize("src_device,dst_device", [(DEVICE, DEVICE), (DEVICE, "cpu"), ("cpu", DEVICE)],
                         ids=["same", "to_cpu", "from_cpu"])
def test_swap_blocks_between_caches(src_device, dst_device):
    """Within one memory, and between CPU and the test device (vLLM's offload; the same memory
    on a CPU run)."""
    src = torch.randn(6, 2, 64, 16).half().to(src_device)
    dst = torch.zeros(3, 2, 64, 16).half().to(dst_device)
    vllm_ops.swap_blocks(src, dst, torch.tensor([[5, 0], [2, 2]]))
    src, dst = host(src), host(dst)
    assert torch.equal(dst[0], src[5]) and torch.equal(dst[2], src[2]) and torch.all(dst[1] == 0)
    with pytest.raises(ValueError, match=r"block_mapping\[0\]\[1\] = 3 is outside"):
        vllm_ops.swap_blocks(src, dst, torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="differ beyond the block dimension"):
        vllm_ops.swap_blocks(src, torch.zeros(3, 2, 32, 16).half(), torch.tensor([[0, 0]]))


# --- one decode step as vLLM's paged-attention backend makes it -------------------------------------

def vllm_uses_v1(max_seq_len, num_seqs, num_heads):
    """vLLM's choice between the two kernels (PagedAttention.forward_decode)."""
    max_num_partitions = partitions_for(max_seq_len)
    return max_seq_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)


@pytest.mark.parametrize("prompt_lens,kv_cache_dtype", [([5, 31, 200], "auto"), ([700, 1500], "auto"),
                                                         ([64, 900], "fp8")])
def test_decode_step_as_vllm_backend_drives_it(prompt_lens, kv_cache_dtype):
    """Prefill writes the prompts' keys and values; the decode step writes each sequence's new
    token into its slot, then attends over everything cached, with v1 or v2 as vLLM picks."""
    heads, kv_heads, d, block, dtype = 8, 2, 64, 16, torch.float16
    seqs = len(prompt_lens)
    rng = torch.Generator().manual_seed(29)
    total = [n + 1 for n in prompt_lens]
    blocks_per_seq = max(-(-n // block) for n in total)
    num_blocks = seqs * blocks_per_seq + 2
    block_tables = torch.randperm(num_blocks, generator=rng)[:seqs * blocks_per_seq].view(seqs, blocks_per_seq)
    x = x_of(torch.uint8 if kv_cache_dtype != "auto" else dtype)
    cache_dtype = torch.uint8 if kv_cache_dtype != "auto" else dtype
    key_cache = torch.zeros(num_blocks, kv_heads, d // x, block, x, dtype=cache_dtype, device=DEVICE)
    value_cache = torch.zeros(num_blocks, kv_heads, d, block, dtype=cache_dtype, device=DEVICE)
    keys = [(torch.rand(n, kv_heads, d, generator=rng) * 2 - 1).to(dtype) for n in total]
    values = [(torch.rand(n, kv_heads, d, generator=rng) * 2 - 1).to(dtype) for n in total]
    k_scale, v_scale = (0.01, 0.01) if kv_cache_dtype != "auto" else (1.0, 1.0)

    def slots(s, positions):
        return block_tables[s, positions // block].long() * block + positions % block

    # Prefill: every prompt token, one call for the batch.
    prompt_slots = torch.cat([slots(s, torch.arange(n)) for s, n in enumerate(prompt_lens)])
    vllm_ops.reshape_and_cache(torch.cat([k[:-1] for k in keys]).to(DEVICE), torch.cat([v[:-1] for v in values]).to(DEVICE),
                               key_cache, value_cache, prompt_slots.to(DEVICE), kv_cache_dtype, k_scale, v_scale)
    # Decode: the new tokens, then attention for their queries.
    new_slots = torch.stack([slots(s, torch.tensor(n)) for s, n in enumerate(prompt_lens)])
    vllm_ops.reshape_and_cache(torch.stack([k[-1] for k in keys]).to(DEVICE), torch.stack([v[-1] for v in values]).to(DEVICE),
                               key_cache, value_cache, new_slots.to(DEVICE), kv_cache_dtype, k_scale, v_scale)
    query = (torch.rand(seqs, heads, d, generator=rng) * 2 - 1).to(dtype).to(DEVICE)
    seq_lens = torch.tensor(total, dtype=torch.int32, device=DEVICE)
    tables = block_tables.to(DEVICE)
    max_seq_len = max(total)
    out = torch.empty_like(query)
    scale = 1 / math.sqrt(d)
    if vllm_uses_v1(max_seq_len, seqs, heads):
        vllm_ops.paged_attention_v1(out, query, key_cache, value_cache, kv_heads, scale, tables, seq_lens, block,
                                    max_seq_len, None, kv_cache_dtype, k_scale, v_scale)
    else:
        parts = partitions_for(max_seq_len)
        exp_sums = torch.empty(seqs, heads, parts, device=DEVICE)
        max_logits = torch.empty(seqs, heads, parts, device=DEVICE)
        tmp_out = torch.empty(seqs, heads, parts, d, dtype=dtype, device=DEVICE)
        vllm_ops.paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, kv_heads, scale,
                                    tables, seq_lens, block, max_seq_len, None, kv_cache_dtype, k_scale, v_scale)
    expected = np.zeros((seqs, heads, d))
    for s in range(seqs):
        k, v = keys[s].double().numpy(), values[s].double().numpy()
        for h in range(heads):
            logits = scale * k[:, h // (heads // kv_heads)] @ host(query)[s, h].double().numpy()
            e = np.exp(logits - logits.max())
            expected[s, h] = e @ v[:, h // (heads // kv_heads)] / e.sum()
    if kv_cache_dtype == "auto":
        assert_close(out.float(), expected, dtype, "decode step")
    else:  # against the unquantised values: fp8's own error (vLLM's fp8 tests allow 1e-2 and more)
        assert np.abs(host(out).double().numpy() - expected).max() < 2e-2


# --- torch integration ---------------------------------------------------------------------------

def test_operators_registered_with_vllm_schemas():
    schema = str(torch.ops.kpa.paged_attention_v2.default._schema)
    assert schema.startswith("kpa::paged_attention_v2(Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, "
                             "Tensor(d!) tmp_out, Tensor query")
    assert "Tensor(a!)[] key_caches" in str(torch.ops.kpa.copy_blocks.default._schema)
    for name in ("paged_attention_v1", "reshape_and_cache", "swap_blocks"):
        assert str(getattr(torch.ops.kpa, name).default._schema).endswith("-> ()")
    assert kpa.__version__ == "0.1.0"
    assert kpa.built_for_cuda in (True, False)
    assert kpa.host_isa() in ("amx", "avx512vbmi", "avx512", "avx2", "portable")


def test_python_signatures_are_vllms():
    attention = ["query", "key_cache", "value_cache", "num_kv_heads", "scale", "block_tables", "seq_lens",
                 "block_size", "max_seq_len", "alibi_slopes", "kv_cache_dtype", "k_scale", "v_scale", "tp_rank",
                 "blocksparse_local_blocks", "blocksparse_vert_stride", "blocksparse_block_size",
                 "blocksparse_head_sliding_step"]
    expected = {
        "paged_attention_v1": ["out"] + attention,
        "paged_attention_v2": ["out", "exp_sum", "max_logits", "tmp_out"] + attention,
        "reshape_and_cache": ["key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale",
                              "v_scale"],
        "copy_blocks": ["key_caches", "value_caches", "block_mapping"],
        "swap_blocks": ["src", "dst", "block_mapping"],
    }
    for name, params in expected.items():
        assert list(inspect.signature(getattr(vllm_ops, name)).parameters) == params, name
    defaults = {k: v.default for k, v in inspect.signature(vllm_ops.paged_attention_v2).parameters.items()
                if v.default is not inspect.Parameter.empty}
    assert defaults == {"tp_rank": 0, "blocksparse_local_blocks": 0, "blocksparse_vert_stride": 0,
                        "blocksparse_block_size": 64, "blocksparse_head_sliding_step": 0}


def test_patch_replaces_vllms_ops():
    custom_ops = types.SimpleNamespace(paged_attention_v2=None, unrelated=1)
    vllm_ops.patch(custom_ops)
    assert custom_ops.paged_attention_v2 is vllm_ops.paged_attention_v2
    assert custom_ops.swap_blocks is vllm_ops.swap_blocks and custom_ops.unrelated == 1


# TorchScript is deprecated in torch 2.x, and still how some deployments call the operators.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torch_jit_script_calls_the_operator():
    p = Problem([3, 90], seed=31)

    @torch.jit.script
    def decode(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_seq_len: int):
        one = torch.ones((), dtype=torch.float32)
        torch.ops.kpa.paged_attention_v1(out, query, key_cache, value_cache, 2, scale, block_tables, seq_lens, 16,
                                         max_seq_len, None, "auto", one, one, 0, 0, 0, 64, 0)
        return out

    out = decode(torch.empty_like(p.query), p.query, p.key_cache, p.value_cache, p.block_tables, p.seq_lens_tensor,
                 p.scale, 90)
    eager, _ = run("v1", p)
    assert torch.equal(out, eager)


def test_meta_tensors_check_shapes_without_data():
    p = Problem([3, 90], seed=37)
    meta = {name: getattr(p, name).to("meta") for name in ("query", "key_cache", "value_cache", "block_tables",
                                                             "seq_lens_tensor")}
    one = torch.ones((), device="meta")
    out = torch.empty_like(meta["query"])
    torch.ops.kpa.paged_attention_v1(out, meta["query"], meta["key_cache"], meta["value_cache"], 2, p.scale,
                                     meta["block_tables"], meta["seq_lens_tensor"], 16, 90, None, "auto", one, one,
                                     0, 0, 0, 64, 0)
    with pytest.raises(ValueError, match="out has shape"):
        torch.ops.kpa.paged_attention_v1(out[:1], meta["query"], meta["key_cache"], meta["value_cache"], 2, p.scale,
                                         meta["block_tables"], meta["seq_lens_tensor"], 16, 90, None, "auto", one,
                                         one, 0, 0, 0, 64, 0)


def test_calls_from_several_threads():
    """Six Python threads at once, none of them the one that initialised kpa; every result bitwise
    equal to the same call made alone (the kernels are deterministic)."""
    p = Problem([40, 333, 2], num_heads=8, num_kv_heads=2, seed=41)
    expected = {version: run(version, p)[0] for version in ("v1", "v2")}
    assert_close(expected["v2"].float(), p.reference()[0], p.dtype, "v2")
    failures = []

    def caller(version):
        for _ in range(10):
            if not torch.equal(run(version, p)[0], expected[version]):
                failures.append(version)

    threads = [threading.Thread(target=caller, args=("v1" if i % 2 else "v2",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.skipif(not torch.cuda.is_available() or kpa.built_for_cuda, reason="needs a CUDA device and a CPU build")
def test_gpu_tensors_on_a_cpu_build_are_refused():
    p = Problem([3], seed=43)
    with pytest.raises(NotImplementedError, match="built for CPU tensors only"):
        run("v1", p, out=torch.empty(p.query.shape, dtype=p.dtype, device="cuda"), query=p.query.cuda())


CPU_TENSORS_IN_A_FRESH_PROCESS = """
import os, torch, kpa
keys = torch.arange(2 * 4 * 8, dtype=torch.float32).reshape(2, 4, 8)
values = -keys
torch.ops.kpa.copy_blocks([keys], [values], torch.tensor([[0, 1]]))
assert torch.equal(keys[1], keys[0]) and torch.equal(values[1], values[0])
package = os.path.dirname(kpa.__file__)
mapped = {line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("libkpa.so")}
print(sorted(os.path.relpath(path, package) for path in mapped))
"""


@pytest.mark.skipif(ON_GPU, reason="CPU tensors in a process that touches no GPU")
def test_cpu_tensors_start_only_the_host_library():
    """CPU tensors run on the package's host libkpa and never load its CUDA one: a CUDA build's
    CPU tensors keep running on a machine without a GPU or its driver."""
    result = subprocess.run([sys.executable, "-c", CPU_TENSORS_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr
    expected = ["host/libkpa.so"] if kpa.built_for_cuda else ["libkpa.so"]
    assert result.stdout.split("\n")[-2] == str(expected)


def test_init_cuda_says_why_the_cuda_back_end_cannot_start():
    """kpa.init_cuda starts the CUDA back end where there is a GPU; elsewhere it says why not, and
    CPU tensors run on as before."""
    if not kpa.built_for_cuda:
        with pytest.raises(NotImplementedError, match="built for CPU tensors only"):
            kpa.init_cuda()
    elif torch.cuda.is_available():
        kpa.init_cuda()
    else:
        with pytest.raises(RuntimeError, match="kpa's CUDA back end could not start: .*driver.*CPU tensors still run"):
            kpa.init_cuda()
    if not ON_GPU:
        p = Problem([5, 40], seed=101)
        out, _ = run("v1", p)
        assert_close(out.float(), p.reference()[0], p.dtype, "v1 after init_cuda")


def test_index_checks_can_be_turned_off():
    """With the index check off the operators trust their indices: an int64 table holding a value
    beyond int32 in a column no sequence reads is converted without the range check that
    refuses it otherwise, and the result is the checked one."""
    p = Problem([7, 300], seed=71)
    checked, _ = run("v1", p)
    wide = p.block_tables.long()
    wide[0, -1] = 2 ** 33  # sequence 0 has 7 tokens: one block, the last column unread
    with pytest.raises(ValueError, match="outside int32"):
        run("v1", p, block_tables=wide)
    assert kpa.set_check_indices(False) is True
    try:
        unchecked, _ = run("v1", p, block_tables=wide)
        slots = torch.tensor([0, 1], device=DEVICE)
        key = torch.ones(2, p.num_kv_heads, p.head_size, dtype=p.dtype, device=DEVICE)
        vllm_ops.reshape_and_cache(key, key, p.key_cache.clone(), p.value_cache.clone(), slots, "auto", 1.0, 1.0)
    finally:
        assert kpa.set_check_indices(True) is False
    assert torch.equal(unchecked, checked)


# --- CUDA tensors (KPA_TEST_DEVICE=cuda with a CUDA build of kpa) ----------------------------------

gpu_only = pytest.mark.skipif(not ON_GPU, reason="CUDA tensors: KPA_TEST_DEVICE=cuda with a CUDA build of kpa")


@gpu_only
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_and_gpu_agree(dtype, version):
    """The same call on CPU tensors (kpa's host back end) and CUDA tensors (its CUDA back end), in
    one process and one build."""
    p = Problem([1, 100, 1300], num_heads=8, num_kv_heads=2, head_size=128, block_size=16, dtype=dtype, seed=73)
    gpu, _ = run(version, p)
    cpu_out = torch.full(tuple(p.query.shape), float("nan"), dtype=dtype)
    args = [host(t) for t in (p.query, p.key_cache, p.value_cache)]
    if version == "v1":
        vllm_ops.paged_attention_v1(cpu_out, *args, p.num_kv_heads, p.scale, host(p.block_tables),
                                    host(p.seq_lens_tensor), p.block_size, 1300, None, "auto", 1.0, 1.0)
    else:
        parts = partitions_for(1300)
        exp_sums, max_logits = torch.empty(3, 8, parts), torch.empty(3, 8, parts)
        tmp_out = torch.empty(3, 8, parts, 128, dtype=dtype)
        vllm_ops.paged_attention_v2(cpu_out, exp_sums, max_logits, tmp_out, *args, p.num_kv_heads, p.scale,
                                    host(p.block_tables), host(p.seq_lens_tensor), p.block_size, 1300, None, "auto",
                                    1.0, 1.0)
    expected = p.reference()[0]
    assert_close(gpu.float(), expected, dtype, f"{version} on CUDA")
    assert_close(cpu_out.float(), expected, dtype, f"{version} on the CPU")


@gpu_only
def test_runs_on_torchs_current_stream():
    """The query is written on a side stream behind a long GPU sleep; attention called on that
    stream reads the new query only if it runs on it."""
    p = Problem([40, 700], num_heads=8, num_kv_heads=2, seed=79)
    expected, _ = run("v1", p)
    query = torch.zeros_like(p.query)
    out = torch.full_like(p.query, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        query.copy_(p.query)
        run("v1", p, out=out, query=query)
    side.synchronize()
    assert torch.equal(out, expected)


@gpu_only
def test_cuda_graph_capture_and_replay_of_a_decode_step():
    """A decode step (reshape_and_cache, paged_attention_v2, a matmul) captured in a CUDA graph
    with the index check off, replayed on new inputs copied into its static tensors, equal to the
    same step run eagerly on a copy of the caches."""
    p = Problem([33, 600, 1500], num_heads=8, num_kv_heads=2, head_size=128, block_size=16, seed=83)
    generator = torch.Generator().manual_seed(89)
    weights = (torch.rand(8 * 128, 8 * 128, generator=generator) / 64).to(p.dtype).to(DEVICE)
    static = decode_inputs(p, generator)
    cache = (p.key_cache, p.value_cache, "auto")
    step = dict(weights=weights, seq_lens=p.seq_lens_tensor, tables=p.block_tables, max_seq_len=1500)
    previous = kpa.set_check_indices(False)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on the capture stream: kpa's state for it
            for _ in range(2):
                decode_step(cache, *static, **step)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            static_out = decode_step(cache, *static, **step)
        for trial in range(3):
            fresh = decode_inputs(p, generator)
            eager_cache = (p.key_cache.clone(), p.value_cache.clone(), "auto")
            eager = decode_step(eager_cache, *fresh, **step)
            for dst, src in zip(static, fresh):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            difference = (static_out.float() - eager.float()).abs().max().item()
            print(f"graph replay {trial} vs eager: max |difference| = {difference}")
            assert difference == 0.0
            assert bitwise_equal(p.key_cache, eager_cache[0]) and bitwise_equal(p.value_cache, eager_cache[1])
    finally:
        kpa.set_check_indices(previous)


@gpu_only
def test_capture_with_index_checks_on_is_refused():
    p = Problem([33], seed=97)
    run("v1", p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run("v1", p)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="kpa.set_check_indices"):
        with torch.cuda.graph(graph, stream=side):
            run("v1", p)


# --- errors: kpa's message in ValueError / NotImplementedError, never a crash ------------------------------

D = dict(device=DEVICE)
ERRORS = [
    ("out of another shape", dict(out=torch.empty(2, 4, 64, dtype=torch.float16, **D)), ValueError, "out has shape"),
    ("out of another dtype", dict(out=torch.empty(3, 4, 64, **D)), ValueError, "out is Float"),
    ("non-contiguous out", dict(out=torch.empty(3, 64, 4, dtype=torch.float16, **D).transpose(1, 2)), ValueError,
     "out must be contiguous"),
    ("float64 query", dict(query=torch.zeros(3, 4, 64, dtype=torch.float64, **D),
                           out=torch.zeros(3, 4, 64, dtype=torch.float64, **D)), NotImplementedError, "kpa takes float32"),
    ("query of rank 2", dict(query=torch.zeros(3, 256, dtype=torch.float16, **D)), ValueError, "query must be"),
    ("block size differs from the cache's", dict(block_size=8), ValueError, "key_cache has shape"),
    ("num_kv_heads differs from the cache's", dict(num_kv_heads=4), ValueError, "key_cache has shape"),
    ("unknown kv_cache_dtype", dict(kv_cache_dtype="fp8_inc"), NotImplementedError, "fp8_inc"),
    ("fp8 with a float16 cache", dict(kv_cache_dtype="fp8"), ValueError, "an fp8 cache is a uint8 tensor"),
    ("int16 block tables", dict(block_tables=torch.zeros(3, 2, dtype=torch.int16, **D)), ValueError, "int32 or int64"),
    ("block tables of another batch", dict(block_tables=torch.zeros(2, 2, dtype=torch.int32, **D)), ValueError,
     "block_tables must be"),
    ("seq_lens of another batch", dict(seq_lens=torch.zeros(4, dtype=torch.int32, **D)), ValueError,
     "seq_lens has shape"),
    ("block id past the cache", dict(block_tables=torch.full((3, 2), 99, dtype=torch.int32, **D)), ValueError,
     r"block_tables\[.\]\[0\] = 99"),
    ("length above max_seq_len", dict(max_seq_len=10), ValueError, "exceeds max_seq_len"),
    ("negative length", dict(seq_lens=torch.tensor([1, -1, 2], dtype=torch.int32, **D)), ValueError, "seq_lens"),
    ("alibi of another extent", dict(alibi_slopes=torch.zeros(3, **D)), ValueError, "alibi_slopes has shape"),
    ("k_scale of two values", dict(k_scale=torch.ones(2)), ValueError, "k_scale must hold one"),
    ("meta query with the data elsewhere", dict(query=torch.zeros(3, 4, 64, dtype=torch.float16, device="meta")),
     ValueError, "query is on meta, out on (cpu|cuda)"),
]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("what,changes,error,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_argument_errors(what, changes, error, message, version):
    p = Problem([3, 17, 20], num_heads=4, num_kv_heads=2, head_size=64, block_size=16, seed=47)
    with pytest.raises(error, match=message):
        run(version, p, **changes)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_num_heads_not_a_multiple_of_num_kv_heads(version):
    p = Problem([3, 17], num_heads=4, num_kv_heads=3, head_size=64, seed=61)
    with pytest.raises(ValueError, match="num_kv_heads"):
        run(version, p)


def test_v2_with_too_few_partitions():
    p = Problem([600], seed=53)
    with pytest.raises(ValueError, match="max_num_partitions"):
        run("v2", p, partitions=1)


def test_unsupported_head_size():
    p = Problem([3], head_size=32, seed=59)
    cache = torch.zeros(p.num_blocks, 2, 1040 // 8, 16, 8, dtype=torch.float16, device=DEVICE)
    values = torch.zeros(p.num_blocks, 2, 1040, 16, dtype=torch.float16, device=DEVICE)
    query = torch.zeros(1, 4, 1040, dtype=torch.float16, device=DEVICE)
    with pytest.raises(NotImplementedError, match="head_size 1040 is not supported"):
        vllm_ops.paged_attention_v1(torch.empty_like(query), query, cache, values, 2, 1.0, p.block_tables,
                                    p.seq_lens_tensor, 16, 3, None, "auto", 1.0, 1.0)


def test_cache_op_errors():
    key = torch.zeros(4, 2, 64, dtype=torch.float16, **D)
    key_cache = torch.zeros(3, 2, 8, 16, 8, dtype=torch.float16, **D)
    value_cache = torch.zeros(3, 2, 64, 16, dtype=torch.float16, **D)
    with pytest.raises(ValueError, match=r"slot_mapping\[2\] = 48"):
        vllm_ops.reshape_and_cache(key, key, key_cache, value_cache, torch.tensor([0, 1, 48, 2], **D), "auto", 1.0, 1.0)
    with pytest.raises(ValueError, match="slot_mapping has shape"):
        vllm_ops.reshape_and_cache(key, key, key_cache, value_cache, torch.tensor([0, 1], **D), "auto", 1.0, 1.0)
    with pytest.raises(ValueError, match="value_cache has shape"):
        vllm_ops.reshape_and_cache(key, key, key_cache, value_cache[:, :, :32], torch.arange(4, **D), "auto", 1.0, 1.0)
    with pytest.raises(ValueError, match="2 key caches and 1 value caches"):
        vllm_ops.copy_blocks([key_cache, key_cache], [value_cache], torch.zeros(0, 2, dtype=torch.int64, **D))
    with pytest.raises(ValueError, match=r"block_mapping must be \[num_pairs, 2\]"):
        vllm_ops.copy_blocks([key_cache], [value_cache], torch.zeros(2, 3, dtype=torch.int64, **D))
    with pytest.raises(NotImplementedError, match="Double"):
        vllm_ops.copy_blocks([key_cache.double()], [value_cache.double()], torch.zeros(1, 2, dtype=torch.int64, **D))


# --- kpa.paged_attention: several query tokens per sequence and the variants -----------------------

def variant_reference(p, query, query_lens, soft_cap=0.0, window=0, sinks=None):
    """float64: query row i of sequence s (its last query_lens[s] tokens) at position p attends the
    keys j <= p (and p - window < j with a window): logits scaled, soft-capped, then softmax with
    the sink logit in the denominator."""
    q = host(query).double().numpy()
    out = np.zeros(q.shape)
    group = p.num_heads // p.num_kv_heads
    row = 0
    for s, (n, m) in enumerate(zip(p.seq_lens, query_lens)):
        k, v = p.cached(s)
        for i in range(m):
            position = n - m + i
            keys = np.arange(n)
            visible = (keys <= position) & ((keys > position - window) if window > 0 else True)
            for h in range(p.num_heads):
                logits = p.scale * (k[:, h // group, :] @ q[row, h])
                if soft_cap > 0:
                    logits = soft_cap * np.tanh(logits / soft_cap)
                logits = np.where(visible, logits, -np.inf)
                top = max(logits.max(), float(sinks[h]) if sinks is not None else -np.inf)
                e = np.exp(logits - top)
                denominator = e.sum() + (np.exp(float(sinks[h]) - top) if sinks is not None else 0.0)
                out[row, h] = e @ v[:, h // group, :] / denominator
            row += 1
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["causal", "window_softcap_sinks"])
def test_paged_attention_several_query_tokens(variant, dtype):
    """A batch mixing a prefill chunk, a decode step and a whole prompt, as vLLM's attention
    backends pass it (query_start_loc), against the float64 reference."""
    p = Problem([40, 700, 17, 1100], num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=dtype, seed=107)
    query_lens = [5, 1, 17, 300]
    generator = torch.Generator().manual_seed(109)
    query = (torch.rand(sum(query_lens), 8, 64, generator=generator) * 2 - 1).to(dtype).to(DEVICE)
    starts = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32, device=DEVICE)
    extra = {}
    if variant != "causal":
        extra = dict(logits_soft_cap=2.0, sliding_window=64,
                     sinks=(torch.rand(8, generator=generator) * 2).to(DEVICE))
    out = torch.full_like(query, float("nan"))
    kpa.paged_attention(out, query, p.key_cache, p.value_cache, p.num_kv_heads, p.scale, p.block_tables,
                        p.seq_lens_tensor, starts, **extra)
    expected = variant_reference(p, query, query_lens, extra.get("logits_soft_cap", 0.0), extra.get("sliding_window", 0),
                                 host(extra["sinks"]) if "sinks" in extra else None)
    assert_close(out.float(), expected, dtype, f"{variant} {dtype}")


def test_paged_attention_one_token_per_sequence_is_v1():
    p = Problem([3, 600, 90], num_heads=8, num_kv_heads=2, seed=113)
    expected, _ = run("v1", p)
    out = torch.full_like(p.query, float("nan"))
    kpa.paged_attention(out, p.query, p.key_cache, p.value_cache, p.num_kv_heads, p.scale, p.block_tables,
                        p.seq_lens_tensor)
    assert_close(out.float(), p.reference()[0], p.dtype, "automatic")
    assert_close(out.float(), host(expected).double().numpy(), p.dtype, "automatic against v1")


def test_paged_attention_argument_errors():
    p = Problem([3, 20], num_heads=4, num_kv_heads=2, seed=127)
    query = torch.zeros(6, 4, 64, dtype=p.dtype, device=DEVICE)
    out = torch.empty_like(query)
    starts = torch.tensor([0, 3, 6], dtype=torch.int32, device=DEVICE)
    args = (p.num_kv_heads, p.scale, p.block_tables, p.seq_lens_tensor)
    with pytest.raises(ValueError, match=r"sequence 0 has 4 query tokens, more than seq_lens\[0\] = 3"):
        kpa.paged_attention(out, query, p.key_cache, p.value_cache, *args, torch.tensor([0, 4, 6], dtype=torch.int32,
                                                                                           device=DEVICE))
    with pytest.raises(ValueError, match="sinks has shape"):
        kpa.paged_attention(out, query, p.key_cache, p.value_cache, *args, starts, sinks=torch.zeros(3, **D))
    with pytest.raises(ValueError, match="logits_soft_cap"):
        kpa.paged_attention(out, query, p.key_cache, p.value_cache, *args, starts, logits_soft_cap=-1.0)
    with pytest.raises(ValueError, match=r"block_tables must be \[num_seqs = 3"):
        kpa.paged_attention(out, query, p.key_cache, p.value_cache, *args,
                            torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=DEVICE))
