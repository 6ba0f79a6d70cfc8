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
  /// Avx512Vbmi with AMX-BF16 tiles (Sapphire Rapids and later, where the kernel grants the
  /// process the tile state): q.k and p.V as tile products for bf16 and fp8 caches.
  Amx,
  /// Not a level of the CPU: Amx's loops on any AVX2 CPU, its tiles over a software model of the
  /// tile instructions and its 16-lane AVX-512 tiles over pairs of AVX2 registers (for tests;
  /// never chosen by itself).
  AmxModel,
};

std::string_view to_string(HostIsa isa);
std::ostream& operator<<(std::ostream& os, HostIsa isa);
/// "portable", "avx2", "avx512", "avx512vbmi", "amx" or "amx-model"; throws kpa::Error for
/// anything else.
HostIsa parse_host_isa(std::string_view name);

namespace detail {
/// The best host instruction set the CPU running this process supports (cpuid, read once).
HostIsa cpu_host_isa();
/// The best one libkpa has loops for (Portable where it was compiled without the x86 sets).
HostIsa compiled_host_isa();
/// The best set this process runs: the lesser of the two above.
HostIsa best_host_isa();
/// Whether loops of `isa` run where `best` is the best set: every set up to `best`, and
/// AmxModel wherever AVX2 runs if libkpa was built with its software models (KPA_SOFTWARE_MODELS).
bool host_isa_runs(HostIsa isa, HostIsa best);
/// The vector set under `isa`'s loops (the set itself, but Avx512Vbmi for Amx, Avx2 for AmxModel).
HostIsa vector_isa(HostIsa isa);
/// `best`, or the environment variable KPA_HOST_ISA when set (kpa::Error if it names a set that
/// does not run here).
HostIsa chosen_host_isa(HostIsa best);
}  // namespace detail

}  // namespace kpa
