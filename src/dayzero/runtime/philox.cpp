#include "dayzero/runtime/philox.h"

namespace dz::runtime {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

PhiloxCounter round(const PhiloxCounter& x, const PhiloxKey& key) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * x[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * x[2];
  const auto hi0 = static_cast<uint32_t>(product0 >> 32);
  const auto lo0 = static_cast<uint32_t>(product0);
  const auto hi1 = static_cast<uint32_t>(product1 >> 32);
  const auto lo1 = static_cast<uint32_t>(product1);
  return {hi1 ^ x[1] ^ key[0], lo1, hi0 ^ x[3] ^ key[1], lo0};
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  counter = round(counter, key);
  for (int r = 1; r < 10; ++r) {  // the key is bumped before every round but the first
    key[0] += kWeyl0;
    key[1] += kWeyl1;
    counter = round(counter, key);
  }
  return counter;
}

double philox_uniform(uint64_t seed, uint32_t choice_index, int64_t position,
                      RandomPurpose purpose) {
  const auto pos = static_cast<uint64_t>(position);
  const PhiloxCounter out =
      philox4x32_10({static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), choice_index,
                     static_cast<uint32_t>(purpose)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(out[0]) << 32) | out[1];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace dz::runtime
