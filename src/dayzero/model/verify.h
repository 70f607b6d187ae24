#pragma once
// Layered verification of a model against the PyTorch reference's taps (docs/models.md §8.1,
// `dayzero verify`): operator level (each layer's real sublayers fed the reference's inputs, with
// the reference's discrete decisions substituted at the taps where the engine makes them: q latent,
// indexer selection, routing; MLA, DSA indexer, KDA, dense MLP, MoE and latent MoE), layer level
// (the engine's own forward, per-layer outputs and AttnRes mixes) and model level (logits). Works
// on any HybridModel, so every recipe gets it. The reference's taps come from
// python/dayzero_ref/verify_dump.py.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/dist/comm.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/taps.h"

namespace dz::model {

struct TapArray {
  Shape shape;
  std::vector<float> data;
};
// (layer id, tap name) → FP32 array; layer −1 holds the globals ("final_norm", "logits").
using TapMap = std::map<std::pair<int, std::string>, TapArray>;

// A TapSink that keeps a copy of every tap.
class CapturingTapSink final : public TapSink {
 public:
  CapturingTapSink() = default;
  // Also hands on `given`'s arrays for `names` (the reference's decisions) in place of the
  // engine's own, where their shapes match.
  CapturingTapSink(const TapMap* given, std::vector<std::string> names)
      : given_(given), names_(std::move(names)) {}

  void on_tap(int layer_id, std::string_view name, const float* data, const Shape& shape) override;
  const float* substitute(int layer_id, std::string_view name, const Shape& shape) override;
  TapMap& taps() { return taps_; }

 private:
  TapMap taps_;
  const TapMap* given_ = nullptr;
  std::vector<std::string> names_;
};

struct VerifyRow {
  std::string level;     // "operator", "layer", "model"
  int layer_id = -1;     // −1: the whole model
  std::string quantity;  // e.g. "index_scores", "attn_out", "logits"
  std::string metric;    // e.g. "rel_rms", "median_rel_l2", "argmax_agree"
  double value = 0;
  double tolerance = 0;
  bool at_least = false;  // pass when value ≥ tolerance (else value < tolerance, or ≤ for counts)
  bool pass = false;
};

// Tolerances (docs/models.md §8.1, docs/models.md §0).
inline constexpr double kOperatorRelRms = 1e-2;  // BF16 / FP8 paths on the reference's inputs
inline constexpr double kLayerRelRms = 2e-2;     // layer_out of the engine's own forward
inline constexpr double kLogitsMedianRelL2 = 2e-2;  // per position ‖ours − ref‖₂/‖ref‖₂, median
inline constexpr double kArgmaxAgreement = 0.95;  // fraction of positions
inline constexpr double kIndexerGapBound = 1e-2;  // selection swaps allowed within this score gap
inline constexpr double kRoutingGapBound = 1e-4;  // expert swaps allowed within this score gap

// Runs every comparison for `token_ids` (positions 0…T−1, one sequence) against `ref`, the
// reference's taps on the same tokens with the same KV cache dtype as `model`. Each C++ run gets a
// fresh KV cache and recurrent state. kInvalidArgument when a needed tap is missing or has the
// wrong shape.
// `given`: image embeddings at placeholder positions (the engine's own, from verify_vision), used
// by the layer- and model-level forward.
Result<std::vector<VerifyRow>> verify_model(const ExecContext& ctx, HybridModel& model,
                                            std::span<const int32_t> token_ids, const TapMap& ref,
                                            int64_t block_size,
                                            std::span<const GivenEmbedding> given = {});

// The vision rows (docs/vision.md §5; taps of layer kVisionTapLayer): the engine's preprocessing
// of `images` against the reference's pixel_values (exact: the same arithmetic), the patch
// embedding, every block, the final norm, the merge and the projector each on the reference's
// input, and the engine's whole encode against the reference's projector output. The engine's
// embeddings [Σ tokens, hidden] go to `embeddings`.
Result<std::vector<VerifyRow>> verify_vision(const ExecContext& ctx, const VisionEncoder& vision,
                                             std::span<const ProcessedImage> images,
                                             const TapMap& ref, std::vector<float>& embeddings);

// Under a parallel plan every rank runs verify_model on its own shard, in step (the blocks'
// collectives line up; each data-parallel group runs the same sequence), each comparing its own
// heads where a block splits them, and under context parallelism the rows of its own pieces. This
// gives every rank, for each row, the worst value over the ranks and its verdict.
std::vector<VerifyRow> worst_over_ranks(dist::Comm& comm, std::vector<VerifyRow> rows);

}  // namespace dz::model
