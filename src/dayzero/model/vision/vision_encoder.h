#pragma once
// What a model that takes images offers the engine (docs/vision.md): the processor (bytes to
// patches and a token count), the tower (patches to decoder-width embeddings), and the
// placeholder token whose positions those embeddings fill.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/formats/image_decode.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/vision/image_processor.h"
#include "dayzero/model/vision/moonvit.h"

namespace dz::model {

class VisionEncoder {
 public:
  VisionEncoder(MoonVit tower, ImageProcessorConfig processor, int32_t placeholder_token_id)
      : tower_(std::move(tower)),
        processor_(processor),
        placeholder_token_id_(placeholder_token_id) {}

  const MoonVit& tower() const { return tower_; }
  const ImageProcessorConfig& processor() const { return processor_; }
  int32_t placeholder_token_id() const { return placeholder_token_id_; }
  int64_t hidden_size() const { return tower_.config().text_hidden_size; }

  // Decodes and preprocesses one image file; kInvalidArgument names what is wrong with it.
  Result<ProcessedImage> process(std::span<const uint8_t> bytes,
                                 const formats::ImageLimits& limits = {}) const;
  // [Σ num_tokens, hidden_size] for `images`, each attending only within itself.
  std::vector<float> encode(const ExecContext& ctx, std::span<const ProcessedImage* const> images,
                            TapSink* taps = nullptr) const {
    return tower_.encode(ctx, images, taps);
  }

 private:
  MoonVit tower_;
  ImageProcessorConfig processor_;
  int32_t placeholder_token_id_;
};

}  // namespace dz::model
