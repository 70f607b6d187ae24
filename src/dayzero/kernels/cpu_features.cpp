#include "dayzero/kernels/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "dayzero/core/check.h"
#include "dayzero/kernels/kernel_paths.h"

namespace dz::kernels {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return "generic";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "?";
}

Result<CpuIsa> parse_cpu_isa(std::string_view value) {
  std::string lower(value);
  for (char& c : lower)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  if (lower.empty() || lower == "amx") return CpuIsa::kAmx;
  if (lower == "avx512") return CpuIsa::kAvx512;
  if (lower == "generic") return CpuIsa::kGeneric;
  return make_error(StatusCode::kInvalidArgument,
                    "{}=\"{}\" is not a known ISA; accepted: generic (no AVX-512 kernels), avx512 "
                    "(AVX-512 kernels, no AMX), amx (everything the CPU has; also when unset)",
                    kCpuIsaEnv, value);
}

CpuFeatures cap_cpu_features(const CpuFeatures& detected, CpuIsa isa) {
  CpuFeatures f = detected;
  if (isa == CpuIsa::kGeneric) return CpuFeatures{};
  if (isa == CpuIsa::kAvx512) f.amx_bf16 = false;
  return f;
}

Result<CpuIsa> cpu_isa_from_env() {
  const char* value = std::getenv(kCpuIsaEnv);
  return parse_cpu_isa(value == nullptr ? std::string_view() : std::string_view(value));
}

namespace {

// CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE; then Linux must grant the tile data state to
// this process (arch_prctl ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18).
bool amx_bf16_granted() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

}  // namespace

const CpuFeatures& detected_cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
    f.amx_bf16 = f.avx512_bf16 && amx_bf16_granted();
    return f;
  }();
  return features;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    Result<CpuIsa> isa = cpu_isa_from_env();
    DZ_CHECK(isa.ok(), "{}", isa.status().message());
    const CpuFeatures f = cap_cpu_features(detected_cpu_features(), *isa);
    log_slower_kernel_paths(detected_cpu_features(), *isa);
    return f;
  }();
  return features;
}

}  // namespace dz::kernels
