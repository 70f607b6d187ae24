#pragma once
// The CPU features the kernel variants need, read once (one place decides; no feature checks
// inside loops). Every *_avx512.cpp variant is chosen through this.
//
// The environment variable DZ_CPU_ISA caps what is reported (docs/cpu_dispatch.md), in the manner
// of oneDNN's ONEDNN_MAX_CPU_ISA, at one of three levels: "generic" (no AVX-512 feature at all:
// every kernel takes its portable path), "avx512" (the AVX-512 kernels, with VBMI and BF16 where
// the CPU has them, but no AMX: what AMD and most Intel CPUs run) and "amx" (everything the CPU
// has; also when unset or empty). Case does not matter. Any other value is an error naming the
// variable and the accepted values.

#include <string_view>

#include "dayzero/core/status.h"

namespace dz::kernels {

struct CpuFeatures {
  bool avx512 = false;       // F, BW, VL, DQ (and F16C, which every AVX-512 part has)
  bool avx512_vbmi = false;  // VPERMI2B byte tables (docs/formats.md)
  bool avx512_bf16 = false;  // VDPBF16PS (the MXFP4 GEMV, docs/formats.md)
  bool avx512_vnni = false;  // VPDPBUSD (MXFP4 weights with 8-bit activations)
  // AMX-TILE and AMX-BF16, with the tile data state granted to this process by the OS (Linux
  // asks each process to request it); only alongside avx512_bf16.
  bool amx_bf16 = false;
};

inline constexpr const char* kCpuIsaEnv = "DZ_CPU_ISA";

// The levels, lowest first: each allows what the one before does and more.
enum class CpuIsa {
  kGeneric,  // "generic": portable code only
  kAvx512,   // "avx512": AVX-512 (with VBMI and BF16 where present), no AMX
  kAmx,      // "amx", "" or unset: everything the CPU has
};

// "generic", "avx512" or "amx".
std::string_view cpu_isa_name(CpuIsa isa);
// Parses a DZ_CPU_ISA value.
Result<CpuIsa> parse_cpu_isa(std::string_view value);
// `detected` limited to what `isa` allows.
CpuFeatures cap_cpu_features(const CpuFeatures& detected, CpuIsa isa);
// The value of DZ_CPU_ISA parsed (kAmx when unset): programs call this at start-up to report a
// bad value as an error rather than stopping inside the first kernel.
Result<CpuIsa> cpu_isa_from_env();

// What this CPU and the OS offer, before DZ_CPU_ISA: read once.
const CpuFeatures& detected_cpu_features();

// The CPU's features capped by DZ_CPU_ISA, decided on first use (which also logs, once and at
// info level, the operators that run a slower path than this build has and why). A bad
// DZ_CPU_ISA stops the process there with the message of parse_cpu_isa (running the wrong code
// path silently would defeat the variable's purpose).
const CpuFeatures& cpu_features();

}  // namespace dz::kernels
