#!/usr/bin/env python3
"""Plots KV-cache read throughput against sequence length, one PNG per dtype, with the machine's
measured read bandwidth as a line.

    scripts/plot_bench.py RESULTS.json [RESULTS.json ...] [--out-dir DIR] [--bandwidth GBPS]

Each RESULTS.json is either kpa-bench's --json output (which carries the measured bandwidth) or Google
Benchmark JSON from kpa-perf-tests (--benchmark_out=FILE --benchmark_out_format=json; pass
--bandwidth, e.g. from kpa-bench's table). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import collections
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    """Returns rows (dtype, series label, seq_len, GB/s) and the measured bandwidth if known."""
    with open(path) as f:
        data = json.load(f)
    rows, bandwidth = [], None
    if isinstance(data, list):  # kpa-bench
        for r in data:
            dtype = r["dtype"] if r["kv_cache_dtype"] == "auto" else f'{r["dtype"]}, {r["kv_cache_dtype"]} cache'
            label = (f'{r["version"]} batch {r["batch_size"]}, {r["num_query_heads"]}/{r["num_kv_heads"]} heads, '
                     f'head {r["head_size"]}')
            rows.append((dtype, label, r["seq_len"], r["kv_gbps"]))
            bandwidth = r.get("machine_read_gbps", bandwidth)
    else:  # Google Benchmark
        pattern = re.compile(r"paged_attention<([^>]*)>/version:(\d)/batch:(\d+)/seq_len:(\d+)/heads:(\d+)/"
                             r"kv_heads:(\d+)/head:(\d+)/block:(\d+)")
        for b in data.get("benchmarks", []):
            m = pattern.match(b["name"])
            if not m or b.get("run_type") == "aggregate" or "kv_bytes_per_s" not in b:
                continue
            dtype, version, batch, seq_len, heads, kv_heads, head, block = m.groups()
            label = f'{["", "v1", "v2", "auto"][int(version)]} batch {batch}, {heads}/{kv_heads} heads, head {head}'
            rows.append((dtype.replace("kpa::", ""), label, int(seq_len), b["kv_bytes_per_s"] / 1e9))
    return rows, bandwidth


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out-dir", default=".")
    parser.add_argument("--bandwidth", type=float, help="measured read bandwidth, GB/s")
    args = parser.parse_args()
    rows, bandwidths = [], []
    for path in args.results:
        file_rows, file_bandwidth = load(path)
        rows += file_rows
        if file_bandwidth:
            bandwidths.append(file_bandwidth)
    # Several runs: the best measured bandwidth is the machine's limit.
    bandwidth = args.bandwidth or (max(bandwidths) if bandwidths else None)
    by_dtype = collections.defaultdict(lambda: collections.defaultdict(list))
    for dtype, label, seq_len, gbps in rows:
        by_dtype[dtype][label].append((seq_len, gbps))
    if not by_dtype:
        sys.exit("plot_bench.py: no paged-attention results in " + ", ".join(args.results))
    os.makedirs(args.out_dir, exist_ok=True)
    for dtype, series in by_dtype.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, points in sorted(series.items()):
            points.sort()
            if len(points) > 1:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        if bandwidth:
            ax.axhline(bandwidth, color="black", linestyle="--", label=f"measured read bandwidth {bandwidth:.1f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("KV cache read (GB/s)")
        ax.set_title(f"kpa paged attention, {dtype}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        name = re.sub(r"[^A-Za-z0-9]+", "_", dtype).strip("_")
        path = os.path.join(args.out_dir, f"kv_gbps_{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        print(path)


if __name__ == "__main__":
    main()
