/* The C ABI from plain C: every entry point on a small f32 batch against a double-precision
 * reference written here, the error paths, and 8 threads calling v1, v2 and the automatic entry
 * point at once. Pointers are host memory, so this test runs on builds whose default execution
 * space is a host back end. */

#define _GNU_SOURCE /* syscall */

#include <kpa/kpa.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { SEQS = 3, HEADS = 4, KV_HEADS = 2, HEAD = 32, BLOCK = 8, MAX_BLOCKS = 4, NUM_BLOCKS = 12, X = 4 };
static const int32_t seq_lens[SEQS] = {0, 5, 29};
static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    ++checks;                                              \
    if (!(cond)) {                                         \
      ++failures;                                          \
      printf("FAILED %s:%d: ", __FILE__, __LINE__);        \
      printf(__VA_ARGS__);                                 \
      printf(" (last error: %s)\n", kpa_last_error());     \
    }                                                      \
  } while (0)

static float uniform(unsigned* state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* keys / values by (sequence, token, kv head, dim); tokens of sequence s live in blocks 4s.. */
static float keys[SEQS][MAX_BLOCKS * BLOCK][KV_HEADS][HEAD], values[SEQS][MAX_BLOCKS * BLOCK][KV_HEADS][HEAD];
static float query[SEQS][HEADS][HEAD];

static void reference(double out[SEQS][HEADS][HEAD], float scale) {
  for (int s = 0; s < SEQS; ++s)
    for (int h = 0; h < HEADS; ++h) {
      const int g = h / (HEADS / KV_HEADS);
      double logits[MAX_BLOCKS * BLOCK], max = -HUGE_VAL, sum = 0.0;
      for (int d = 0; d < HEAD; ++d) out[s][h][d] = 0.0;
      if (seq_lens[s] == 0) continue;
      for (int t = 0; t < seq_lens[s]; ++t) {
        double dot = 0.0;
        for (int d = 0; d < HEAD; ++d) dot += (double)query[s][h][d] * keys[s][t][g][d];
        logits[t] = scale * dot;
        if (logits[t] > max) max = logits[t];
      }
      for (int t = 0; t < seq_lens[s]; ++t) sum += exp(logits[t] - max);
      for (int t = 0; t < seq_lens[s]; ++t)
        for (int d = 0; d < HEAD; ++d) out[s][h][d] += exp(logits[t] - max) / sum * values[s][t][g][d];
    }
}

static double max_error(const float* got, double ref[SEQS][HEADS][HEAD]) {
  double worst = 0.0;
  for (int i = 0; i < SEQS * HEADS * HEAD; ++i) {
    const double err = fabs(got[i] - (&ref[0][0][0])[i]);
    if (!(err <= worst)) worst = err; /* NaN propagates */
  }
  return worst;
}

static void* call_init(void* status) {
  *(int*)status = kpa_init();
  return NULL;
}

static void* call_finalize(void* unused) {
  (void)unused;
  kpa_finalize();
  return NULL;
}

/* What one of the concurrent callers shares with main. */
struct shared_inputs {
  const float* query;
  const float* key_cache;
  const float* value_cache;
  const int32_t* block_tables;
  float scale;
  double (*ref)[HEADS][HEAD];
};

struct caller {
  const struct shared_inputs* in;
  int failures;
  double worst;
};

/* Calls v1, v2 and auto 20 times each from its own thread, with its own outputs. */
static void* concurrent_caller(void* arg) {
  struct caller* c = (struct caller*)arg;
  const struct shared_inputs* in = c->in;
  enum { P = 4, PS = 8 };
  float out[SEQS][HEADS][HEAD], exp_sums[SEQS][HEADS][P], max_logits[SEQS][HEADS][P], tmp_out[SEQS][HEADS][P][HEAD];
  for (int round = 0; round < 20; ++round) {
    for (int version = 0; version < 3; ++version) {
      memset(out, 0xff, sizeof out);
      int status;
      if (version == 0) {
        status = kpa_paged_attention_v1(out, in->query, KPA_F32, in->key_cache, in->value_cache, KPA_F32, SEQS, HEADS,
                                        KV_HEADS, HEAD, NUM_BLOCKS, BLOCK, in->block_tables, MAX_BLOCKS, seq_lens, 29,
                                        in->scale, NULL, 1.0f, 1.0f, 0, NULL);
      } else if (version == 1) {
        status = kpa_paged_attention_v2(out, &exp_sums[0][0][0], &max_logits[0][0][0], tmp_out, P, PS, in->query,
                                        KPA_F32, in->key_cache, in->value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                        NUM_BLOCKS, BLOCK, in->block_tables, MAX_BLOCKS, seq_lens, 29, in->scale, NULL,
                                        1.0f, 1.0f, 0, NULL);
      } else {
        status = kpa_paged_attention(out, in->query, KPA_F32, in->key_cache, in->value_cache, KPA_F32, SEQS, HEADS,
                                     KV_HEADS, HEAD, NUM_BLOCKS, BLOCK, in->block_tables, MAX_BLOCKS, seq_lens, 29,
                                     in->scale, NULL, 1.0f, 1.0f, 0, NULL);
      }
      const double err = max_error(&out[0][0][0], in->ref);
      if (status != KPA_OK || !(err < 1e-5)) {
        if (c->failures++ == 0) printf("thread: version %d status %d error %g (%s)\n", version, status, err, kpa_last_error());
      }
      if (!(err <= c->worst)) c->worst = err;
    }
  }
  return NULL;
}

int main(void) {
  /* kpa_init from 4 threads at once: one initialises, all succeed. */
  {
    pthread_t threads[4];
    int status[4];
    for (int t = 0; t < 4; ++t) CHECK(pthread_create(&threads[t], NULL, call_init, &status[t]) == 0, "pthread_create");
    for (int t = 0; t < 4; ++t) {
      pthread_join(threads[t], NULL);
      CHECK(status[t] == KPA_OK, "concurrent kpa_init %d: %d", t, status[t]);
    }
  }
  CHECK(kpa_init() == KPA_OK, "kpa_init again");
  CHECK(strlen(kpa_version()) > 0, "kpa_version");
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  /* libkpa.so is built for baseline x86-64: its kernels still use AVX2, AVX-512 (with VBMI) or
   * AMX where the CPU has them (AMX: AMX-TILE, AMX-BF16 and AVX512-BF16, the tile state enabled
   * in XCR0, and the kernel's permission for this process). */
  __builtin_cpu_init();
  const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const int vbmi = avx512 && __builtin_cpu_supports("avx512vbmi");
  int amx = 0;
#if defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const int avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && ((a1 >> 5) & 1u);
  if (vbmi && avx512_bf16 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u) && ((d >> 24) & 1u)) {
    unsigned xcr0 = 0, xcr0_high = 0;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    amx = (xcr0 & 0x60000u) == 0x60000u && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  }
#endif
  const char* best = amx ? "amx" : vbmi ? "avx512vbmi" : (avx512 ? "avx512" : (avx2 ? "avx2" : "portable"));
  CHECK(strcmp(kpa_host_isa(), best) == 0, "kpa_host_isa %s, expected %s", kpa_host_isa(), best);
#endif

  unsigned state = 12345u;
  int32_t block_tables[SEQS][MAX_BLOCKS];
  int64_t slots[SEQS * MAX_BLOCKS * BLOCK];
  static float token_keys[SEQS * MAX_BLOCKS * BLOCK][KV_HEADS][HEAD], token_values[SEQS * MAX_BLOCKS * BLOCK][KV_HEADS][HEAD];
  int tokens = 0;
  for (int s = 0; s < SEQS; ++s) {
    for (int b = 0; b < MAX_BLOCKS; ++b) block_tables[s][b] = 4 * s + (MAX_BLOCKS - 1 - b); /* reversed */
    for (int t = 0; t < seq_lens[s]; ++t, ++tokens) {
      slots[tokens] = (int64_t)block_tables[s][t / BLOCK] * BLOCK + t % BLOCK;
      for (int g = 0; g < KV_HEADS; ++g)
        for (int d = 0; d < HEAD; ++d) {
          keys[s][t][g][d] = token_keys[tokens][g][d] = uniform(&state);
          values[s][t][g][d] = token_values[tokens][g][d] = uniform(&state);
        }
    }
    for (int h = 0; h < HEADS; ++h)
      for (int d = 0; d < HEAD; ++d) query[s][h][d] = uniform(&state);
  }
  static float key_cache[NUM_BLOCKS][KV_HEADS][HEAD / X][BLOCK][X], value_cache[NUM_BLOCKS][KV_HEADS][HEAD][BLOCK];
  CHECK(kpa_reshape_and_cache(token_keys, token_values, KPA_F32, key_cache, value_cache, KPA_F32, tokens, KV_HEADS,
                              HEAD, NUM_BLOCKS, BLOCK, slots, 1.0f, 1.0f) == KPA_OK,
        "kpa_reshape_and_cache");
  CHECK(key_cache[block_tables[2][3]][1][2][4][3] == keys[2][3 * BLOCK + 4][1][2 * X + 3], "key layout");
  CHECK(value_cache[block_tables[1][0]][0][7][2] == values[1][2][0][7], "value layout");

  const float scale = 1.0f / sqrtf((float)HEAD);
  static double ref[SEQS][HEADS][HEAD];
  reference(ref, scale);
  static float out[SEQS][HEADS][HEAD];
  const double tolerance = 1e-5;

  memset(out, 0xff, sizeof out); /* NaN */
  CHECK(kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                               NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                               1.0f, 0, NULL) == KPA_OK,
        "kpa_paged_attention_v1");
  CHECK(max_error(&out[0][0][0], ref) < tolerance, "v1 error %g", max_error(&out[0][0][0], ref));

  enum { PARTITIONS = 4, PARTITION = 8 };
  static float exp_sums[SEQS][HEADS][PARTITIONS], max_logits[SEQS][HEADS][PARTITIONS];
  static float tmp_out[SEQS][HEADS][PARTITIONS][HEAD];
  memset(out, 0xff, sizeof out);
  CHECK(kpa_paged_attention_v2(out, &exp_sums[0][0][0], &max_logits[0][0][0], tmp_out, PARTITIONS, PARTITION, query,
                               KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD, NUM_BLOCKS,
                               BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f, 1.0f, 0,
                               NULL) == KPA_OK,
        "kpa_paged_attention_v2");
  CHECK(max_error(&out[0][0][0], ref) < tolerance, "v2 error %g", max_error(&out[0][0][0], ref));
  CHECK(exp_sums[2][0][3] >= 1.0f && exp_sums[2][0][3] <= 5.0f, "v2 exp_sums of the 5-token last partition");

  for (int call = 0; call < 2; ++call) { /* the second call reuses the library-held workspace */
    memset(out, 0xff, sizeof out);
    CHECK(kpa_paged_attention(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                              NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                              1.0f, 0, NULL) == KPA_OK,
          "kpa_paged_attention");
    CHECK(max_error(&out[0][0][0], ref) < tolerance, "auto error %g", max_error(&out[0][0][0], ref));
  }

  /* kpa_paged_attention_ex: NULL options are the defaults (scale 1); with options the decode
   * call equals kpa_paged_attention's, and a window of 1 gives each row its own token's value. */
  {
    kpa_attention_options options;
    kpa_attention_options_init(&options);
    CHECK(options.struct_size == sizeof options && options.scale == 1.0f && options.k_scale == 1.0f &&
              options.check_indices == 1 && options.num_tokens == -1 && options.query_start_loc == NULL,
          "kpa_attention_options_init defaults");
    options.scale = scale;
    float lse[SEQS][HEADS];
    options.lse = &lse[0][0];
    memset(out, 0xff, sizeof out);
    CHECK(kpa_paged_attention_ex(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                 NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, &options) == KPA_OK,
          "kpa_paged_attention_ex");
    CHECK(max_error(&out[0][0][0], ref) < tolerance, "ex error %g", max_error(&out[0][0][0], ref));
    CHECK(lse[0][0] == -INFINITY && lse[2][3] > -1e30f && lse[2][3] < 1e30f,
          "ex lse: -inf for the empty sequence (%g), finite for the others (%g)", lse[0][0], lse[2][3]);
    options.sliding_window = 1;
    CHECK(kpa_paged_attention_ex(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                 NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, &options) == KPA_OK,
          "kpa_paged_attention_ex, window 1");
    /* token 28 of sequence 2, kv head 0: value_cache[block][0][d][slot] */
    const int32_t last_block = block_tables[2][28 / BLOCK];
    CHECK(fabsf(out[2][0][5] - value_cache[last_block][0][5][28 % BLOCK]) < 1e-6f, "window 1 attends its own token");
    options.struct_size = 4;
    CHECK(kpa_paged_attention_ex(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                 NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29,
                                 &options) == KPA_ERR_INVALID_ARGUMENT &&
              strstr(kpa_last_error(), "struct_size") != NULL,
          "a struct_size kpa does not know");
  }

  /* 8 threads at once, none of them the one that called kpa_init. */
  {
    enum { THREADS = 8 };
    const struct shared_inputs in = {&query[0][0][0], &key_cache[0][0][0][0][0], &value_cache[0][0][0][0],
                                     &block_tables[0][0], scale, ref};
    pthread_t threads[THREADS];
    struct caller callers[THREADS];
    for (int t = 0; t < THREADS; ++t) {
      callers[t].in = &in;
      callers[t].failures = 0;
      callers[t].worst = 0.0;
      CHECK(pthread_create(&threads[t], NULL, concurrent_caller, &callers[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < THREADS; ++t) {
      pthread_join(threads[t], NULL);
      CHECK(callers[t].failures == 0, "thread %d: %d failed calls, max error %g", t, callers[t].failures,
            callers[t].worst);
    }
  }

  /* kpa_copy_blocks over two layers and kpa_swap_blocks between two caches: whole blocks copied
   * bit for bit, every other block untouched, and a mapping outside the caches refused. */
  {
    static float layer_keys[2][NUM_BLOCKS][KV_HEADS][HEAD / X][BLOCK][X];
    static float layer_values[2][NUM_BLOCKS][KV_HEADS][HEAD][BLOCK];
    for (int l = 0; l < 2; ++l) {
      memcpy(layer_keys[l], key_cache, sizeof key_cache);
      memcpy(layer_values[l], value_cache, sizeof value_cache);
    }
    void* key_layers[2] = {layer_keys[0], layer_keys[1]};
    void* value_layers[2] = {layer_values[0], layer_values[1]};
    const int64_t mapping[2][2] = {{1, 0}, {NUM_BLOCKS - 1, 2}};
    CHECK(kpa_copy_blocks(key_layers, value_layers, 2, KPA_F32, NUM_BLOCKS, KV_HEADS * HEAD * BLOCK,
                          &mapping[0][0], 2) == KPA_OK, "kpa_copy_blocks: %s", kpa_last_error());
    for (int l = 0; l < 2; ++l) {
      for (int b = 0; b < NUM_BLOCKS; ++b) {
        const int from = b == 0 ? 1 : b == 2 ? NUM_BLOCKS - 1 : b;
        CHECK(memcmp(layer_keys[l][b], key_cache[from], sizeof key_cache[0]) == 0 &&
                  memcmp(layer_values[l][b], value_cache[from], sizeof value_cache[0]) == 0,
              "copy_blocks layer %d block %d holds block %d", l, b, from);
      }
    }
    const int64_t outside[1][2] = {{0, NUM_BLOCKS}};
    int status = kpa_copy_blocks(key_layers, value_layers, 2, KPA_F32, NUM_BLOCKS, KV_HEADS * HEAD * BLOCK,
                                 &outside[0][0], 1);
    CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "block_mapping[0][1]") != NULL,
          "copy_blocks destination outside the caches: %d", status);

    static float offloaded[3][KV_HEADS][HEAD][BLOCK];
    memset(offloaded, 0, sizeof offloaded);
    const int64_t swap_out[2][2] = {{5, 2}, {0, 0}};
    CHECK(kpa_swap_blocks(value_cache, KPA_MEMORY_DEFAULT, NUM_BLOCKS, offloaded, KPA_MEMORY_HOST, 3,
                          sizeof value_cache[0], &swap_out[0][0], 2) == KPA_OK, "kpa_swap_blocks: %s", kpa_last_error());
    CHECK(memcmp(offloaded[2], value_cache[5], sizeof value_cache[0]) == 0 &&
              memcmp(offloaded[0], value_cache[0], sizeof value_cache[0]) == 0 && offloaded[1][0][0][0] == 0.0f,
          "swap_blocks copies blocks 5 -> 2 and 0 -> 0 only");
    status = kpa_swap_blocks(value_cache, KPA_MEMORY_DEFAULT, NUM_BLOCKS, offloaded, (kpa_memory)7, 3,
                                     sizeof value_cache[0], &swap_out[0][0], 2);
    CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "dst_memory") != NULL,
          "swap_blocks with an unknown kpa_memory: %d", status);
  }

  /* Errors: status codes and messages naming the problem. */
  int status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, 3, HEAD,
                                      NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL,
                                      1.0f, 1.0f, 0, NULL);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "num_kv_heads") != NULL,
        "num_heads %% num_kv_heads: status %d", status);
  status = kpa_paged_attention_v1(NULL, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                                  1.0f, 0, NULL);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "out is NULL") != NULL, "NULL out: %d", status);
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 20, scale, NULL, 1.0f,
                                  1.0f, 0, NULL);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "exceeds max_seq_len") != NULL,
        "max_seq_len too small: %d", status);
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F16, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                                  1.0f, 0, NULL);
  CHECK(status == KPA_ERR_UNSUPPORTED, "f32 query with an f16 cache: %d", status);
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, 30,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                                  1.0f, 0, NULL);
  CHECK(status == KPA_ERR_UNSUPPORTED && strstr(kpa_last_error(), "head_size 30 is not supported") != NULL,
        "head size 30 (not a multiple of x = 4): %d", status);
  status = kpa_paged_attention_v1(out, query, (kpa_dtype)9, key_cache, value_cache, (kpa_dtype)9, SEQS, HEADS,
                                  KV_HEADS, HEAD, NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29,
                                  scale, NULL, 1.0f, 1.0f, 0, NULL);
  CHECK(status == KPA_ERR_UNSUPPORTED, "dtype 9: %d", status);
  slots[0] = NUM_BLOCKS * BLOCK;
  status = kpa_reshape_and_cache(token_keys, token_values, KPA_F32, key_cache, value_cache, KPA_F32, tokens, KV_HEADS,
                                 HEAD, NUM_BLOCKS, BLOCK, slots, 1.0f, 1.0f);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "slot_mapping[0]") != NULL,
        "slot out of range: %d", status);
  status = kpa_paged_attention_v2(out, &exp_sums[0][0][0], &max_logits[0][0][0], tmp_out, 2, PARTITION, query,
                                  KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD, NUM_BLOCKS,
                                  BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f, 1.0f, 0,
                                  NULL);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "max_num_partitions") != NULL,
        "too few partitions: %d", status);

  /* kpa_set_check_indices: a negative length is an error with the check, and an empty sequence
   * (output 0) to kernels that trust their indices. */
  const int32_t negative_lens[SEQS] = {-3, 5, 29};
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, negative_lens, 29, scale, NULL,
                                  1.0f, 1.0f, 0, NULL);
  CHECK(status == KPA_ERR_INVALID_ARGUMENT && strstr(kpa_last_error(), "seq_lens[0] = -3") != NULL,
        "negative length, checked: %d", status);
  CHECK(kpa_set_check_indices(0) == 1, "the check is on by default");
  memset(out, 0xff, sizeof out);
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, negative_lens, 29, scale, NULL,
                                  1.0f, 1.0f, 0, NULL);
  CHECK(status == KPA_OK && out[0][0][0] == 0.0f && out[0][3][HEAD - 1] == 0.0f, "negative length, unchecked: %d",
        status);
  CHECK(max_error(&out[0][0][0], ref) < tolerance, "unchecked v1 error %g", max_error(&out[0][0][0], ref));
  CHECK(kpa_set_check_indices(1) == 0, "kpa_set_check_indices returns the previous setting");

  /* kpa_finalize from 4 threads at once; calls after it report that Kokkos is gone. */
  {
    pthread_t threads[4];
    for (int t = 0; t < 4; ++t) CHECK(pthread_create(&threads[t], NULL, call_finalize, NULL) == 0, "pthread_create");
    for (int t = 0; t < 4; ++t) pthread_join(threads[t], NULL);
  }
  status = kpa_paged_attention_v1(out, query, KPA_F32, key_cache, value_cache, KPA_F32, SEQS, HEADS, KV_HEADS, HEAD,
                                  NUM_BLOCKS, BLOCK, &block_tables[0][0], MAX_BLOCKS, seq_lens, 29, scale, NULL, 1.0f,
                                  1.0f, 0, NULL);
  CHECK(status == KPA_ERR_RUNTIME && strstr(kpa_last_error(), "kpa_init") != NULL, "call after kpa_finalize: %d",
        status);
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures == 0 ? 0 : 1;
}
