#include <kpa/kpa.hpp>

#include <gtest/gtest.h>

TEST(AttentionParams, ParsesVllmKvCacheDtypeStrings) {
  EXPECT_EQ(kpa::parse_kv_cache_dtype("auto"), kpa::KVCacheDType::Auto);
  EXPECT_EQ(kpa::parse_kv_cache_dtype("fp8"), kpa::KVCacheDType::Fp8E4M3);
  EXPECT_EQ(kpa::parse_kv_cache_dtype("fp8_e4m3"), kpa::KVCacheDType::Fp8E4M3);
  EXPECT_EQ(kpa::parse_kv_cache_dtype("fp8_e5m2"), kpa::KVCacheDType::Fp8E5M2);
  for (auto dtype : {kpa::KVCacheDType::Auto, kpa::KVCacheDType::Fp8E4M3, kpa::KVCacheDType::Fp8E5M2}) {
    EXPECT_EQ(kpa::parse_kv_cache_dtype(kpa::to_string(dtype)), dtype);
  }
}

TEST(AttentionParams, RejectsUnknownKvCacheDtype) {
  for (const char* bad : {"", "Auto", "fp16", "fp8_e4m3fn", "int8"}) {
    try {
      kpa::parse_kv_cache_dtype(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const kpa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
  static_assert(std::is_base_of_v<std::invalid_argument, kpa::Error>);
}

TEST(AttentionParams, DefaultsMatchVllm) {
  const kpa::AttentionParams params;
  EXPECT_EQ(params.scale, 1.0f);
  EXPECT_EQ(params.kv_cache_dtype, kpa::KVCacheDType::Auto);
  EXPECT_EQ(params.k_scale, 1.0f);
  EXPECT_EQ(params.v_scale, 1.0f);
  EXPECT_EQ(params.block_sparse.vert_stride, 0);
  EXPECT_EQ(params.block_sparse.block_size, 64);
  EXPECT_TRUE(params.check_indices);
}
