// libFuzzer target over the C ABI (kpa.h). Each input is decoded into one call (v1, v2, the
// automatic entry point, its _ex form with the variants, reshape_and_cache, copy_blocks or
// swap_blocks; see fuzz_block_copies for the last two) with fuzzed shapes,
// dtypes, lengths, block tables, scales, ALiBi, block-sparse parameters, soft cap, sliding window,
// sinks and the LSE output, over buffers laid out exactly as the call declares them. The only allowed outcomes are:
//   - an error status with a message, exactly when the arguments break the documented contract
//     (the oracle below is written from kpa.h and the README, apart from the library's checks);
//   - success, with every output equal to a float64 reference written here within the dtype's
//     tolerance (NaN exactly where the reference has NaN).
// Cache slots no sequence owns hold NaN, so a kernel that reads one fails. Anything else aborts.

#include <kpa/kpa.h>
#include <kpa/numeric_types.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

struct Call;
const Call* current = nullptr;  // the call under test, described by fail()
void describe(const Call& c);

[[noreturn]] void fail(const char* what, double a = 0, double b = 0) {
  std::fprintf(stderr, "kpa fuzz: %s (%g, %g); last error: %s\n", what, a, b, kpa_last_error());
  if (current != nullptr) describe(*current);
  std::abort();
}

int element_size(int dtype) { return dtype == KPA_F32 ? 4 : dtype <= KPA_BF16 ? 2 : 1; }
bool is_fp8(int dtype) { return dtype == KPA_FP8_E4M3 || dtype == KPA_FP8_E5M2; }

/// Activations and caches as bytes, read and written through kpa's own (separately tested)
/// storage conversions.
float load(const std::vector<std::uint8_t>& bytes, std::size_t i, int dtype) {
  switch (dtype) {
    case KPA_F32: { float f; std::memcpy(&f, &bytes[4 * i], 4); return f; }
    case KPA_F16: { kpa::half h; std::memcpy(&h.bits, &bytes[2 * i], 2); return kpa::to_float(h); }
    case KPA_BF16: { kpa::bfloat16 b; std::memcpy(&b.bits, &bytes[2 * i], 2); return kpa::to_float(b); }
    case KPA_FP8_E4M3: return kpa::to_float(kpa::fp8_e4m3{bytes[i]});
    default: return kpa::to_float(kpa::fp8_e5m2{bytes[i]});
  }
}

void store(std::vector<std::uint8_t>& bytes, std::size_t i, int dtype, float v) {
  switch (dtype) {
    case KPA_F32: std::memcpy(&bytes[4 * i], &v, 4); break;
    case KPA_F16: { const auto h = kpa::to_half(v); std::memcpy(&bytes[2 * i], &h.bits, 2); break; }
    case KPA_BF16: { const auto b = kpa::to_bfloat16(v); std::memcpy(&bytes[2 * i], &b.bits, 2); break; }
    case KPA_FP8_E4M3: bytes[i] = kpa::to_fp8_e4m3(v).bits; break;
    default: bytes[i] = kpa::to_fp8_e5m2(v).bits; break;
  }
}

struct Call {
  int entry;  // 0 v1, 1 v2, 2 auto, 3 reshape_and_cache, 4 auto through kpa_paged_attention_ex
  int dtype, cache_dtype;
  int64_t seqs, heads, kv_heads, head, blocks, block, columns, max_seq_len;
  std::vector<int32_t> seq_lens, tables;
  float scale, k_scale, v_scale;
  bool alibi;
  bool sparse;
  kpa_block_sparse pattern;
  int tp_rank;
  int64_t partition, partitions;  // v2
  bool check_indices;
  // kpa_paged_attention_ex (entry 4): one query token per sequence.
  bool bad_struct_size = false;
  float soft_cap = 0.0f;
  int window = 0;
  std::vector<float> sinks;  // empty: none
  bool lse = false;
};

void describe(const Call& c) {
  std::fprintf(stderr,
               "  entry %d dtype %d cache_dtype %d seqs %lld heads %lld kv_heads %lld head %lld blocks %lld block %lld "
               "columns %lld max_seq_len %lld\n  scale %g k_scale %g v_scale %g alibi %d sparse %d (local %d stride %d "
               "block %d step %d) tp_rank %d partition %lld partitions %lld check_indices %d\n  ex %d (struct_size "
               "%s) soft_cap %g window %d sinks %d lse %d\n  seq_lens",
               c.entry, c.dtype, c.cache_dtype, static_cast<long long>(c.seqs), static_cast<long long>(c.heads),
               static_cast<long long>(c.kv_heads), static_cast<long long>(c.head), static_cast<long long>(c.blocks),
               static_cast<long long>(c.block), static_cast<long long>(c.columns),
               static_cast<long long>(c.max_seq_len), c.scale, c.k_scale, c.v_scale, c.alibi, c.sparse,
               c.pattern.local_blocks, c.pattern.vert_stride, c.pattern.block_size, c.pattern.head_sliding_step,
               c.tp_rank, static_cast<long long>(c.partition), static_cast<long long>(c.partitions), c.check_indices,
               c.entry == 4, c.bad_struct_size ? "wrong" : "right", c.soft_cap, c.window, !c.sinks.empty(), c.lse);
  for (int32_t len : c.seq_lens) std::fprintf(stderr, " %d", len);
  std::fprintf(stderr, "\n  tables");
  for (int32_t id : c.tables) std::fprintf(stderr, " %d", id);
  std::fprintf(stderr, "\n");
}

/// The contract, from kpa.h and the README: whether `c` must succeed.
bool valid(const Call& c) {
  if (c.dtype < KPA_F32 || c.dtype > KPA_BF16) return false;
  if (c.cache_dtype != c.dtype && !is_fp8(c.cache_dtype)) return false;
  const int x = 16 / element_size(c.cache_dtype);
  if (c.block < 1 || c.head < 1 || c.head % x != 0) return false;
  if (is_fp8(c.cache_dtype) && !(c.k_scale > 0 && c.v_scale > 0)) return false;
  if (c.kv_heads < 1) return false;
  if (c.entry == 3) return true;  // reshape_and_cache: slots are checked by the caller below
  if (c.heads < 1 || c.heads % c.kv_heads != 0 || c.head > 512 || c.max_seq_len < 0) return false;
  for (int64_t s = 0; s < c.seqs; ++s) {
    const int32_t len = c.seq_lens[s];
    if (len < 0 || len > c.max_seq_len || len > c.columns * c.block) return false;
    for (int64_t b = 0; b < (len + c.block - 1) / c.block; ++b) {
      const int32_t id = c.tables[s * c.columns + b];
      if (id < 0 || id >= c.blocks) return false;
    }
  }
  if (c.sparse && c.pattern.vert_stride > 1) {
    if (c.pattern.block_size <= 0 || c.pattern.block_size % c.block != 0) return false;
    if (c.pattern.local_blocks < 0 || c.tp_rank < 0) return false;
  }
  if (c.entry == 1) {
    if (c.partition < 1 || c.partition % c.block != 0) return false;
    if (c.partitions < (c.max_seq_len + c.partition - 1) / c.partition) return false;
  }
  if (c.entry == 4 && (c.bad_struct_size || !(std::isfinite(c.soft_cap) && c.soft_cap >= 0) || c.window < 0)) return false;
  return true;
}

/// vLLM's block-sparse rule (SPEC section 4): whether head h of sequence s attends token t.
bool attends(const Call& c, int64_t s, int64_t h, int64_t t) {
  if (!c.sparse || c.pattern.vert_stride <= 1) return true;
  const int64_t q_bs = (c.seq_lens[s] - 1) / c.pattern.block_size;
  const int64_t k_bs = (t / c.block) * c.block / c.pattern.block_size;
  const int64_t g = h / (c.heads / c.kv_heads);
  const int64_t step = c.pattern.head_sliding_step;
  const int64_t offset = step >= 0 ? (c.tp_rank * c.heads + h) * step + 1 : (c.tp_rank * c.kv_heads + g) * -step + 1;
  return (k_bs + offset) % c.pattern.vert_stride == 0 || k_bs > q_bs - c.pattern.local_blocks;
}

void check_attention(const Call& c, const std::vector<std::uint8_t>& query, const std::vector<std::uint8_t>& keys,
                     const std::vector<std::uint8_t>& values, const std::vector<float>& slopes,
                     const std::vector<std::uint8_t>& out, const std::vector<float>& lse) {
  const int x = 16 / element_size(c.cache_dtype);
  const double k_scale = is_fp8(c.cache_dtype) ? c.k_scale : 1.0, v_scale = is_fp8(c.cache_dtype) ? c.v_scale : 1.0;
  const double tolerance = c.dtype == KPA_F32 ? 1e-4 : c.dtype == KPA_F16 ? 3e-3 : 2e-2;
  for (int64_t s = 0; s < c.seqs; ++s) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t g = h / (c.heads / c.kv_heads), len = c.seq_lens[s];
      std::vector<double> logits(len, -HUGE_VAL), o(c.head, 0.0);
      double m = -HUGE_VAL, sum = 0;
      for (int64_t t = 0; t < len; ++t) {
        if (!attends(c, s, h, t)) continue;
        if (c.window > 0 && t <= len - 1 - c.window) continue;  // the decode row is at len - 1
        const int64_t block = c.tables[s * c.columns + t / c.block], slot = t % c.block;
        double dot = 0;
        for (int64_t d = 0; d < c.head; ++d) {
          const std::size_t k = (((block * c.kv_heads + g) * (c.head / x) + d / x) * c.block + slot) * x + d % x;
          dot += static_cast<double>(load(query, (s * c.heads + h) * c.head + d, c.dtype)) *
                 load(keys, k, c.cache_dtype) * k_scale;
        }
        double logit = c.scale * dot;
        if (c.soft_cap > 0) logit = c.soft_cap * std::tanh(logit / c.soft_cap);  // before ALiBi
        logits[t] = logit + (c.alibi ? slopes[h] * static_cast<double>(t - len + 1) : 0.0);
        m = std::fmax(m, logits[t]);
      }
      if (!c.sinks.empty()) m = std::fmax(m, c.sinks[h]);
      for (int64_t t = 0; t < len; ++t) {
        if (logits[t] == -HUGE_VAL) continue;
        const int64_t block = c.tables[s * c.columns + t / c.block], slot = t % c.block;
        const double w = std::exp(logits[t] - m);
        sum += w;
        for (int64_t d = 0; d < c.head; ++d) {
          o[d] += w * load(values, ((block * c.kv_heads + g) * c.head + d) * c.block + slot, c.cache_dtype) * v_scale;
        }
      }
      if (!c.sinks.empty()) sum += std::exp(c.sinks[h] - m);  // the sink joins the denominator only
      if (c.lse) {
        const double ref = sum == 0 ? -HUGE_VAL : m + std::log(sum);
        const double got = lse[s * c.heads + h];
        if (std::isnan(ref) != std::isnan(got)) fail("LSE NaN differs from the reference", got, ref);
        if (!std::isnan(ref) && !(got == ref || std::fabs(got - ref) <= 1e-3 * (1 + std::fabs(ref)))) {
          fail("LSE differs from the reference", got, ref);
        }
      }
      for (int64_t d = 0; d < c.head; ++d) {
        const double ref = sum == 0 ? 0.0 : o[d] / sum;
        const double got = load(out, (s * c.heads + h) * c.head + d, c.dtype);
        if (std::isnan(ref) != std::isnan(got)) fail("NaN differs from the reference", got, ref);
        if (!std::isnan(ref) && !(std::fabs(got - ref) <= tolerance * (1 + std::fabs(ref)))) {
          fail("output differs from the reference", got, ref);
        }
      }
    }
  }
}

/// kpa_copy_blocks (swap false) and kpa_swap_blocks (swap true) with fuzzed layer and block
/// counts, block sizes, dtype or memory kinds, NULL pointers and mappings over random bytes. The
/// contract (kpa.h and the C ABI's checks): counts >= 0, a block size >= 1, a known dtype or
/// memory kind, no NULL pointer where there is something to read, every mapping entry inside its
/// cache; copy_blocks with no layers has nothing to copy and succeeds without reading the mapping.
/// On success every destination block is its source block bit for bit and every other byte is
/// unchanged (when some destination is another pair's source, or two pairs share a destination,
/// the order is unspecified: then only the bytes outside the destinations are compared); on an
/// error nothing changed.
void fuzz_block_copies(FuzzedDataProvider& in, bool swap) {
  const int64_t layers = swap ? 1 : in.ConsumeIntegralInRange<int64_t>(-1, 3);
  const int dtype = in.ConsumeIntegralInRange(0, 7) == 0 ? in.ConsumeIntegralInRange(-1, 6) : in.ConsumeIntegralInRange(0, 4);
  const int64_t src_blocks = in.ConsumeIntegralInRange<int64_t>(-1, 12);
  const int64_t dst_blocks = swap ? in.ConsumeIntegralInRange<int64_t>(-1, 12) : src_blocks;
  const int64_t block_elems = in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegralInRange<int64_t>(-2, 0)
                                                                     : in.ConsumeIntegralInRange<int64_t>(1, 40);
  const int64_t pairs = in.ConsumeIntegralInRange<int64_t>(-1, 6);
  auto memory_kind = [&] {
    return in.ConsumeIntegralInRange(0, 7) == 0 ? in.ConsumeIntegralInRange(-1, 3) : in.ConsumeIntegralInRange(0, 1);
  };
  const int src_memory = swap ? memory_kind() : 0, dst_memory = swap ? memory_kind() : 0;
  const int null_at = in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegralInRange(0, 3) : -1;
  std::vector<int64_t> mapping(std::max<int64_t>(pairs, 0) * 2);
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    const int64_t blocks = i % 2 == 0 ? src_blocks : dst_blocks;
    mapping[i] = in.ConsumeIntegralInRange(0, 15) == 0 ? in.ConsumeIntegralInRange<int64_t>(-2, blocks + 1)
                                                        : in.ConsumeIntegralInRange<int64_t>(0, std::max<int64_t>(blocks - 1, 0));
  }

  const int64_t bytes_per_block = swap ? std::max<int64_t>(block_elems, 0)
                                       : std::max<int64_t>(block_elems, 0) * (dtype >= 0 && dtype <= 4 ? element_size(dtype) : 1);
  const int64_t caches = swap ? 2 : 2 * std::max<int64_t>(layers, 0);  // swap: src, dst; copy: keys, values per layer
  std::vector<std::vector<std::uint8_t>> buffers(caches);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  for (int64_t b = 0; b < caches; ++b) {
    const int64_t blocks = swap && b == 1 ? dst_blocks : src_blocks;
    buffers[b].resize(std::max<int64_t>(blocks, 0) * bytes_per_block + 1);  // never empty: data() is not NULL
    for (std::uint8_t& byte : buffers[b]) byte = static_cast<std::uint8_t>(rng());
  }
  const std::vector<std::vector<std::uint8_t>> before = buffers;

  bool in_range = true;
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    in_range = in_range && mapping[i] >= 0 && mapping[i] < (i % 2 == 0 ? src_blocks : dst_blocks);
  }
  int status;
  bool expect_ok;
  if (swap) {
    const void* src = null_at == 0 ? nullptr : buffers[0].data();
    void* dst = null_at == 1 ? nullptr : buffers[1].data();
    const int64_t* map = null_at == 2 ? nullptr : mapping.data();
    expect_ok = src_blocks >= 0 && dst_blocks >= 0 && block_elems >= 1 && pairs >= 0 && src_memory >= 0 &&
                src_memory <= 1 && dst_memory >= 0 && dst_memory <= 1 && (src != nullptr || src_blocks == 0) &&
                (dst != nullptr || dst_blocks == 0) && (map != nullptr || pairs == 0) && in_range;
    status = kpa_swap_blocks(src, static_cast<kpa_memory>(src_memory), src_blocks, dst, static_cast<kpa_memory>(dst_memory),
                             dst_blocks, block_elems, map, pairs);
  } else {
    std::vector<void*> keys, values;
    for (int64_t l = 0; l < std::max<int64_t>(layers, 0); ++l) {
      keys.push_back(buffers[2 * l].data());
      values.push_back(buffers[2 * l + 1].data());
    }
    if (null_at == 3 && layers > 0) values.back() = nullptr;
    const bool layer_null = null_at == 3 && layers > 0;
    void* const* key_list = null_at == 0 || keys.empty() ? nullptr : keys.data();
    void* const* value_list = null_at == 1 || values.empty() ? nullptr : values.data();
    const int64_t* map = null_at == 2 ? nullptr : mapping.data();
    expect_ok = layers >= 0 && src_blocks >= 0 && block_elems >= 1 && pairs >= 0 && dtype >= 0 && dtype <= 4 &&
                (map != nullptr || pairs == 0) &&
                (layers == 0 || (key_list != nullptr && value_list != nullptr && (!layer_null || src_blocks == 0) &&
                                 in_range));
    status = kpa_copy_blocks(key_list, value_list, layers, static_cast<kpa_dtype>(dtype), src_blocks, block_elems, map,
                             pairs);
  }
  if ((status == KPA_OK) != expect_ok) {
    std::fprintf(stderr, "  %s layers %lld dtype %d blocks %lld -> %lld elems %lld pairs %lld memory %d -> %d null %d\n",
                 swap ? "swap_blocks" : "copy_blocks", static_cast<long long>(layers), dtype,
                 static_cast<long long>(src_blocks), static_cast<long long>(dst_blocks),
                 static_cast<long long>(block_elems), static_cast<long long>(pairs), src_memory, dst_memory, null_at);
    fail("block copy status against the contract", status, expect_ok);
  }
  if (status != KPA_OK) {
    if (kpa_last_error()[0] == '\0') fail("an error without a message");
    if (buffers != before) fail("a failed block copy changed a cache");
    return;
  }
  // The expected caches: each destination block from the source's bytes before the call.
  std::vector<std::vector<std::uint8_t>> expected = before;
  std::vector<char> written(std::max<int64_t>(dst_blocks, 0), 0);
  bool ordered = true;  // no destination is another pair's source or another pair's destination
  for (int64_t i = 0; i < std::max<int64_t>(pairs, 0) && layers != 0; ++i) {
    const int64_t dst = mapping[2 * i + 1];
    ordered = ordered && !written[dst];
    written[dst] = 1;
    for (int64_t j = 0; j < pairs && !swap; ++j) ordered = ordered && (j == i || mapping[2 * j] != dst);
  }
  for (int64_t b = swap ? 1 : 0; b < caches; b += swap ? 2 : 1) {
    const std::vector<std::uint8_t>& source = swap ? before[0] : before[b];
    for (int64_t i = 0; i < std::max<int64_t>(pairs, 0) && layers != 0; ++i) {
      std::memcpy(&expected[b][mapping[2 * i + 1] * bytes_per_block], &source[mapping[2 * i] * bytes_per_block],
                  bytes_per_block);
    }
    for (int64_t block = 0; block < (swap ? dst_blocks : src_blocks); ++block) {
      if (!ordered && written[block]) continue;
      if (std::memcmp(&buffers[b][block * bytes_per_block], &expected[b][block * bytes_per_block], bytes_per_block) != 0)
        fail("a block after a block copy", static_cast<double>(b), static_cast<double>(block));
    }
  }
  if (swap && buffers[0] != before[0]) fail("swap_blocks changed its source");
  for (int64_t b = 0; b < caches; ++b) {
    if (buffers[b].back() != before[b].back()) fail("a byte past a cache", static_cast<double>(b));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (kpa_init() != KPA_OK) fail("kpa_init");
  std::atexit(kpa_finalize);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  // Every input starts with the index check on: an input may end with it off, and the calls
  // below count on it wherever they pass bad indices.
  kpa_set_check_indices(1);
  Call c;
  const int entry = in.ConsumeIntegralInRange(0, 6);
  if (entry >= 5) {  // the block copies share nothing with the attention calls below
    fuzz_block_copies(in, entry == 6);
    return 0;
  }
  c.entry = entry;
  bool sinks = false;
  if (c.entry == 4) {  // the variants first: short inputs reach them too
    c.bad_struct_size = in.ConsumeIntegralInRange(0, 15) == 15;
    const float caps[] = {0.0f, 0.0f, 1.0f, 5.0f, 30.0f, -1.0f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
    c.soft_cap = in.ConsumeBool() ? in.ConsumeFloatingPointInRange(0.05f, 50.0f) : in.PickValueInArray(caps);
    c.window = in.ConsumeIntegralInRange(0, 3) == 3 ? in.ConsumeIntegralInRange(-2, 40) : 0;
    sinks = in.ConsumeBool();
    c.lse = in.ConsumeBool();
  }
  c.dtype = in.ConsumeIntegralInRange(0, 3);  // 3 is not an activation type
  c.cache_dtype = in.ConsumeBool() ? c.dtype : in.ConsumeIntegralInRange(0, 5);
  c.seqs = in.ConsumeIntegralInRange(0, 4);
  c.kv_heads = in.ConsumeIntegralInRange(0, 3);
  c.heads = c.kv_heads * in.ConsumeIntegralInRange(1, 4) + (in.ConsumeIntegralInRange(0, 7) == 0 ? 1 : 0);
  static constexpr int head_sizes[] = {16, 32, 48, 64, 80, 96, 128, 256, 4, 8, 12, 30, 520, 0};
  c.head = in.PickValueInArray(head_sizes);
  static constexpr int block_sizes[] = {8, 16, 32, 1, 3, 4, 0};
  c.block = in.PickValueInArray(block_sizes);
  c.blocks = in.ConsumeIntegralInRange(0, 24);
  c.columns = in.ConsumeIntegralInRange(0, 6);
  const int64_t capacity = c.columns * std::max<int64_t>(c.block, 0);
  int32_t longest = 0;
  for (int64_t s = 0; s < c.seqs; ++s) {
    const int32_t len = in.ConsumeIntegralInRange<int32_t>(0, 15) == 0 ? in.ConsumeIntegralInRange<int32_t>(-2, capacity + 3)
                                                                        : in.ConsumeIntegralInRange<int32_t>(0, capacity);
    c.seq_lens.push_back(len);
    longest = std::max(longest, len);
  }
  for (int64_t i = 0; i < c.seqs * c.columns; ++i) {
    c.tables.push_back(in.ConsumeIntegralInRange<int32_t>(0, 15) == 0 ? in.ConsumeIntegralInRange<int32_t>(-3, c.blocks + 2)
                                                                       : in.ConsumeIntegralInRange<int32_t>(0, std::max<int64_t>(c.blocks - 1, 0)));
  }
  c.max_seq_len = longest + (in.ConsumeIntegralInRange(0, 7) == 0 ? in.ConsumeIntegralInRange(-3, 2) : in.ConsumeIntegralInRange(0, 40));
  c.scale = in.ConsumeFloatingPointInRange(-1.0f, 1.0f);
  const float scales[] = {1.0f, 0.01f, 0.1f, 0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
  c.k_scale = in.ConsumeIntegralInRange(0, 3) ? in.ConsumeFloatingPointInRange(0.005f, 0.5f) : in.PickValueInArray(scales);
  c.v_scale = in.ConsumeIntegralInRange(0, 3) ? in.ConsumeFloatingPointInRange(0.005f, 0.5f) : in.PickValueInArray(scales);
  c.alibi = in.ConsumeBool();
  c.sparse = in.ConsumeIntegralInRange(0, 3) == 0;
  c.pattern.local_blocks = in.ConsumeIntegralInRange(-1, 3);
  c.pattern.vert_stride = in.ConsumeIntegralInRange(0, 6);
  c.pattern.block_size = std::max<int64_t>(c.block, 1) * in.ConsumeIntegralInRange(0, 4) + (in.ConsumeIntegralInRange(0, 7) == 0 ? 1 : 0);
  c.pattern.head_sliding_step = in.ConsumeIntegralInRange(-2, 2);
  c.tp_rank = in.ConsumeIntegralInRange(-1, 2);
  c.partition = std::max<int64_t>(c.block, 1) * in.ConsumeIntegralInRange(0, 8) + (in.ConsumeIntegralInRange(0, 7) == 0 ? 1 : 0);
  const int64_t needed = c.partition > 0 ? (c.max_seq_len + c.partition - 1) / c.partition : 1;
  c.partitions = std::max<int64_t>(0, needed + (in.ConsumeIntegralInRange(0, 7) == 0 ? -1 : in.ConsumeIntegralInRange(0, 1)));
  c.check_indices = in.ConsumeIntegralInRange(0, 3) != 0;
  current = &c;
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  if (sinks) {
    c.sinks.resize(std::max<int64_t>(c.heads, 0));
    for (float& sink : c.sinks) sink = 3.0f * uniform(rng);
  }

  const int cache = element_size(c.cache_dtype);
  const int x = 16 / cache;
  const int64_t kv_elems = std::max<int64_t>(c.blocks * c.kv_heads * c.head * c.block, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Caches: NaN everywhere (slots no sequence owns), then random values in the owned slots.
  // Four bytes an element whatever the declared types: a call the contract refuses must fail
  // before it touches memory, but if it wrongly went ahead it must not leave the buffers.
  std::vector<std::uint8_t> keys(kv_elems * 4), values(kv_elems * 4);
  const bool fp8 = is_fp8(c.cache_dtype);
  const int cache_type = fp8 || c.cache_dtype == c.dtype ? c.cache_dtype : KPA_F32;
  for (int64_t i = 0; i < kv_elems; ++i) {
    store(keys, i, cache_type, nan);
    store(values, i, cache_type, nan);
  }
  // Slots some sequence owns, as the tables say (a block two sequences share is owned by both).
  std::vector<char> owned(std::max<int64_t>(c.blocks * c.block, 0), 0);
  for (int64_t s = 0; s < c.seqs; ++s)
    for (int64_t b = 0; b < c.columns; ++b)
      for (int64_t slot = 0; slot < c.block && b * c.block + slot < c.seq_lens[s]; ++slot) {
        const int32_t block = c.tables[s * c.columns + b];
        if (block >= 0 && block < c.blocks) owned[block * c.block + slot] = 1;
      }
  // Element i's block is i / (kv_heads * head * block) in both layouts; its slot is i % block for
  // values ([..][head][block]) and (i / x) % block for keys ([..][head/x][block][x]).
  const float ks = fp8 ? c.k_scale : 1.0f, vs = fp8 ? c.v_scale : 1.0f;
  for (int64_t i = 0; i < kv_elems; ++i) {
    const int64_t block = i / (c.kv_heads * c.head * c.block);
    if (owned[block * c.block + (i / x) % c.block]) store(keys, i, cache_type, fp8 ? uniform(rng) / ks : uniform(rng));
    if (owned[block * c.block + i % c.block]) store(values, i, cache_type, fp8 ? uniform(rng) / vs : uniform(rng));
  }
  const int64_t q_elems = std::max<int64_t>(c.seqs * c.heads * c.head, 0);
  std::vector<std::uint8_t> query(q_elems * 4), out(q_elems * 4, 0xff);
  const int act_type = c.dtype >= KPA_F32 && c.dtype <= KPA_BF16 ? c.dtype : KPA_F32;
  for (int64_t i = 0; i < q_elems; ++i) store(query, i, act_type, uniform(rng));
  std::vector<float> slopes(std::max<int64_t>(c.heads, 0));
  for (float& a : slopes) a = uniform(rng) * 0.5f;

  kpa_set_check_indices(1);
  const bool expect_ok = valid(c);
  if (!c.check_indices && expect_ok) kpa_set_check_indices(0);  // unchecked calls only with valid tables
  int status = KPA_OK;
  const kpa_block_sparse* sparse = c.sparse ? &c.pattern : nullptr;
  const float* alibi = c.alibi ? slopes.data() : nullptr;
  std::vector<float> lse(std::max<int64_t>(c.seqs * c.heads, 0) + 1, 12345.0f);
  if (c.entry == 0) {
    status = kpa_paged_attention_v1(out.data(), query.data(), static_cast<kpa_dtype>(c.dtype), keys.data(), values.data(),
                                    static_cast<kpa_dtype>(c.cache_dtype), c.seqs, c.heads, c.kv_heads, c.head, c.blocks,
                                    c.block, c.tables.data(), c.columns, c.seq_lens.data(), c.max_seq_len, c.scale, alibi,
                                    c.k_scale, c.v_scale, c.tp_rank, sparse);
  } else if (c.entry == 1) {
    const int64_t rows = std::max<int64_t>(c.seqs * c.heads * c.partitions, 0);
    std::vector<float> sums(rows + 1), maxes(rows + 1);
    std::vector<std::uint8_t> tmp((rows * std::max<int64_t>(c.head, 0) + 1) * 4);
    status = kpa_paged_attention_v2(out.data(), sums.data(), maxes.data(), tmp.data(), c.partitions, c.partition,
                                    query.data(), static_cast<kpa_dtype>(c.dtype), keys.data(), values.data(),
                                    static_cast<kpa_dtype>(c.cache_dtype), c.seqs, c.heads, c.kv_heads, c.head, c.blocks,
                                    c.block, c.tables.data(), c.columns, c.seq_lens.data(), c.max_seq_len, c.scale, alibi,
                                    c.k_scale, c.v_scale, c.tp_rank, sparse);
  } else if (c.entry == 4) {
    kpa_attention_options options;
    kpa_attention_options_init(&options);
    if (c.bad_struct_size) options.struct_size -= 8;
    options.scale = c.scale;
    options.k_scale = c.k_scale;
    options.v_scale = c.v_scale;
    options.tp_rank = c.tp_rank;
    options.block_sparse = sparse;
    options.alibi_slopes = alibi;
    options.logits_soft_cap = c.soft_cap;
    options.sliding_window = c.window;
    options.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
    options.lse = c.lse ? lse.data() : nullptr;
    options.check_indices = c.check_indices || !expect_ok ? 1 : 0;
    status = kpa_paged_attention_ex(out.data(), query.data(), static_cast<kpa_dtype>(c.dtype), keys.data(),
                                    values.data(), static_cast<kpa_dtype>(c.cache_dtype), c.seqs, c.heads, c.kv_heads,
                                    c.head, c.blocks, c.block, c.tables.data(), c.columns, c.seq_lens.data(),
                                    c.max_seq_len, &options);
  } else if (c.entry == 2) {
    status = kpa_paged_attention(out.data(), query.data(), static_cast<kpa_dtype>(c.dtype), keys.data(), values.data(),
                                 static_cast<kpa_dtype>(c.cache_dtype), c.seqs, c.heads, c.kv_heads, c.head, c.blocks,
                                 c.block, c.tables.data(), c.columns, c.seq_lens.data(), c.max_seq_len, c.scale, alibi,
                                 c.k_scale, c.v_scale, c.tp_rank, sparse);
  } else {
    // reshape_and_cache: one token per sequence slot, some slots padding (-1), some out of range.
    const int64_t tokens = c.seqs;
    std::vector<int64_t> slots;
    bool slots_valid = true;
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t slot = in.ConsumeIntegralInRange<int64_t>(-1, c.blocks * std::max<int64_t>(c.block, 0));
      slots_valid = slots_valid && slot < c.blocks * c.block;
      slots.push_back(slot);
    }
    const int64_t per_token = std::max<int64_t>(c.kv_heads * c.head, 0);
    std::vector<std::uint8_t> k(tokens * per_token * 4), v(k.size());
    for (int64_t i = 0; i < tokens * per_token; ++i) {
      store(k, i, act_type, uniform(rng));
      store(v, i, act_type, uniform(rng));
    }
    const std::vector<std::uint8_t> keys_before = keys;
    status = kpa_reshape_and_cache(k.data(), v.data(), static_cast<kpa_dtype>(c.dtype), keys.data(), values.data(),
                                   static_cast<kpa_dtype>(c.cache_dtype), tokens, c.kv_heads, c.head, c.blocks, c.block,
                                   slots.data(), c.k_scale, c.v_scale);
    const bool ok = expect_ok && slots_valid;
    if ((status == KPA_OK) != ok) fail("reshape_and_cache status against the contract", status, ok);
    if (status != KPA_OK) {
      if (kpa_last_error()[0] == '\0') fail("an error without a message");
      if (keys != keys_before) fail("a failed reshape_and_cache changed the cache");
      return 0;
    }
    for (int64_t t = 0; t < tokens; ++t) {  // each written element is the conversion of its input
      if (slots[t] < 0) continue;
      const int64_t block = slots[t] / c.block, offset = slots[t] % c.block;
      for (int64_t g = 0; g < c.kv_heads; ++g)
        for (int64_t d = 0; d < c.head; ++d) {
          const float in_k = load(k, (t * c.kv_heads + g) * c.head + d, c.dtype);
          std::vector<std::uint8_t> expected(cache);
          store(expected, 0, c.cache_dtype, fp8 ? in_k / c.k_scale : in_k);
          const std::size_t at = (((block * c.kv_heads + g) * (c.head / x) + d / x) * c.block + offset) * x + d % x;
          // A later token of the batch may own the same slot: the last write wins; skip those.
          bool overwritten = false;
          for (int64_t u = t + 1; u < tokens; ++u) overwritten = overwritten || slots[u] == slots[t];
          if (!overwritten && std::memcmp(&keys[at * cache], expected.data(), cache) != 0) fail("a written key");
        }
    }
    return 0;
  }
  kpa_set_check_indices(1);
  if ((status == KPA_OK) != expect_ok) fail("status against the contract", status, expect_ok);
  if (status != KPA_OK) {
    if (kpa_last_error()[0] == '\0') fail("an error without a message");
    return 0;
  }
  check_attention(c, query, keys, values, slopes, out, lse);
  return 0;
}
