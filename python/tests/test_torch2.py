"""kpa's operators under torch 2's machinery: torch.library.opcheck for every operator (schema,
fake tensors, autograd registration, AOT dispatch with dynamic shapes), fake tensors checked by
the operators' meta kernels, and a torch.compile(fullgraph=True) decode step against eager.
Skipped on torch 1.x, which has none of it."""

import warnings

import pytest
import torch

from reference import DEVICE, Problem, bitwise_equal, decode_inputs, decode_step, partitions_for

pytestmark = pytest.mark.skipif(not hasattr(torch.library, "opcheck"),
                                reason=f"torch {torch.__version__} has no torch.library.opcheck (torch 2.4 and later)")

ATTENTION_CASES = [(torch.float16, "auto"), (torch.bfloat16, "fp8"), (torch.float32, "fp8_e5m2")]


def attention_args(p, max_seq_len, tp_rank=0):
    """The schema's arguments after out (v1) or the partition triple (v2)."""
    return (p.query, p.key_cache, p.value_cache, p.num_kv_heads, p.scale, p.block_tables, p.seq_lens_tensor,
            p.block_size, max_seq_len, p.alibi_slopes, p.kv_cache_dtype, torch.tensor(float(p.k_scale)),
            torch.tensor(float(p.v_scale)), tp_rank, 0, 0, 64, 0)


def problem(dtype, kv_cache_dtype, **kw):
    fp8 = kv_cache_dtype != "auto"
    return Problem([5, 600, 33], num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=dtype,
                   kv_cache_dtype=kv_cache_dtype, k_scale=0.05 if fp8 else 1.0, v_scale=0.03 if fp8 else 1.0,
                   seed=101, **kw)


@pytest.mark.parametrize("dtype,kv_cache_dtype", ATTENTION_CASES, ids=str)
def test_opcheck_paged_attention_v1(dtype, kv_cache_dtype):
    p = problem(dtype, kv_cache_dtype, alibi=dtype == torch.float16)
    out = torch.empty_like(p.query)
    torch.library.opcheck(torch.ops.kpa.paged_attention_v1.default, (out,) + attention_args(p, 600))


@pytest.mark.parametrize("dtype,kv_cache_dtype", ATTENTION_CASES, ids=str)
def test_opcheck_paged_attention_v2(dtype, kv_cache_dtype):
    p = problem(dtype, kv_cache_dtype)
    parts = partitions_for(600)
    seqs, heads = p.query.shape[:2]
    triple = (torch.empty(seqs, heads, parts, device=DEVICE), torch.empty(seqs, heads, parts, device=DEVICE),
              torch.empty(seqs, heads, parts, p.head_size, dtype=dtype, device=DEVICE))
    torch.library.opcheck(torch.ops.kpa.paged_attention_v2.default,
                          (torch.empty_like(p.query),) + triple + attention_args(p, 600))


@pytest.mark.parametrize("dtype,kv_cache_dtype", ATTENTION_CASES, ids=str)
def test_opcheck_paged_attention(dtype, kv_cache_dtype):
    """Several query tokens per sequence, a soft cap, a window and sinks."""
    p = problem(dtype, kv_cache_dtype)
    query = torch.rand(9, 8, 64, device=DEVICE).to(dtype)
    starts = torch.tensor([0, 4, 5, 9], dtype=torch.int32, device=DEVICE)
    sinks = torch.rand(8, device=DEVICE)
    torch.library.opcheck(torch.ops.kpa.paged_attention.default,
                          (torch.empty_like(query), query) + attention_args(p, 600)[1:7] + (starts, 600, None)
                          + attention_args(p, 600)[10:13] + (2.0, 128, sinks))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_opcheck_reshape_and_cache(kv_cache_dtype):
    tokens, kv_heads, d, block, blocks = 7, 2, 64, 16, 4
    fp8 = kv_cache_dtype != "auto"
    cache_dtype, x = (torch.uint8, 16) if fp8 else (torch.float16, 8)
    key = torch.randn(tokens, kv_heads, d, device=DEVICE).half()
    value = torch.randn(tokens, kv_heads, d, device=DEVICE).half()
    key_cache = torch.zeros(blocks, kv_heads, d // x, block, x, dtype=cache_dtype, device=DEVICE)
    value_cache = torch.zeros(blocks, kv_heads, d, block, dtype=cache_dtype, device=DEVICE)
    slots = torch.tensor([3, 17, -1, 40, 41, 0, 63], device=DEVICE)
    torch.library.opcheck(torch.ops.kpa.reshape_and_cache.default,
                          (key, value, key_cache, value_cache, slots, kv_cache_dtype, torch.tensor(0.5),
                           torch.tensor(0.25)))


def test_opcheck_copy_blocks():
    keys = [torch.randn(6, 2, 8, 16, 8, device=DEVICE).half() for _ in range(2)]
    values = [torch.randn(6, 2, 64, 16, device=DEVICE).half() for _ in range(2)]
    mapping = torch.tensor([[0, 3], [5, 1]], device=DEVICE)
    torch.library.opcheck(torch.ops.kpa.copy_blocks.default, (keys, values, mapping))


def test_opcheck_swap_blocks():
    src = torch.randn(6, 2, 64, 16, device=DEVICE).half()
    dst = torch.zeros(3, 2, 64, 16).half()
    torch.library.opcheck(torch.ops.kpa.swap_blocks.default, (src, dst, torch.tensor([[5, 0], [2, 2]])))


def test_fake_tensors_are_checked_by_the_meta_kernels():
    """Under FakeTensorMode (what torch.compile traces with) a wrong shape fails at trace time with
    the operator's own message."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    p = problem(torch.float16, "auto")
    with FakeTensorMode() as mode:
        args = tuple(mode.from_tensor(a) if torch.is_tensor(a) else a for a in attention_args(p, 600))
        torch.ops.kpa.paged_attention_v1(torch.empty(3, 8, 64, dtype=torch.float16, device=DEVICE), *args)
        with pytest.raises(ValueError, match=r"out has shape \[3, 8, 63\]"):
            torch.ops.kpa.paged_attention_v1(torch.empty(3, 8, 63, dtype=torch.float16, device=DEVICE), *args)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_decode_step_matches_eager(dynamic):
    """reshape_and_cache + paged_attention_v2 + a matmul under torch.compile(fullgraph=True): one
    graph, the same output and caches as eager, for two batch sizes."""
    torch._dynamo.reset()
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=dynamic)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_compiled_and_eager(compiled)
    # Tracing kpa's wrappers must not leave the user with warnings about them.
    assert [str(w.message) for w in caught if "vllm_ops" in str(w.message)] == []


def run_compiled_and_eager(compiled):
    for seq_lens in ([33, 600, 1500], [7, 1100]):
        p = Problem(seq_lens, num_heads=8, num_kv_heads=2, head_size=64, block_size=16, seed=len(seq_lens))
        generator = torch.Generator().manual_seed(103)
        weights = (torch.rand(8 * 64, 8 * 64, generator=generator) / 32).to(p.dtype).to(DEVICE)
        inputs = decode_inputs(p, generator)
        step = dict(weights=weights, seq_lens=p.seq_lens_tensor, tables=p.block_tables, max_seq_len=max(seq_lens))
        eager_cache = (p.key_cache.clone(), p.value_cache.clone(), "auto")
        eager = decode_step(eager_cache, *inputs, **step)
        got = compiled((p.key_cache, p.value_cache, "auto"), *inputs, **step)
        assert torch.equal(got, eager)
        assert bitwise_equal(p.key_cache, eager_cache[0]) and bitwise_equal(p.value_cache, eager_cache[1])
