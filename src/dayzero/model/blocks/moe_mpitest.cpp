// The MoE block under expert parallelism (docs/parallel.md §1, §3), run by mpirun at 2 and 4 ranks
// (model/CMakeLists.txt): every plan the ranks allow (tp × ep with ep > 1) against the block in one
// process, and the bytes each rank receives in the dispatch and combine against the record format
// evaluated on the routing that was made.
//
// Every rank builds the same random block (rank 0 draws and prints the seed) and keeps only its
// experts (and, at tp > 1, its columns of the shared expert). Each TP group serves its own tokens,
// one group none at all, as a data-parallel step may. Tolerance: relative RMS < 2e-3 against the
// one-process block, as moe_test.cpp derives it: only the grouping of the FP32 sum of the experts'
// outputs differs (each rank's experts are summed first), and an intermediate BF16 rounding it tips
// moves a token's outputs by ~1e-3 at most. Routing cannot differ: both blocks route the same
// inputs with the same code.

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dayzero/dist/mpi_comm.h"
#include "dayzero/dist/mpi_test_main.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/model/blocks/moe.h"

namespace dz::model {
namespace {

dist::MpiComm* g_world = nullptr;
constexpr int kLayer = 7;

uint32_t shared_seed() {
  return dist::shared_test_seed(*g_world);
}

std::vector<float> random_bf16(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = formats::round_to_bf16(normal(rng));
  return v;
}

// A gated MLP's three matrices as FP32 values (BF16-valued): gate, up [inter, in], down [in,
// inter].
struct MlpValues {
  int64_t in = 0, inter = 0;
  std::vector<float> gate, up, down;
};

MlpValues random_mlp(std::mt19937& rng, int64_t in, int64_t inter) {
  const float s_in = 1.0f / std::sqrt(static_cast<float>(in));
  const float s_inter = 1.0f / std::sqrt(static_cast<float>(inter));
  return {in, inter, random_bf16(rng, inter * in, s_in), random_bf16(rng, inter * in, s_in),
          random_bf16(rng, in * inter, s_inter)};
}

// Columns [first, first + count) of the intermediate axis: gate/up rows, down columns.
MlpWeights mlp_slice(const MlpValues& v, int64_t first, int64_t count) {
  std::vector<float> down(static_cast<size_t>(v.in * count));
  for (int64_t i = 0; i < v.in; ++i)
    for (int64_t j = 0; j < count; ++j) down[i * count + j] = v.down[i * v.inter + first + j];
  MlpWeights w;
  w.gate_proj = kernels::LinearWeight::from_f32_as_bf16(v.gate.data() + first * v.in, count, v.in);
  w.up_proj = kernels::LinearWeight::from_f32_as_bf16(v.up.data() + first * v.in, count, v.in);
  w.down_proj = kernels::LinearWeight::from_f32_as_bf16(down.data(), v.in, count);
  return w;
}

struct BlockValues {
  MoeConfig config;
  std::vector<float> gate_weight, bias;
  std::vector<MlpValues> experts;
  MlpValues shared;
  std::vector<float> latent_down, latent_up, latent_norm;  // latent: [r, d], [d, r], [r]
};

BlockValues random_block(uint32_t seed, bool latent) {
  std::mt19937 rng(seed);
  BlockValues b;
  MoeConfig& c = b.config;
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 1;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5f;
  c.hidden_size = 96;
  c.intermediate_size = 32;
  c.num_shared_experts = 1;
  c.latent_size = latent ? 64 : 0;
  c.latent_norm = latent;
  const int64_t d = c.hidden_size, width = latent ? c.latent_size : d;
  b.gate_weight = random_bf16(rng, c.num_experts * d, 1.0f / std::sqrt(static_cast<float>(d)));
  b.bias = random_bf16(rng, c.num_experts, 0.05f);
  for (int64_t e = 0; e < c.num_experts; ++e)
    b.experts.push_back(random_mlp(rng, width, c.intermediate_size));
  b.shared = random_mlp(rng, d, c.intermediate_size);
  if (latent) {
    b.latent_down = random_bf16(rng, width * d, 1.0f / std::sqrt(static_cast<float>(d)));
    b.latent_up = random_bf16(rng, d * width, 1.0f / std::sqrt(static_cast<float>(width)));
    b.latent_norm = random_bf16(rng, width, 0.2f);
    for (float& g : b.latent_norm) g = formats::round_to_bf16(1.0f + g);
  }
  return b;
}

// The block one rank builds: experts [first, end) of them (all in one process), its TP share of
// the shared expert's columns.
MoeBlock make_block(const BlockValues& b, int64_t first_expert, int64_t end_expert, int tp_rank,
                    int tp, dist::Comm* expert_comm) {
  MoeConfig c = b.config;
  MoeWeights w;
  w.gate_weight = b.gate_weight;
  w.e_score_correction_bias = b.bias;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const MlpValues& v = b.experts[static_cast<size_t>(e)];
    w.experts.push_back(e >= first_expert && e < end_expert ? mlp_slice(v, 0, v.inter)
                                                            : MlpWeights{});
  }
  const int64_t cols = b.shared.inter / tp;
  w.shared_experts.push_back(mlp_slice(b.shared, cols * tp_rank, cols));
  if (!b.latent_down.empty()) {
    const int64_t width = c.latent_size, d = c.hidden_size;
    w.latent_down_proj = kernels::LinearWeight::from_f32_as_bf16(b.latent_down.data(), width, d);
    w.latent_up_proj = kernels::LinearWeight::from_f32_as_bf16(b.latent_up.data(), d, width);
    w.latent_norm = b.latent_norm;
  }
  c.output_is_partial = tp > 1;
  c.expert_comm = expert_comm;
  c.token_share = {.index = tp_rank, .count = tp};
  return MoeBlock(c, std::move(w));
}

// Group g's tokens: a different count per group, none for group 1.
int64_t group_tokens(int group) {
  return group == 1 ? 0 : 5 + 6 * group;
}

std::vector<float> group_input(uint32_t seed, int group, int64_t d) {
  std::mt19937 rng(seed + 104729u * static_cast<uint32_t>(group + 1));
  return random_bf16(rng, group_tokens(group) * d, 1.0f);
}

// Records the block's routing decisions.
class RoutingTap final : public TapSink {
 public:
  void on_tap(int, std::string_view name, const float* data, const Shape& shape) override {
    if (name == "routing_ids") ids.assign(data, data + shape.num_elems());
  }
  std::vector<float> ids;
};

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err2 += (got[i] - want[i]) * (got[i] - want[i]);
    ref2 += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(err2 / std::max(ref2, 1e-30));
}

// Bytes rank `me` receives in one layer's exchange, from the routing of every group's tokens:
// the counts ((N-1)·8), one record per (token of another rank's share, this rank holding some of
// its experts): 4 + 2·width + 8 per choice; one FP32 row per (token of its share, other rank).
int64_t expected_received(const std::vector<std::vector<float>>& ids_of_group, int tp, int me,
                          int ranks, int64_t num_experts, int64_t k, int64_t width) {
  const int64_t per_rank = num_experts / ranks;
  int64_t bytes = (ranks - 1) * 8;
  for (size_t g = 0; g < ids_of_group.size(); ++g) {
    const int64_t tokens = group_tokens(static_cast<int>(g));
    const std::vector<int64_t> shares = dist::even_split(tokens, tp);
    int64_t t = 0;
    for (int s = 0; s < tp; ++s) {
      const int sender = static_cast<int>(g) * tp + s;
      for (int64_t end = t + shares[static_cast<size_t>(s)]; t < end; ++t) {
        std::vector<int64_t> choices_on(static_cast<size_t>(ranks), 0);
        for (int64_t i = 0; i < k; ++i)
          ++choices_on[static_cast<size_t>(ids_of_group[g][static_cast<size_t>(t * k + i)]) /
                       static_cast<size_t>(per_rank)];
        for (int r = 0; r < ranks; ++r) {
          const int64_t n = choices_on[static_cast<size_t>(r)];
          if (n == 0 || r == sender) continue;
          if (r == me) bytes += 4 + 2 * width + 8 * n;  // dispatched to me
          if (sender == me) bytes += width * 4;         // my token's result from r
        }
      }
    }
  }
  return bytes;
}

void run_plan(int tp, bool latent) {
  const int ranks = g_world->size(), me = g_world->rank();
  if (ranks % tp != 0 || ranks / tp < 2) GTEST_SKIP() << "needs ep > 1";
  const int ep = ranks / tp, group = me / tp, tp_rank = me % tp;
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", tp " << tp << " ep " << ep);
  const BlockValues b = random_block(seed, latent);
  const MoeConfig& c = b.config;
  const int64_t d = c.hidden_size, per_rank = c.num_experts / ranks;
  const int64_t width = latent ? c.latent_size : d;
  ASSERT_TRUE(!latent || tp == 1) << "the latent up projection's row split is not sliced here";
  std::unique_ptr<dist::MpiComm> tp_group = g_world->split(group, tp_rank);

  // Every group's routing and one-process output, on every rank.
  const MoeBlock whole = make_block(b, 0, c.num_experts, 0, 1, nullptr);
  std::vector<std::vector<float>> ids_of_group;
  std::vector<float> want;
  for (int g = 0; g < ep; ++g) {
    const std::vector<float> x = group_input(seed, g, d);
    const int64_t tokens = group_tokens(g);
    std::vector<float> out(static_cast<size_t>(tokens * d));
    Arena scratch(whole.scratch_bytes(std::max<int64_t>(tokens, 1)));
    RoutingTap routing;
    whole.forward(ExecContext{}, x.data(), tokens, out.data(), scratch, &routing, kLayer);
    ids_of_group.push_back(routing.ids);
    if (g == group) want = out;
  }

  const MoeBlock mine = make_block(b, per_rank * me, per_rank * (me + 1), tp_rank, tp, g_world);
  const std::vector<float> x = group_input(seed, group, d);
  const int64_t tokens = group_tokens(group);
  std::vector<float> got(static_cast<size_t>(tokens * d));
  Arena scratch(mine.scratch_bytes(std::max<int64_t>(tokens, 1)));
  g_world->stats().reset();
  mine.forward(ExecContext{}, x.data(), tokens, got.data(), scratch, nullptr, kLayer);
  const dist::CommCounts exchanged =
      g_world->stats().by_key().at({kLayer, dist::CommOp::kAllToAll});
  if (tp > 1 && tokens > 0) {  // the TP group's partial outputs, as DecoderLayer sums them
    tp_group->all_reduce_sum(got, kLayer);
    for (float& v : got) v = formats::round_to_bf16(v);
  }
  EXPECT_EQ(exchanged.calls, 3) << "counts, dispatch, combine";
  EXPECT_EQ(exchanged.bytes_received, expected_received(ids_of_group, tp, me, ranks, c.num_experts,
                                                        c.num_experts_per_tok, width));
  if (tokens > 0) {
    EXPECT_LT(rel_rms(got, want), 2e-3);
  }
}

TEST(MoeExpertParallel, OneRankPerGroupMatchesOneProcess) {
  run_plan(1, false);
}

TEST(MoeExpertParallel, LatentMoeMatchesOneProcess) {
  run_plan(1, true);
}

TEST(MoeExpertParallel, TwoRankGroupsMatchOneProcess) {
  run_plan(2, false);
}

}  // namespace
}  // namespace dz::model

int main(int argc, char** argv) {
  return dz::dist::mpi_test_main(argc, argv, dz::model::g_world);
}
