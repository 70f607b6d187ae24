#pragma once
// Consistency checks on the MoE routing fields that DeepSeek and Kimi configs both carry under
// their own names (n_routed_experts / num_experts, n_group / num_expert_group, ...). Errors name
// the config's own field.

#include <cstdint>
#include <string_view>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"

namespace dz::model {

// Far above any published model; keeps tensor tables of hostile configs bounded.
inline constexpr int64_t kMaxExperts = 65536;

struct NamedField {
  std::string_view name;
  int64_t value = 0;
};

struct MoeRoutingFields {
  NamedField num_experts;        // n_routed_experts | num_experts
  NamedField experts_per_token;  // num_experts_per_tok | num_experts_per_token
  NamedField num_groups;         // n_group | num_expert_group
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t num_hidden_layers = 0;
};

Status check_moe_routing_fields(const formats::ConfigObject& obj, const MoeRoutingFields& f);

}  // namespace dz::model
