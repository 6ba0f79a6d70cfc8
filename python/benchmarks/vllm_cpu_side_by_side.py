"""kpa's CPU attention and vLLM's own CPU attention kernel side by side: the same decode steps
(shapes, dtypes, block sizes) and prefill chunks (the last 512 query tokens of 2,048-token prompts,
causal), each cache written through its own kernel's reshape_and_cache from the same keys and
values, timed in one run with cold caches, and both checked against one float64 reference first;
then both reshape_and_cache kernels on a prefill chunk and on a decode step.

    scripts/vllm.sh                          # once: vLLM's CPU build and kpa in .deps/vllm-0.32.0
    OMP_NUM_THREADS=2 .deps/vllm-0.32.0/bin/python python/benchmarks/vllm_cpu_side_by_side.py

vLLM's kernel is torch.ops._C.cpu_attention_with_kv_cache after get_scheduler_metadata, with the
instruction set vLLM's CPU backend picks (amx for bf16 at block sizes that are multiples of 32 where
the CPU has AMX, vec at other multiples of 32, vec16 at 16). kpa's is kpa.paged_attention. Times are
medians of --iters calls per round, the rounds alternating which kernel goes first, then the median
over rounds; "% read" is the K/V bytes per second against what torch.sum reads per second from a
1 GiB tensor in the same process. ratio = vLLM time / kpa time: above 1, kpa is faster.
"""

import argparse
import math
import os
import statistics
import time

import torch

import kpa

# name: (sequences, tokens, query heads, kv heads, head size)
SHAPES = {
    "llama_32x4096": (32, 4096, 32, 8, 128),
    "long_context_1x100k": (1, 100000, 24, 4, 256),
    "single_tile_64x512": (64, 512, 32, 8, 128),
    "one_1x8192": (1, 8192, 32, 8, 128),
}
# name: (sequences, tokens, query tokens per sequence, query heads, kv heads, head size)
PREFILL_SHAPES = {
    "prefill_4x2048_q512_32x8": (4, 2048, 512, 32, 8, 128),
    "prefill_4x2048_q512_16x4": (4, 2048, 512, 16, 4, 128),
}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
# name: (tokens, sequences they belong to), 8 kv heads of 128: a chunk of one prompt's tokens in
# consecutive slots, and a decode step's one token per sequence, each in another block.
CACHE_WRITES = {"prefill_chunk_2048": (2048, 1), "decode_step_64": (64, 64)}


def vllm_isa(dtype, block_size, head_size):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    return _get_attn_isa(dtype, block_size, head_size)


class Step:
    """One step's inputs (`queries` tokens per sequence: 1 for decode, a prefill chunk's tokens,
    the last of the sequence, causal among themselves), with both kernels' caches written from
    the same keys and values."""

    def __init__(self, seqs, tokens, heads, kv_heads, head, dtype, block_size, seed=0, queries=1):
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head, self.block_size = heads, kv_heads, head, block_size
        self.queries = queries
        self.seq_lens = torch.full((seqs,), tokens, dtype=torch.int32)
        blocks_per_seq = math.ceil(tokens / block_size)
        num_blocks = seqs * blocks_per_seq
        self.block_table = torch.randperm(num_blocks, generator=g).to(torch.int32).view(seqs, blocks_per_seq)
        self.query = torch.randn(seqs * queries, heads, head, generator=g).to(dtype)
        self.scale = head ** -0.5
        # Multiply-adds of q.k and p.V over every (query row, attended key) pair.
        pairs = seqs * sum(tokens - queries + 1 + i for i in range(queries))
        self.flops = 4.0 * pairs * heads * head
        self.kv_bytes = seqs * tokens * kv_heads * head * 2 * self.query.element_size()
        positions = torch.arange(tokens)
        slots = (self.block_table[:, positions // block_size].long() * block_size + positions % block_size).reshape(-1)
        key = torch.randn(seqs * tokens, kv_heads, head, generator=g).to(dtype)
        value = torch.randn(seqs * tokens, kv_heads, head, generator=g).to(dtype)
        self.key, self.value = key, value
        # kpa: vLLM's paged layout.
        x = 16 // self.query.element_size()
        self.kpa_key = torch.zeros(num_blocks, kv_heads, head // x, block_size, x, dtype=dtype)
        self.kpa_value = torch.zeros(num_blocks, kv_heads, head, block_size, dtype=dtype)
        kpa.vllm_ops.reshape_and_cache(key, value, self.kpa_key, self.kpa_value, slots, "auto", 1.0, 1.0)
        self.kpa_out = torch.empty_like(self.query)
        # vLLM's CPU kernel: its own cache, [blocks, kv heads, 2 x block, head] split into K and V.
        self.isa = vllm_isa(dtype, block_size, head)
        cache = torch.zeros(num_blocks, kv_heads, 2 * block_size, head, dtype=dtype)
        self.vllm_key, self.vllm_value = cache.chunk(2, dim=2)
        torch.ops._C.cpu_attn_reshape_and_cache(key, value, self.vllm_key, self.vllm_value, slots, self.isa, 1.0,
                                                1.0, "auto")
        self.query_start_loc = torch.arange(seqs + 1, dtype=torch.int32) * queries
        self.metadata = torch.ops._C.get_scheduler_metadata(seqs, heads, kv_heads, head, self.seq_lens, dtype,
                                                            self.query_start_loc, True, -1, self.isa, False, None,
                                                            "auto")
        self.vllm_out = torch.empty_like(self.query)
        self.max_seq_len = tokens

    def run_kpa(self):
        kpa.paged_attention(self.kpa_out, self.query, self.kpa_key, self.kpa_value, self.kv_heads, self.scale,
                            self.block_table, self.seq_lens, max_seq_len=self.max_seq_len,
                            query_start_loc=self.query_start_loc if self.queries > 1 else None)

    def run_vllm(self):
        torch.ops._C.cpu_attention_with_kv_cache(self.query, self.vllm_key, self.vllm_value, self.vllm_out,
                                                 self.query_start_loc, self.seq_lens, self.scale, True, None, -1,
                                                 self.block_table, 0.0, self.metadata, None, None, 1.0, 1.0, "auto")

    def reference(self):
        """float64 attention of every sequence's query over its keys and values."""
        group = self.heads // self.kv_heads
        out = torch.empty(self.query.shape, dtype=torch.float64)
        tokens, q = int(self.seq_lens[0]), self.queries
        for s in range(self.query.shape[0] // q):
            k = self.key[s * tokens:(s + 1) * tokens].double().repeat_interleave(group, dim=1)  # [t, H, D]
            v = self.value[s * tokens:(s + 1) * tokens].double().repeat_interleave(group, dim=1)
            rows = self.query[s * q:(s + 1) * q].double()  # [q, H, D]: positions tokens - q ..
            logits = torch.einsum("qhd,thd->qht", rows, k) * self.scale
            position = torch.arange(tokens - q, tokens).view(q, 1, 1)
            logits = logits.masked_fill(torch.arange(tokens).view(1, 1, tokens) > position, float("-inf"))
            out[s * q:(s + 1) * q] = torch.einsum("qht,thd->qhd", torch.softmax(logits, dim=-1), v)
        return out


class CacheWrite:
    """reshape_and_cache of `tokens` new tokens of `seqs` sequences into both kernels' caches."""

    def __init__(self, tokens, seqs, dtype, block_size, kv_heads=8, head=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        per_seq = tokens // seqs
        blocks_per_seq = math.ceil(4096 / block_size)
        num_blocks = seqs * blocks_per_seq
        table = torch.randperm(num_blocks, generator=g).view(seqs, blocks_per_seq)
        # Each sequence's new tokens follow 1,000 cached ones.
        positions = 1000 + torch.arange(per_seq)
        self.slots = (table[:, positions // block_size] * block_size + positions % block_size).reshape(-1)
        self.key = torch.randn(tokens, kv_heads, head, generator=g).to(dtype)
        self.value = torch.randn(tokens, kv_heads, head, generator=g).to(dtype)
        x = 16 // self.key.element_size()
        self.kpa_key = torch.zeros(num_blocks, kv_heads, head // x, block_size, x, dtype=dtype)
        self.kpa_value = torch.zeros(num_blocks, kv_heads, head, block_size, dtype=dtype)
        self.isa = vllm_isa(dtype, block_size, head)
        cache = torch.zeros(num_blocks, kv_heads, 2 * block_size, head, dtype=dtype)
        self.vllm_key, self.vllm_value = cache.chunk(2, dim=2)

    def run_kpa(self):
        kpa.vllm_ops.reshape_and_cache(self.key, self.value, self.kpa_key, self.kpa_value, self.slots, "auto", 1.0,
                                       1.0)

    def run_vllm(self):
        torch.ops._C.cpu_attn_reshape_and_cache(self.key, self.value, self.vllm_key, self.vllm_value, self.slots,
                                                self.isa, 1.0, 1.0, "auto")


class ColdCache:
    """Rewrites 256 MiB before each timed call, as serving meets a cold cache."""

    def __init__(self):
        self.buffer = torch.empty(64 << 20, dtype=torch.float32)

    def __call__(self):
        self.buffer.add_(1.0)


def median_us(fn, iters, flush):
    times = []
    for _ in range(iters):
        flush()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def read_bandwidth():
    data = torch.ones(256 << 20, dtype=torch.float32)
    data.sum()
    best = min(_timed(data.sum) for _ in range(5))
    return data.numel() * 4 / best


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names (empty: none): " + ", ".join(SHAPES))
    parser.add_argument("--prefill-shapes", default=",".join(PREFILL_SHAPES),
                        help="comma-separated names (empty: none): " + ", ".join(PREFILL_SHAPES))
    parser.add_argument("--prefill-block-sizes", default="128")
    parser.add_argument("--cache-writes", default=",".join(CACHE_WRITES),
                        help="comma-separated names (empty: none): " + ", ".join(CACHE_WRITES))
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--block-sizes", default="16,32,128")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-only", action="store_true", help="only the float64 check on a small case")
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    if hasattr(torch.cpu, "_init_amx"):
        torch.cpu._init_amx()  # vLLM's amx kernels need the tile permission (its engine asks for it)

    # Both kernels against float64 on a small case of every dtype and block size.
    for dtype_name in args.dtypes.split(","):
        for block_size in (int(b) for b in args.block_sizes.split(",")):
            for queries in (1, 40):  # a decode step and a prefill chunk
                step = Step(2, 300, 8, 2, 128, DTYPES[dtype_name], block_size, seed=block_size, queries=queries)
                ref = step.reference()
                step.run_kpa()
                step.run_vllm()
                kpa_err = (step.kpa_out.double() - ref).abs().max().item()
                vllm_err = (step.vllm_out.double() - ref).abs().max().item()
                tolerance = 1e-2 if dtype_name == "bf16" else 2e-3
                print(f"check {dtype_name} block {block_size} ({step.isa}), {queries} query tokens: max |error| "
                      f"kpa {kpa_err:.2e}, vLLM {vllm_err:.2e}")
                if kpa_err > tolerance or vllm_err > tolerance:
                    raise SystemExit(f"error above {tolerance}")
    if args.check_only:
        return

    bandwidth = read_bandwidth()
    print(f"\n{threads} threads, CPU instruction sets {kpa.host_isa()} (kpa); read bandwidth {bandwidth / 1e9:.1f} GB/s "
          f"(torch.sum over 1 GiB); cold caches, medians\n")
    flush = ColdCache()

    def timed(step):
        step.run_kpa()
        step.run_vllm()
        kpa_rounds, vllm_rounds = [], []
        for r in range(args.rounds):
            order = [("kpa", step.run_kpa), ("vllm", step.run_vllm)]
            for which, fn in (order if r % 2 == 0 else order[::-1]):
                (kpa_rounds if which == "kpa" else vllm_rounds).append(median_us(fn, args.iters, flush))
        return statistics.median(kpa_rounds), statistics.median(vllm_rounds)

    def table(title, header, names, block_sizes, make, figures):
        """One row per name, dtype and block size: both kernels timed on make(name, dtype, block),
        then figures(case, vLLM us, kpa us), the last two columns."""
        if not names:
            return
        if title:
            print(f"\n{title}\n")
        print(f"| {header[0]} | dtype | block | vLLM isa | vLLM us | kpa us | ratio | {header[1]} | {header[2]} |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in names:
            for dtype_name in args.dtypes.split(","):
                for block_size in (int(b) for b in block_sizes.split(",")):
                    case = make(name, DTYPES[dtype_name], block_size)
                    kpa_us, vllm_us = timed(case)
                    vllm_figure, kpa_figure = figures(case, vllm_us, kpa_us)
                    print(f"| {name} | {dtype_name} | {block_size} | {case.isa} | {vllm_us:.0f} | {kpa_us:.0f} "
                          f"| {vllm_us / kpa_us:.2f} | {vllm_figure} | {kpa_figure} |", flush=True)
                    del case

    def percent_read(step, us):
        return f"{step.kv_bytes / us / 1e3 / (bandwidth / 1e9) * 100:.0f}"

    table(None, ("shape", "vLLM % read", "kpa % read"), [n for n in args.shapes.split(",") if n], args.block_sizes,
          lambda name, dtype, block: Step(*SHAPES[name], dtype, block),
          lambda step, vllm_us, kpa_us: (percent_read(step, vllm_us), percent_read(step, kpa_us)))

    def prefill_step(name, dtype, block):
        seqs, tokens, queries, heads, kv_heads, head = PREFILL_SHAPES[name]
        return Step(seqs, tokens, heads, kv_heads, head, dtype, block, queries=queries)

    table("Prefill chunks (compute-bound): GFLOP/s counts the multiply-adds of q.k and p.V over the attended pairs",
          ("shape", "vLLM GFLOP/s", "kpa GFLOP/s"), [n for n in args.prefill_shapes.split(",") if n],
          args.prefill_block_sizes, prefill_step,
          lambda step, vllm_us, kpa_us: (f"{step.flops / vllm_us / 1e3:.1f}", f"{step.flops / kpa_us / 1e3:.1f}"))

    def written(write, us):
        return f"{2 * write.key.numel() * write.key.element_size() / us / 1e3:.1f}"

    table("Cache writes (reshape_and_cache, 8 kv heads of 128): GB/s counts the K/V bytes written",
          ("writes", "vLLM GB/s", "kpa GB/s"), [n for n in args.cache_writes.split(",") if n], args.block_sizes,
          lambda name, dtype, block: CacheWrite(*CACHE_WRITES[name], dtype, block),
          lambda write, vllm_us, kpa_us: (written(write, vllm_us), written(write, kpa_us)))

if __name__ == "__main__":
    main()
