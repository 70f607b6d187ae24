// libFuzzer target: arbitrary bytes as config.json text through the registry (model_type lookup,
// recipe config parse, contradiction checks) and the layer schedule. Bad input must come back as
// a Status, never a crash, a hang or an unbounded allocation. Tensor tables are not built here:
// a valid config may legitimately describe millions of tensors (dayzero inspect builds them).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dayzero/model/layer_schedule.h"
#include "dayzero/model/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto arch = dz::model::parse_model_config_text(text, "config.json");
  if (!arch.ok()) {
    // Every refusal names the file.
    if (!arch.status().message().starts_with("config.json: ")) __builtin_trap();
    return 0;
  }
  dz::model::LayerSchedule schedule = (*arch)->schedule();
  (void)dz::model::describe_schedule(schedule);
  (void)(*arch)->quantization().describe();
  return 0;
}
