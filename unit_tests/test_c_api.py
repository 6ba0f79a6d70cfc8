"""The C ABI through ctypes, as a Python framework would load it: f16 activations with an f16 and
an fp8 (E4M3) cache filled by kpa_reshape_and_cache, every attention entry point against a float64
numpy reference, and the error paths.

    python3 test_c_api.py /path/to/libkpa.so
"""
import ctypes
import sys
import threading

import numpy as np

KPA_F32, KPA_F16, KPA_BF16, KPA_FP8_E4M3, KPA_FP8_E5M2 = range(5)
KPA_OK, KPA_ERR_INVALID_ARGUMENT, KPA_ERR_UNSUPPORTED, KPA_ERR_RUNTIME = range(4)

lib = ctypes.CDLL(sys.argv[1])
P, I64, F, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
ATTENTION = [I, P, P, I, I64, I64, I64, I64, I64, I64, P, I64, P, I64, F, P, F, F, I, P]  # after out, query
lib.kpa_init.restype = I
lib.kpa_last_error.restype = ctypes.c_char_p
lib.kpa_version.restype = ctypes.c_char_p
lib.kpa_paged_attention_v1.argtypes = [P, P] + ATTENTION
lib.kpa_paged_attention.argtypes = [P, P] + ATTENTION
lib.kpa_paged_attention_v2.argtypes = [P, P, P, P, I64, I64, P] + ATTENTION
lib.kpa_reshape_and_cache.argtypes = [P, P, I, P, P, I, I64, I64, I64, I64, I64, P, F, F]
lib.kpa_set_check_indices.argtypes = [I]
for name in ("kpa_paged_attention_v1", "kpa_paged_attention_v2", "kpa_paged_attention", "kpa_reshape_and_cache",
             "kpa_set_check_indices"):
    getattr(lib, name).restype = I

passed = failed = 0


def check(condition, what):
    global passed, failed
    if condition:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {what} (last error: {lib.kpa_last_error().decode()})")


def ptr(array):
    return array.ctypes.data_as(ctypes.c_void_p) if array is not None else None


rng = np.random.default_rng(7)
seqs, heads, kv_heads, head, block, max_blocks = 4, 8, 2, 64, 16, 8
seq_lens = np.array([1, 0, 77, 128], dtype=np.int32)
num_blocks = seqs * max_blocks
block_tables = rng.permutation(num_blocks).astype(np.int32).reshape(seqs, max_blocks)
query = rng.uniform(-1, 1, (seqs, heads, head)).astype(np.float16)
keys = [rng.uniform(-1, 1, (n, kv_heads, head)).astype(np.float16) for n in seq_lens]
values = [rng.uniform(-1, 1, (n, kv_heads, head)).astype(np.float16) for n in seq_lens]
token_keys, token_values = np.concatenate(keys), np.concatenate(values)
slots = np.concatenate([block_tables[s, np.arange(n) // block] * block + np.arange(n) % block
                        for s, n in enumerate(seq_lens)]).astype(np.int64)
scale = 1.0 / np.sqrt(head)


def reference(k_seq, v_seq):
    out = np.zeros((seqs, heads, head))
    for s in range(seqs):
        if seq_lens[s] == 0:
            continue
        for h in range(heads):
            g = h // (heads // kv_heads)
            logits = scale * (k_seq[s][:, g, :].astype(np.float64) @ query[s, h].astype(np.float64))
            p = np.exp(logits - logits.max())
            out[s, h] = (p / p.sum()) @ v_seq[s][:, g, :].astype(np.float64)
    return out


def attention_args(key_cache, value_cache, cache_dtype, max_seq_len=128, k_scale=1.0, v_scale=1.0, kv=kv_heads):
    return [KPA_F16, ptr(key_cache), ptr(value_cache), cache_dtype, seqs, heads, kv, head, num_blocks, block,
            ptr(block_tables), max_blocks, ptr(seq_lens), max_seq_len, scale, None, k_scale, v_scale, 0, None]


def run_all_versions(key_cache, value_cache, cache_dtype, expected, tolerance, **scales):
    partitions, partition = 4, 32
    for name in ("v1", "v2", "auto", "auto again"):
        out = np.full((seqs, heads, head), np.nan, dtype=np.float16)
        args = attention_args(key_cache, value_cache, cache_dtype, **scales)
        if name == "v2":
            exp_sums = np.empty((seqs, heads, partitions), dtype=np.float32)
            max_logits = np.empty_like(exp_sums)
            tmp_out = np.empty((seqs, heads, partitions, head), dtype=np.float16)
            status = lib.kpa_paged_attention_v2(ptr(out), ptr(exp_sums), ptr(max_logits), ptr(tmp_out), partitions,
                                                partition, ptr(query), *args)
        elif name == "v1":
            status = lib.kpa_paged_attention_v1(ptr(out), ptr(query), *args)
        else:
            status = lib.kpa_paged_attention(ptr(out), ptr(query), *args)
        check(status == KPA_OK, f"{name} status {status}")
        error = np.nanmax(np.abs(out.astype(np.float64) - expected)) if not np.isnan(out).any() else np.inf
        check(error < tolerance, f"{name} max error {error} >= {tolerance}")


check(lib.kpa_init() == KPA_OK, "kpa_init")
check(len(lib.kpa_version()) > 0, "kpa_version")

# f16 cache written by kpa_reshape_and_cache, then attention.
key_cache = np.full((num_blocks, kv_heads, head // 8, block, 8), np.nan, dtype=np.float16)
value_cache = np.full((num_blocks, kv_heads, head, block), np.nan, dtype=np.float16)
status = lib.kpa_reshape_and_cache(ptr(token_keys), ptr(token_values), KPA_F16, ptr(key_cache), ptr(value_cache),
                                   KPA_F16, len(slots), kv_heads, head, num_blocks, block, ptr(slots), 1.0, 1.0)
check(status == KPA_OK, "reshape_and_cache f16")
b, t = block_tables[3, 5], 5 * block + 3
check(np.array_equal(key_cache[b, 1, :, 3, :].reshape(head), keys[3][t, 1]), "f16 key layout")
check(np.array_equal(value_cache[b, 0, :, 3], values[3][t, 0]), "f16 value layout")
run_all_versions(key_cache, value_cache, KPA_F16, reference(keys, values), 1e-3)

def e4m3_to_float(codes):
    """OCP E4M3FN decoded with plain arithmetic: bias 7, no infinities, S.1111.111 is NaN."""
    c = codes.astype(np.int64)
    exponent, mantissa = (c >> 3) & 0xF, c & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9, (8 + mantissa) * 2.0 ** (exponent - 10))
    magnitude = np.where((c & 0x7F) == 0x7F, np.nan, magnitude)
    return np.where(c & 0x80, -magnitude, magnitude)


def cached_tokens(key_cache, value_cache, k_scale, v_scale):
    """Each sequence's keys and values as the fp8 cache holds them, read through the block table."""
    x = key_cache.shape[-1]
    k_seq, v_seq = [], []
    for s, n in enumerate(seq_lens):
        t = np.arange(n)
        b, o = block_tables[s, t // block], t % block
        k = key_cache[b, :, :, o, :].reshape(n, kv_heads, head)  # [t][g][d/x][x] -> [t][g][d]
        v = value_cache[b, :, :, o]  # [t][g][d]
        k_seq.append(e4m3_to_float(k) * k_scale)
        v_seq.append(e4m3_to_float(v) * v_scale)
    assert x == 16
    return k_seq, v_seq


# 8 Python threads at once (ctypes drops the GIL during the calls), none of them the thread that
# called kpa_init, each through v1, v2 and auto with its own outputs.
expected_f16 = reference(keys, values)
thread_errors = []


def caller():
    for _ in range(10):
        for name in ("v1", "v2", "auto"):
            out = np.full((seqs, heads, head), np.nan, dtype=np.float16)
            args = attention_args(key_cache, value_cache, KPA_F16)
            if name == "v2":
                sums = np.empty((seqs, heads, 4), dtype=np.float32)
                maxes = np.empty_like(sums)
                tmp = np.empty((seqs, heads, 4, head), dtype=np.float16)
                status = lib.kpa_paged_attention_v2(ptr(out), ptr(sums), ptr(maxes), ptr(tmp), 4, 32, ptr(query), *args)
            elif name == "v1":
                status = lib.kpa_paged_attention_v1(ptr(out), ptr(query), *args)
            else:
                status = lib.kpa_paged_attention(ptr(out), ptr(query), *args)
            error = np.abs(out.astype(np.float64) - expected_f16).max()
            if status != KPA_OK or not error < 1e-3:
                thread_errors.append(f"{name}: status {status}, error {error}")


threads = [threading.Thread(target=caller) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(not thread_errors, f"8 concurrent threads: {thread_errors[:3]}")

# fp8 E4M3 cache: quantised on write (each code checked against the rounded value), attention
# against the reference over the dequantised cache (f16 output tolerance) and within vLLM's fp8
# tolerance of the unquantised values on the long sequences.
k_scale, v_scale = 1.0 / 200, 1.0 / 100
key8 = np.full((num_blocks, kv_heads, head // 16, block, 16), 0x7F, dtype=np.uint8)
value8 = np.full((num_blocks, kv_heads, head, block), 0x7F, dtype=np.uint8)
status = lib.kpa_reshape_and_cache(ptr(token_keys), ptr(token_values), KPA_F16, ptr(key8), ptr(value8),
                                   KPA_FP8_E4M3, len(slots), kv_heads, head, num_blocks, block, ptr(slots),
                                   k_scale, v_scale)
check(status == KPA_OK, "reshape_and_cache fp8")
k_deq, v_deq = cached_tokens(key8, value8, k_scale, v_scale)
check(all(np.all(np.abs(kd - k.astype(np.float64)) <= np.abs(k.astype(np.float64)) / 16 + 2.0 ** -9 * k_scale)
          for kd, k in zip(k_deq, keys)), "fp8 keys within half an E4M3 step of the written values")
run_all_versions(key8, value8, KPA_FP8_E4M3, reference(k_deq, v_deq), 1e-3, k_scale=k_scale, v_scale=v_scale)
out = np.zeros((seqs, heads, head), dtype=np.float16)
lib.kpa_paged_attention(ptr(out), ptr(query), *attention_args(key8, value8, KPA_FP8_E4M3, k_scale=k_scale,
                                                              v_scale=v_scale))
long_rows = seq_lens >= 64
error = np.abs(out.astype(np.float64) - reference(keys, values))[long_rows].max()
check(error < 1e-2, f"fp8 vs unquantised values on sequences of 77 and 128 tokens: {error}")

# Errors.
out = np.zeros((seqs, heads, head), dtype=np.float16)
status = lib.kpa_paged_attention_v1(ptr(out), ptr(query), *attention_args(key_cache, value_cache, KPA_F16, kv=3))
check(status == KPA_ERR_INVALID_ARGUMENT and b"num_kv_heads" in lib.kpa_last_error(), f"bad kv heads: {status}")
status = lib.kpa_paged_attention_v1(ptr(out), ptr(query), *attention_args(key_cache, value_cache, KPA_F16, 100))
check(status == KPA_ERR_INVALID_ARGUMENT and b"exceeds max_seq_len" in lib.kpa_last_error(), f"short max: {status}")
status = lib.kpa_paged_attention_v1(ptr(out), ptr(query), *attention_args(key_cache, value_cache, KPA_BF16))
check(status == KPA_ERR_UNSUPPORTED, f"f16 query with a bf16 cache: {status}")
bad_tables = block_tables.copy()
bad_tables[2, 1] = num_blocks
args = attention_args(key_cache, value_cache, KPA_F16)
args[10] = ptr(bad_tables)
status = lib.kpa_paged_attention(ptr(out), ptr(query), *args)
check(status == KPA_ERR_INVALID_ARGUMENT and b"block_tables[2][1]" in lib.kpa_last_error(), f"bad block: {status}")

# With the index check off the same bad table is trusted: the length-0 sequence's row is not
# read, so a bad entry there is harmless and the call succeeds.
unread = block_tables.copy()
unread[1, 0] = -7  # sequence 1 is empty
args[10] = ptr(unread)
check(lib.kpa_paged_attention(ptr(out), ptr(query), *args) == KPA_OK, "unused row entries are never checked")
check(lib.kpa_set_check_indices(0) == 1, "index check on by default")
args[10] = ptr(block_tables)
check(lib.kpa_paged_attention(ptr(out), ptr(query), *args) == KPA_OK, "unchecked call")
check(np.abs(out.astype(np.float64) - reference(keys, values)).max() < 1e-3, "unchecked call result")
check(lib.kpa_set_check_indices(1) == 0, "kpa_set_check_indices returns the previous setting")

lib.kpa_finalize()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
