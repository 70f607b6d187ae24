#pragma once
// Which variant of each operator runs on given CPU features: what `dayzero --version` prints and
// what cpu_features() logs once when an operator takes a slower path than this build has.
//
// The table mirrors the feature checks of the dispatchers (each entry names where its check
// lives); kernel_paths_test.cpp holds it against those checks, so the two cannot drift apart.
// Shape conditions (a head size, a block size) are part of the variant's description: the report
// says what runs for the shapes the fast variants are written for.

#include <string>
#include <string_view>
#include <vector>

#include "dayzero/kernels/cpu_features.h"

namespace dz::kernels {

struct KernelPath {
  std::string_view op;    // the operator, e.g. "lightning indexer"
  std::string_view path;  // the variant these features select
  std::string_view best;  // the fastest variant this build has for the operator
  std::string missing;    // the features `best` needs that these lack, "" when path == best
};

// Every operator with more than one variant, in a fixed order.
std::vector<KernelPath> kernel_paths(const CpuFeatures& features);

// The features of `f` as one line, e.g. "avx512 yes, avx512_vbmi yes, avx512_bf16 yes, amx_bf16
// no".
std::string describe_cpu_features(const CpuFeatures& f);

// The report of `dayzero --version`: the CPU's features, the DZ_CPU_ISA level, and one line per
// operator with the variant it runs (and, for a slower one, what it lacks).
std::string kernel_path_report(const CpuFeatures& detected, CpuIsa isa);

// Logs at info level, once per process, the operators whose variant under `isa` is slower than
// the build's best, saying whether the CPU or DZ_CPU_ISA is why.
void log_slower_kernel_paths(const CpuFeatures& detected, CpuIsa isa);

}  // namespace dz::kernels
