#!/usr/bin/env python3
"""The side-by-side anchor for kpa-bench on a GPU: the same decode shapes through PyTorch's
scaled_dot_product_attention over contiguous (not paged) K/V, timed with CUDA events.

    scripts/sdpa_anchor.py [--json FILE] [--iters N] SHAPE...

SHAPE is NAME:BATCH:SEQ_LEN:HEADS:KV_HEADS:HEAD_SIZE (f16), e.g. long_1x131072:1:131072:32:8:128.
Prints one line per shape: median time, KV bytes read per second, and torch's version and device.
"""

import argparse
import json
import statistics
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("sdpa_anchor: torch sees no CUDA device", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    results = []
    for spec in args.shapes:
        name, batch, seq_len, heads, kv_heads, head_size = spec.split(":")
        batch, seq_len, heads, kv_heads, head_size = map(int, (batch, seq_len, heads, kv_heads, head_size))
        q = torch.randn(batch, heads, 1, head_size, device=device, dtype=torch.float16)
        k = torch.randn(batch, kv_heads, seq_len, head_size, device=device, dtype=torch.float16)
        v = torch.randn_like(k)
        # Older torch has no enable_gqa: expand the kv heads (a view, no copy).
        try:
            run = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
            run()
        except TypeError:
            group = heads // kv_heads
            ke = k[:, :, None].expand(batch, kv_heads, group, seq_len, head_size).reshape(batch, heads, seq_len, head_size)
            ve = v[:, :, None].expand(batch, kv_heads, group, seq_len, head_size).reshape(batch, heads, seq_len, head_size)
            run = lambda: F.scaled_dot_product_attention(q, ke, ve)  # noqa: E731
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)  # microseconds
        median_us = statistics.median(times)
        kv_bytes = 2.0 * batch * seq_len * kv_heads * head_size * 2
        result = {"name": name, "batch_size": batch, "seq_len": seq_len, "num_query_heads": heads,
                  "num_kv_heads": kv_heads, "head_size": head_size, "dtype": "half", "median_us": median_us,
                  "kv_gbps": kv_bytes / median_us / 1e3, "torch": torch.__version__,
                  "device": torch.cuda.get_device_name()}
        results.append(result)
        print(f"sdpa {name:24s} {median_us:10.1f} us {result['kv_gbps']:8.1f} GB/s  "
              f"(torch {torch.__version__}, {result['device']})")
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
