#include "dayzero/runtime/engine.h"

#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "dayzero/kernels/paged_cache.h"

namespace dz::runtime {
namespace engine_test {

using std::chrono::milliseconds;

constexpr int64_t kVocab = 48;
constexpr int64_t kLatentDim = 16;
constexpr auto kWait = milliseconds(20000);  // generous: the machine is shared

// A causal toy model that really uses the paged cache: each token's record stores its id, and the
// logits of a row are a hash of every id cached at positions [0, pos] (read back through the
// block table), so a wrong block, slot or recompute changes the output. Forward passes can be
// rationed (permits), so tests can hold the engine inside a step.
class FakeLm : public model::CausalLm {
 public:
  int64_t vocab_size() const override { return kVocab; }
  int64_t hidden_size() const override { return kLatentDim; }
  std::vector<model::LayerCacheSpec> cache_layers() const override {
    model::LayerCacheSpec spec;
    spec.mla = kernels::MlaCacheLayout{
        .latent_dim = kLatentDim, .rope_dim = 0, .dtype = kernels::KvCacheDtype::kBf16};
    return {spec};
  }

  // Logits of the next token after `ids` (the hash chain of the whole prefix).
  static std::vector<float> logits_after(std::span<const int32_t> ids) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t id : ids) h = (h ^ static_cast<uint64_t>(id + 1)) * 1099511628211ull;
    std::vector<float> logits(kVocab);
    for (int64_t v = 0; v < kVocab; ++v) {
      uint64_t x = (h + static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull);
      x ^= x >> 31;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 29;
      logits[static_cast<size_t>(v)] = static_cast<float>(x % 4096) / 512.0f;
    }
    return logits;
  }

  Status forward(const ExecContext&, const model::ForwardBatch& batch, model::KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits,
                 model::TapSink*) override {
    {
      std::unique_lock lock(gate_mutex_);
      ++num_forwards_;
      last_num_sequences_ = static_cast<int64_t>(batch.sequences.size());
      gate_cv_.notify_all();
      gate_cv_.wait(lock, [&] { return permits_ != 0; });
      if (permits_ > 0) --permits_;
    }
    model::MlaLayerCache layer = cache.mla_layer(0);
    std::vector<float> record(kLatentDim, 0.0f);
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      const int32_t id = batch.token_ids[static_cast<size_t>(t)];
      if (id < 0 || id >= kVocab)
        return make_error(StatusCode::kInvalidArgument, "token {} outside the vocabulary", id);
      record[0] = static_cast<float>(id);
      kernels::write_mla_record(layer.layout, layer.pool,
                                batch.slot_mapping[static_cast<size_t>(t)], record.data(), nullptr);
    }
    std::vector<int32_t> prefix;
    for (size_t r = 0; r < logits_rows.size(); ++r) {
      const int64_t row = logits_rows[r];
      const model::SequenceSlice* seq = nullptr;
      for (const auto& s : batch.sequences)
        if (row >= s.token_begin && row < s.token_begin + s.num_tokens) seq = &s;
      if (seq == nullptr) return make_error(StatusCode::kInternal, "row {} in no sequence", row);
      const int64_t pos = seq->pos_begin + (row - seq->token_begin);
      prefix.clear();
      for (int64_t p = 0; p <= pos; ++p) {
        kernels::read_mla_record(layer.layout, layer.pool,
                                 model::slot_of(seq->block_table, batch.block_size, p),
                                 record.data());
        prefix.push_back(static_cast<int32_t>(record[0]));
      }
      std::vector<float> logits = logits_after(prefix);
      std::copy(logits.begin(), logits.end(), out_logits + r * kVocab);
    }
    return Status::ok_status();
  }

  // How many more forward passes may run; -1: any number.
  void set_permits(int64_t permits) {
    {
      std::lock_guard lock(gate_mutex_);
      permits_ = permits;
    }
    gate_cv_.notify_all();
  }
  // Waits until more than `count` forward passes have started.
  bool wait_forwards_above(int64_t count) {
    std::unique_lock lock(gate_mutex_);
    return gate_cv_.wait_for(lock, kWait, [&] { return num_forwards_ > count; });
  }
  int64_t num_forwards() {
    std::lock_guard lock(gate_mutex_);
    return num_forwards_;
  }
  // Sequences in the batch of the latest forward pass (the one held, if any).
  int64_t last_num_sequences() {
    std::lock_guard lock(gate_mutex_);
    return last_num_sequences_;
  }

 private:
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  int64_t permits_ = -1;
  int64_t num_forwards_ = 0;
  int64_t last_num_sequences_ = 0;
};

// Lets every forward pass run again when a test ends early, before its engine is destroyed
// (declare it after the engine).
struct ReleaseOnExit {
  FakeLm& model;
  ~ReleaseOnExit() { model.set_permits(-1); }
};

EngineConfig small_config() {
  EngineConfig config;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 24;
  config.block_size = 4;
  config.num_blocks = 64;
  config.max_model_len = 128;
  config.check_invariants = true;
  return config;
}

GenerationRequest make_request(std::mt19937& rng, int64_t index) {
  GenerationRequest request;
  const int64_t num_prompt = 1 + static_cast<int64_t>(rng() % 30);
  for (int64_t i = 0; i < num_prompt; ++i)
    request.prompt_token_ids.push_back(static_cast<int32_t>(rng() % kVocab));
  request.max_tokens = 1 + static_cast<int64_t>(rng() % 12);
  if (index % 2 == 1) {
    request.sampling.temperature = 0.8f;
    request.sampling.seed = static_cast<uint64_t>(index);
  }
  return request;
}

struct Collected {
  std::vector<int32_t> tokens;
  RequestOutput last;
  int64_t num_outputs = 0;
};

// Reads a stream to its end (fails the test on a timeout).
Collected drain(RequestStream& stream) {
  Collected result;
  while (!stream.finished()) {
    std::optional<RequestOutput> output = stream.next(kWait);
    if (!output) {
      ADD_FAILURE() << "request " << stream.id() << " timed out";
      break;
    }
    EXPECT_EQ(output->request_id, stream.id());
    result.tokens.insert(result.tokens.end(), output->new_token_ids.begin(),
                         output->new_token_ids.end());
    ++result.num_outputs;
    result.last = std::move(*output);
  }
  return result;
}

// The same requests through one EngineCore stepped by hand.
std::vector<std::vector<int32_t>> run_core(model::CausalLm& model, const EngineConfig& config,
                                           const std::vector<GenerationRequest>& requests) {
  auto core = EngineCore::create(model, ExecContext{}, config);
  EXPECT_TRUE(core.ok()) << core.status().to_string();
  std::vector<std::vector<int32_t>> tokens(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_TRUE((*core)->add_request(static_cast<int64_t>(i), requests[i]).ok());
  for (int64_t steps = 0; (*core)->has_unfinished_requests() && steps < 100000; ++steps)
    for (RequestOutput& output : (*core)->step()) {
      EXPECT_TRUE(output.error.ok()) << output.error.to_string();
      auto& out = tokens[static_cast<size_t>(output.request_id)];
      out.insert(out.end(), output.new_token_ids.begin(), output.new_token_ids.end());
    }
  return tokens;
}

TEST(EngineTest, ConcurrentSubmittersMatchTheCoreDrivenDirectly) {
  FakeLm model;
  const EngineConfig config = small_config();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 6;
  std::mt19937 rng(7);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < kThreads * kPerThread; ++i) requests.push_back(make_request(rng, i));
  const std::vector<std::vector<int32_t>> expected = run_core(model, config, requests);

  // Greedy outputs also follow the model's own argmax chain (a check of the fake and the core).
  for (size_t i = 0; i < requests.size(); i += 2) {
    std::vector<int32_t> ids = requests[i].prompt_token_ids;
    for (size_t k = 0; k < expected[i].size(); ++k) {
      std::vector<float> logits = FakeLm::logits_after(ids);
      const auto argmax =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(expected[i][k], argmax) << "request " << i << " token " << k;
      ids.push_back(argmax);
    }
    EXPECT_EQ(static_cast<int64_t>(expected[i].size()), requests[i].max_tokens);
  }

  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<Collected> got(requests.size());
  std::vector<int64_t> ids(requests.size(), -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::pair<size_t, std::shared_ptr<RequestStream>>> streams;
      for (int k = 0; k < kPerThread; ++k) {
        const size_t i = static_cast<size_t>(t * kPerThread + k);
        auto stream = (*engine)->submit(requests[i]);
        if (!stream.ok()) {
          ADD_FAILURE() << stream.status().to_string();
          return;
        }
        ids[i] = (*stream)->id();
        streams.emplace_back(i, *stream);
      }
      for (auto& [i, stream] : streams) got[i] = drain(*stream);
    });
  for (auto& thread : threads) thread.join();

  std::set<int64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), requests.size()) << "request ids must be fresh";
  int64_t num_generated = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i;
    EXPECT_TRUE(got[i].last.finished);
    EXPECT_FALSE(got[i].last.aborted);
    EXPECT_TRUE(got[i].last.error.ok());
    EXPECT_EQ(got[i].last.num_prompt_tokens,
              static_cast<int64_t>(requests[i].prompt_token_ids.size()));
    num_generated += static_cast<int64_t>(got[i].tokens.size());
  }
  const EngineMetrics metrics = (*engine)->metrics();
  EXPECT_EQ(metrics.num_running, 0);
  EXPECT_EQ(metrics.num_waiting, 0);
  EXPECT_GE(metrics.generation_tokens, num_generated);
  EXPECT_GT(metrics.num_steps, 0);
}

TEST(EngineTest, NextAfterTheFinalOutputReturnsAtOnce) {
  FakeLm model;
  auto engine = Engine::create(model, ExecContext{}, small_config());
  ASSERT_TRUE(engine.ok());
  GenerationRequest request;
  request.prompt_token_ids = {1, 2, 3};
  request.max_tokens = 3;
  auto stream = (*engine)->submit(request);
  ASSERT_TRUE(stream.ok());
  Collected result = drain(**stream);
  EXPECT_EQ(result.tokens.size(), 3u);
  EXPECT_EQ(result.last.finish_reason, FinishReason::kLength);
  EXPECT_TRUE((*stream)->finished());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE((*stream)->next(milliseconds(5000)).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

TEST(EngineTest, InvalidRequestsAreRefusedAtOnce) {
  FakeLm model;
  auto engine = Engine::create(model, ExecContext{}, small_config());
  ASSERT_TRUE(engine.ok());
  GenerationRequest empty;
  auto refused = (*engine)->submit(empty);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  GenerationRequest outside;
  outside.prompt_token_ids = {1, static_cast<int32_t>(kVocab)};
  refused = (*engine)->submit(outside);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineTest, QueueFullIsRefusedWithResourceExhausted) {
  FakeLm model;
  EngineConfig config = small_config();
  config.max_num_seqs = 1;
  config.max_queued_requests = 2;
  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok());
  GenerationRequest request;
  request.prompt_token_ids = {5, 6, 7};
  request.max_tokens = 4;

  ReleaseOnExit release{model};
  model.set_permits(0);  // the loop blocks inside the first forward pass
  auto running = (*engine)->submit(request);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(model.wait_forwards_above(0));
  // Until a step ends, requests moved into the core count as waiting (the core cannot be asked
  // mid-step), so let step 1 finish: `running` is then running, not waiting.
  model.set_permits(1);
  ASSERT_TRUE(model.wait_forwards_above(1));
  auto queued1 = (*engine)->submit(request);
  auto queued2 = (*engine)->submit(request);
  ASSERT_TRUE(queued1.ok());
  ASSERT_TRUE(queued2.ok());
  auto refused = (*engine)->submit(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("max_queued_requests"), std::string::npos)
      << refused.status().to_string();
  model.set_permits(-1);

  for (auto* stream : {&*running, &*queued1, &*queued2}) {
    Collected result = drain(**stream);
    EXPECT_EQ(result.tokens.size(), 4u);
    EXPECT_FALSE(result.last.aborted);
  }
  // Room again once the queue drained.
  auto later = (*engine)->submit(request);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(drain(**later).tokens.size(), 4u);
}

// The race of a soak (12 clients, --max-queued-requests 4, a tiny KV cache): submit counts the
// core's waiting requests as of the last step end, but the step running meanwhile may preempt
// and so fill the core's queue. A request submit accepted must still run, never end with
// kResourceExhausted (which the server answered as a 500).
TEST(EngineTest, PreemptionDuringAStepDoesNotRefuseAcceptedRequests) {
  FakeLm model;
  EngineConfig config = small_config();
  config.max_num_seqs = 2;
  config.max_queued_requests = 2;
  config.num_blocks = 1 + 7;  // two requests of 23 tokens need 12 blocks of 4: one is preempted
  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok());
  GenerationRequest long_request;
  long_request.prompt_token_ids = {1, 2, 3, 4};
  long_request.max_tokens = 20;

  ReleaseOnExit release{model};
  model.set_permits(0);
  auto a = (*engine)->submit(long_request);
  auto b = (*engine)->submit(long_request);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  // Step by step until a step runs one sequence: its schedule() preempted the other, which now
  // waits in the core while the engine still counts no waiting request.
  int64_t step = 1;
  for (;; ++step) {
    ASSERT_TRUE(model.wait_forwards_above(step - 1));
    if (step > 1 && model.last_num_sequences() == 1) break;
    ASSERT_LT(step, 40) << "no preemption";
    model.set_permits(1);
  }
  GenerationRequest short_request;
  short_request.prompt_token_ids = {5, 6, 7};
  short_request.max_tokens = 2;
  auto c = (*engine)->submit(short_request);
  auto d = (*engine)->submit(short_request);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(d.ok());
  auto refused = (*engine)->submit(short_request);  // the bound, at submit
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  model.set_permits(-1);

  int64_t num_preemptions = 0;
  for (auto* stream : {&*a, &*b, &*c, &*d}) {
    Collected result = drain(**stream);
    EXPECT_TRUE(result.last.error.ok()) << result.last.error.to_string();
    EXPECT_FALSE(result.last.aborted);
    EXPECT_EQ(static_cast<int64_t>(result.tokens.size()), stream == &*a || stream == &*b ? 20 : 2);
    num_preemptions += result.last.num_preemptions;
  }
  EXPECT_GE(num_preemptions, 1);
}

TEST(EngineTest, CancelWhileQueuedAndWhileRunning) {
  FakeLm model;
  EngineConfig config = small_config();
  config.max_num_seqs = 1;
  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok());
  GenerationRequest long_request;
  long_request.prompt_token_ids = {3, 1, 4, 1, 5};
  long_request.max_tokens = 100;

  ReleaseOnExit release{model};
  model.set_permits(0);
  auto running = (*engine)->submit(long_request);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(model.wait_forwards_above(0));  // step 1 of `running`, held
  // Queued behind it (max_num_seqs 1): one cancelled while still in the engine's inbox, one after
  // the loop moved it into the core's waiting queue.
  auto in_inbox = (*engine)->submit(long_request);
  ASSERT_TRUE(in_inbox.ok());
  (*engine)->cancel((*in_inbox)->id());
  auto in_core = (*engine)->submit(long_request);
  ASSERT_TRUE(in_core.ok());
  model.set_permits(1);
  ASSERT_TRUE(model.wait_forwards_above(1));  // step 2 held: in_core was admitted before it
  (*engine)->cancel((*in_core)->id());
  model.set_permits(1);
  ASSERT_TRUE(model.wait_forwards_above(2));  // step 3 held: the cancel was processed before it
  for (auto* stream : {&*in_inbox, &*in_core}) {
    Collected result = drain(**stream);
    EXPECT_TRUE(result.last.finished);
    EXPECT_TRUE(result.last.aborted);
    EXPECT_EQ(result.last.finish_reason, FinishReason::kNone);
    EXPECT_TRUE(result.tokens.empty());
  }

  // The running one, after two steps.
  (*engine)->cancel((*running)->id());
  model.set_permits(-1);
  Collected rest = drain(**running);
  EXPECT_TRUE(rest.last.aborted);
  EXPECT_LE(static_cast<int64_t>(rest.tokens.size()), 3);

  (*engine)->cancel(12345);             // unknown: ignored
  (*engine)->cancel((*running)->id());  // finished: ignored
  GenerationRequest after = long_request;
  after.max_tokens = 2;
  auto stream = (*engine)->submit(after);
  ASSERT_TRUE(stream.ok());
  Collected result = drain(**stream);
  EXPECT_EQ(result.tokens.size(), 2u);
  EXPECT_EQ((*engine)->metrics().num_running, 0);
}

TEST(EngineTest, ChoicesStreamApartAndEqualIndependentRequests) {
  FakeLm model;
  const EngineConfig config = small_config();
  GenerationRequest request;
  request.prompt_token_ids = {2, 7, 1, 8, 2, 8};
  request.max_tokens = 6;
  request.sampling.temperature = 1.0f;
  request.sampling.seed = 11;
  std::vector<GenerationRequest> alone(4, request);
  for (size_t c = 0; c < alone.size(); ++c) alone[c].choice_index = static_cast<uint32_t>(c);
  const std::vector<std::vector<int32_t>> want = run_core(model, config, alone);
  EXPECT_NE(want[0], want[1]);

  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->submit_choices(request, 0).status().code(), StatusCode::kInvalidArgument);
  ReleaseOnExit release{model};
  // Held inside a step, so that the next submission waits in the inbox while one choice is
  // cancelled: the others keep their choice streams.
  model.set_permits(0);
  auto blocker = (*engine)->submit(request);
  ASSERT_TRUE(blocker.ok());
  ASSERT_TRUE(model.wait_forwards_above(0));
  auto streams = (*engine)->submit_choices(request, 4);
  ASSERT_TRUE(streams.ok());
  ASSERT_EQ(streams->size(), 4u);
  (*engine)->cancel((*streams)[1]->id());
  model.set_permits(-1);
  for (size_t c = 0; c < streams->size(); ++c) {
    const Collected result = drain(*(*streams)[c]);
    EXPECT_TRUE(result.last.finished) << "choice " << c;
    if (c == 1) {
      EXPECT_TRUE(result.last.aborted);
      continue;
    }
    EXPECT_EQ(result.tokens, want[c]) << "choice " << c;
  }
  EXPECT_EQ(drain(**blocker).tokens, want[0]);
}

TEST(EngineTest, AbandonedStreamsDoNotBlockTheEngine) {
  FakeLm model;
  auto engine = Engine::create(model, ExecContext{}, small_config());
  ASSERT_TRUE(engine.ok());
  GenerationRequest request;
  request.prompt_token_ids = {9, 8, 7, 6};
  request.max_tokens = 50;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*engine)->submit(request).ok());  // dropped at once
  request.max_tokens = 5;
  auto kept = (*engine)->submit(request);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(drain(**kept).tokens.size(), 5u);
  // The dropped ones were cancelled rather than run to the end.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while ((*engine)->metrics().num_running + (*engine)->metrics().num_waiting > 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ((*engine)->metrics().num_running, 0);
  EXPECT_LT((*engine)->metrics().generation_tokens, 10 * 50);
}

TEST(EngineTest, DestructorAbortsRequestsInFlight) {
  FakeLm model;
  std::vector<std::shared_ptr<RequestStream>> streams;
  EngineConfig config = small_config();
  config.max_num_seqs = 2;
  auto engine = Engine::create(model, ExecContext{}, config);
  ASSERT_TRUE(engine.ok());
  GenerationRequest request;
  request.prompt_token_ids = {2, 4, 6, 8, 10, 12};
  request.max_tokens = 100;
  ReleaseOnExit release{model};
  model.set_permits(3);
  for (int i = 0; i < 6; ++i) {
    auto stream = (*engine)->submit(request);
    ASSERT_TRUE(stream.ok());
    streams.push_back(*stream);
  }
  ASSERT_TRUE(model.wait_forwards_above(3));  // held in step 4: two running, the rest waiting
  std::unique_ptr<Engine> owned = std::move(*engine);
  std::thread destroy([&] { owned.reset(); });
  std::this_thread::sleep_for(milliseconds(50));  // the destructor is waiting for the step
  model.set_permits(-1);
  destroy.join();
  for (auto& stream : streams) {
    Collected result = drain(*stream);
    EXPECT_TRUE(result.last.finished);
    EXPECT_TRUE(result.last.aborted) << "request " << stream->id();
  }
}

TEST(EngineTest, TheLoopSleepsWhenIdle) {
  FakeLm model;
  auto engine = Engine::create(model, ExecContext{}, small_config());
  ASSERT_TRUE(engine.ok());
  std::this_thread::sleep_for(milliseconds(50));
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(milliseconds(300));
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  auto micros = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000 + r.ru_utime.tv_usec +
           r.ru_stime.tv_usec;
  };
  EXPECT_LT(micros(after) - micros(before), 50000) << "the idle loop burned CPU";
  EXPECT_EQ(model.num_forwards(), 0);
}

}  // namespace engine_test
}  // namespace dz::runtime
