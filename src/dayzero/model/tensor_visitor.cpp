#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

TensorVisitor::Scope::Scope(TensorVisitor& visitor, const Place& place)
    : visitor_(visitor), saved_prefix_(visitor.prefix_), saved_scope_(visitor.scope_) {
  visitor.prefix_ += place.prefix;
  if (place.component) visitor.scope_.component = *place.component;
  if (place.layer_id) visitor.scope_.layer_id = *place.layer_id;
  if (place.is_mtp) visitor.scope_.is_mtp = *place.is_mtp;
}

TensorVisitor::Scope::~Scope() {
  visitor_.prefix_ = std::move(saved_prefix_);
  visitor_.scope_ = saved_scope_;
}

std::string TensorVisitor::full_name(std::string_view name) const {
  std::string out = prefix_;
  out += name;
  return out;
}

}  // namespace dz::model
