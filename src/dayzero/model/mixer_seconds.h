#pragma once
// This process's wall time in the token mixers since the last reset, for the per-rank reports of
// a multi-rank run (the load balance of context parallelism, docs/parallel.md §9.5).

#include <chrono>

namespace dz::model {

struct MixerSeconds {
  double indexer = 0;   // DSA indexer: keys, scores, top-k, and their exchange under CP
  double mla = 0;       // MLA: projections, attention, and the cache-row exchange under CP
  double kda = 0;       // KDA, whole block, with its exchange under CP
  double exchange = 0;  // of the above, the CP collectives (waiting for the slower rank included)
};

inline MixerSeconds& mixer_seconds() {
  static MixerSeconds seconds;
  return seconds;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace dz::model
