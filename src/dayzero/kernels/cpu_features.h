#pragma once
// The CPU features the kernel variants need, read once (style.md §2.5: one place decides; no
// feature checks inside loops). Every *_avx512.cpp variant is chosen through this.

namespace dz::kernels {

struct CpuFeatures {
  bool avx512 = false;       // F, BW, VL, DQ (and F16C, which every AVX-512 part has)
  bool avx512_vbmi = false;  // VPERMI2B byte tables (formats.md §6.4a)
  bool avx512_bf16 = false;  // VDPBF16PS (the MXFP4 GEMV, formats.md §6.6)
};

const CpuFeatures& cpu_features();

}  // namespace dz::kernels
