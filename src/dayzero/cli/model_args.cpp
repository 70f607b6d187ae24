#include "dayzero/cli/model_args.h"

#include <cstdio>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "dayzero/cli/default_model.h"
#include "dayzero/dist/mpi_comm.h"
#include "dayzero/model/decoder_layer.h"
#include "dayzero/model/step_broadcast.h"

namespace dz::cli {
namespace {

// MPI for the whole process, started by the first multi-rank load and finalized at exit, after
// every model (which only borrows the communicator) is gone.
struct Ranks {
  std::unique_ptr<dist::MpiSession> session;
  std::unique_ptr<dist::MpiComm> world;
  std::unique_ptr<dist::MpiComm>
      tp_group;  // this rank's TP group when ep or cp > 1 (else the world)
  std::unique_ptr<dist::MpiComm> cp_group;  // this rank's CP group when cp > 1
};
Ranks& ranks() {
  static Ranks state;
  return state;
}

model::ParallelPlan plan_of(const ModelArgs& args) {
  return {.tp = args.parallel.tp, .ep = args.parallel.ep, .cp = args.parallel.cp};
}

// How long a rank waits in one collective before it names the operation and ends the job.
constexpr double kCollectiveTimeoutSeconds = 120.0;

Result<dist::Comm*> start_ranks(const model::ParallelPlan& plan) {
  Ranks& state = ranks();
  if (state.world == nullptr) {
    if (!dist::launched_by_mpi())
      return make_error(
          StatusCode::kInvalidArgument,
          "plan {} needs {} ranks: run this command under `mpirun -np {} dayzero ...`",
          plan.describe(), plan.world_size(), plan.world_size());
    DZ_ASSIGN_OR_RETURN(state.session, dist::MpiSession::start());
    state.world = dist::MpiComm::world(kCollectiveTimeoutSeconds);
  }
  if (state.world->size() != plan.world_size())
    return make_error(StatusCode::kInvalidArgument,
                      "plan {} needs {} ranks, mpirun started {}: use `mpirun -np {}`",
                      plan.describe(), plan.world_size(), state.world->size(), plan.world_size());
  return static_cast<dist::Comm*>(state.world.get());
}

// Every rank learns whether every rank loaded its shard before any forward collective: a rank
// that failed reports its own error, the others name it, and all stop together (instead of the
// others waiting in their first collective until the deadline).
Result<std::unique_ptr<model::CausalLm>> agree_on_load(
    dist::Comm& comm, Result<std::unique_ptr<model::CausalLm>> loaded) {
  const int32_t mine = loaded.ok() ? 0 : 1;
  std::vector<int32_t> failed(static_cast<size_t>(comm.size()));
  const std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 1);
  comm.all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(failed)),
                  counts, dist::WireType::kI32, -1);
  if (!loaded.ok()) return loaded.status().with_context(fmt::format("rank {}", comm.rank()));
  std::vector<int> ranks_failed;
  for (int r = 0; r < comm.size(); ++r)
    if (failed[static_cast<size_t>(r)] != 0) ranks_failed.push_back(r);
  comm.stats().reset();  // the traffic reported from here on is the model's
  model::mixer_seconds() = {};
  if (!ranks_failed.empty())
    return make_error(StatusCode::kInternal,
                      "rank {}: rank(s) {} could not load their shard (their own error says why)",
                      comm.rank(), fmt::join(ranks_failed, ", "));
  return loaded;
}

}  // namespace

CLI::Validator integer_at_least(int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || value < min)
          return fmt::format("must be an integer >= {}, got {}", min, text);
        return {};
      },
      fmt::format("INT>={}", min));
}

void add_model_options(CLI::App& command, ModelArgs& args, bool model_has_default) {
  if (model_has_default) {
    command.add_option("--model", args.model_dir, default_model_help());
  } else {
    command.add_option("--model", args.model_dir, "checkpoint folder (config.json, safetensors)")
        ->required();
  }
  command
      .add_option("--kv-cache-dtype", args.kv_cache_dtype,
                  "MLA latent cache: fp8 (656-byte records, act_quant round trip), bf16, or auto "
                  "(the model's default: fp8 for deepseek_v32, bf16 for Kimi)")
      ->check(CLI::IsMember({"auto", "fp8", "bf16"}))
      ->capture_default_str();
  command
      .add_option("--mxfp4-activations", args.mxfp4_activations,
                  "what MXFP4 weights multiply: bf16, or mxint8 (8-bit activations with a "
                  "power-of-two scale per 32, as llama.cpp's Q8 blocks: faster with several "
                  "tokens per expert on CPUs with AVX-512 VNNI, ~0.5 % error per activation)")
      ->check(CLI::IsMember({"bf16", "mxint8"}))
      ->capture_default_str();
  command.add_option("--threads", args.num_threads, "worker threads (0: all hardware threads)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command.add_option("--block-size", args.block_size, "tokens per KV cache block")
      ->check(integer_at_least(1))
      ->capture_default_str();
}

void add_parallel_options(CLI::App& command, ParallelArgs& args) {
  command.add_option("--tp", args.tp, "tensor-parallel ranks (under mpirun)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command.add_option("--ep", args.ep, "expert-parallel groups (under mpirun)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--cp", args.cp, "context-parallel ranks sharing each long prompt (under mpirun)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--cp-layout", args.cp_layout,
                  "how --cp cuts a prompt into 2·cp pieces: zigzag (rank r: pieces r and "
                  "2cp-1-r, balanced) or contiguous (pieces 2r and 2r+1)")
      ->check(CLI::IsMember({"zigzag", "contiguous"}))
      ->capture_default_str();
}

dist::Comm* plan_comm() {
  return ranks().world.get();
}

std::string traffic_summary() {
  const Ranks& state = ranks();
  if (state.world == nullptr) return "";
  const dist::CommStats& stats = state.world->stats();
  const dist::CommCounts steps = stats.for_layer(dist::kStepLayer);
  const dist::CommCounts model = stats.total();
  std::map<dist::CommOp, int64_t> received;  // the model's, by collective
  for (const auto& [key, counts] : stats.by_key())
    if (key.layer != dist::kStepLayer) received[key.op] += counts.bytes_received;
  std::string by_op;
  for (const auto& [op, bytes] : received)
    by_op += fmt::format("{}{} {}", by_op.empty() ? "" : ", ", dist::comm_op_name(op), bytes);
  const model::MixerSeconds& mixers = model::mixer_seconds();
  return fmt::format(
      "rank {} of {}: {} collectives, {} bytes received, {} sent (received: {}); step messages: "
      "{} collectives; mixer seconds: indexer {:.3f}, MLA {:.3f}, KDA {:.3f}, of which CP "
      "exchange {:.3f}",
      state.world->rank(), state.world->size(), model.calls, model.bytes_received, model.bytes_sent,
      by_op.empty() ? "none" : by_op, steps.calls, mixers.indexer, mixers.mla, mixers.kda,
      mixers.exchange);
}

Result<int> plan_rank(const ModelArgs& args) {
  const model::ParallelPlan plan = plan_of(args);
  if (plan.world_size() == 1) return 0;
  DZ_ASSIGN_OR_RETURN(dist::Comm * comm, start_ranks(plan));
  return comm->rank();
}

ExecContext exec_context(const ModelArgs& args) {
  return ExecContext{.num_threads =
                         args.num_threads > 0 ? args.num_threads : default_num_threads()};
}

Result<std::unique_ptr<model::CausalLm>> load_shard(const ModelArgs& args) {
  model::ModelOptions options;
  if (args.kv_cache_dtype == "bf16") options.kv_cache_dtype = kernels::KvCacheDtype::kBf16;
  if (args.kv_cache_dtype == "fp8") options.kv_cache_dtype = kernels::KvCacheDtype::kFp8;
  if (args.mxfp4_activations == "mxint8")
    options.mxfp4_activations = kernels::Mxfp4Activations::kMxint8;
  options.plan = plan_of(args);
  if (options.plan.world_size() == 1) return model::load_causal_lm(args.model_dir, options);
  DZ_ASSIGN_OR_RETURN(options.comm, start_ranks(options.plan));
  options.rank = options.comm->rank();
  options.tp_comm = options.comm;
  const model::ParallelPlan& plan = options.plan;
  Ranks& state = ranks();
  if (plan.ep > 1 || plan.cp > 1) {  // the tp ranks of the same ep and cp coordinates
    if (state.tp_group == nullptr)
      state.tp_group = state.world->split(options.rank / plan.tp, plan.tp_rank(options.rank));
    options.tp_comm = state.tp_group.get();
  }
  if (plan.cp > 1) {  // the cp ranks of the same TP index (ep is 1)
    if (state.cp_group == nullptr)
      state.cp_group =
          state.world->split(options.rank % (plan.tp * plan.ep), plan.cp_rank(options.rank));
    options.cp_comm = state.cp_group.get();
    options.cp_layout = args.parallel.cp_layout == "contiguous" ? model::ContextLayout::kContiguous
                                                                : model::ContextLayout::kZigzag;
  }
  return agree_on_load(*options.comm, model::load_causal_lm(args.model_dir, options));
}

Result<std::unique_ptr<model::CausalLm>> load_model(const ModelArgs& args) {
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> shard, load_shard(args));
  const model::ParallelPlan plan = plan_of(args);
  if (plan.world_size() == 1) return shard;
  dist::Comm& comm = *plan_comm();
  if (comm.rank() == 0)
    return std::unique_ptr<model::CausalLm>(
        std::make_unique<model::StepLeader>(std::move(shard), comm, plan));
  model::follow_steps(*shard, comm, exec_context(args), plan);
  spdlog::info("{}", traffic_summary());
  return std::unique_ptr<model::CausalLm>();
}

Result<std::vector<int32_t>> parse_token_ids(const std::string& list, const char* flag) {
  std::vector<int32_t> ids;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX)
      return make_error(StatusCode::kInvalidArgument,
                        "{}: \"{}\" is not a token id (a non-negative integer)", flag, item);
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty() || (!list.empty() && list.back() == ','))
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected a comma-separated list of token ids, got \"{}\"", flag, list);
  return ids;
}

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
  return 1;
}

}  // namespace dz::cli
