#include "dayzero/serve/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "dayzero/runtime/testing/recording_lm.h"

namespace dz::serve {
namespace server_test {

using std::chrono::milliseconds;

constexpr auto kWait = milliseconds(20000);  // generous: the machine is shared

// What the test controls in the model's forward passes: how many more may run (-1: any; the
// engine is held inside a step while none may), and an error for the next one.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  int64_t permits = -1;
  int64_t num_forwards = 0;
  int64_t last_num_sequences = 0;
  std::optional<Status> fail_next;

  void set_permits(int64_t n) {
    {
      std::lock_guard lock(mutex);
      permits = n;
    }
    cv.notify_all();
  }
  bool wait_forwards_above(int64_t count) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, kWait, [&] { return num_forwards > count; });
  }
  int64_t sequences_in_last_forward() {
    std::lock_guard lock(mutex);
    return last_num_sequences;
  }
};

// The recording fake (token ids in a real paged cache) behind the gate.
class GatedLm : public runtime::testing::RecordingLm {
 public:
  explicit GatedLm(std::shared_ptr<Gate> gate) : RecordingLm(false), gate_(std::move(gate)) {}

  Status forward(const ExecContext& ctx, const model::ForwardBatch& batch, model::KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits,
                 model::TapSink* taps) override {
    {
      std::unique_lock lock(gate_->mutex);
      ++gate_->num_forwards;
      gate_->last_num_sequences = static_cast<int64_t>(batch.sequences.size());
      gate_->cv.notify_all();
      gate_->cv.wait(lock, [&] { return gate_->permits != 0; });
      if (gate_->permits > 0) --gate_->permits;
      if (gate_->fail_next) {
        Status failure = std::move(*gate_->fail_next);
        gate_->fail_next.reset();
        return failure;
      }
    }
    return RecordingLm::forward(ctx, batch, cache, logits_rows, out_logits, taps);
  }

 private:
  std::shared_ptr<Gate> gate_;
};

// The real server on a free loopback port, with the demo model's tokenizer in front of GatedLm.
class ServerTest : public ::testing::Test {
 protected:
  void start(const runtime::EngineConfig& engine) {
    ServerConfig config;
    config.port = 0;
    config.model_dir = DZ_SOURCE_DIR "/models/demo";
    config.engine = engine;
    config.load_model = [gate = gate_]() -> Result<std::unique_ptr<model::CausalLm>> {
      return std::unique_ptr<model::CausalLm>(std::make_unique<GatedLm>(gate));
    };
    server_ = std::make_unique<Server>(std::move(config));
    ASSERT_TRUE(server_->bind().ok());
    thread_ = std::thread([this] { (void)server_->run(); });
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!server_->ready() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(server_->ready());
  }

  void TearDown() override {
    gate_->set_permits(-1);
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }

  struct Reply {
    int status = 0;  // 0: no response
    std::string retry_after;
    std::string body;
  };

  Reply post(const nlohmann::json& body) const {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(std::chrono::seconds(30));
    httplib::Result result = client.Post("/v1/completions", body.dump(), "application/json");
    Reply reply;
    if (!result) return reply;
    reply.status = result->status;
    reply.retry_after = result->get_header_value("Retry-After");
    reply.body = result->body;
    return reply;
  }

  static nlohmann::json completion(int64_t max_tokens, bool stream = false) {
    return {{"model", "demo"},  {"prompt", {1, 2, 3, 4}}, {"max_tokens", max_tokens},
            {"temperature", 0}, {"ignore_eos", true},     {"stream", stream}};
  }

  static void expect_overloaded(const Reply& reply) {
    EXPECT_EQ(reply.status, 503) << reply.body;
    ASSERT_FALSE(reply.retry_after.empty()) << reply.body;
    const int seconds = std::stoi(reply.retry_after);
    EXPECT_GE(seconds, 1);
    EXPECT_LE(seconds, 60);
    const auto body = nlohmann::json::parse(reply.body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << reply.body;
    EXPECT_EQ(body["error"]["type"], "server_overloaded") << reply.body;
  }

  static runtime::EngineConfig small_engine() {
    runtime::EngineConfig engine;
    engine.max_num_seqs = 2;
    engine.max_queued_requests = 2;
    engine.max_num_batched_tokens = 24;
    engine.block_size = 4;
    engine.num_blocks = 1 + 7;  // two requests of 23 tokens need 12 blocks: one is preempted
    engine.max_model_len = 128;
    engine.check_invariants = true;
    return engine;
  }

  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

// The soak's race, end to end: requests accepted while a step preempts (filling the engine
// core's queue behind submit's back) must run (200), and the queue bound answers 503 with
// Retry-After, never 500.
TEST_F(ServerTest, QueueFullWhileAStepPreemptsIs503NotA500) {
  start(small_engine());
  gate_->set_permits(0);
  std::vector<Reply> long_replies(2);
  std::vector<std::thread> clients;
  for (Reply& reply : long_replies) clients.emplace_back([&] { reply = post(completion(20)); });
  // Step by step until both run, then until one step runs a single sequence: its schedule()
  // preempted the other.
  bool both_ran = false;
  for (int64_t step = 1;; ++step) {
    ASSERT_TRUE(gate_->wait_forwards_above(step - 1));
    const int64_t sequences = gate_->sequences_in_last_forward();
    if (both_ran && sequences == 1) break;
    both_ran = both_ran || sequences == 2;
    ASSERT_LT(step, 40) << "no preemption";
    // The second client's request may still be on its way.
    if (!both_ran) std::this_thread::sleep_for(milliseconds(20));
    gate_->set_permits(1);
  }
  // Four more while that step is held: the engine counts no waiting request, so two are accepted
  // (and wait), two refused at once.
  std::vector<Reply> short_replies(4);
  std::mutex mutex;
  std::condition_variable answered_cv;
  int answered = 0;
  for (Reply& reply : short_replies)
    clients.emplace_back([&] {
      Reply r = post(completion(2));
      std::lock_guard lock(mutex);
      reply = std::move(r);
      ++answered;
      answered_cv.notify_all();
    });
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(answered_cv.wait_for(lock, kWait, [&] { return answered >= 2; }));
    int refused = 0;
    for (const Reply& reply : short_replies) {
      if (reply.status == 0) continue;
      expect_overloaded(reply);
      ++refused;
    }
    EXPECT_EQ(refused, 2);
  }
  gate_->set_permits(-1);
  for (std::thread& client : clients) client.join();

  int succeeded = 0;
  for (const Reply& reply : short_replies) {
    if (reply.status == 503) continue;
    EXPECT_EQ(reply.status, 200) << reply.body;
    const auto body = nlohmann::json::parse(reply.body, nullptr, false);
    EXPECT_EQ(body["usage"]["completion_tokens"], 2) << reply.body;
    ++succeeded;
  }
  EXPECT_EQ(succeeded, 2);
  for (const Reply& reply : long_replies) {
    EXPECT_EQ(reply.status, 200) << reply.body;
    const auto body = nlohmann::json::parse(reply.body, nullptr, false);
    EXPECT_EQ(body["usage"]["completion_tokens"], 20) << reply.body;
  }
}

// A full pool or queue reported after submit (kResourceExhausted in the stream) is an overload
// too: 503 with Retry-After for a whole response; once a stream's 200 is out, an SSE error event
// of type server_overloaded, then [DONE].
TEST_F(ServerTest, ResourceExhaustedAfterSubmitIsAnOverload) {
  start(small_engine());
  {
    std::lock_guard lock(gate_->mutex);
    gate_->fail_next = Status(StatusCode::kResourceExhausted, "injected: no room");
  }
  const Reply whole = post(completion(4));
  expect_overloaded(whole);
  EXPECT_NE(whole.body.find("injected: no room"), std::string::npos) << whole.body;

  {
    std::lock_guard lock(gate_->mutex);
    gate_->fail_next = Status(StatusCode::kResourceExhausted, "injected: no room");
  }
  const Reply streamed = post(completion(4, /*stream=*/true));
  EXPECT_EQ(streamed.status, 200);
  const size_t data = streamed.body.find("data: {\"error\"");
  ASSERT_NE(data, std::string::npos) << streamed.body;
  const size_t end = streamed.body.find("\n\n", data);
  const auto event = nlohmann::json::parse(streamed.body.substr(data + 6, end - data - 6));
  EXPECT_EQ(event["error"]["type"], "server_overloaded");
  EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos) << streamed.body;

  // Other failures stay 500.
  {
    std::lock_guard lock(gate_->mutex);
    gate_->fail_next = Status(StatusCode::kInternal, "injected: broken");
  }
  const Reply failed = post(completion(4));
  EXPECT_EQ(failed.status, 500) << failed.body;
  EXPECT_TRUE(failed.retry_after.empty());
}

}  // namespace server_test
}  // namespace dz::serve
