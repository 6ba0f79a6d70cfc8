#pragma once
// The operations that fill and manage a paged KV cache, as vLLM's cache ops:
//   reshape_and_cache  write new tokens' keys and values into their cache slots (fp8: quantise);
//   copy_blocks        copy whole blocks inside the caches of every layer (copy-on-write);
//   swap_blocks        copy whole blocks between two caches, possibly in different memory spaces.
// Same conventions as the attention calls: execution space first, Kokkos Views, argument checks
// (detail/validate.hpp) that throw kpa::Error naming the argument and the value, work enqueued
// on `space`.

#include <kpa/attention_params.hpp>
#include <kpa/detail/cache_storage.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/numeric_types.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace kpa {
namespace detail {

/// One token per team, its kv heads over the team's threads, their dimensions over the vector
/// lanes: key and value go to the token's slot, converted to the cache's storage type S (the
/// activation type for "auto" caches; fp8: the code of value / scale, rounded to nearest even and
/// saturated). The key cache holds x elements of a slot contiguously ([D / x][B][x] per head), so
/// the keys go x at a time; the value cache holds a slot's dimensions block_size apart.
template <class S, class KeyView, class ValueView, class KeyCacheView, class ValueCacheView, class SlotView>
struct ReshapeAndCacheKernel {
  KeyView key;
  ValueView value;
  KeyCacheView key_cache;
  ValueCacheView value_cache;
  SlotView slot_mapping;
  int num_kv_heads;
  int head_size;
  int block_size;
  float k_scale, v_scale;  ///< fp8 only

  template <class T>
  KOKKOS_INLINE_FUNCTION static auto to_cache(const T& v, float scale) {
    if constexpr (std::is_same_v<S, T>) {
      (void)scale;
      return v;  // "auto": an exact copy
    } else {
      return from_float<S>(to_float(v) / scale).bits;  // fp8: the code of value / scale
    }
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    constexpr int x = static_cast<int>(16 / sizeof(typename KeyCacheView::non_const_value_type));
    const int t = team.league_rank();
    const std::int64_t slot = slot_mapping(t);
    if (slot < 0) return;  // padding
    const std::int64_t block = slot / block_size;
    const int offset = static_cast<int>(slot % block_size);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, num_kv_heads), [&](int g) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_size / x), [&](int chunk) {
        for (int i = 0; i < x; ++i) key_cache(block, g, chunk, offset, i) = to_cache(key(t, g, chunk * x + i), k_scale);
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, head_size), [&](int d) {
        value_cache(block, g, d, offset) = to_cache(value(t, g, d), v_scale);
      });
    });
  }
};

/// Vector lanes of a reshape_and_cache team: one on host back ends, where a team is one thread
/// and its loops run in order; a warp's worth elsewhere.
template <class Space>
inline constexpr int kCacheWriteLanes = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible ? 1 : 32;

/// Copies block pair(i)'s source to its destination in one contiguous cache, one element per item.
template <class T, class MappingView>
struct CopyBlocksKernel {
  T* data;
  MappingView block_mapping;
  std::int64_t block_elems;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t pair = i / block_elems;
    const std::int64_t e = i % block_elems;
    data[block_mapping(pair, 1) * block_elems + e] = data[block_mapping(pair, 0) * block_elems + e];
  }
};

/// The block `block` of a key (rank 5), value (rank 4) or flat ([blocks][elements], rank 2)
/// cache, as a contiguous view.
template <class CacheView>
auto cache_block(const CacheView& cache, std::int64_t block) {
  if constexpr (CacheView::rank == 5) {
    return Kokkos::subview(cache, block, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  } else if constexpr (CacheView::rank == 4) {
    return Kokkos::subview(cache, block, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  } else {
    static_assert(CacheView::rank == 2, "caches are rank 5 (keys), rank 4 (values) or rank 2 (flat blocks)");
    return Kokkos::subview(cache, block, Kokkos::ALL);
  }
}

template <class Space, class CacheView, class MappingView>
void copy_blocks_of(const Space& space, const CacheView& cache, const MappingView& block_mapping) {
  static_assert(Kokkos::SpaceAccessibility<Space, typename CacheView::memory_space>::accessible,
                "caches must be accessible from the execution space");
  static_assert(std::is_same_v<typename CacheView::array_layout, Kokkos::LayoutRight>,
                "caches are LayoutRight: a block is one contiguous run of elements");
  const auto pairs = static_cast<std::int64_t>(block_mapping.extent(0));
  if (cache.extent(0) == 0 || pairs == 0) return;
  using T = typename CacheView::value_type;
  const std::int64_t block_elems = static_cast<std::int64_t>(cache.size() / cache.extent(0));
  Kokkos::parallel_for("kpa::copy_blocks",
                       Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, pairs * block_elems),
                       CopyBlocksKernel<T, MappingView>{cache.data(), block_mapping, block_elems});
}

}  // namespace detail

/// vLLM's reshape_and_cache. key / value: [num_tokens, num_kv_heads, head_size] (any row stride);
/// token t goes to slot slot_mapping[t] (block slot / block_size, offset slot % block_size);
/// a negative slot is padding and is skipped. "auto" caches (the key's element type) receive
/// exact copies; fp8 caches (std::uint8_t) receive round-to-nearest-even(value / scale),
/// saturated to the format's largest finite value. With `check_indices` a kernel checks every
/// slot first and the call waits for it; without, the call only enqueues the copy.
template <class Space, class KeyView, class ValueView, class KeyCacheView, class ValueCacheView, class SlotView>
void reshape_and_cache(const Space& space, const KeyView& key, const ValueView& value, const KeyCacheView& key_cache,
                       const ValueCacheView& value_cache, const SlotView& slot_mapping, KVCacheDType kv_cache_dtype,
                       float k_scale = 1.0f, float v_scale = 1.0f, bool check_indices = true) {
  constexpr const char* call = "kpa::reshape_and_cache";
  using T = typename KeyView::non_const_value_type;
  using C = typename KeyCacheView::non_const_value_type;
  static_assert(KeyView::rank == 3 && ValueView::rank == 3, "key and value are [num_tokens, num_kv_heads, head_size]");
  static_assert(std::is_same_v<typename ValueView::non_const_value_type, T> && detail::is_activation_type_v<T>,
                "key and value hold one of float, kpa::half, kpa::bfloat16");
  static_assert(std::is_same_v<typename ValueCacheView::non_const_value_type, C> &&
                    (std::is_same_v<C, T> || std::is_same_v<C, std::uint8_t>),
                "caches hold the key type (auto) or std::uint8_t (fp8)");
  static_assert(KeyCacheView::rank == 5 && ValueCacheView::rank == 4, "vLLM cache layouts");
  static_assert(SlotView::rank == 1 && std::is_same_v<typename SlotView::non_const_value_type, std::int64_t>,
                "slot_mapping is int64 [num_tokens]");
  static_assert(Kokkos::SpaceAccessibility<Space, typename KeyView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename ValueView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename KeyCacheView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename ValueCacheView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Space, typename SlotView::memory_space>::accessible,
                "every view must be accessible from the execution space");
  detail::check_cache_format<C>(call, kv_cache_dtype, k_scale, v_scale);
  detail::check_int_extents(call, "key", key);
  if (value.extent(0) != key.extent(0) || value.extent(1) != key.extent(1) || value.extent(2) != key.extent(2)) {
    detail::fail(call, "value extents ", detail::extents_of(value), " differ from key extents ",
                 detail::extents_of(key));
  }
  const auto num_tokens = static_cast<std::int64_t>(key.extent(0));
  const int num_kv_heads = static_cast<int>(key.extent(1));
  const int head_size = static_cast<int>(key.extent(2));
  const detail::CacheExtents cache = detail::check_cache_extents(call, key_cache, value_cache, num_kv_heads, head_size);
  if (static_cast<std::int64_t>(slot_mapping.extent(0)) != num_tokens) {
    detail::fail(call, "slot_mapping has ", slot_mapping.extent(0), " entries, expected num_tokens = ", num_tokens);
  }
  if (check_indices) {
    detail::check_slot_mapping(call, space, slot_mapping, static_cast<std::int64_t>(cache.num_blocks) * cache.block_size);
  }
  if (num_tokens == 0) return;
  detail::with_cache_storage<C>(kv_cache_dtype, [&](auto storage) {
    using S = typename decltype(storage)::type;  // T itself for "auto" caches
    using Kernel = detail::ReshapeAndCacheKernel<S, KeyView, ValueView, KeyCacheView, ValueCacheView, SlotView>;
    Kokkos::parallel_for("kpa::reshape_and_cache",
                         Kokkos::TeamPolicy<Space>(space, static_cast<int>(num_tokens), Kokkos::AUTO,
                                                   detail::kCacheWriteLanes<Space>),
                         Kernel{key, value, key_cache, value_cache, slot_mapping, num_kv_heads, head_size,
                                cache.block_size, k_scale, v_scale});
  });
}

/// vLLM's copy_blocks: for every layer l and every pair (src, dst) of block_mapping
/// ([pairs][2] int64, accessible from `space`), block dst of key_caches[l] and value_caches[l]
/// becomes a copy of block src. With `check_indices` a kernel checks the mapping first and the
/// call waits for it; without, the call only enqueues the copies.
template <class Space, class KeyCacheView, class ValueCacheView, class MappingView>
void copy_blocks(const Space& space, const std::vector<KeyCacheView>& key_caches,
                 const std::vector<ValueCacheView>& value_caches, const MappingView& block_mapping,
                 bool check_indices = true) {
  constexpr const char* call = "kpa::copy_blocks";
  static_assert(Kokkos::SpaceAccessibility<Space, typename MappingView::memory_space>::accessible,
                "block_mapping must be accessible from the execution space");
  if (key_caches.size() != value_caches.size()) {
    detail::fail(call, "key_caches has ", key_caches.size(), " layers, value_caches ", value_caches.size());
  }
  if (key_caches.empty()) return;
  std::int64_t num_blocks = key_caches[0].extent(0);
  for (std::size_t layer = 0; layer < key_caches.size(); ++layer) {
    if (value_caches[layer].extent(0) != key_caches[layer].extent(0)) {
      detail::fail(call, "value_caches[", layer, "] has ", value_caches[layer].extent(0), " blocks, key_caches[",
                   layer, "] ", key_caches[layer].extent(0));
    }
    num_blocks = std::min<std::int64_t>(num_blocks, key_caches[layer].extent(0));
  }
  if (check_indices) detail::check_block_mapping(call, space, block_mapping, num_blocks, num_blocks);
  for (std::size_t layer = 0; layer < key_caches.size(); ++layer) {
    detail::copy_blocks_of(space, key_caches[layer], block_mapping);
    detail::copy_blocks_of(space, value_caches[layer], block_mapping);
  }
}

/// vLLM's swap_blocks: for every pair (src, dst) of the host-side block_mapping ([pairs][2]
/// int64), block dst of `dst` becomes a copy of block src of `src`. The caches have one layout
/// (both keys, both values, or both flat [blocks][elements]) and element type and may live in different memory spaces (device
/// <-> host offload). Copies are enqueued on `space`.
template <class Space, class SrcCacheView, class DstCacheView, class MappingView>
void swap_blocks(const Space& space, const SrcCacheView& src, const DstCacheView& dst, const MappingView& block_mapping) {
  constexpr const char* call = "kpa::swap_blocks";
  static_assert(static_cast<int>(SrcCacheView::rank) == static_cast<int>(DstCacheView::rank),
                "src and dst caches have one rank");
  static_assert(std::is_same_v<typename SrcCacheView::non_const_value_type, typename DstCacheView::non_const_value_type>,
                "src and dst caches have one element type");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename MappingView::memory_space>::accessible,
                "block_mapping lives on the host");
  for (int r = 1; r < static_cast<int>(SrcCacheView::rank); ++r) {
    if (src.extent(r) != dst.extent(r)) {
      detail::fail(call, "src extents ", detail::extents_of(src), " and dst extents ", detail::extents_of(dst),
                   " differ beyond the block index");
    }
  }
  detail::check_block_mapping(call, Kokkos::DefaultHostExecutionSpace(), block_mapping, src.extent(0), dst.extent(0));
  for (std::size_t i = 0; i < block_mapping.extent(0); ++i) {
    Kokkos::deep_copy(space, detail::cache_block(dst, block_mapping(i, 1)), detail::cache_block(src, block_mapping(i, 0)));
  }
}

}  // namespace kpa
