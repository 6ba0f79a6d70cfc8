// The streaming attention kernel's instantiations that scripts/device-gates.sh compiles for each
// gated architecture (device code only: nvcc --cubin): every rows-per-pass value of the device
// path with every cache storage type, as libkpa instantiates them.

#include <kpa/detail/launch.hpp>

namespace {

template <int H, class Cache, class T>
using StreamingKernel = kpa::detail::PartitionKernel<Kokkos::Cuda, kpa::detail::StreamingPath<H, Cache>, T, T>;

template <class Kernel>
void launch(const Kernel& kernel) {
  const typename Kernel::policy_type policy(Kokkos::Cuda(), 1, 1, 32);
  Kokkos::parallel_for(policy, kernel);
}

// Taking a launch's address instantiates it, and with it the kernel.
template <class Cache, class T>
void instantiate_rows() {
  (void)&launch<StreamingKernel<1, Cache, T>>;
  (void)&launch<StreamingKernel<2, Cache, T>>;
  (void)&launch<StreamingKernel<4, Cache, T>>;
  (void)&launch<StreamingKernel<8, Cache, T>>;
}

}  // namespace

void kpa_device_gate_kernels() {
  instantiate_rows<kpa::half, kpa::half>();
  instantiate_rows<kpa::bfloat16, kpa::bfloat16>();
  instantiate_rows<float, float>();
  instantiate_rows<kpa::fp8_e4m3, kpa::half>();
  instantiate_rows<kpa::fp8_e5m2, kpa::half>();
}
