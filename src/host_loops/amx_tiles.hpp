#pragma once
// The AMX tile operations the AMX host loops use (amx.hpp), as two mappings with one interface:
//   AmxTiles    the instructions (ldtilecfg, tilezero, tileloadd, tilestored, tdpbf16ps,
//               tilerelease), written as assembly so that no target attribute or compiler flag
//               is needed to build them; only CPUs with AMX-BF16, in processes the kernel granted
//               the tile state (cpu_host_isa), run them;
//   TileModel   a software model of exactly those operations, for HostIsa::AmxModel: the same
//               loops on any CPU, so a wrong tile shape, stride or accumulation fails the tests
//               on machines without AMX. It checks what the CPU would fault on (an unconfigured
//               tile, a shape tdpbf16ps does not accept) and aborts with the reason.
// Tile numbers are template arguments: the instructions encode them.

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kpa::detail::amx {

/// Palette 1's configuration, in the 64-byte layout ldtilecfg reads: for each of the 8 tiles its
/// rows (at most 16) and bytes per row (at most 64).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};

  void set(int tile, int tile_rows, int bytes_per_row) {
    rows[tile] = static_cast<std::uint8_t>(tile_rows);
    colsb[tile] = static_cast<std::uint16_t>(bytes_per_row);
  }
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

inline constexpr int kTiles = 8, kTileRows = 16, kTileRowBytes = 64;

struct AmxTiles {
  /// The code around the tiles may use AVX512-BF16: every CPU with AMX-BF16 has it
  /// (cpu_host_isa asks for both).
  static constexpr bool kAvx512Bf16 = true;
  static void configure(const TileConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }
  /// Whether the tiles are configured as `config` (sttilecfg stores zeros where none is).
  static bool configured_as(const TileConfig& config) {
    TileConfig current;
    __asm__ volatile("sttilecfg %0" : "=m"(current));
    return std::memcmp(&current, &config, sizeof config) == 0;
  }
  static void release() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  /// Row r of tile T from p + r * stride (bytes).
  template <int T>
  static void load(const void* p, std::int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void store(void* p, std::int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride), "i"(T) : "memory");
  }
  /// C += A . B: A's rows hold pairs of bf16 along k, B's row k the pairs of k for each column.
  template <int C, int A, int B>
  static void dot_bf16() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

class TileModel {
 public:
  /// The code around the modelled tiles stays AVX2, so that the model runs on any AVX2 CPU.
  static constexpr bool kAvx512Bf16 = false;
  static void configure(const TileConfig& config) {
    State& s = state();
    if (config.palette != 1 || config.start_row != 0) fail("ldtilecfg: palette 1 from row 0 expected");
    for (int t = 0; t < kTiles; ++t) {
      const bool used = config.rows[t] != 0 || config.colsb[t] != 0;
      if (used && (config.rows[t] == 0 || config.rows[t] > kTileRows || config.colsb[t] == 0 ||
                   config.colsb[t] > kTileRowBytes)) {
        fail("ldtilecfg: a tile's rows or bytes per row out of range");
      }
    }
    s.config = config;
    s.configured = true;
    std::memset(s.data, 0, sizeof s.data);  // ldtilecfg zeroes the tiles
  }
  static bool configured_as(const TileConfig& config) {
    const State& s = state();
    return s.configured && std::memcmp(&s.config, &config, sizeof config) == 0;
  }
  static void release() {
    State& s = state();
    s.configured = false;
    std::memset(s.data, 0, sizeof s.data);
  }
  template <int T>
  static void zero() {
    static_assert(T >= 0 && T < kTiles, "tmm0..tmm7");
    check_used(T, "tilezero");
    std::memset(state().data[T], 0, sizeof state().data[T]);
  }
  template <int T>
  static void load(const void* p, std::int64_t stride) {
    static_assert(T >= 0 && T < kTiles, "tmm0..tmm7");
    State& s = state();
    check_used(T, "tileloadd");
    std::memset(s.data[T], 0, sizeof s.data[T]);  // bytes past the configured shape read as zero
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(s.data[T] + r * kTileRowBytes, static_cast<const char*>(p) + r * stride, s.config.colsb[T]);
    }
  }
  template <int T>
  static void store(void* p, std::int64_t stride) {
    static_assert(T >= 0 && T < kTiles, "tmm0..tmm7");
    State& s = state();
    check_used(T, "tilestored");
    for (int r = 0; r < s.config.rows[T]; ++r) {
      std::memcpy(static_cast<char*>(p) + r * stride, s.data[T] + r * kTileRowBytes, s.config.colsb[T]);
    }
  }
  /// tdpbf16ps as the architecture defines it: for each row m of C and each column n,
  /// C[m][n] += A[m][2k] * B[k][2n], then += A[m][2k+1] * B[k][2n+1], k in order; bf16 inputs
  /// below 2^-126 in magnitude count as zero, each sum is rounded to nearest even and a result
  /// below 2^-126 is flushed to zero (the instruction ignores MXCSR).
  template <int C, int A, int B>
  static void dot_bf16() {
    static_assert(C != A && C != B && A != B, "three distinct tiles");
    static_assert(C >= 0 && C < kTiles && A >= 0 && A < kTiles && B >= 0 && B < kTiles, "tmm0..tmm7");
    State& s = state();
    check_used(C, "tdpbf16ps");
    check_used(A, "tdpbf16ps");
    check_used(B, "tdpbf16ps");
    const TileConfig& c = s.config;
    if (c.colsb[A] % 4 != 0 || c.colsb[A] / 4 != c.rows[B] || c.rows[C] != c.rows[A] || c.colsb[C] != c.colsb[B] ||
        c.colsb[C] % 4 != 0) {
      fail("tdpbf16ps: tile shapes do not match (A rows = C rows, A bytes / 4 = B rows, B bytes = C bytes)");
    }
    std::fenv_t environment;  // the instruction raises no floating-point exception (inf * 0 included)
    std::feholdexcept(&environment);
    for (int m = 0; m < c.rows[C]; ++m) {
      for (int n = 0; n < c.colsb[C] / 4; ++n) {
        float acc;
        std::memcpy(&acc, s.data[C] + m * kTileRowBytes + 4 * n, 4);
        for (int k = 0; k < c.rows[B]; ++k) {
          for (int j = 0; j < 2; ++j) {
            const float a = bf16_at(s.data[A] + m * kTileRowBytes + 4 * k + 2 * j);
            const float b = bf16_at(s.data[B] + k * kTileRowBytes + 4 * n + 2 * j);
            acc = flushed(acc + a * b);  // a * b is exact in float: 8-bit significands
          }
        }
        std::memcpy(s.data[C] + m * kTileRowBytes + 4 * n, &acc, 4);
      }
    }
    std::fesetenv(&environment);
  }

 private:
  struct State {
    TileConfig config;
    bool configured = false;
    alignas(64) unsigned char data[kTiles][kTileRows * kTileRowBytes];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  [[noreturn]] static void fail(const char* what) {
    std::fprintf(stderr, "kpa: AMX tile model: %s\n", what);
    std::abort();
  }
  static void check_used(int t, const char* op) {
    const State& s = state();
    if (!s.configured) fail("a tile instruction without ldtilecfg");
    if (s.config.rows[t] == 0) {
      std::fprintf(stderr, "kpa: AMX tile model: %s on tmm%d, which the configuration leaves unused\n", op, t);
      std::abort();
    }
  }
  static float flushed(float x) { return std::isless(std::fabs(x), 0x1p-126f) ? std::copysign(0.0f, x) : x; }
  static float bf16_at(const unsigned char* p) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    return flushed(x);
  }
};

}  // namespace kpa::detail::amx
