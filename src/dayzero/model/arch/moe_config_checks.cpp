#include "dayzero/model/arch/moe_config_checks.h"

#include <fmt/format.h>

namespace dz::model {

Status check_moe_routing_fields(const formats::ConfigObject& obj, const MoeRoutingFields& f) {
  const auto& [experts_name, num_experts] = f.num_experts;
  const auto& [per_token_name, per_token] = f.experts_per_token;
  const auto& [groups_name, num_groups] = f.num_groups;
  if (num_experts > kMaxExperts)
    return obj.field_error(experts_name,
                           fmt::format("{} exceeds the limit {}", num_experts, kMaxExperts));
  if (f.first_k_dense_replace >= f.num_hidden_layers)
    return obj.field_error("first_k_dense_replace",
                           fmt::format("{} leaves no MoE layer (num_hidden_layers {})",
                                       f.first_k_dense_replace, f.num_hidden_layers));
  if (per_token > num_experts)
    return obj.field_error(per_token_name,
                           fmt::format("{} exceeds {} {}", per_token, experts_name, num_experts));
  if (num_experts % num_groups != 0)
    return obj.field_error(groups_name, fmt::format("{} does not divide {} {}", num_groups,
                                                    experts_name, num_experts));
  if (f.topk_group > num_groups)
    return obj.field_error("topk_group",
                           fmt::format("{} exceeds {} {}", f.topk_group, groups_name, num_groups));
  const int64_t selectable = f.topk_group * (num_experts / num_groups);
  if (per_token > selectable)
    return obj.field_error(per_token_name,
                           fmt::format("{} exceeds the {} experts of the topk_group {} groups",
                                       per_token, selectable, f.topk_group));
  return {};
}

}  // namespace dz::model
