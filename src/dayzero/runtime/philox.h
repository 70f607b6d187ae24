#pragma once
// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so a random number is a pure function of (key, counter). The sampler
// keys it by the request seed and puts (output position, choice index, purpose) in the counter,
// which makes a draw independent of batch composition, step boundaries, preemption and restarts
// (docs/serving.md §3).

#include <array>
#include <cstdint>

namespace dz::runtime {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Ten rounds of Philox-4x32 on counter under key, as Random123's philox4x32_R(10, ...).
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// What a random number is for; part of the counter so that streams of different uses never overlap.
enum class RandomPurpose : uint32_t {
  kSampleToken = 0,
};

// A uniform in [0, 1) with 53 random bits from the first two words of
// philox4x32_10({position lo, position hi, choice, purpose}, {seed lo, seed hi}).
double philox_uniform(uint64_t seed, uint32_t choice_index, int64_t position,
                      RandomPurpose purpose);

}  // namespace dz::runtime
