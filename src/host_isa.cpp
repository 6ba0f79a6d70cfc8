#include <kpa/error.hpp>
#include <kpa/host_isa.hpp>

#include <algorithm>
#include <cstdlib>
#include <ostream>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kpa {

std::string_view to_string(HostIsa isa) {
  switch (isa) {
    case HostIsa::AmxModel: return "amx-model";
    case HostIsa::Amx: return "amx";
    case HostIsa::Avx512Vbmi: return "avx512vbmi";
    case HostIsa::Avx512: return "avx512";
    case HostIsa::Avx2: return "avx2";
    default: return "portable";
  }
}

std::ostream& operator<<(std::ostream& os, HostIsa isa) { return os << to_string(isa); }

HostIsa parse_host_isa(std::string_view name) {
  if (name == "portable") return HostIsa::Portable;
  if (name == "avx2") return HostIsa::Avx2;
  if (name == "avx512") return HostIsa::Avx512;
  if (name == "avx512vbmi") return HostIsa::Avx512Vbmi;
  if (name == "amx") return HostIsa::Amx;
  if (name == "amx-model") return HostIsa::AmxModel;
  throw Error("kpa: unknown host instruction set '" + std::string(name) +
              "' (expected 'portable', 'avx2', 'avx512', 'avx512vbmi', 'amx' or 'amx-model')");
}

namespace detail {
namespace {
bool tile_state_granted() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
}  // namespace

HostIsa cpu_host_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // AVX2, FMA and F16C, and the operating system saving the YMM registers; then AVX-512 F, BW,
  // VL and DQ with the opmask and ZMM state saved too, then VBMI (cpuid and xgetbv: not every
  // compiler's __builtin_cpu_supports knows F16C).
  static const HostIsa isa = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return HostIsa::Portable;
    const bool fma = (c >> 12) & 1u, osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, f16c = (c >> 29) & 1u;
    if (!(fma && osxsave && avx && f16c)) return HostIsa::Portable;
    unsigned xcr0 = 0;  // the state bits kpa needs are all in the low half
    __asm__("xgetbv" : "=a"(xcr0) : "c"(0) : "edx");
    if ((xcr0 & 6u) != 6u) return HostIsa::Portable;  // XMM and YMM state
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return HostIsa::Portable;
    if (((b >> 5) & 1u) == 0) return HostIsa::Portable;
    const bool avx512 = ((b >> 16) & 1u) && ((b >> 17) & 1u) && ((b >> 30) & 1u) && ((b >> 31) & 1u);
    if (!avx512 || (xcr0 & 0xe0u) != 0xe0u) return HostIsa::Avx2;
    if (((c >> 1) & 1u) == 0) return HostIsa::Avx512;
    // AMX-TILE and AMX-BF16, the tile state enabled (XCR0 bits 17 and 18), and the kernel's
    // permission for this process to use it (Linux: arch_prctl ARCH_REQ_XCOMP_PERM); and
    // AVX512-BF16 (leaf 7.1), whose conversion the code around the tiles takes.
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    const bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0 && ((a1 >> 5) & 1u);
    const bool amx = ((d >> 24) & 1u) && ((d >> 22) & 1u) && (xcr0 & 0x60000u) == 0x60000u && avx512_bf16;
    return amx && tile_state_granted() ? HostIsa::Amx : HostIsa::Avx512Vbmi;
  }();
  return isa;
#else
  return HostIsa::Portable;
#endif
}

HostIsa best_host_isa() { return std::min(cpu_host_isa(), compiled_host_isa()); }

bool host_isa_runs(HostIsa isa, HostIsa best) {
#ifdef KPA_IMPL_SOFTWARE_MODELS
  if (isa == HostIsa::AmxModel) return best >= HostIsa::Avx2;
#else
  if (isa == HostIsa::AmxModel) return false;  // built with -DKPA_SOFTWARE_MODELS=OFF
#endif
  return isa <= best;
}

HostIsa vector_isa(HostIsa isa) {
  if (isa == HostIsa::Amx) return HostIsa::Avx512Vbmi;
  if (isa == HostIsa::AmxModel) return HostIsa::Avx2;
  return isa;
}

HostIsa chosen_host_isa(HostIsa best) {
  const char* name = std::getenv("KPA_HOST_ISA");
  if (name == nullptr || *name == '\0') return best;
  const HostIsa isa = parse_host_isa(name);
  if (!host_isa_runs(isa, best)) {
    throw Error(std::string("kpa: KPA_HOST_ISA=") + name + " is not available here (best: " +
                std::string(to_string(best)) + ")" +
                (isa == HostIsa::AmxModel ? "; amx-model needs libkpa built with -DKPA_SOFTWARE_MODELS=ON" : ""));
  }
  return isa;
}
}  // namespace detail

}  // namespace kpa
