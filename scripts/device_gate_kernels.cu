// The device-path attention kernel's instantiations that scripts/device-gates.sh compiles for each
// gated architecture (device code only: nvcc --cubin): every rows-per-pass value of the device
// path with every cache storage type, as libkpa instantiates them.

#include <kpa/detail/launch.hpp>

namespace {

template <int H, class Cache, class T>
using DeviceKernel = kpa::detail::PartitionKernel<Kokkos::Cuda, kpa::detail::DevicePath<H, Cache>, T, T>;

template <class Kernel>
void launch(const Kernel& kernel) {
  const typename Kernel::policy_type policy(Kokkos::Cuda(), 1, 1, 32);
  Kokkos::parallel_for(policy, kernel);
}

// Taking a launch's address instantiates it, and with it the kernel.
template <class Cache, class T>
void instantiate_rows() {
  (void)&launch<DeviceKernel<1, Cache, T>>;
  (void)&launch<DeviceKernel<2, Cache, T>>;
  (void)&launch<DeviceKernel<4, Cache, T>>;
  (void)&launch<DeviceKernel<8, Cache, T>>;
}

}  // namespace

void kpa_device_gate_kernels() {
  instantiate_rows<kpa::half, kpa::half>();
  instantiate_rows<kpa::bfloat16, kpa::bfloat16>();
  instantiate_rows<float, float>();
  instantiate_rows<kpa::fp8_e4m3, kpa::half>();
  instantiate_rows<kpa::fp8_e5m2, kpa::half>();
}
