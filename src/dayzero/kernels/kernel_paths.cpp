#include "dayzero/kernels/kernel_paths.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace dz::kernels {

namespace {

struct Variant {
  std::string_view name;
  CpuFeatures needs;  // every feature set here must be present
};

struct Operator {
  std::string_view name;
  std::vector<Variant> variants;  // fastest first; the last needs nothing
};

bool runs(const Variant& v, const CpuFeatures& f) {
  const CpuFeatures& n = v.needs;
  return (!n.avx512 || f.avx512) && (!n.avx512_vbmi || f.avx512_vbmi) &&
         (!n.avx512_bf16 || f.avx512_bf16) && (!n.avx512_vnni || f.avx512_vnni) &&
         (!n.amx_bf16 || f.amx_bf16);
}

// The features of `needs` that `f` lacks (all of them when `f` is empty), space-separated.
std::string lacking(const CpuFeatures& needs, const CpuFeatures& f) {
  const std::tuple<std::string_view, bool, bool> flags[] = {
      {"avx512", needs.avx512, f.avx512},
      {"avx512_vbmi", needs.avx512_vbmi, f.avx512_vbmi},
      {"avx512_bf16", needs.avx512_bf16, f.avx512_bf16},
      {"avx512_vnni", needs.avx512_vnni, f.avx512_vnni},
      {"amx_bf16", needs.amx_bf16, f.amx_bf16}};
  std::string out;
  for (const auto& [name, needed, present] : flags) {
    if (!needed || present) continue;
    if (!out.empty()) out += ' ';
    out += name;
  }
  return out;
}

constexpr CpuFeatures kAvx512{.avx512 = true};
constexpr CpuFeatures kAvx512Bf16{.avx512 = true, .avx512_bf16 = true};
constexpr CpuFeatures kAvx512VbmiBf16{.avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true};
constexpr CpuFeatures kVnni{.avx512 = true, .avx512_vnni = true};
constexpr CpuFeatures kVbmi{.avx512 = true, .avx512_vbmi = true};
constexpr CpuFeatures kAmx{.avx512 = true, .avx512_bf16 = true, .amx_bf16 = true};
constexpr CpuFeatures kAmxVbmi{
    .avx512 = true, .avx512_vbmi = true, .avx512_bf16 = true, .amx_bf16 = true};
const Variant kPortable{"portable C++", {}};

// In the order of a decoder step. Where each check lives: linear_bf16.cpp (reorder_for_onednn),
// linear_fp8_block.cpp and linear_mxfp4.cpp (create), gemm_small_bf16.cpp, lightning_indexer.cpp,
// kda.cpp, short_conv.cpp, mla_absorb.cpp, mla_attention.cpp, activations.cpp, hadamard.cpp,
// norms.cpp, dense_attention.cpp.
const std::vector<Operator>& operators() {
  static const std::vector<Operator> ops = {
      {"BF16 linear, <= 64 tokens",
       {{"AMX-BF16 small-M GEMM", kAmx},
        {"VDPBF16PS GEMM", kAvx512Bf16},
        {"oneDNN BF16 matmul", kAvx512},
        kPortable}},
      {"BF16 linear, 65-512 tokens",
       {{"oneDNN BF16 matmul (AMX)", kAmx},
        {"VDPBF16PS GEMM", kAvx512Bf16},
        {"oneDNN BF16 matmul", kAvx512},
        kPortable}},
      {"BF16 linear, > 512 tokens", {{"oneDNN BF16 matmul", kAvx512}, kPortable}},
      {"FP8 block linear, < 9 tokens",
       {{"GEMV, E4M3->BF16 tables + VDPBF16PS", kAvx512VbmiBf16},
        {"GEMV, E4M3->FP16->FP32 FMAs", kAvx512},
        kPortable}},
      {"FP8 block linear, >= 9 tokens",
       {{"AMX-BF16 GEMM, decoded codes as A tiles", kAmxVbmi},
        {"VDPBF16PS GEMM, tokens in the lanes", kAvx512VbmiBf16},
        {"dequantized tiles + oneDNN", kAvx512},
        kPortable}},
      {"MXFP4 linear",
       {{"AMX-BF16 tiles (GEMV to 16 tokens, GEMM)", kAmx},
        {"GEMV / BF16 tiles + oneDNN", kAvx512Bf16},
        kPortable}},
      {"MXFP4 linear, MXINT8 activations", {{"VPDPBUSD GEMV", kVnni}, kPortable}},
      {"lightning indexer (FP8 keys)",
       {{"AMX-BF16 tiles", kAmxVbmi},
        {"VDPBF16PS, heads in the lanes", kAvx512VbmiBf16},
        {"AVX-512 FP32 FMA, VBMI byte tables", kVbmi},
        kPortable}},
      {"KDA chunked (head_dim 64/128)",
       {{"AVX-512 + AMX BF16x3 state products", kAmx}, {"AVX-512 FP32", kAvx512}, kPortable}},
      {"KDA recurrence (head_dim 64/128)", {{"AVX-512 FP32", kAvx512}, kPortable}},
      {"MLA absorb / expand", {{"AVX-512 FP32", kAvx512}, kPortable}},
      {"MLA decode attention",
       {{"AMX-BF16 tiles, 16 heads x 64 records", kAmxVbmi},
        {"AVX-512 FP32, every head per record tile", kVbmi},
        {"AVX-512 FP32, each head's own pass", kAvx512},
        kPortable}},
      {"KDA short conv", {{"AVX-512 FP32", kAvx512}, kPortable}},
      {"SiLU / sigmoid gates, Hadamard", {{"AVX-512 FP32", kAvx512}, kPortable}},
      {"RMSNorm, L2 norm, BF16 rounding", {{"AVX-512", kAvx512}, kPortable}},
      {"vision attention (head_dim 64k)",
       {{"VDPBF16PS flash tiles, 4 queries x 64 keys", kAvx512Bf16}, kPortable}},
  };
  return ops;
}

}  // namespace

std::vector<KernelPath> kernel_paths(const CpuFeatures& features) {
  std::vector<KernelPath> paths;
  for (const Operator& op : operators()) {
    const Variant& best = op.variants.front();
    for (const Variant& v : op.variants) {
      if (!runs(v, features)) continue;
      paths.push_back(
          {op.name, v.name, best.name, &v == &best ? "" : lacking(best.needs, features)});
      break;
    }
  }
  return paths;
}

std::string describe_cpu_features(const CpuFeatures& f) {
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  return fmt::format("avx512 {}, avx512_vbmi {}, avx512_bf16 {}, avx512_vnni {}, amx_bf16 {}",
                     yes(f.avx512), yes(f.avx512_vbmi), yes(f.avx512_bf16), yes(f.avx512_vnni),
                     yes(f.amx_bf16));
}

std::string kernel_path_report(const CpuFeatures& detected, CpuIsa isa) {
  std::string out = fmt::format("cpu: {}\n{}: {}\nkernel paths:\n", describe_cpu_features(detected),
                                kCpuIsaEnv, cpu_isa_name(isa));
  for (const KernelPath& p : kernel_paths(cap_cpu_features(detected, isa))) {
    out += fmt::format("  {:<36} {}", p.op, p.path);
    if (!p.missing.empty()) out += fmt::format("  (slower: no {})", p.missing);
    out += '\n';
  }
  return out;
}

void log_slower_kernel_paths(const CpuFeatures& detected, CpuIsa isa) {
  const std::vector<KernelPath> on_cpu = kernel_paths(detected);
  const std::vector<KernelPath> taken = kernel_paths(cap_cpu_features(detected, isa));
  std::string by_cpu, by_isa;
  for (size_t i = 0; i < taken.size(); ++i) {
    if (taken[i].missing.empty()) continue;
    // The CPU could run a faster variant than the one taken: DZ_CPU_ISA chose; else the CPU lacks.
    const bool capped = on_cpu[i].path != taken[i].path;
    std::string& list = capped ? by_isa : by_cpu;
    list += fmt::format("{}{}: {} (no {})", list.empty() ? "" : "; ", taken[i].op, taken[i].path,
                        capped ? taken[i].missing : on_cpu[i].missing);
  }
  if (!by_cpu.empty())
    spdlog::info("kernels: slower paths, as this CPU lacks features: {}", by_cpu);
  if (!by_isa.empty())
    spdlog::info("kernels: slower paths, as {}={}: {}", kCpuIsaEnv, cpu_isa_name(isa), by_isa);
}

}  // namespace dz::kernels
