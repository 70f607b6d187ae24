#include "dayzero/serve/worker/worker_protocol.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "dayzero/core/base64.h"

namespace dz::serve::worker {
namespace {

using nlohmann::json;

Status write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return make_error(StatusCode::kIo, "worker socket: write: {}", std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::ok_status();
}

// Reads exactly size bytes; false at end of stream before the first byte.
Result<bool> read_all(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error(StatusCode::kIo, "worker socket: read: {}", std::strerror(errno));
    if (n == 0) {
      if (done == 0) return false;
      return make_error(StatusCode::kCorrupt, "worker socket: the peer closed inside a message");
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Runs a decoder, turning a missing or mistyped field into kCorrupt.
template <typename T, typename F>
Result<T> decode_with(const char* what, F&& decode) {
  try {
    return decode();
  } catch (const json::exception& e) {
    return make_error(StatusCode::kCorrupt, "worker message: bad {}: {}", what, e.what());
  } catch (const std::invalid_argument& e) {  // a value of the right type that is wrong
    return make_error(StatusCode::kCorrupt, "worker message: bad {}: {}", what, e.what());
  }
}

json encode_sampling(const runtime::SamplingParams& p) {
  return {{"temperature", p.temperature},
          {"top_p", p.top_p},
          {"top_k", p.top_k},
          {"min_p", p.min_p},
          {"repetition_penalty", p.repetition_penalty},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"logit_bias", p.logit_bias},
          {"seed", p.seed},
          {"min_tokens", p.min_tokens},
          {"stop_token_ids", p.stop_token_ids},
          {"ignore_eos", p.ignore_eos},
          {"logprobs", p.logprobs},
          {"top_logprobs", p.top_logprobs},
          {"stop", p.stop},
          {"include_stop_str_in_output", p.include_stop_str_in_output}};
}

runtime::SamplingParams decode_sampling(const json& j) {
  runtime::SamplingParams p;
  j.at("temperature").get_to(p.temperature);
  j.at("top_p").get_to(p.top_p);
  j.at("top_k").get_to(p.top_k);
  j.at("min_p").get_to(p.min_p);
  j.at("repetition_penalty").get_to(p.repetition_penalty);
  j.at("presence_penalty").get_to(p.presence_penalty);
  j.at("frequency_penalty").get_to(p.frequency_penalty);
  j.at("logit_bias").get_to(p.logit_bias);
  j.at("seed").get_to(p.seed);
  j.at("min_tokens").get_to(p.min_tokens);
  j.at("stop_token_ids").get_to(p.stop_token_ids);
  j.at("ignore_eos").get_to(p.ignore_eos);
  j.at("logprobs").get_to(p.logprobs);
  j.at("top_logprobs").get_to(p.top_logprobs);
  j.at("stop").get_to(p.stop);
  j.at("include_stop_str_in_output").get_to(p.include_stop_str_in_output);
  return p;
}

// JSON has no infinities (a log-probability can be -inf): those travel as strings.
json encode_float(float x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

float decode_float(const json& j) {
  if (!j.is_string()) return j.get<float>();
  const std::string& s = j.get_ref<const std::string&>();
  if (s == "inf") return std::numeric_limits<float>::infinity();
  if (s == "-inf") return -std::numeric_limits<float>::infinity();
  return std::numeric_limits<float>::quiet_NaN();
}

json encode_sample(const runtime::SampleResult& s) {
  json top = json::array();
  for (const runtime::TokenLogprob& t : s.top_logprobs)
    top.push_back({t.token, encode_float(t.logprob)});
  return {{"token", s.token}, {"logprob", encode_float(s.logprob)}, {"top", std::move(top)}};
}

runtime::SampleResult decode_sample(const json& j) {
  runtime::SampleResult s;
  j.at("token").get_to(s.token);
  s.logprob = decode_float(j.at("logprob"));
  for (const json& t : j.at("top"))
    s.top_logprobs.push_back({.token = t.at(0).get<int32_t>(), .logprob = decode_float(t.at(1))});
  return s;
}

}  // namespace

Status send_message(int fd, const json& message) {
  const std::string body = message.dump(-1, ' ', false, json::error_handler_t::replace);
  if (body.size() > kMaxMessageBytes)
    return make_error(StatusCode::kInvalidArgument, "worker message of {} bytes exceeds {}",
                      body.size(), kMaxMessageBytes);
  const auto size = static_cast<uint32_t>(body.size());
  const char header[4] = {static_cast<char>(size & 0xff), static_cast<char>((size >> 8) & 0xff),
                          static_cast<char>((size >> 16) & 0xff),
                          static_cast<char>((size >> 24) & 0xff)};
  DZ_RETURN_IF_ERROR(write_all(fd, header, sizeof(header)));
  return write_all(fd, body.data(), body.size());
}

Result<std::optional<json>> read_message(int fd) {
  unsigned char header[4];
  DZ_ASSIGN_OR_RETURN(const bool any, read_all(fd, reinterpret_cast<char*>(header), 4));
  if (!any) return std::optional<json>();
  const uint32_t size = header[0] | (uint32_t{header[1]} << 8) | (uint32_t{header[2]} << 16) |
                        (uint32_t{header[3]} << 24);
  if (size > kMaxMessageBytes)
    return make_error(StatusCode::kCorrupt, "worker socket: a message of {} bytes (max {})", size,
                      kMaxMessageBytes);
  std::string body(size, '\0');
  DZ_ASSIGN_OR_RETURN(const bool whole, read_all(fd, body.data(), size));
  if (!whole && size > 0)
    return make_error(StatusCode::kCorrupt, "worker socket: the peer closed inside a message");
  json message = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object() || !message.contains("type"))
    return make_error(StatusCode::kCorrupt, "worker socket: a message is not a typed JSON object");
  return std::optional<json>(std::move(message));
}

// Images travel with their file's bytes in base64: the worker preprocesses them (docs/vision.md
// §4).
json encode_images(const std::vector<runtime::PromptImage>& images) {
  json out = json::array();
  for (const runtime::PromptImage& image : images)
    out.push_back({{"offset", image.offset},
                   {"num_tokens", image.num_tokens},
                   {"hash", {image.hash.lo, image.hash.hi}},
                   {"data", encode_base64(image.data ? *image.data : std::string())}});
  return out;
}

std::vector<runtime::PromptImage> decode_images(const json& j) {
  std::vector<runtime::PromptImage> images;
  for (const json& image : j) {
    runtime::PromptImage p;
    image.at("offset").get_to(p.offset);
    image.at("num_tokens").get_to(p.num_tokens);
    image.at("hash").at(0).get_to(p.hash.lo);
    image.at("hash").at(1).get_to(p.hash.hi);
    const std::string& text = image.at("data").get_ref<const std::string&>();
    std::optional<std::string> data = text.empty() ? std::string() : decode_base64(text);
    if (!data) throw std::invalid_argument("an image's data is not base64");
    p.data = std::make_shared<const std::string>(std::move(*data));
    images.push_back(std::move(p));
  }
  return images;
}

json encode_request(const runtime::GenerationRequest& r) {
  return {{"prompt_token_ids", r.prompt_token_ids},
          {"images", encode_images(r.images)},
          {"sampling", encode_sampling(r.sampling)},
          {"max_tokens", r.max_tokens},
          {"priority", r.priority},
          {"cache_salt", r.cache_salt},
          {"choice_index", r.choice_index},
          {"return_logits", r.return_logits},
          {"return_prompt_logits", r.return_prompt_logits},
          {"forced_output_token_ids", r.forced_output_token_ids},
          {"return_mtp_logits", r.return_mtp_logits},
          {"resumed_output_token_ids", r.resumed_output_token_ids}};
}

Result<runtime::GenerationRequest> decode_request(const json& j) {
  return decode_with<runtime::GenerationRequest>("request", [&] {
    runtime::GenerationRequest r;
    j.at("prompt_token_ids").get_to(r.prompt_token_ids);
    r.images = decode_images(j.at("images"));
    r.sampling = decode_sampling(j.at("sampling"));
    j.at("max_tokens").get_to(r.max_tokens);
    j.at("priority").get_to(r.priority);
    j.at("cache_salt").get_to(r.cache_salt);
    j.at("choice_index").get_to(r.choice_index);
    j.at("return_logits").get_to(r.return_logits);
    j.at("return_prompt_logits").get_to(r.return_prompt_logits);
    j.at("forced_output_token_ids").get_to(r.forced_output_token_ids);
    j.at("return_mtp_logits").get_to(r.return_mtp_logits);
    j.at("resumed_output_token_ids").get_to(r.resumed_output_token_ids);
    return r;
  });
}

json encode_status(const Status& status) {
  return {{"code", static_cast<int>(status.code())}, {"message", status.message()}};
}

Status decode_status(const json& j) {
  const int code = j.value("code", static_cast<int>(StatusCode::kInternal));
  const bool known = code >= 0 && code <= static_cast<int>(StatusCode::kAlreadyExists);
  return Status(known ? static_cast<StatusCode>(code) : StatusCode::kInternal,
                j.value("message", std::string("(no message)")));
}

json encode_output(const runtime::RequestOutput& o) {
  json samples = json::array();
  for (const runtime::SampleResult& s : o.new_samples) samples.push_back(encode_sample(s));
  json out = {{"id", o.request_id},
              {"tokens", o.new_token_ids},
              {"samples", std::move(samples)},
              {"logits", o.new_logits},
              {"prompt_logits", o.new_prompt_logits},
              {"mtp_logits", o.new_mtp_logits},
              {"text", o.new_text},
              {"finished", o.finished},
              {"finish_reason", static_cast<int>(o.finish_reason)},
              {"aborted", o.aborted},
              {"error", encode_status(o.error)},
              {"num_prompt_tokens", o.num_prompt_tokens},
              {"num_cached_tokens", o.num_cached_tokens},
              {"num_output_tokens", o.num_output_tokens},
              {"num_preemptions", o.num_preemptions},
              {"first_scheduled_ns", nullptr}};
  if (o.first_scheduled) out["first_scheduled_ns"] = o.first_scheduled->time_since_epoch().count();
  return out;
}

Result<runtime::RequestOutput> decode_output(const json& j) {
  return decode_with<runtime::RequestOutput>("output", [&] {
    runtime::RequestOutput o;
    j.at("id").get_to(o.request_id);
    j.at("tokens").get_to(o.new_token_ids);
    for (const json& s : j.at("samples")) o.new_samples.push_back(decode_sample(s));
    j.at("logits").get_to(o.new_logits);
    j.at("prompt_logits").get_to(o.new_prompt_logits);
    j.at("mtp_logits").get_to(o.new_mtp_logits);
    j.at("text").get_to(o.new_text);
    j.at("finished").get_to(o.finished);
    const int reason = j.at("finish_reason").get<int>();
    o.finish_reason = reason == 1   ? runtime::FinishReason::kStop
                      : reason == 2 ? runtime::FinishReason::kLength
                                    : runtime::FinishReason::kNone;
    j.at("aborted").get_to(o.aborted);
    o.error = decode_status(j.at("error"));
    j.at("num_prompt_tokens").get_to(o.num_prompt_tokens);
    j.at("num_cached_tokens").get_to(o.num_cached_tokens);
    j.at("num_output_tokens").get_to(o.num_output_tokens);
    j.at("num_preemptions").get_to(o.num_preemptions);
    if (const json& t = j.at("first_scheduled_ns"); !t.is_null())
      o.first_scheduled = std::chrono::steady_clock::time_point(
          std::chrono::steady_clock::duration(t.get<int64_t>()));
    return o;
  });
}

json encode_metrics(const runtime::EngineMetrics& m) {
  json comm = json::array();
  for (const auto& [key, counts] : m.comm)
    comm.push_back({key.layer, static_cast<int>(key.op), counts.calls, counts.bytes_received,
                    counts.bytes_sent});
  return {{"num_running", m.num_running},
          {"num_waiting", m.num_waiting},
          {"num_blocks", m.num_blocks},
          {"num_used_blocks", m.num_used_blocks},
          {"num_cached_free_blocks", m.num_cached_free_blocks},
          {"kv_cache_usage", m.kv_cache_usage},
          {"prefix_query_tokens", m.prefix_query_tokens},
          {"prefix_hit_tokens", m.prefix_hit_tokens},
          {"prompt_tokens", m.prompt_tokens},
          {"generation_tokens", m.generation_tokens},
          {"num_preemptions", m.num_preemptions},
          {"num_steps", m.num_steps},
          {"live_tokens", m.live_tokens},
          {"allocated_slots", m.allocated_slots},
          {"comm", std::move(comm)},
          {"spec_num_drafts", m.spec_num_drafts},
          {"spec_num_draft_tokens", m.spec_num_draft_tokens},
          {"spec_num_accepted_tokens", m.spec_num_accepted_tokens},
          {"spec_accepted_per_position", m.spec_accepted_per_position},
          {"spec_rollback_bytes", m.spec_rollback_bytes},
          {"worker_restarts", m.worker_restarts},
          {"requests_migrated", m.requests_migrated},
          {"images_preprocessed", m.images_preprocessed},
          {"image_preprocess_seconds", m.image_preprocess_seconds},
          {"images_encoded", m.images_encoded},
          {"image_tokens_encoded", m.image_tokens_encoded},
          {"image_encode_steps", m.image_encode_steps},
          {"image_encode_seconds", m.image_encode_seconds}};
}

Result<runtime::EngineMetrics> decode_metrics(const json& j) {
  return decode_with<runtime::EngineMetrics>("metrics", [&] {
    runtime::EngineMetrics m;
    j.at("num_running").get_to(m.num_running);
    j.at("num_waiting").get_to(m.num_waiting);
    j.at("num_blocks").get_to(m.num_blocks);
    j.at("num_used_blocks").get_to(m.num_used_blocks);
    j.at("num_cached_free_blocks").get_to(m.num_cached_free_blocks);
    j.at("kv_cache_usage").get_to(m.kv_cache_usage);
    j.at("prefix_query_tokens").get_to(m.prefix_query_tokens);
    j.at("prefix_hit_tokens").get_to(m.prefix_hit_tokens);
    j.at("prompt_tokens").get_to(m.prompt_tokens);
    j.at("generation_tokens").get_to(m.generation_tokens);
    j.at("num_preemptions").get_to(m.num_preemptions);
    j.at("num_steps").get_to(m.num_steps);
    j.at("live_tokens").get_to(m.live_tokens);
    j.at("allocated_slots").get_to(m.allocated_slots);
    for (const json& c : j.at("comm"))
      m.comm[dist::CommKey{.layer = c.at(0).get<int>(),
                           .op = static_cast<dist::CommOp>(c.at(1).get<int>())}] =
          dist::CommCounts{.calls = c.at(2).get<int64_t>(),
                           .bytes_received = c.at(3).get<int64_t>(),
                           .bytes_sent = c.at(4).get<int64_t>()};
    j.at("spec_num_drafts").get_to(m.spec_num_drafts);
    j.at("spec_num_draft_tokens").get_to(m.spec_num_draft_tokens);
    j.at("spec_num_accepted_tokens").get_to(m.spec_num_accepted_tokens);
    j.at("spec_accepted_per_position").get_to(m.spec_accepted_per_position);
    j.at("spec_rollback_bytes").get_to(m.spec_rollback_bytes);
    j.at("worker_restarts").get_to(m.worker_restarts);
    j.at("requests_migrated").get_to(m.requests_migrated);
    j.at("images_preprocessed").get_to(m.images_preprocessed);
    j.at("image_preprocess_seconds").get_to(m.image_preprocess_seconds);
    j.at("images_encoded").get_to(m.images_encoded);
    j.at("image_tokens_encoded").get_to(m.image_tokens_encoded);
    j.at("image_encode_steps").get_to(m.image_encode_steps);
    j.at("image_encode_seconds").get_to(m.image_encode_seconds);
    return m;
  });
}

}  // namespace dz::serve::worker
