"""Plain float64 references for kpa's PyTorch operators, written from vLLM's semantics with numpy,
and the problem builder the tests share: random sequences laid out in vLLM's paged caches.

The tests run on the tensors of DEVICE: CPU unless KPA_TEST_DEVICE names another torch device
(KPA_TEST_DEVICE=cuda: the same suite on CUDA tensors, against a CUDA build of kpa)."""

import math
import os

import numpy as np
import torch

# |got - ref| <= atol + rtol |ref| against float64, outputs in [-1, 1]: one rounding of the
# result to the output dtype plus the kernels' float accumulation.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 0.0), torch.bfloat16: (8e-3, 0.0)}
PARTITION_SIZE = 512
DEVICE = torch.device(os.environ.get("KPA_TEST_DEVICE", "cpu"))


def host(t):
    """A tensor's values as a CPU tensor (the references are computed on the host)."""
    return t.detach().cpu() if torch.is_tensor(t) else t


def assert_close(got, expected, dtype, what=""):
    atol, rtol = TOLERANCE[dtype]
    got = np.asarray(host(got), dtype=np.float64)
    error = np.abs(got - expected) - (atol + rtol * np.abs(expected))
    worst = np.unravel_index(np.argmax(error), error.shape) if error.size else ()
    assert error.size == 0 or error.max() <= 0, (
        f"{what}: |got - ref| exceeds atol {atol} + rtol {rtol} |ref| at {worst}: got {got[worst]}, ref {expected[worst]}")


def bitwise_equal(a, b):
    """Whether two tensors hold the same bits (NaN slots of the caches included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def fp8_decode(codes, kind):
    """The float value of each fp8 code: OCP E4M3FN (no infinities, 0x7F / 0xFF NaN) or E5M2."""
    c = np.asarray(codes).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if kind == "e4m3":
        exp, man, bias, bits = (c >> 3) & 0xF, c & 0x7, 7, 3
    else:
        exp, man, bias, bits = (c >> 2) & 0x1F, c & 0x3, 15, 2
    value = np.where(exp == 0, sign * 2.0 ** (1 - bias) * (man / 2 ** bits),
                     sign * 2.0 ** (exp - bias) * (1 + man / 2 ** bits))
    if kind == "e4m3":
        value = np.where((c & 0x7F) == 0x7F, np.nan, value)
    else:
        value = np.where(exp == 31, np.where(man == 0, sign * np.inf, np.nan), value)
    return value


def fp8_kind(kv_cache_dtype):
    return {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}[kv_cache_dtype]


def nearest_fp8_distance(targets, kind):
    """Distance from each target to the nearest finite fp8 value (round-to-nearest with saturation)."""
    table = fp8_decode(np.arange(256), kind)
    table = table[np.isfinite(table)]
    t = np.asarray(targets, dtype=np.float64).reshape(-1, 1)
    return np.abs(t - table.reshape(1, -1)).min(axis=1).reshape(np.shape(targets))


def partitions_for(max_seq_len):
    return max(1, -(-max_seq_len // PARTITION_SIZE))


def x_of(cache_dtype):
    return 16 // torch.empty((), dtype=cache_dtype).element_size()


class Problem:
    """Sequences of given lengths with random keys, values and queries in [-1, 1), in vLLM's caches,
    as tensors on DEVICE.

    Blocks are assigned in a random order with spare blocks in between; every cache slot no
    sequence owns holds NaN, so reading one shows. "auto" caches are written here directly;
    fp8 caches through kpa.vllm_ops.reshape_and_cache (whose codes test_cache_ops checks), and the
    reference then reads the dequantised cache."""

    def __init__(self, seq_lens, num_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float16,
                 kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, seed=0, alibi=False, spare_blocks=3):
        from kpa import vllm_ops

        rng = np.random.default_rng(seed)
        self.seq_lens = list(seq_lens)
        self.num_heads, self.num_kv_heads, self.head_size, self.block_size = num_heads, num_kv_heads, head_size, block_size
        self.dtype, self.kv_cache_dtype, self.k_scale, self.v_scale = dtype, kv_cache_dtype, k_scale, v_scale
        self.scale = 1.0 / math.sqrt(head_size)
        seqs = len(self.seq_lens)
        blocks_of = [max(1, -(-n // block_size)) for n in self.seq_lens]
        self.max_blocks = max(blocks_of) if blocks_of else 1
        self.num_blocks = sum(blocks_of) + spare_blocks
        order = rng.permutation(self.num_blocks)
        tables = np.zeros((seqs, self.max_blocks), dtype=np.int32)
        used = 0
        for s, n in enumerate(blocks_of):
            tables[s, :n] = order[used:used + n]
            used += n
        self.block_tables = torch.from_numpy(tables).to(DEVICE)
        self.seq_lens_tensor = torch.tensor(self.seq_lens, dtype=torch.int32, device=DEVICE)

        def uniform(*shape):
            return torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32)).to(dtype).to(DEVICE)

        self.query = uniform(seqs, num_heads, head_size)
        self.keys = [uniform(n, num_kv_heads, head_size) for n in self.seq_lens]
        self.values = [uniform(n, num_kv_heads, head_size) for n in self.seq_lens]
        self.alibi_slopes = (torch.from_numpy(rng.uniform(-0.5, 0.1, num_heads).astype(np.float32)).to(DEVICE)
                             if alibi else None)
        slots = [int(tables[s, t // block_size]) * block_size + t % block_size
                 for s, n in enumerate(self.seq_lens) for t in range(n)]
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64)

        fp8 = kv_cache_dtype != "auto"
        cache_dtype = torch.uint8 if fp8 else dtype
        x = x_of(cache_dtype)
        nan = 0x7F if fp8 else float("nan")
        key_cache = torch.full((self.num_blocks, num_kv_heads, head_size // x, block_size, x), nan, dtype=cache_dtype)
        value_cache = torch.full((self.num_blocks, num_kv_heads, head_size, block_size), nan, dtype=cache_dtype)
        all_keys = torch.cat(self.keys) if seqs else torch.empty(0, num_kv_heads, head_size, dtype=dtype)
        all_values = torch.cat(self.values) if seqs else torch.empty(0, num_kv_heads, head_size, dtype=dtype)
        if fp8:
            self.key_cache, self.value_cache = key_cache.to(DEVICE), value_cache.to(DEVICE)
            vllm_ops.reshape_and_cache(all_keys.to(DEVICE), all_values.to(DEVICE), self.key_cache, self.value_cache,
                                       self.slot_mapping.to(DEVICE), kv_cache_dtype, k_scale, v_scale)
        else:
            write_auto_cache(key_cache, value_cache, host(all_keys), host(all_values), self.slot_mapping)
            self.key_cache, self.value_cache = key_cache.to(DEVICE), value_cache.to(DEVICE)

    # The keys and values the reference attends, as the cache holds them (dequantised for fp8).
    def cached(self, s):
        n = self.seq_lens[s]
        blocks = host(self.block_tables)[s, np.arange(n) // self.block_size].numpy()
        offsets = np.arange(n) % self.block_size
        key_cache, value_cache = host(self.key_cache), host(self.value_cache)
        if self.kv_cache_dtype == "auto":
            k = key_cache[blocks, :, :, offsets, :].double().numpy()
            v = value_cache[blocks, :, :, offsets].double().numpy()
            return k.reshape(n, self.num_kv_heads, self.head_size), v
        kind = fp8_kind(self.kv_cache_dtype)
        k = fp8_decode(key_cache.numpy()[blocks, :, :, offsets, :], kind).reshape(n, self.num_kv_heads, self.head_size)
        v = fp8_decode(value_cache.numpy()[blocks, :, :, offsets], kind)
        return k * float(self.k_scale), v * float(self.v_scale)

    def reference(self, sparse=None, tp_rank=0):
        """out [seqs, heads, head_size] and, per partition of PARTITION_SIZE tokens, the max logit,
        the sum of exponentials and the normalised partial output (v2's intermediates)."""
        seqs = len(self.seq_lens)
        out = np.zeros((seqs, self.num_heads, self.head_size))
        parts = []
        group = self.num_heads // self.num_kv_heads
        q = host(self.query).double().numpy()
        slopes = None if self.alibi_slopes is None else host(self.alibi_slopes)
        for s, n in enumerate(self.seq_lens):
            k, v = self.cached(s)
            per_head = []
            for h in range(self.num_heads):
                g = h // group
                logits = self.scale * (k[:, g, :] @ q[s, h])
                if slopes is not None:
                    logits = logits + float(slopes[h]) * (np.arange(n) - (n - 1))
                mask = attended(n, h, g, self.block_size, self.num_heads, self.num_kv_heads, sparse, tp_rank)
                logits = np.where(mask, logits, -np.inf)
                if n > 0 and mask.any():
                    p = np.exp(logits - logits.max())
                    out[s, h] = p @ v[:, g, :] / p.sum()
                partitions = []
                for lo in range(0, n, PARTITION_SIZE):
                    part = logits[lo:lo + PARTITION_SIZE]
                    m = part.max()
                    if np.isfinite(m):
                        e = np.exp(part - m)
                        partitions.append((m, e.sum(), e @ v[lo:lo + PARTITION_SIZE, g, :] / e.sum()))
                    else:
                        partitions.append((m, 0.0, None))
                per_head.append(partitions)
            parts.append(per_head)
        return out, parts


def attended(n, head, kv_head, block_size, num_heads, num_kv_heads, sparse, tp_rank):
    """vLLM's block-sparse rule for the decode query at position n - 1 (all tokens when dense)."""
    tokens = np.arange(n)
    if sparse is None or sparse["vert_stride"] <= 1:
        return np.ones(n, dtype=bool)
    query_block = (n - 1) // sparse["block_size"]
    key_block = (tokens // block_size) * block_size // sparse["block_size"]
    step = sparse["head_sliding_step"]
    offset = (tp_rank * num_heads + head) * step + 1 if step >= 0 else (tp_rank * num_kv_heads + kv_head) * (-step) + 1
    return ((key_block + offset) % sparse["vert_stride"] == 0) | (key_block > query_block - sparse["local_blocks"])


def write_auto_cache(key_cache, value_cache, keys, values, slot_mapping):
    """vLLM's layout, written plainly: key_cache[b, g, d // x, o, d % x], value_cache[b, g, d, o]."""
    x = key_cache.shape[4]
    block_size = key_cache.shape[3]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        b, o = slot // block_size, slot % block_size
        key_cache[b, :, :, o, :] = keys[t].reshape(keys.shape[1], keys.shape[2] // x, x)
        value_cache[b, :, :, o] = values[t]


def decode_step(cache, x, new_keys, new_values, slots, weights, seq_lens, tables, max_seq_len, k_scale=1.0,
                v_scale=1.0):
    """One decode step of a layer: the new tokens into the cache, attention (v2), an output
    projection. `cache` = (key_cache, value_cache, kv_cache_dtype)."""
    key_cache, value_cache, kv_cache_dtype = cache
    seqs, heads, d = x.shape
    from kpa import vllm_ops

    vllm_ops.reshape_and_cache(new_keys, new_values, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale)
    out = torch.empty_like(x)
    parts = partitions_for(max_seq_len)
    exp_sums = torch.empty(seqs, heads, parts, device=x.device)
    max_logits = torch.empty(seqs, heads, parts, device=x.device)
    tmp_out = torch.empty(seqs, heads, parts, d, dtype=x.dtype, device=x.device)
    vllm_ops.paged_attention_v2(out, exp_sums, max_logits, tmp_out, x, key_cache, value_cache, new_keys.shape[1],
                                d ** -0.5, tables, seq_lens, key_cache.shape[3], max_seq_len, None, kv_cache_dtype,
                                k_scale, v_scale)
    return out.view(seqs, heads * d) @ weights


def decode_inputs(p, generator):
    """A decode step's inputs for Problem p: each sequence's next token goes to the slot after its
    last one (p.seq_lens then count it)."""
    seqs, kv = len(p.seq_lens), p.num_kv_heads
    tables = host(p.block_tables)
    slots = torch.tensor([int(tables[s, (n - 1) // p.block_size]) * p.block_size + (n - 1) % p.block_size
                          for s, n in enumerate(p.seq_lens)], device=DEVICE)
    x = (torch.rand(seqs, p.num_heads, p.head_size, generator=generator) - 0.5).to(p.dtype).to(DEVICE)
    k = (torch.rand(seqs, kv, p.head_size, generator=generator) - 0.5).to(p.dtype).to(DEVICE)
    v = (torch.rand(seqs, kv, p.head_size, generator=generator) - 0.5).to(p.dtype).to(DEVICE)
    return x, k, v, slots
