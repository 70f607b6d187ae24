#include "dayzero/model/layer_schedule.h"

#include <fmt/format.h>

namespace dz::model {

int LayerSchedule::num_main_layers() const {
  int count = 0;
  for (const auto& layer : layers) count += layer.is_mtp ? 0 : 1;
  return count;
}

int LayerSchedule::num_mtp_layers() const {
  return static_cast<int>(layers.size()) - num_main_layers();
}

int LayerSchedule::count(AttentionKind kind) const {
  int count = 0;
  for (const auto& layer : layers) count += (!layer.is_mtp && layer.attention == kind) ? 1 : 0;
  return count;
}

int LayerSchedule::count(FfnKind kind) const {
  int count = 0;
  for (const auto& layer : layers) count += (!layer.is_mtp && layer.ffn == kind) ? 1 : 0;
  return count;
}

std::string attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMla:
      return "MLA";
    case AttentionKind::kMlaDsa:
      return "MLA+DSA";
    case AttentionKind::kKda:
      return "KDA";
  }
  return "?";
}

std::string ffn_kind_name(FfnKind kind) {
  switch (kind) {
    case FfnKind::kDenseMlp:
      return "dense MLP";
    case FfnKind::kMoe:
      return "MoE";
    case FfnKind::kLatentMoe:
      return "latent MoE";
  }
  return "?";
}

std::string describe_layer(const LayerSpec& layer) {
  std::string text = fmt::format("{}{} + {}", layer.is_mtp ? "MTP: " : "",
                                 attention_kind_name(layer.attention), ffn_kind_name(layer.ffn));
  if (layer.attn_res) text += layer.attn_res_write ? " + AttnRes (bank write)" : " + AttnRes";
  return text;
}

std::vector<std::string> describe_schedule(const LayerSchedule& schedule) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < schedule.layers.size()) {
    std::string text = describe_layer(schedule.layers[begin]);
    size_t end = begin + 1;
    while (end < schedule.layers.size() && describe_layer(schedule.layers[end]) == text) ++end;
    int first = schedule.layers[begin].layer_id;
    int last = schedule.layers[end - 1].layer_id;
    lines.push_back(first == last ? fmt::format("{}: {}", first, text)
                                  : fmt::format("{}-{}: {}", first, last, text));
    begin = end;
  }
  return lines;
}

}  // namespace dz::model
