#pragma once
// E8M0 block scales (MXFP4, MXINT8) as FP32 on AVX-512. Include only from *_avx512.cpp files.
#include <immintrin.h>

namespace dz::kernels::detail {

// 2^(E−127) as FP32 bits from E8M0 codes already shifted into the exponent field (E << 23 per
// dword): E = 0 becomes 0x00400000, 2^−127 as a subnormal (the unsigned max picks it for 0 only).
inline __m512i e8m0_scale_bits(__m512i codes_shl_23) {
  return _mm512_max_epu32(codes_shl_23, _mm512_set1_epi32(0x00400000));
}

}  // namespace dz::kernels::detail
