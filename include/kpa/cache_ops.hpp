#pragma once
// The operations that fill and manage a paged KV cache, as vLLM's cache ops:
//   reshape_and_cache  write new tokens' keys and values into their cache slots (fp8: quantise);
//   copy_blocks        copy whole blocks inside the caches of every layer (copy-on-write);
//   swap_blocks        copy whole blocks between two caches, possibly in different memory spaces.
// Same conventions as the attention calls: execution space first, Kokkos Views, argument checks
// that throw kpa::Error naming the argument and the value, work enqueued on `space`.

#include <kpa/attention_params.hpp>
#include <kpa/detail/validate.hpp>
#include <kpa/numeric_types.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace kpa {
namespace detail {

/// Converts an activation value to what a cache of element C stores: the same value for
/// "auto" caches, the fp8 code of value / scale for std::uint8_t caches.
template <class C, class T>
KOKKOS_INLINE_FUNCTION C to_cache_element(const T& value, KVCacheDType dtype, float scale) {
  if constexpr (std::is_same_v<C, std::uint8_t>) {
    const float v = to_float(value) / scale;
    return dtype == KVCacheDType::Fp8E5M2 ? to_fp8_e5m2(v).bits : to_fp8_e4m3(v).bits;
  } else {
    (void)dtype;
    (void)scale;
    return value;
  }
}

/// Checks a [pairs][2] int64 block mapping: every source id (column 0) in [0, src_blocks), every
/// destination id (column 1) in [0, dst_blocks). Reads the mapping on the host.
template <class MappingView>
void check_block_mapping(const char* call, const MappingView& block_mapping, std::int64_t src_blocks,
                         std::int64_t dst_blocks) {
  static_assert(MappingView::rank == 2 && std::is_same_v<typename MappingView::non_const_value_type, std::int64_t>,
                "block_mapping is int64 [pairs][2]");
  if (block_mapping.extent(0) > 0 && block_mapping.extent(1) != 2) {
    fail(call, "block_mapping extents ", extents_of(block_mapping), " are not [pairs, 2]");
  }
  const auto mapping = compat::host_copy(block_mapping);
  for (std::size_t i = 0; i < mapping.extent(0); ++i) {
    for (int side = 0; side < 2; ++side) {
      const std::int64_t block = mapping(i, side);
      const std::int64_t limit = side == 0 ? src_blocks : dst_blocks;
      if (block < 0 || block >= limit) {
        fail(call, "block_mapping[", i, "][", side, "] = ", block, " is outside [0, num_blocks = ", limit, ") of the ",
             side == 0 ? "source" : "destination", " cache");
      }
    }
  }
}

/// The block `block` of a key (rank 5) or value (rank 4) cache, as a contiguous view.
template <class CacheView>
auto cache_block(const CacheView& cache, std::int64_t block) {
  if constexpr (CacheView::rank == 5) {
    return Kokkos::subview(cache, block, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  } else {
    static_assert(CacheView::rank == 4, "caches are rank 5 (keys) or rank 4 (values)");
    return Kokkos::subview(cache, block, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
  }
}

}  // namespace detail

/// vLLM's reshape_and_cache. key / value: [num_tokens, num_kv_heads, head_size] (any row stride);
/// token t goes to slot slot_mapping[t] (block slot / block_size, offset slot % block_size);
/// a negative slot is padding and is skipped. "auto" caches (the key's element type) receive
/// exact copies; fp8 caches (std::uint8_t) receive round-to-nearest-even(value / scale),
/// saturated to the format's largest finite value.
template <class Space, class KeyView, class ValueView, class KeyCacheView, class ValueCacheView, class SlotView>
void reshape_and_cache(const Space& space, const KeyView& key, const ValueView& value, const KeyCacheView& key_cache,
                       const ValueCacheView& value_cache, const SlotView& slot_mapping, KVCacheDType kv_cache_dtype,
                       float k_scale = 1.0f, float v_scale = 1.0f) {
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
  const bool byte_cache = std::is_same_v<C, std::uint8_t>;
  if (byte_cache != (kv_cache_dtype != KVCacheDType::Auto)) {
    detail::fail(call, "kv_cache_dtype ", to_string(kv_cache_dtype), " does not match a ", sizeof(C),
                 "-byte cache element");
  }
  if (byte_cache && !(k_scale > 0.0f && v_scale > 0.0f)) {
    detail::fail(call, "fp8 scales must be positive, got k_scale ", k_scale, " and v_scale ", v_scale);
  }
  const auto num_tokens = static_cast<std::int64_t>(key.extent(0));
  const int num_kv_heads = static_cast<int>(key.extent(1));
  const int head_size = static_cast<int>(key.extent(2));
  const int x = static_cast<int>(16 / sizeof(C));
  if (value.extent(0) != key.extent(0) || value.extent(1) != key.extent(1) || value.extent(2) != key.extent(2)) {
    detail::fail(call, "value extents ", detail::extents_of(value), " differ from key extents ",
                 detail::extents_of(key));
  }
  if (head_size % x != 0) {
    detail::fail<UnsupportedError>(call, "head_size ", head_size, " is not supported (need a multiple of x = ", x, ")");
  }
  if (static_cast<int>(key_cache.extent(1)) != num_kv_heads ||
      static_cast<int>(key_cache.extent(2) * key_cache.extent(4)) != head_size ||
      static_cast<int>(key_cache.extent(4)) != x) {
    detail::fail(call, "key_cache extents ", detail::extents_of(key_cache), " do not match [num_blocks, ", num_kv_heads,
                 ", head_size/x = ", head_size / x, ", block_size, x = ", x, "]");
  }
  const auto num_blocks = static_cast<std::int64_t>(key_cache.extent(0));
  const int block_size = static_cast<int>(key_cache.extent(3));
  if (static_cast<std::int64_t>(value_cache.extent(0)) != num_blocks ||
      static_cast<int>(value_cache.extent(1)) != num_kv_heads || static_cast<int>(value_cache.extent(2)) != head_size ||
      static_cast<int>(value_cache.extent(3)) != block_size) {
    detail::fail(call, "value_cache extents ", detail::extents_of(value_cache), " do not match [", num_blocks, ", ",
                 num_kv_heads, ", ", head_size, ", ", block_size, "]");
  }
  if (static_cast<std::int64_t>(slot_mapping.extent(0)) != num_tokens) {
    detail::fail(call, "slot_mapping has ", slot_mapping.extent(0), " entries, expected num_tokens = ", num_tokens);
  }
  {
    const auto slots = detail::compat::host_copy(slot_mapping);
    for (std::int64_t t = 0; t < num_tokens; ++t) {
      if (slots(t) >= num_blocks * block_size) {
        detail::fail(call, "slot_mapping[", t, "] = ", slots(t), " is outside the cache's ", num_blocks * block_size,
                     " slots");
      }
    }
  }
  const std::int64_t per_token = static_cast<std::int64_t>(num_kv_heads) * head_size;
  Kokkos::parallel_for(
      "kpa::reshape_and_cache", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, num_tokens * per_token),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t t = i / per_token;
        const std::int64_t slot = slot_mapping(t);
        if (slot < 0) return;  // padding
        const int g = static_cast<int>((i % per_token) / head_size);
        const int d = static_cast<int>(i % head_size);
        const std::int64_t block = slot / block_size;
        const int offset = static_cast<int>(slot % block_size);
        key_cache(block, g, d / x, offset, d % x) = detail::to_cache_element<C>(key(t, g, d), kv_cache_dtype, k_scale);
        value_cache(block, g, d, offset) = detail::to_cache_element<C>(value(t, g, d), kv_cache_dtype, v_scale);
      });
}

/// vLLM's copy_blocks: for every layer l and every pair (src, dst) of block_mapping
/// ([pairs][2] int64), block dst of key_caches[l] and value_caches[l] becomes a copy of block src.
template <class Space, class KeyCacheView, class ValueCacheView, class MappingView>
void copy_blocks(const Space& space, const std::vector<KeyCacheView>& key_caches,
                 const std::vector<ValueCacheView>& value_caches, const MappingView& block_mapping) {
  constexpr const char* call = "kpa::copy_blocks";
  static_assert(Kokkos::SpaceAccessibility<Space, typename MappingView::memory_space>::accessible,
                "block_mapping must be accessible from the execution space");
  if (key_caches.size() != value_caches.size()) {
    detail::fail(call, "key_caches has ", key_caches.size(), " layers, value_caches ", value_caches.size());
  }
  const auto pairs = static_cast<std::int64_t>(block_mapping.extent(0));
  if (key_caches.empty()) return;
  std::int64_t num_blocks = key_caches[0].extent(0);
  for (std::size_t layer = 0; layer < key_caches.size(); ++layer) {
    if (value_caches[layer].extent(0) != key_caches[layer].extent(0)) {
      detail::fail(call, "value_caches[", layer, "] has ", value_caches[layer].extent(0), " blocks, key_caches[", layer,
                   "] ", key_caches[layer].extent(0));
    }
    num_blocks = std::min<std::int64_t>(num_blocks, key_caches[layer].extent(0));
  }
  detail::check_block_mapping(call, block_mapping, num_blocks, num_blocks);
  auto copy = [&](const auto& cache) {
    using View = std::decay_t<decltype(cache)>;
    static_assert(Kokkos::SpaceAccessibility<Space, typename View::memory_space>::accessible,
                  "caches must be accessible from the execution space");
    static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                  "caches are LayoutRight: a block is one contiguous run of elements");
    if (cache.extent(0) == 0 || pairs == 0) return;
    auto* data = cache.data();
    const std::int64_t block_elems = static_cast<std::int64_t>(cache.size() / cache.extent(0));
    Kokkos::parallel_for(
        "kpa::copy_blocks", Kokkos::RangePolicy<Space, Kokkos::IndexType<std::int64_t>>(space, 0, pairs * block_elems),
        KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t pair = i / block_elems;
          const std::int64_t e = i % block_elems;
          data[block_mapping(pair, 1) * block_elems + e] = data[block_mapping(pair, 0) * block_elems + e];
        });
  };
  for (std::size_t layer = 0; layer < key_caches.size(); ++layer) {
    copy(key_caches[layer]);
    copy(value_caches[layer]);
  }
}

/// vLLM's swap_blocks: for every pair (src, dst) of the host-side block_mapping ([pairs][2]
/// int64), block dst of `dst` becomes a copy of block src of `src`. The caches have one layout
/// (both keys or both values) and element type and may live in different memory spaces (device
/// <-> host offload). Copies are enqueued on `space`.
template <class Space, class SrcCacheView, class DstCacheView, class MappingView>
void swap_blocks(const Space& space, const SrcCacheView& src, const DstCacheView& dst, const MappingView& block_mapping) {
  constexpr const char* call = "kpa::swap_blocks";
  static_assert(SrcCacheView::rank == DstCacheView::rank, "src and dst caches have one rank");
  static_assert(std::is_same_v<typename SrcCacheView::non_const_value_type, typename DstCacheView::non_const_value_type>,
                "src and dst caches have one element type");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename MappingView::memory_space>::accessible,
                "block_mapping lives on the host");
  for (unsigned r = 1; r < SrcCacheView::rank; ++r) {
    if (src.extent(r) != dst.extent(r)) {
      detail::fail(call, "src extents ", detail::extents_of(src), " and dst extents ", detail::extents_of(dst),
                   " differ beyond the block index");
    }
  }
  detail::check_block_mapping(call, block_mapping, src.extent(0), dst.extent(0));
  for (std::size_t i = 0; i < block_mapping.extent(0); ++i) {
    Kokkos::deep_copy(space, detail::cache_block(dst, block_mapping(i, 1)), detail::cache_block(src, block_mapping(i, 0)));
  }
}

}  // namespace kpa
