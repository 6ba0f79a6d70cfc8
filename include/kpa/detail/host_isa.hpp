#pragma once
// Which instruction sets kpa's headers compile host kernels for (see host_kernels.hpp): on
// x86-64 with GCC or Clang, AVX2 + FMA + F16C and AVX-512 besides the portable loops, through target
// attributes, so whatever the translation unit's flags; never in device compilers' translation
// units, nor where KPA_PORTABLE_KERNELS is defined.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(KPA_PORTABLE_KERNELS)
#define KPA_IMPL_X86_KERNELS 1
#endif
