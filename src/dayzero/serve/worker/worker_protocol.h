#pragma once
// The messages between a serving frontend and its worker group's rank 0 (docs/serving.md §5.10):
// one JSON object per message behind a 4-byte little-endian length, on a Unix stream socket.
//
//   worker → frontend: hello {pid}  ready {load_s}  load_failed {error}
//                      submitted {tag, error?}  output {id, ...RequestOutput}
//                      heartbeat {step_ms, metrics}
//   frontend → worker: submit {tag, ids, n, request}  cancel {id}  shutdown
//
// The codecs below carry every field of the runtime structs they name; a round-trip test fills
// each one.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"
#include "dayzero/runtime/engine_types.h"

namespace dz::serve::worker {

// Messages larger than this are refused as corrupt (a logits row of a 1M vocabulary is 4 MiB
// of floats, about 12 MiB as JSON).
inline constexpr uint32_t kMaxMessageBytes = 256u << 20;

// Writes one message (all of it, retrying short writes); kIo when the peer is gone.
Status send_message(int fd, const nlohmann::json& message);
// Reads one message; nullopt at a clean end of stream (the peer closed between messages), kIo or
// kCorrupt otherwise.
Result<std::optional<nlohmann::json>> read_message(int fd);

nlohmann::json encode_request(const runtime::GenerationRequest& request);
Result<runtime::GenerationRequest> decode_request(const nlohmann::json& json);

nlohmann::json encode_output(const runtime::RequestOutput& output);
Result<runtime::RequestOutput> decode_output(const nlohmann::json& json);

nlohmann::json encode_metrics(const runtime::EngineMetrics& metrics);
Result<runtime::EngineMetrics> decode_metrics(const nlohmann::json& json);

nlohmann::json encode_status(const Status& status);
Status decode_status(const nlohmann::json& json);

}  // namespace dz::serve::worker
