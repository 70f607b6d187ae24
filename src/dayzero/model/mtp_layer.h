#pragma once
// The multi-token-prediction layer (DeepSeek MTP, docs/models.md §7.1) a HybridModel may carry
// after its main layers: row t predicts token t+2 from the main model's final-norm state h_t and
// the token x_{t+1}, z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]) through one decoder layer with
// the plain residual (its own caches, no recurrent state), then shared_head.norm and the head.
// DeepSeek-V3.2 publishes it as layer num_hidden_layers; dayzero_hybrid uses the same layout
// (docs/recipe_dayzero_hybrid.md).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dayzero/kernels/linear.h"
#include "dayzero/model/decoder_layer.h"
#include "dayzero/model/tensor_visitor.h"
#include "dayzero/model/weight_loader.h"

namespace dz::model {

struct MtpLayer {
  std::vector<float> enorm;             // [d], on the embedding of x_{t+1}
  std::vector<float> hnorm;             // [d], on the main model's state h_t
  kernels::LinearWeight eh_proj;        // [d, 2d], input [enorm(e) ; hnorm(h)]
  std::vector<float> shared_head_norm;  // [d]
  // The published embed_tokens / shared_head.head are copies of the main ones: loaded only when
  // their bytes differ, otherwise the main ones serve.
  std::optional<Embedding> embed_tokens;
  std::optional<kernels::LinearWeight> head;
  DecoderLayer layer;  // built by the recipe from its own tensors
};

// The MTP layer's tensors beside its decoder layer's, under decoder_layer_prefix(layer_id) of the
// current (model root) prefix: "enorm", "hnorm", "eh_proj" [d, 2d] (quantizable: DeepSeek's dtype
// is (unverified)), "shared_head.norm", and "embed_tokens" / "shared_head.head", copies of the
// main embedding and head that visit_model_globals declared.
void visit_mtp_tensors(TensorVisitor& v, int layer_id, int64_t vocab_size, int64_t hidden_size,
                       bool tie_word_embeddings, MtpLayer& mtp);

}  // namespace dz::model
