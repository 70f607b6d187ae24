#include "dayzero/cli/engine_request.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dayzero/cli/engine_args.h"

namespace dz::cli {

runtime::TokenBytesFn token_bytes_of(const serve::Tokenizer& tokenizer) {
  return [&tokenizer](int32_t id) -> std::optional<std::string> {
    std::optional<std::string_view> bytes = tokenizer.token_bytes(id);
    if (!bytes) return std::nullopt;
    return std::string(*bytes);
  };
}

Status run_request(runtime::EngineCore& engine, runtime::GenerationRequest request,
                   const OutputFn& on_output) {
  constexpr int64_t kRequestId = 0;
  DZ_RETURN_IF_ERROR(engine.add_request(kRequestId, std::move(request)));
  bool finished = false;
  while (!finished) {
    std::vector<runtime::RequestOutput> outputs = engine.step();
    for (runtime::RequestOutput& output : outputs) {
      if (!output.error.ok()) return output.error;
      finished = finished || output.finished;
      const Status status = on_output(output);
      if (!status.ok()) {
        engine.abort_request(kRequestId);
        engine.step();  // reports the abort, so the engine is idle again
        return status;
      }
    }
  }
  return Status::ok_status();
}

Result<std::unique_ptr<runtime::EngineCore>> make_scoring_engine(model::CausalLm& model,
                                                                 const ModelArgs& args,
                                                                 int64_t num_positions,
                                                                 int64_t chunk_tokens) {
  DZ_ASSIGN_OR_RETURN(runtime::EngineConfig config, engine_config(args, EngineArgs{}));
  config.max_num_seqs = 1;
  config.max_num_batched_tokens = chunk_tokens;
  config.long_prefill_threshold = chunk_tokens;
  config.enable_prefix_caching = false;
  config.max_state_checkpoints = 0;
  config.reserve_blocks = 0;
  // The null block and the positions' blocks; max_model_len counts the one sampled token past
  // the last position (a request samples at its end).
  config.num_blocks = 1 + (num_positions + config.block_size - 1) / config.block_size;
  config.max_model_len = std::max<int64_t>(2, num_positions + 1);
  return runtime::EngineCore::create(model, exec_context(args), config);
}

}  // namespace dz::cli
