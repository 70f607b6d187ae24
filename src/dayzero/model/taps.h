#pragma once
// Named intermediate results for layered verification (docs/style.md §12). A block reports an
// output with its layer index and a name shared with the hooks in python/dayzero_ref; with no sink
// set, a tap costs one pointer test.

#include <cstdint>
#include <string_view>

#include "dayzero/core/tensor_view.h"

namespace dz::model {

class TapSink {
 public:
  virtual ~TapSink() = default;
  // data: FP32, contiguous, `shape` in PyTorch order (e.g. [num_tokens, hidden]).
  virtual void on_tap(int layer_id, std::string_view name, const float* data,
                      const Shape& shape) = 0;
  // A value to carry on with instead of the engine's own at a decision point (the q latent, the
  // indexer's selection, the routing), as the Python reference's hooks do: verification checks
  // each block of the real forward on the reference's inputs. nullptr keeps the engine's value.
  virtual const float* substitute(int /*layer_id*/, std::string_view /*name*/,
                                  const Shape& /*shape*/) {
    return nullptr;
  }
};

inline void tap(TapSink* sink, int layer_id, std::string_view name, const float* data,
                const Shape& shape) {
  if (sink != nullptr) sink->on_tap(layer_id, name, data, shape);
}

// The sink's substitute for `name`, or nullptr (always without a sink).
inline const float* substitute(TapSink* sink, int layer_id, std::string_view name,
                               const Shape& shape) {
  return sink != nullptr ? sink->substitute(layer_id, name, shape) : nullptr;
}

}  // namespace dz::model
