"""kpa's PyTorch operators, measured in one process:

1. kpa.vllm_ops.paged_attention_v2 against the plain-PyTorch way to do the same step (gather each
   sequence's blocks, then softmax(q k^T) v with torch operators, in float32: CPU torch has no
   half-precision matrix products), on --batch-size x --seq-len tokens;
2. the per-call cost of the layers above the kernels on a tiny batch (1 sequence x 16 tokens):
   kpa.vllm_ops.paged_attention_v1, torch.ops.kpa.paged_attention_v1 and the C ABI call it makes
   (kpa_paged_attention_v1 through ctypes, with and without its index check), with the C++ entry
   point's time (kpa-bench, warm caches, no index check) when --kpa-bench names it.

    OMP_NUM_THREADS=2 python3 python/benchmarks/bench_vllm_ops.py --kpa-bench build/perf_tests/kpa-bench

Times are medians; torch runs with as many threads as kpa's OpenMP (OMP_NUM_THREADS).
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import tempfile
import time

import torch

import kpa
from kpa import vllm_ops


def median_seconds(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_problem(seqs, seq_len, heads, kv_heads, d, block, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 16 // torch.empty((), dtype=dtype).element_size()
    blocks_per_seq = -(-seq_len // block)
    num_blocks = seqs * blocks_per_seq
    key_cache = (torch.rand(num_blocks, kv_heads, d // x, block, x, generator=g) * 2 - 1).to(dtype)
    value_cache = (torch.rand(num_blocks, kv_heads, d, block, generator=g) * 2 - 1).to(dtype)
    block_tables = torch.randperm(num_blocks, generator=g).view(seqs, blocks_per_seq).int()
    seq_lens = torch.full((seqs,), seq_len, dtype=torch.int32)
    query = (torch.rand(seqs, heads, d, generator=g) * 2 - 1).to(dtype)
    return query, key_cache, value_cache, block_tables, seq_lens


def torch_paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens, scale):
    """The same step with plain torch operators: gather, then softmax(q k^T) v per sequence."""
    num_kv_heads, block = value_cache.shape[1], value_cache.shape[3]
    heads, d = query.shape[1], query.shape[2]
    group = heads // num_kv_heads
    for s in range(query.shape[0]):
        n = int(seq_lens[s])
        blocks = block_tables[s, :-(-n // block)].long()
        k = key_cache[blocks].permute(0, 3, 1, 2, 4).reshape(-1, num_kv_heads, d)[:n].float()  # [n, kv, d]
        v = value_cache[blocks].permute(0, 3, 1, 2).reshape(-1, num_kv_heads, d)[:n].float()
        q = query[s].view(num_kv_heads, group, d).float()
        logits = torch.matmul(q, k.permute(1, 2, 0)) * scale  # [kv, group, n]
        p = torch.softmax(logits, dim=-1)
        out[s] = torch.matmul(p, v.permute(1, 0, 2)).reshape(heads, d).to(out.dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tiny-iters", type=int, default=2000)
    parser.add_argument("--kpa-bench", help="path of kpa-bench, for the C++ entry point's time on the tiny batch")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    heads, kv_heads, d, block, dtype = 32, 8, 128, 16, torch.float16
    # The C++ entry point first, in a process of its own, before this one starts any thread.
    cxx_us = None
    if args.kpa_bench:
        with tempfile.TemporaryDirectory() as folder:
            report = os.path.join(folder, "tiny.json")
            subprocess.run([args.kpa_bench, "--version", "v1", "--batch-size", "1", "--seq-len", "16",
                            "--num-query-heads", str(heads), "--num-kv-heads", str(kv_heads), "--head-size", str(d),
                            "--dtype", "half", "--no-baselines", "--warm-cache", "--iters", str(args.tiny_iters),
                            "--json", report], check=True, capture_output=True)
            with open(report) as f:
                cxx_us = json.load(f)[0]["median_us"]
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    torch.set_num_threads(threads)
    scale = 1 / math.sqrt(d)
    figures = {"torch": torch.__version__, "kpa": kpa.__version__, "host_isa": kpa.host_isa(), "threads": threads}

    # 1. Per-call cost on a tiny batch, first: torch's own OpenMP threads, once used, spin for a
    # while after each of its parallel regions and would share the cores with kpa's.
    tiny = make_problem(1, 16, heads, kv_heads, d, block, dtype, seed=1)
    q, kc, vc, bt, sl = tiny
    out = torch.empty_like(q)
    one = torch.ones(())

    def wrapper():
        vllm_ops.paged_attention_v1(out, q, kc, vc, kv_heads, scale, bt, sl, block, 16, None, "auto", 1.0, 1.0)

    def operator():
        torch.ops.kpa.paged_attention_v1(out, q, kc, vc, kv_heads, scale, bt, sl, block, 16, None, "auto", one, one, 0,
                                         0, 0, 64, 0)

    lib = ctypes.CDLL(os.path.join(os.path.dirname(kpa.__file__), "libkpa.so"))
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    lib.kpa_paged_attention_v1.argtypes = [P, P, ctypes.c_int, P, P, ctypes.c_int, I64, I64, I64, I64, I64, I64, P, I64,
                                           P, I64, ctypes.c_float, P, ctypes.c_float, ctypes.c_float, ctypes.c_int, P]
    c_args = [out.data_ptr(), q.data_ptr(), 1, kc.data_ptr(), vc.data_ptr(), 1, 1, heads, kv_heads, d, kc.shape[0],
              block, bt.data_ptr(), bt.shape[1], sl.data_ptr(), 16, scale, None, 1.0, 1.0, 0, None]

    def c_abi():
        assert lib.kpa_paged_attention_v1(*c_args) == 0, lib.kpa_last_error()

    lib.kpa_last_error.restype = ctypes.c_char_p
    tiny_figures = {name: median_seconds(fn, args.tiny_iters, warmup=50) * 1e6
                    for name, fn in (("kpa.vllm_ops_us", wrapper), ("torch.ops.kpa_us", operator), ("c_abi_ctypes_us", c_abi))}
    lib.kpa_set_check_indices(0)  # the C ABI call without its index check (the operators keep it)
    tiny_figures["c_abi_ctypes_unchecked_us"] = median_seconds(c_abi, args.tiny_iters, warmup=50) * 1e6
    lib.kpa_set_check_indices(1)
    if cxx_us is not None:
        tiny_figures["cxx_kpa_bench_unchecked_us"] = cxx_us
    figures["tiny_call_1x16"] = tiny_figures

    # 2. kpa v2 against plain PyTorch.
    query, key_cache, value_cache, block_tables, seq_lens = make_problem(args.batch_size, args.seq_len, heads, kv_heads,
                                                                         d, block, dtype)
    parts = -(-args.seq_len // vllm_ops.PARTITION_SIZE)
    exp_sums = torch.empty(args.batch_size, heads, parts)
    max_logits = torch.empty_like(exp_sums)
    tmp_out = torch.empty(args.batch_size, heads, parts, d, dtype=dtype)
    out_kpa, out_torch = torch.empty_like(query), torch.empty_like(query)

    def kpa_v2():
        vllm_ops.paged_attention_v2(out_kpa, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, kv_heads,
                                    scale, block_tables, seq_lens, block, args.seq_len, None, "auto", 1.0, 1.0)

    def plain():
        torch_paged_attention(out_torch, query, key_cache, value_cache, block_tables, seq_lens, scale)

    t_kpa, t_torch = median_seconds(kpa_v2, args.iters), median_seconds(plain, args.iters)
    kv_bytes = 2 * args.batch_size * args.seq_len * kv_heads * d * key_cache.element_size()
    figures["v2_vs_plain_torch"] = {
        "shape": f"{args.batch_size} x {args.seq_len} tokens, {heads}/{kv_heads} heads, d{d}, block {block}, f16",
        "kpa_ms": t_kpa * 1e3, "plain_torch_ms": t_torch * 1e3, "speedup": t_torch / t_kpa,
        "kpa_kv_GBps": kv_bytes / t_kpa / 1e9,
        "max_abs_difference": (out_kpa.float() - out_torch.float()).abs().max().item()}

    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
