#pragma once
// `dayzero generate --prompts-file FILE.jsonl`: every prompt of the file submitted at once to the
// serving Engine (continuous batching, chunked prefill, prefix cache, preemption), one JSON line
// per prompt on stdout in input order, a summary on stderr.

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "dayzero/cli/engine_args.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/cli/prompts_file.h"
#include "dayzero/core/status.h"

namespace dz::cli {

struct BatchGenerateArgs {
  ModelArgs model;
  EngineArgs engine;
  std::string prompts_file;
  std::string dump_logits_dir;  // non-empty: DIR/<index>.npy, float32 [num_generated, vocab]
  PromptDefaults defaults;
};

Status run_prompts_file(const BatchGenerateArgs& args);

}  // namespace dz::cli
