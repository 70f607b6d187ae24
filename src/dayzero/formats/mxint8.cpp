#include "dayzero/formats/mxint8.h"

#include <algorithm>
#include <cmath>

namespace dz::formats {

int mxint8_exponent(float amax) {
  const int exp_field = static_cast<int>(std::bit_cast<uint32_t>(amax) >> 23) & 0xFF;
  if (exp_field != 0) return std::max(mxint8_exponent_normal(amax), kMxint8MinExponent);
  // Subnormal (amax < 2^−126): 127 · 2^−133 is just below 2^−126.
  return amax <= 127.0f * mxint8_pow2(kMxint8MinExponent) ? kMxint8MinExponent
                                                          : kMxint8MinExponent + 1;
}

float mxint8_pow2(int e) {
  if (e >= -126) return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23);
  return std::bit_cast<float>(uint32_t{1} << (e + 149));
}

float quantize_mxint8_block(std::span<const float, kMxint8BlockElems> x,
                            std::span<int8_t, kMxint8BlockElems> q) {
  float amax = 0.0f;
  bool finite = true;
  for (float v : x) {
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  std::fill(q.begin(), q.end(), int8_t{0});
  if (!finite) return std::nanf("");
  if (amax == 0.0f) return 0.0f;
  const float scale = mxint8_pow2(mxint8_exponent(amax));
  for (int i = 0; i < kMxint8BlockElems; ++i)
    q[static_cast<size_t>(i)] =
        static_cast<int8_t>(std::nearbyint(x[static_cast<size_t>(i)] / scale));
  return scale;
}

}  // namespace dz::formats
