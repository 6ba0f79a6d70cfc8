"""The C ABI through ctypes, as a Python framework would load it: f16 activations with an f16 and
an fp8 (E4M3) cache filled by kpa_reshape_and_cache, every attention entry point against a float64
numpy reference, and the error paths.

    python3 test_c_api.py /path/to/libkpa.so           a host build: numpy's host pointers
    python3 test_c_api.py /path/to/libkpa.so --cuda    a CUDA build: every array goes to the GPU
                                                       through torch, each call gets device pointers
    python3 test_c_api.py /path/to/libkpa.so --beside /path/to/other/libkpa.so
                                                       a self-contained libkpa (its own Kokkos inside)
                                                       with another libkpa and its Kokkos started in
                                                       the same process; both compute at the end
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
lib.kpa_set_execution.argtypes = [I, P]
lib.kpa_check_indices.argtypes = []
KPA_MEMORY_DEFAULT, KPA_MEMORY_HOST = range(2)


class Options(ctypes.Structure):
    """kpa_attention_options, field for field."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("scale", F), ("k_scale", F), ("v_scale", F), ("tp_rank", I),
                ("block_sparse", P), ("alibi_slopes", P), ("logits_soft_cap", F), ("sliding_window", I),
                ("sinks", P), ("query_start_loc", P), ("num_tokens", I64), ("lse", P), ("check_indices", I)]


lib.kpa_attention_options_init.argtypes = [ctypes.POINTER(Options)]
lib.kpa_attention_options_init.restype = None
lib.kpa_paged_attention_ex.argtypes = [P, P, I, P, P, I, I64, I64, I64, I64, I64, I64, P, I64, P, I64,
                                       ctypes.POINTER(Options)]
lib.kpa_merge_attn_states.argtypes = [P, P, P, P, P, P, I, I64, I64, I64]
for name in ("kpa_paged_attention_v1", "kpa_paged_attention_v2", "kpa_paged_attention", "kpa_reshape_and_cache",
             "kpa_set_check_indices", "kpa_check_indices", "kpa_set_execution", "kpa_paged_attention_ex", "kpa_merge_attn_states"):
    getattr(lib, name).restype = I


class DeviceCopies:
    """--cuda: ptr() hands kpa a CUDA copy of the array (kept alive, since an argument list may be
    reused); after each call the copies made for it, on this thread, are read back into their arrays."""

    def __init__(self):
        import torch
        self.torch = torch
        self.alive = []
        self.lock = threading.Lock()
        self.local = threading.local()

    def ptr(self, array):
        tensor = self.torch.from_numpy(np.ascontiguousarray(array)).cuda()
        with self.lock:
            self.alive.append(tensor)
        self.pending().append((array, tensor))
        return tensor.data_ptr()

    def pending(self):
        if not hasattr(self.local, "pending"):
            self.local.pending = []
        return self.local.pending

    def read_back(self):
        self.torch.cuda.synchronize()
        for array, tensor in self.pending():
            array[...] = tensor.cpu().numpy()
        self.pending().clear()


class CallsThenReadsBack:
    """The library, each of whose calls is followed by DeviceCopies.read_back()."""

    def __init__(self, cdll, copies):
        self.cdll, self.copies = cdll, copies

    def __getattr__(self, name):
        function = getattr(self.cdll, name)

        def call(*args):
            status = function(*args)
            self.copies.read_back()
            return status
        return call


device = DeviceCopies() if "--cuda" in sys.argv[2:] else None
if device is not None:
    lib = CallsThenReadsBack(lib, device)

passed = failed = 0


def check(condition, what):
    global passed, failed
    if condition:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {what} (last error: {lib.kpa_last_error().decode()})")


def ptr(array):
    if array is None:
        return None
    return device.ptr(array) if device is not None else array.ctypes.data_as(ctypes.c_void_p)


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
beside = None
if "--beside" in sys.argv[2:]:
    beside = ctypes.CDLL(sys.argv[sys.argv.index("--beside") + 1])
    beside.kpa_last_error.restype = ctypes.c_char_p
    beside.kpa_paged_attention_v1.argtypes = [P, P] + ATTENTION
    check(beside.kpa_init() == KPA_OK, "kpa_init of the library beside")

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

# kpa_paged_attention_ex: several query tokens per sequence (causal), a sliding window, a soft
# cap, sinks and the LSE, against a numpy float64 reference written from the README's semantics.
query_lens = np.array([1, 0, 3, 4], dtype=np.int32)
starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
tokens = int(starts[-1])
rows = rng.uniform(-1, 1, (tokens, heads, head)).astype(np.float16)
sinks = rng.uniform(-1, 2, heads).astype(np.float32)
cap, window = 0.3, 40


def variant_reference():
    out, lse = np.zeros((tokens, heads, head)), np.full((tokens, heads), -np.inf)
    for s in range(seqs):
        for i in range(query_lens[s]):
            row, position = starts[s] + i, seq_lens[s] - query_lens[s] + i
            first = max(0, position - window + 1)
            for h in range(heads):
                g = h // (heads // kv_heads)
                k = keys[s][first:position + 1, g, :].astype(np.float64)
                logits = scale * (k @ rows[row, h].astype(np.float64))
                logits = cap * np.tanh(logits / cap)
                m = max(logits.max(), sinks[h])
                p = np.exp(logits - m)
                denominator = p.sum() + np.exp(sinks[h] - m)
                out[row, h] = p @ values[s][first:position + 1, g, :].astype(np.float64) / denominator
                lse[row, h] = m + np.log(denominator)
    return out, lse


options = Options()
lib.kpa_attention_options_init(ctypes.byref(options))
check(options.struct_size == ctypes.sizeof(Options) and options.scale == 1.0 and options.check_indices == 1 and
      options.num_tokens == -1, "kpa_attention_options_init defaults")
options.scale, options.logits_soft_cap, options.sliding_window = scale, cap, window
options.sinks, options.query_start_loc, options.num_tokens = ptr(sinks), ptr(starts), tokens
lse = np.full((tokens, heads), np.nan, dtype=np.float32)
options.lse = ptr(lse)
out_ex = np.full((tokens, heads, head), np.nan, dtype=np.float16)
status = lib.kpa_paged_attention_ex(ptr(out_ex), ptr(rows), KPA_F16, ptr(key_cache), ptr(value_cache), KPA_F16, seqs,
                                    heads, kv_heads, head, num_blocks, block, ptr(block_tables), max_blocks,
                                    ptr(seq_lens), 128, ctypes.byref(options))
check(status == KPA_OK, f"kpa_paged_attention_ex status {status}")
expected_out, expected_lse = variant_reference()
check(np.abs(out_ex.astype(np.float64) - expected_out).max() < 1e-3, "kpa_paged_attention_ex output")
check(np.abs(lse.astype(np.float64) - expected_lse).max() < 1e-5, "kpa_paged_attention_ex lse")
options.struct_size = 8
status = lib.kpa_paged_attention_ex(ptr(out_ex), ptr(rows), KPA_F16, ptr(key_cache), ptr(value_cache), KPA_F16, seqs,
                                    heads, kv_heads, head, num_blocks, block, ptr(block_tables), max_blocks,
                                    ptr(seq_lens), 128, ctypes.byref(options))
check(status == KPA_ERR_INVALID_ARGUMENT and b"struct_size" in lib.kpa_last_error(), f"bad struct_size: {status}")

# kpa_merge_attn_states: the outputs of two halves of the rows' keys merge into the whole.
half_out = [np.zeros((tokens, heads, head), dtype=np.float16) for _ in range(2)]
half_lse = [np.zeros((tokens, heads), dtype=np.float32) for _ in range(2)]
for side in range(2):  # the reference over keys [0, 24) and [24, end): numpy, then rounded to f16
    for s in range(seqs):
        for i in range(query_lens[s]):
            row, position = starts[s] + i, seq_lens[s] - query_lens[s] + i
            lo, hi = (0, min(24, position + 1)) if side == 0 else (24, position + 1)
            for h in range(heads):
                g = h // (heads // kv_heads)
                if hi <= lo:
                    half_lse[side][row, h] = -np.inf
                    continue
                logits = scale * (keys[s][lo:hi, g, :].astype(np.float64) @ rows[row, h].astype(np.float64))
                p = np.exp(logits - logits.max())
                half_out[side][row, h] = p @ values[s][lo:hi, g, :].astype(np.float64) / p.sum()
                half_lse[side][row, h] = logits.max() + np.log(p.sum())
merged = np.full((tokens, heads, head), np.nan, dtype=np.float16)
merged_lse = np.full((tokens, heads), np.nan, dtype=np.float32)
status = lib.kpa_merge_attn_states(ptr(merged), ptr(merged_lse), ptr(half_out[0]), ptr(half_lse[0]), ptr(half_out[1]),
                                   ptr(half_lse[1]), KPA_F16, tokens, heads, head)
check(status == KPA_OK, f"kpa_merge_attn_states status {status}")
whole = np.zeros((tokens, heads, head))
whole_lse = np.zeros((tokens, heads))
for s in range(seqs):
    for i in range(query_lens[s]):
        row, position = starts[s] + i, seq_lens[s] - query_lens[s] + i
        for h in range(heads):
            g = h // (heads // kv_heads)
            logits = scale * (keys[s][:position + 1, g, :].astype(np.float64) @ rows[row, h].astype(np.float64))
            p = np.exp(logits - logits.max())
            whole[row, h] = p @ values[s][:position + 1, g, :].astype(np.float64) / p.sum()
            whole_lse[row, h] = logits.max() + np.log(p.sum())
check(np.abs(merged.astype(np.float64) - whole).max() < 2e-3, "merged halves equal the whole (f16 inputs)")
check(np.abs(merged_lse - whole_lse).max() < 1e-5, "merged LSE")
check(lib.kpa_merge_attn_states(ptr(merged), None, ptr(half_out[0]), ptr(half_lse[0]), ptr(half_out[1]),
                                ptr(half_lse[1]), KPA_F16, tokens, heads, head) == KPA_OK, "merge without out_lse")

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
check(lib.kpa_check_indices() == 0, "kpa_check_indices reads the setting (off)")
args[10] = ptr(block_tables)
check(lib.kpa_paged_attention(ptr(out), ptr(query), *args) == KPA_OK, "unchecked call")
check(np.abs(out.astype(np.float64) - reference(keys, values)).max() < 1e-3, "unchecked call result")
check(lib.kpa_set_check_indices(1) == 0, "kpa_set_check_indices returns the previous setting")
check(lib.kpa_check_indices() == 1, "kpa_check_indices reads the setting (on)")

# kpa_set_execution: the calling thread's calls on the host back end with host pointers (on a
# CUDA build, its OpenMP or Serial back end; on a CPU build the default), and on a CUDA build on a
# stream of the caller's, with device pointers and no wait inside the call.
raw = lib.cdll if device is not None else lib
check(raw.kpa_set_execution(7, None) == KPA_ERR_INVALID_ARGUMENT, "kpa_set_execution refuses a bad kpa_memory")
check(raw.kpa_set_execution(KPA_MEMORY_HOST, None) == KPA_OK, "kpa_set_execution(KPA_MEMORY_HOST)")
host_args = [a.ctypes.data_as(ctypes.c_void_p) if isinstance(a, np.ndarray) else a
             for a in [query, KPA_F16, key_cache, value_cache, KPA_F16, seqs, heads, kv_heads, head, num_blocks,
                       block, block_tables, max_blocks, seq_lens, 128, scale, None, 1.0, 1.0, 0, None]]
for name in ("kpa_paged_attention_v1", "kpa_paged_attention"):
    host_out = np.full((seqs, heads, head), np.nan, dtype=np.float16)
    status = getattr(raw, name)(host_out.ctypes.data_as(ctypes.c_void_p), *host_args)
    error = np.abs(host_out.astype(np.float64) - reference(keys, values)).max()
    check(status == KPA_OK and error < 1e-3, f"{name} on the host back end with host pointers: {status}, {error}")
check(raw.kpa_set_execution(KPA_MEMORY_HOST, ctypes.c_void_p(1)) == KPA_ERR_UNSUPPORTED,
      "a stream with KPA_MEMORY_HOST is refused")
if device is None:
    check(raw.kpa_set_execution(KPA_MEMORY_DEFAULT, ctypes.c_void_p(1)) == KPA_ERR_UNSUPPORTED,
          "a stream on a build without a GPU back end is refused")
else:
    torch = device.torch
    stream = torch.cuda.Stream()
    check(raw.kpa_set_execution(KPA_MEMORY_DEFAULT, ctypes.c_void_p(stream.cuda_stream)) == KPA_OK,
          "kpa_set_execution with a CUDA stream")
    out_gpu = torch.full((seqs, heads, head), float("nan"), dtype=torch.float16, device="cuda")
    device_args = [torch.from_numpy(np.ascontiguousarray(a)).cuda() if isinstance(a, np.ndarray) else a
                   for a in [query, KPA_F16, key_cache, value_cache, KPA_F16, seqs, heads, kv_heads, head,
                             num_blocks, block, block_tables, max_blocks, seq_lens, 128, scale, None, 1.0, 1.0, 0,
                             None]]
    torch.cuda.synchronize()
    raw.kpa_set_check_indices(0)
    with torch.cuda.stream(stream):
        status = raw.kpa_paged_attention_v1(out_gpu.data_ptr(), *[a.data_ptr() if torch.is_tensor(a) else a
                                                                  for a in device_args])
    raw.kpa_set_check_indices(1)
    stream.synchronize()
    error = np.abs(out_gpu.cpu().numpy().astype(np.float64) - reference(keys, values)).max()
    check(status == KPA_OK and error < 1e-3, f"kpa_paged_attention_v1 on a CUDA stream: {status}, {error}")
check(raw.kpa_set_execution(KPA_MEMORY_DEFAULT, None) == KPA_OK, "back to the default execution")

if beside is not None:
    # The other library's Kokkos ran all along beside this one's: both still compute the same step.
    for name, which in (("this library", lib), ("the library beside", beside)):
        host_out = np.full((seqs, heads, head), np.nan, dtype=np.float16)
        status = which.kpa_paged_attention_v1(host_out.ctypes.data_as(ctypes.c_void_p), *host_args)
        error = np.abs(host_out.astype(np.float64) - reference(keys, values)).max()
        check(status == KPA_OK and error < 1e-3, f"{name}, both started: {status}, {error}")
    beside.kpa_finalize()
lib.kpa_finalize()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
