#pragma once
// The instruction sets of the host kernel path's inner loops, and which of them this process runs.
// The loops themselves are compiled once, into libkpa (src/host_loops/), so every translation
// unit that includes kpa's headers runs the same ones, whatever its compiler and flags.

#include <iosfwd>
#include <string_view>

namespace kpa {

/// Instruction sets of the host kernel path's inner loops, in increasing order of capability.
enum class HostIsa {
  Portable,  ///< plain C++ (any CPU)
  Avx2,      ///< x86-64 AVX2 + FMA + F16C
  Avx512,    ///< x86-64 AVX-512 F + BW + VL + DQ (and AVX2): q.k and p.V on 16 lanes
  /// AVX-512 with VBMI as well (Ice Lake, Zen 4 and later): fp8 codes widened through byte
  /// lookups; other caches run the Avx512 loops.
  Avx512Vbmi,
};

std::string_view to_string(HostIsa isa);
std::ostream& operator<<(std::ostream& os, HostIsa isa);
/// "portable", "avx2", "avx512" or "avx512vbmi"; throws kpa::Error for anything else.
HostIsa parse_host_isa(std::string_view name);

namespace detail {
/// The best host instruction set the CPU running this process supports (cpuid, read once).
HostIsa cpu_host_isa();
/// The best one libkpa has loops for (Portable where it was compiled without the x86 sets).
HostIsa compiled_host_isa();
/// The best set this process runs: the lesser of the two above.
HostIsa best_host_isa();
/// `best`, or the environment variable KPA_HOST_ISA when set (kpa::Error if it names a better one).
HostIsa chosen_host_isa(HostIsa best);
}  // namespace detail

}  // namespace kpa
