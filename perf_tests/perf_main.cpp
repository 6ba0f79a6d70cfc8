// Shared main of the perf tests: Kokkos around Google Benchmark, with the configuration a
// reader needs to compare runs recorded in the benchmark context.

#include <kpa/kpa.hpp>

#include <benchmark/benchmark.h>

#include <sstream>
#include <string>

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    benchmark::Initialize(&argc, argv);
    std::ostringstream config;
    Kokkos::DefaultExecutionSpace().print_configuration(config, false);
    benchmark::AddCustomContext("kpa_version", kpa::version_string);
    benchmark::AddCustomContext("kpa_git_revision", KPA_GIT_REVISION);
    benchmark::AddCustomContext("kpa_arch_flags", KPA_ARCH_FLAGS);
    benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION));
    benchmark::AddCustomContext("kokkos_execution_space", Kokkos::DefaultExecutionSpace::name());
    benchmark::AddCustomContext("kokkos_concurrency", std::to_string(Kokkos::DefaultExecutionSpace().concurrency()));
    benchmark::AddCustomContext("device_profile", kpa::DeviceProfile::detect(Kokkos::DefaultExecutionSpace()).name);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  return 0;
}
