#include <kpa/attention_params.hpp>
#include <kpa/error.hpp>

#include <string>

namespace kpa {

KVCacheDType parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return KVCacheDType::Auto;
  if (name == "fp8" || name == "fp8_e4m3") return KVCacheDType::Fp8E4M3;
  if (name == "fp8_e5m2") return KVCacheDType::Fp8E5M2;
  throw Error("kpa::parse_kv_cache_dtype: unknown kv_cache_dtype '" + std::string(name) +
              "' (expected auto, fp8, fp8_e4m3 or fp8_e5m2)");
}

std::string_view to_string(KVCacheDType dtype) {
  switch (dtype) {
    case KVCacheDType::Auto: return "auto";
    case KVCacheDType::Fp8E4M3: return "fp8_e4m3";
    case KVCacheDType::Fp8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

}  // namespace kpa
