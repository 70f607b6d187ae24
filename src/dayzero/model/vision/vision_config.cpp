#include "dayzero/model/vision/vision_config.h"

#include <algorithm>
#include <string>

namespace dz::model {
namespace {

#define READ(method, field, ...) \
  DZ_READ_CONFIG_FIELD(obj, c, method, field __VA_OPT__(, ) __VA_ARGS__)

// A string option K3 publishes with one value: anything else is refused by name.
Status expect_string(const formats::ConfigObject& obj, std::string_view key,
                     std::string_view wanted, std::string_view default_value) {
  DZ_ASSIGN_OR_RETURN(std::optional<std::string> value, obj.optional_string(key));
  const std::string got = value.value_or(std::string(default_value));
  if (got != wanted)
    return obj.field_error(
        key, fmt::format("\"{}\" is not supported (dayzero runs \"{}\")", got, wanted));
  return Status::ok_status();
}

Status expect_false(const formats::ConfigObject& obj, std::string_view key, bool default_value) {
  DZ_ASSIGN_OR_RETURN(bool value, obj.optional_bool(key, default_value));
  if (value)
    return obj.field_error(key, "biases in the vision tower are not supported (K3 has none)");
  return Status::ok_status();
}

Result<std::pair<int64_t, int64_t>> merge_kernel(const formats::ConfigObject& obj) {
  DZ_ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                      obj.required_positive_int_list("merge_kernel_size"));
  if (kernel.size() != 2 || kernel[0] != 2 || kernel[1] != 2)
    return obj.field_error("merge_kernel_size", "only [2, 2] is supported");
  return std::pair{kernel[0], kernel[1]};
}

}  // namespace

Result<VisionConfig> parse_vision_config(const formats::ConfigObject& obj,
                                         int64_t decoder_hidden_size) {
  VisionConfig c;
  READ(required_positive_int, patch_size);
  READ(required_positive_int, vt_hidden_size);
  READ(required_positive_int, vt_num_hidden_layers);
  READ(required_positive_int, vt_num_attention_heads);
  DZ_ASSIGN_OR_RETURN(std::optional<int64_t> qkv, obj.optional_positive_int("qkv_hidden_size"));
  c.qkv_hidden_size = qkv.value_or(c.vt_hidden_size);
  READ(required_positive_int, vt_intermediate_size);
  READ(required_positive_int, init_pos_emb_height);
  READ(required_positive_int, init_pos_emb_width);
  DZ_ASSIGN_OR_RETURN(std::optional<int64_t> mm, obj.optional_positive_int("mm_hidden_size"));
  c.mm_hidden_size = mm.value_or(c.vt_hidden_size);
  READ(required_positive_int, text_hidden_size);
  READ(optional_number, projector_ln_eps, 1e-5);
  DZ_ASSIGN_OR_RETURN(auto kernel, merge_kernel(obj));
  std::tie(c.merge_height, c.merge_width) = kernel;
  if (c.vt_num_hidden_layers > 1024)
    return obj.field_error("vt_num_hidden_layers", "exceeds the limit 1024");
  if (c.patch_size > 64 || c.init_pos_emb_height > 1024 || c.init_pos_emb_width > 1024)
    return obj.field_error("patch_size", "patch or position table too large");
  if (c.qkv_hidden_size % c.vt_num_attention_heads != 0 || c.head_dim() % 4 != 0)
    return obj.field_error("qkv_hidden_size",
                           fmt::format("{} over {} heads: the head dim must be a multiple of 4 "
                                       "(2-D RoPE rotates pairs along x and y)",
                                       c.qkv_hidden_size, c.vt_num_attention_heads));
  if (c.mm_hidden_size != c.vt_hidden_size)
    return obj.field_error("mm_hidden_size", fmt::format("{} differs from vt_hidden_size {}",
                                                         c.mm_hidden_size, c.vt_hidden_size));
  if (c.text_hidden_size != decoder_hidden_size)
    return obj.field_error("text_hidden_size",
                           fmt::format("{} differs from the decoder's hidden_size {}",
                                       c.text_hidden_size, decoder_hidden_size));
  DZ_RETURN_IF_ERROR(expect_string(obj, "norm_type", "rmsnorm", "layernorm"));
  DZ_RETURN_IF_ERROR(expect_string(obj, "pos_emb_interpolation_mode", "bilinear", "bicubic"));
  DZ_RETURN_IF_ERROR(expect_string(obj, "pos_emb_type", "divided_fixed", "divided_fixed"));
  DZ_RETURN_IF_ERROR(expect_string(obj, "merge_type", "sd2_tpool", "sd2_tpool"));
  DZ_RETURN_IF_ERROR(expect_string(obj, "mm_projector_type", "patchmergerv2", "patchmerger"));
  DZ_RETURN_IF_ERROR(
      expect_string(obj, "activation_func", "gelu_pytorch_tanh", "gelu_pytorch_tanh"));
  DZ_RETURN_IF_ERROR(expect_false(obj, "attn_bias", true));
  DZ_RETURN_IF_ERROR(expect_false(obj, "linear_bias", true));
  DZ_RETURN_IF_ERROR(expect_false(obj, "patch_embed_proj_bias", true));
  return c;
}

Result<ImageProcessorConfig> parse_image_processor_config(const formats::ConfigObject& root) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject obj, root.required_object("media_proc_cfg"));
  ImageProcessorConfig c;
  READ(required_positive_int, patch_size);
  READ(required_positive_int, merge_kernel_size);
  READ(required_positive_int, in_patch_limit);
  READ(required_positive_int, patch_limit_on_one_side);
  if (c.patch_size > 64 || c.merge_kernel_size != 2)
    return obj.field_error("merge_kernel_size", "only patches ≤ 64 merged 2 × 2 are supported");
  if (c.in_patch_limit < c.merge_kernel_size * c.merge_kernel_size || c.in_patch_limit > (1 << 22))
    return obj.field_error("in_patch_limit", "must be between 4 and 2^22");
  DZ_ASSIGN_OR_RETURN(std::optional<int64_t> fixed,
                      obj.optional_positive_int("fixed_output_tokens"));
  if (fixed) return obj.field_error("fixed_output_tokens", "a fixed token count is not supported");
  for (const char* key : {"image_mean", "image_std"}) {
    DZ_ASSIGN_OR_RETURN(std::vector<double> values, obj.optional_number_list(key));
    if (values.empty()) continue;
    if (values.size() != 3) return obj.field_error(key, "expected a list of 3 numbers");
    auto& out = std::string_view(key) == "image_mean" ? c.image_mean : c.image_std;
    std::copy(values.begin(), values.end(), out.begin());
  }
  for (double s : c.image_std)
    if (!(s > 0)) return obj.field_error("image_std", "must be positive");
  DZ_ASSIGN_OR_RETURN(std::optional<formats::ConfigObject> bg,
                      obj.optional_object("transparent_bg_config"));
  if (bg) {
    DZ_RETURN_IF_ERROR(expect_string(*bg, "pattern", "chessboard", "black"));
    DZ_ASSIGN_OR_RETURN(std::optional<std::string> stage,
                        obj.optional_string("transparent_bg_fill_stage"));
    if (stage.value_or("before_resize") != "after_resize")
      return obj.field_error("transparent_bg_fill_stage",
                             "only \"after_resize\" is supported (K3's)");
    ImageProcessorConfig::Chessboard board;
    DZ_ASSIGN_OR_RETURN(board.square_size,
                        bg->optional_non_negative_int("chessboard_square_size", 16));
    DZ_ASSIGN_OR_RETURN(board.white_on_top_left,
                        bg->optional_bool("chessboard_square_on_top_left", true));
    DZ_ASSIGN_OR_RETURN(int64_t white,
                        bg->optional_non_negative_int("chessboard_white_value", 255));
    DZ_ASSIGN_OR_RETURN(int64_t gray, bg->optional_non_negative_int("chessboard_gray_value", 200));
    if (board.square_size < 1 || white > 255 || gray > 255)
      return bg->field_error("chessboard_square_size", "square ≥ 1 and values ≤ 255 expected");
    board.white = static_cast<uint8_t>(white);
    board.gray = static_cast<uint8_t>(gray);
    c.transparent_background = board;
  }
  return c;
}

}  // namespace dz::model
