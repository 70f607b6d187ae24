#pragma once
// The CPU features the kernel variants need, read once (style.md §2.5: one place decides; no
// feature checks inside loops). Every *_avx512.cpp variant is chosen through this.
//
// The environment variable DZ_CPU_ISA caps what is reported (docs/cpu_dispatch.md), in the manner
// of oneDNN's ONEDNN_MAX_CPU_ISA: unset, empty or "avx512": what the CPU has; "generic": no
// AVX-512 feature at all, so every kernel takes its portable path (how `make test` checks the
// fallback a CPU without AVX-512 would run). Case does not matter. Any other value is an error
// naming the variable and the accepted values.

#include <string_view>

#include "dayzero/core/status.h"

namespace dz::kernels {

struct CpuFeatures {
  bool avx512 = false;       // F, BW, VL, DQ (and F16C, which every AVX-512 part has)
  bool avx512_vbmi = false;  // VPERMI2B byte tables (formats.md §6.4a)
  bool avx512_bf16 = false;  // VDPBF16PS (the MXFP4 GEMV, formats.md §6.6)
  // AMX-TILE and AMX-BF16, with the tile data state granted to this process by the OS (Linux
  // asks each process to request it); only alongside avx512_bf16.
  bool amx_bf16 = false;
};

inline constexpr const char* kCpuIsaEnv = "DZ_CPU_ISA";

enum class CpuIsa {
  kDetect,   // "", "avx512": everything the CPU has
  kGeneric,  // "generic": no AVX-512 (portable code only)
};

// Parses a DZ_CPU_ISA value.
Result<CpuIsa> parse_cpu_isa(std::string_view value);
// `detected` limited to what `isa` allows.
CpuFeatures cap_cpu_features(const CpuFeatures& detected, CpuIsa isa);
// The value of DZ_CPU_ISA parsed (kDetect when unset): programs call this at start-up to report
// a bad value as an error rather than stopping inside the first kernel.
Result<CpuIsa> cpu_isa_from_env();

// The CPU's features capped by DZ_CPU_ISA, decided on first use. A bad DZ_CPU_ISA stops the
// process there with the message of parse_cpu_isa (running the wrong code path silently would
// defeat the variable's purpose).
const CpuFeatures& cpu_features();

}  // namespace dz::kernels
