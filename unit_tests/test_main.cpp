// Test main: traps floating-point invalid operations (so a NaN born inside a kernel, e.g. from
// merging two empty softmax states, fails loudly) and brackets the tests with Kokkos.

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cfenv>

int main(int argc, char* argv[]) {
  // Before Kokkos starts its threads, so they inherit the trap.
  feenableexcept(FE_INVALID);
  ::testing::InitGoogleTest(&argc, argv);
  Kokkos::initialize(argc, argv);
  const int result = RUN_ALL_TESTS();
  Kokkos::finalize();
  return result;
}
