"""kpa.vllm_ops.paged_attention_v2 on a device's tensors, as vLLM's decode step calls it: per shape
the median time of an eager call and, on CUDA, of the same call replayed from a CUDA graph (index
checks off), with the KV bytes read per second. Compare with scripts/sdpa_anchor.py (PyTorch's
scaled_dot_product_attention over contiguous K/V) on the same shapes and device.

    python3 python/benchmarks/bench_vllm_ops_device.py [--device cuda] [--json FILE] SHAPE...

SHAPE is NAME:BATCH:SEQ_LEN:HEADS:KV_HEADS:HEAD_SIZE (f16, block size 16, blocks in a random
order), e.g. llama_32x4096:32:4096:32:8:128.
"""

import argparse
import json
import pathlib
import statistics
import time

import torch

import kpa
from kpa import vllm_ops


def problem(batch, seq_len, heads, kv_heads, head_size, device, block=16):
    g = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-seq_len // block)
    num_blocks = batch * blocks_per_seq
    key_cache = torch.empty(num_blocks, kv_heads, head_size // 8, block, 8, dtype=torch.float16, device=device)
    value_cache = torch.empty(num_blocks, kv_heads, head_size, block, dtype=torch.float16, device=device)
    key_cache.uniform_(-1, 1)
    value_cache.uniform_(-1, 1)
    tables = torch.randperm(num_blocks, generator=g).view(batch, blocks_per_seq).int().to(device)
    query = (torch.rand(batch, heads, head_size, generator=g) * 2 - 1).half().to(device)
    parts = -(-seq_len // vllm_ops.PARTITION_SIZE)
    partials = (torch.empty(batch, heads, parts, device=device), torch.empty(batch, heads, parts, device=device),
                torch.empty(batch, heads, parts, head_size, dtype=torch.float16, device=device))
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    out = torch.empty_like(query)

    def call():
        vllm_ops.paged_attention_v2(out, *partials, query, key_cache, value_cache, kv_heads, head_size ** -0.5, tables,
                                    seq_lens, block, seq_len, None, "auto", 1.0, 1.0)
    return call


def median_us(fn, device, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    results = []
    for spec in args.shapes:
        name, *dims = spec.split(":")
        batch, seq_len, heads, kv_heads, head_size = map(int, dims)
        call = problem(batch, seq_len, heads, kv_heads, head_size, device)
        result = {"name": name, "batch_size": batch, "seq_len": seq_len, "num_query_heads": heads,
                  "num_kv_heads": kv_heads, "head_size": head_size, "dtype": "half", "device": str(device),
                  "eager_us": median_us(call, device, args.iters)}
        if device.type == "cuda":
            previous = kpa.set_check_indices(False)
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    call()  # kpa's state for the capture stream
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    call()
                result["graph_us"] = median_us(graph.replay, device, args.iters)
                result["eager_unchecked_us"] = median_us(call, device, args.iters)
            finally:
                kpa.set_check_indices(previous)
        kv_bytes = 2.0 * batch * seq_len * kv_heads * head_size * 2
        best = min(v for k, v in result.items() if k.endswith("_us"))
        result["kv_gbps"] = kv_bytes / best / 1e3
        results.append(result)
        times = "  ".join(f"{k[:-3]} {v:9.1f} us" for k, v in result.items() if k.endswith("_us"))
        print(f"kpa.vllm_ops.paged_attention_v2 {name:24s} {times}  {result['kv_gbps']:8.1f} GB/s (best)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
