// Test main: traps floating-point invalid operations (so a NaN born inside a kernel, e.g. from
// merging two empty softmax states, fails loudly) and brackets the tests with Kokkos. Listing the
// tests (gtest_discover_tests at build time) starts no Kokkos back end: a CUDA build lists its
// tests on a machine without a GPU, and Kokkos' warnings never pass for test names.

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cfenv>

int main(int argc, char* argv[]) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  // Before Kokkos starts its threads, so they inherit the trap.
  feenableexcept(FE_INVALID);
  Kokkos::initialize(argc, argv);
  const int result = RUN_ALL_TESTS();
  Kokkos::finalize();
  return result;
}
