#include "dayzero/kernels/cpu_features.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace dz::kernels {
namespace {

TEST(CpuIsa, ParsesTheAcceptedValuesInAnyCase) {
  for (const char* value : {"", "avx512", "AVX512", "Avx512"}) {
    Result<CpuIsa> isa = parse_cpu_isa(value);
    ASSERT_TRUE(isa.ok()) << value;
    EXPECT_EQ(*isa, CpuIsa::kDetect) << value;
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
  }
}

TEST(CpuIsa, GenericReportsNoAvx512Feature) {
  const CpuFeatures all{.avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true};
  const CpuFeatures generic = cap_cpu_features(all, CpuIsa::kGeneric);
  EXPECT_FALSE(generic.avx512);
  EXPECT_FALSE(generic.avx512_vbmi);
  EXPECT_FALSE(generic.avx512_bf16);
  const CpuFeatures detected = cap_cpu_features(all, CpuIsa::kDetect);
  EXPECT_TRUE(detected.avx512 && detected.avx512_vbmi && detected.avx512_bf16);
}

// The features this process runs with follow DZ_CPU_ISA (the ctest kernels.generic_isa runs this
// whole binary with DZ_CPU_ISA=generic, where this asserts that nothing AVX-512 is reported).
TEST(CpuIsa, ProcessFeaturesFollowTheEnvironment) {
  Result<CpuIsa> isa = cpu_isa_from_env();
  ASSERT_TRUE(isa.ok()) << isa.status().to_string();
  const CpuFeatures& f = cpu_features();
  if (*isa == CpuIsa::kGeneric) {
    EXPECT_FALSE(f.avx512 || f.avx512_vbmi || f.avx512_bf16);
  } else {
    EXPECT_EQ(f.avx512, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512dq"));
  }
}

}  // namespace
}  // namespace dz::kernels
