#pragma once
// Compile-time facts of the attention kernels that the planner must agree with: the heads-per-pass
// values each kernel path is instantiated for, and the team scratch layout of a tile.

#include <kpa/detail/kokkos_compat.hpp>

#include <array>
#include <cstddef>
#include <utility>

namespace kpa::detail {

/// Rows per pass (query heads of a GQA group x the sequence's query tokens) the host path is
/// compiled for (6: groups of 3, 5, 6 and 12 without padding to 8; 16: groups of 16, and 4 query
/// tokens of a group of 4, with one read of K/V), and the device path's (powers of two up to 8
/// keep its instantiations and registers few; more rows take several passes). The planner
/// chooses among these values and the launch instantiates exactly these.
using HostRowsPerPass = std::integer_sequence<int, 1, 2, 4, 6, 8, 16>;
using DeviceRowsPerPass = std::integer_sequence<int, 1, 2, 4, 8>;

template <int... Rows>
constexpr std::array<int, sizeof...(Rows)> values_of(std::integer_sequence<int, Rows...>) {
  return {Rows...};
}
inline constexpr auto kHostRowsPerPass = values_of(HostRowsPerPass{});
inline constexpr auto kDeviceRowsPerPass = values_of(DeviceRowsPerPass{});

/// Team scratch of one tile pass, in floats then ints:
///   q [H][D] (pre-scaled query rows), o [H][D] (running unnormalised output),
///   probs [H][CT] (the chunk's logits, then probabilities),
///   running [3][H] (running max, running sum, last merge weight of each row: device path;
///                   then each row's output factor when the pass stores),
///   block_ids [CB] (the chunk's physical blocks; -1: attended by no head of the pass).
struct TileScratchLayout {
  int heads = 0;
  int head_size = 0;
  int chunk_tokens = 0;
  int chunk_blocks = 0;

  KOKKOS_INLINE_FUNCTION TileScratchLayout(int heads_, int head_size_, int chunk_tokens_, int block_size)
      : heads(heads_), head_size(head_size_), chunk_tokens(chunk_tokens_), chunk_blocks(chunk_tokens_ / block_size) {}

  KOKKOS_INLINE_FUNCTION std::size_t q() const { return 0; }
  KOKKOS_INLINE_FUNCTION std::size_t o() const { return static_cast<std::size_t>(heads) * head_size; }
  KOKKOS_INLINE_FUNCTION std::size_t probs() const { return 2 * o(); }
  KOKKOS_INLINE_FUNCTION std::size_t running() const {
    return probs() + static_cast<std::size_t>(heads) * chunk_tokens;
  }
  KOKKOS_INLINE_FUNCTION std::size_t floats() const { return running() + 3 * static_cast<std::size_t>(heads); }
  KOKKOS_INLINE_FUNCTION std::size_t ints() const { return static_cast<std::size_t>(chunk_blocks); }
  /// Bytes to request per team: both arrays plus room for the scratch allocator's alignment.
  std::size_t bytes() const { return (floats() + ints()) * 4 + 2 * 128; }
};

}  // namespace kpa::detail
