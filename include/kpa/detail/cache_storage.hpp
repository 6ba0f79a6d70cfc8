#pragma once
// The one mapping from a cache's element type and kv_cache_dtype to the type its elements are
// read and written as.

#include <kpa/attention_params.hpp>
#include <kpa/numeric_types.hpp>

#include <cstdint>
#include <type_traits>

namespace kpa::detail {

template <class T>
struct TypeTag {
  using type = T;
};

/// Calls run(TypeTag<StorageT>{}) with the element type of a cache whose views hold CacheT: CacheT
/// itself for "auto" caches, the fp8 format named by `dtype` for std::uint8_t caches.
template <class CacheT, class Run>
void with_cache_storage(KVCacheDType dtype, Run&& run) {
  if constexpr (std::is_same_v<CacheT, std::uint8_t>) {
    if (dtype == KVCacheDType::Fp8E5M2) {
      run(TypeTag<fp8_e5m2>{});
    } else {
      run(TypeTag<fp8_e4m3>{});
    }
  } else {
    run(TypeTag<CacheT>{});
  }
}

}  // namespace kpa::detail
