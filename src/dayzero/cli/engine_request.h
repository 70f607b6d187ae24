#pragma once
// One request at a time through an EngineCore, for the commands that run a single sequence
// (`dayzero generate --prompt`, `dayzero logits`, `dayzero perplexity`): the same decode path as
// the server, stepped on the calling thread with every delta handed to a callback.

#include <cstdint>
#include <functional>
#include <memory>

#include "dayzero/cli/model_args.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/engine_core.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {

// The engine's view of the tokenizer (EngineConfig::token_bytes); tokenizer must outlive it.
runtime::TokenBytesFn token_bytes_of(const serve::Tokenizer& tokenizer);

using OutputFn = std::function<Status(runtime::RequestOutput& output)>;

// Queues request on an engine with nothing else to do and steps it to its end; on_output sees
// each delta as its step returns. An error of the request (or of on_output) ends the run.
Status run_request(runtime::EngineCore& engine, runtime::GenerationRequest request,
                   const OutputFn& on_output);

// An engine for scoring one request at a time (prompt logits, teacher forcing) over at most
// num_positions positions: prefill chunks of exactly chunk_tokens, no prefix cache (every
// position is computed, and hybrid models' checkpoints do not cut the chunks), no reserve, and
// just the blocks those positions need.
Result<std::unique_ptr<runtime::EngineCore>> make_scoring_engine(model::CausalLm& model,
                                                                 const ModelArgs& args,
                                                                 int64_t num_positions,
                                                                 int64_t chunk_tokens);

}  // namespace dz::cli
