#include "dayzero/model/vision/image_input.h"

#include "dayzero/formats/hf_config.h"

namespace dz::model {

Result<ImageProcessorConfig> load_image_processor_config(const std::string& model_dir,
                                                         int64_t tower_patch_size) {
  // The processor's settings sit beside config.json, as the published checkpoints ship them.
  Result<formats::ConfigObject> file =
      formats::ConfigObject::load(model_dir + "/preprocessor_config.json");
  if (!file.ok())
    return make_error(StatusCode::kInvalidArgument,
                      "the vision tower needs the image processor's settings: {}",
                      file.status().message());
  DZ_ASSIGN_OR_RETURN(ImageProcessorConfig processor, parse_image_processor_config(*file));
  if (processor.patch_size != tower_patch_size)
    return make_error(StatusCode::kInvalidArgument,
                      "preprocessor_config.json: patch_size {} differs from vision_config's {}",
                      processor.patch_size, tower_patch_size);
  return processor;
}

Result<std::optional<ImageInputConfig>> load_image_input_config(const std::string& model_dir) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject root,
                      formats::ConfigObject::load(model_dir + "/config.json"));
  DZ_ASSIGN_OR_RETURN(std::optional<formats::ConfigObject> vision,
                      root.optional_object("vision_config"));
  if (!vision) return std::optional<ImageInputConfig>();
  DZ_ASSIGN_OR_RETURN(const int64_t patch_size, vision->required_positive_int("patch_size"));
  DZ_ASSIGN_OR_RETURN(const int64_t placeholder,
                      root.required_non_negative_int("media_placeholder_token_id"));
  DZ_ASSIGN_OR_RETURN(ImageProcessorConfig processor,
                      load_image_processor_config(model_dir, patch_size));
  return std::optional<ImageInputConfig>(
      ImageInputConfig{std::move(processor), static_cast<int32_t>(placeholder)});
}

}  // namespace dz::model
