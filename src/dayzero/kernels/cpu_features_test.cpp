#include "dayzero/kernels/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "dayzero/kernels/kernel_paths.h"

namespace dz::kernels {
namespace cpu_features_test {

TEST(CpuIsa, ParsesTheAcceptedValuesInAnyCase) {
  for (const char* value : {"", "amx", "AMX", "Amx"}) {
    Result<CpuIsa> isa = parse_cpu_isa(value);
    ASSERT_TRUE(isa.ok()) << value;
    EXPECT_EQ(*isa, CpuIsa::kAmx) << value;
  }
  for (const char* value : {"avx512", "AVX512", "Avx512"}) {
    Result<CpuIsa> isa = parse_cpu_isa(value);
    ASSERT_TRUE(isa.ok()) << value;
    EXPECT_EQ(*isa, CpuIsa::kAvx512) << value;
  }
  for (const char* value : {"generic", "GENERIC", "Generic"}) {
    Result<CpuIsa> isa = parse_cpu_isa(value);
    ASSERT_TRUE(isa.ok()) << value;
    EXPECT_EQ(*isa, CpuIsa::kGeneric) << value;
  }
}

TEST(CpuIsa, RefusesAnUnknownValueNamingTheVariableAndTheChoices) {
  for (const char* value : {"avx2", "sse41", "generic ", "avx512_core", "0"}) {
    Result<CpuIsa> isa = parse_cpu_isa(value);
    ASSERT_FALSE(isa.ok()) << value;
    EXPECT_EQ(isa.status().code(), StatusCode::kInvalidArgument);
    const std::string& message = isa.status().message();
    EXPECT_NE(message.find("DZ_CPU_ISA"), std::string::npos) << message;
    EXPECT_NE(message.find(value), std::string::npos) << message;
    EXPECT_NE(message.find("generic"), std::string::npos) << message;
    EXPECT_NE(message.find("avx512"), std::string::npos) << message;
    EXPECT_NE(message.find("amx"), std::string::npos) << message;
  }
}

TEST(CpuIsa, EachLevelCapsTheOneAbove) {
  const CpuFeatures all{.avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true, .amx_bf16 = true};
  const CpuFeatures generic = cap_cpu_features(all, CpuIsa::kGeneric);
  EXPECT_FALSE(generic.avx512 || generic.avx512_vbmi || generic.avx512_bf16 || generic.amx_bf16);
  const CpuFeatures avx512 = cap_cpu_features(all, CpuIsa::kAvx512);
  EXPECT_TRUE(avx512.avx512 && avx512.avx512_vbmi && avx512.avx512_bf16);
  EXPECT_FALSE(avx512.amx_bf16);
  const CpuFeatures amx = cap_cpu_features(all, CpuIsa::kAmx);
  EXPECT_TRUE(amx.avx512 && amx.avx512_vbmi && amx.avx512_bf16 && amx.amx_bf16);
  // A cap never adds what the CPU lacks.
  const CpuFeatures zen4{.avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true};
  EXPECT_FALSE(cap_cpu_features(zen4, CpuIsa::kAmx).amx_bf16);
  for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx512, CpuIsa::kAmx})
    EXPECT_EQ(*parse_cpu_isa(cpu_isa_name(isa)), isa);
}

// The features this process runs with follow DZ_CPU_ISA (the ctests kernels.generic_isa and
// kernels.avx512_isa run this whole binary at those levels, where this asserts the cap).
TEST(CpuIsa, ProcessFeaturesFollowTheEnvironment) {
  Result<CpuIsa> isa = cpu_isa_from_env();
  ASSERT_TRUE(isa.ok()) << isa.status().to_string();
  std::printf("DZ_CPU_ISA level %s; this CPU: %s; running with: %s\n",
              std::string(cpu_isa_name(*isa)).c_str(),
              describe_cpu_features(detected_cpu_features()).c_str(),
              describe_cpu_features(cpu_features()).c_str());
  const CpuFeatures& f = cpu_features();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  EXPECT_EQ(detected_cpu_features().avx512, avx512);
  if (*isa == CpuIsa::kGeneric) {
    EXPECT_FALSE(f.avx512 || f.avx512_vbmi || f.avx512_bf16 || f.amx_bf16);
  } else {
    EXPECT_EQ(f.avx512, avx512);
    EXPECT_EQ(f.avx512_bf16, detected_cpu_features().avx512_bf16);
  }
  if (*isa != CpuIsa::kAmx) {
    EXPECT_FALSE(f.amx_bf16);
  }
}

}  // namespace cpu_features_test
}  // namespace dz::kernels
