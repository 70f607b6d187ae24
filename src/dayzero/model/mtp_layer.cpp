#include "dayzero/model/mtp_layer.h"

namespace dz::model {

void visit_mtp_tensors(TensorVisitor& v, int layer_id, int64_t vocab_size, int64_t hidden_size,
                       bool tie_word_embeddings, MtpLayer& mtp) {
  const int64_t d = hidden_size;
  // The names visit_model_globals gave the main embedding and head, under the root prefix.
  const std::string main_embedding = v.full_name("model.embed_tokens.weight");
  const std::string main_head = v.full_name(tie_word_embeddings ? "model.embed_tokens" : "lm_head");
  TensorVisitor::Scope layer(v, {.prefix = decoder_layer_prefix(layer_id),
                                 .component = Component::kMtp,
                                 .layer_id = layer_id,
                                 .is_mtp = true});
  v.floats("enorm.weight", {d}, DType::kBF16, Split::kReplicated, mtp.enorm);
  v.floats("hnorm.weight", {d}, DType::kBF16, Split::kReplicated, mtp.hnorm);
  v.linear("eh_proj", d, 2 * d, Split::kReplicated, Quantizable::kYes, mtp.eh_proj);
  v.floats("shared_head.norm.weight", {d}, DType::kBF16, Split::kReplicated, mtp.shared_head_norm);
  v.embedding_copy("embed_tokens.weight", vocab_size, d, main_embedding, mtp.embed_tokens);
  v.linear_copy("shared_head.head", vocab_size, d, main_head, mtp.head);
}

}  // namespace dz::model
