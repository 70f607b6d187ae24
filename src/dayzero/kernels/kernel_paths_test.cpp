// kernel_paths.h: the report's table against the dispatchers' own checks on this process's
// features (so the table cannot drift from what runs), and its answers on CPUs of every kind.
#include "dayzero/kernels/kernel_paths.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dayzero/kernels/gemm_small_bf16.h"
#include "dayzero/kernels/kda.h"
#include "dayzero/kernels/kda_detail.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "dayzero/kernels/linear_fp8_block.h"
#include "dayzero/kernels/linear_mxfp4.h"
#include "dayzero/kernels/mla_absorb.h"

namespace dz::kernels {
namespace kernel_paths_test {

const KernelPath& path_of(const std::vector<KernelPath>& paths, std::string_view op) {
  for (const KernelPath& p : paths)
    if (p.op == op) return p;
  ADD_FAILURE() << "no operator " << op;
  static const KernelPath none{};
  return none;
}

bool portable(const KernelPath& p) {
  return p.path == "portable C++";
}

TEST(KernelPaths, FollowTheDispatchersOnThisProcess) {
  const std::vector<KernelPath> paths = kernel_paths(cpu_features());
  std::printf("%s", kernel_path_report(detected_cpu_features(), *cpu_isa_from_env()).c_str());
  EXPECT_EQ(gemm_small_bf16_amx_available(),
            path_of(paths, "BF16 linear, <= 64 tokens").path == "AMX-BF16 small-M GEMM");
  EXPECT_EQ(gemm_small_bf16_dpbf16_available() && !gemm_small_bf16_amx_available(),
            path_of(paths, "BF16 linear, <= 64 tokens").path == "VDPBF16PS GEMM");
  EXPECT_EQ(gemm_small_bf16_dpbf16_available() && !gemm_small_bf16_amx_available(),
            path_of(paths, "BF16 linear, 65-512 tokens").path == "VDPBF16PS GEMM");
  const KdaDims kda{.num_heads = 2, .head_dim = 128};
  EXPECT_EQ(kda_avx512_available(kda),
            !portable(path_of(paths, "KDA recurrence (head_dim 64/128)")));
  EXPECT_EQ(kda_detail::amx_available(kda), path_of(paths, "KDA chunked (head_dim 64/128)").path ==
                                                "AVX-512 + AMX BF16x3 state products");
  const IndexKeyCache keys{
      .layout = {.key_dim = 128, .block_size = 64}, .pool = nullptr, .block_table = {}};
  const KernelPath& indexer = path_of(paths, "lightning indexer (FP8 keys)");
  EXPECT_EQ(lightning_indexer_amx_available(keys), indexer.path == "AMX-BF16 tiles");
  EXPECT_EQ(lightning_indexer_avx512_bf16_available(keys) && !lightning_indexer_amx_available(keys),
            indexer.path == "VDPBF16PS, heads in the lanes");
  EXPECT_EQ(lightning_indexer_avx512_available(keys), !portable(indexer));
  const MlaAbsorbDims mla{.num_heads = 4, .nope_dim = 128, .latent_dim = 512, .v_dim = 128};
  EXPECT_EQ(mla_absorb_avx512_available(mla), !portable(path_of(paths, "MLA absorb / expand")));
  EXPECT_EQ(fp8_block_amx_available(), path_of(paths, "FP8 block linear, >= 9 tokens").path ==
                                           "AMX-BF16 GEMM, decoded codes as A tiles");
  EXPECT_EQ(mxfp4_amx_available(),
            path_of(paths, "MXFP4 linear").path == "AMX-BF16 tiles (GEMV to 16 tokens, GEMM)");
  EXPECT_EQ(mxfp4_mxint8_vnni_available(),
            !portable(path_of(paths, "MXFP4 linear, MXINT8 activations")));
}

TEST(KernelPaths, EveryFeatureTakesEveryBestPath) {
  const CpuFeatures all{.avx512 = true,
                        .avx512_vbmi = true,
                        .avx512_bf16 = true,
                        .avx512_vnni = true,
                        .amx_bf16 = true};
  for (const KernelPath& p : kernel_paths(all)) {
    EXPECT_EQ(p.path, p.best) << p.op;
    EXPECT_EQ(p.missing, "") << p.op;
  }
}

TEST(KernelPaths, NoFeatureRunsThePortableCodeAndSaysWhatIsMissing) {
  for (const KernelPath& p : kernel_paths(CpuFeatures{})) {
    EXPECT_TRUE(portable(p)) << p.op;
    EXPECT_NE(p.missing.find("avx512"), std::string::npos) << p.op;
  }
}

// AMD Zen 4/5: AVX-512 with VBMI and BF16, no AMX.
TEST(KernelPaths, AvxWithoutAmxNamesAmxAsWhatIsMissing) {
  const CpuFeatures zen{.avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true};
  const std::vector<KernelPath> paths = kernel_paths(zen);
  EXPECT_EQ(path_of(paths, "lightning indexer (FP8 keys)").path, "VDPBF16PS, heads in the lanes");
  EXPECT_EQ(path_of(paths, "lightning indexer (FP8 keys)").missing, "amx_bf16");
  EXPECT_EQ(path_of(paths, "BF16 linear, <= 64 tokens").path, "VDPBF16PS GEMM");
  EXPECT_EQ(path_of(paths, "BF16 linear, 65-512 tokens").path, "VDPBF16PS GEMM");
  EXPECT_EQ(path_of(paths, "BF16 linear, > 512 tokens").path, "oneDNN BF16 matmul");
  EXPECT_EQ(path_of(paths, "MXFP4 linear").path, "GEMV / BF16 tiles + oneDNN");
  EXPECT_EQ(path_of(paths, "FP8 block linear, >= 9 tokens").path,
            "VDPBF16PS GEMM, tokens in the lanes");
  EXPECT_EQ(path_of(paths, "MXFP4 linear").missing, "amx_bf16");
  const std::string report = kernel_path_report(zen, CpuIsa::kAmx);
  EXPECT_NE(report.find("amx_bf16 no"), std::string::npos) << report;
  EXPECT_NE(report.find("(slower: no amx_bf16)"), std::string::npos) << report;
  EXPECT_NE(report.find("DZ_CPU_ISA: amx"), std::string::npos) << report;
  EXPECT_NE(kernel_path_report(zen, CpuIsa::kGeneric).find("DZ_CPU_ISA: generic"),
            std::string::npos);
}

}  // namespace kernel_paths_test
}  // namespace dz::kernels
