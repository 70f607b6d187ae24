#pragma once
// DZ_UNROLL(n) before a loop asks the compiler to unroll it n times. The register-blocked AVX-512
// kernels need their loops over tokens, rows and heads unrolled so that the accumulators stay in
// registers (a rolled loop over an array of vectors goes through the stack).

#define DZ_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
#define DZ_UNROLL(n) DZ_PRAGMA(unroll n)
#elif defined(__GNUC__)
#define DZ_UNROLL(n) DZ_PRAGMA(GCC unroll n)
#else
#define DZ_UNROLL(n)
#endif
