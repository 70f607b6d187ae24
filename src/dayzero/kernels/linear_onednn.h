#pragma once
// oneDNN behind the linear weight formats: the one CPU engine, the thread count its OpenMP runtime
// reads, and the matmul primitives each weight caches. Internal to kernels/.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include <dnnl.hpp>

namespace dz::kernels::detail {

// The one CPU engine; oneDNN engines are immutable handles.
const dnnl::engine& cpu_engine();

// Primitives whose scratchpad the caller passes (per-thread buffers, no allocation per call).
dnnl::primitive_attr user_scratchpad_attr();

// oneDNN's OpenMP runtime reads omp_get_max_threads() of the calling thread; this sets it to
// num_threads (at least 1) for the duration of one forward() and restores it.
class OmpThreads {
 public:
  explicit OmpThreads(int num_threads);
  ~OmpThreads();
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// B for a tile of W rows [tile_rows, in] row-major: tileᵀ [in, tile_rows] in "ba".
dnnl::memory::desc tile_weights_desc(int64_t in, int64_t tile_rows, bool f32);
// Tokens per GEMM of the tile paths (FP8 block, MXFP4): the weights are dequantized a tile of
// rows at a time and multiplied with this many tokens at once.
inline constexpr int64_t kTileTokens = 256;

// One matmul y [num_tokens, cols] (rows y_stride floats apart, FP32) = x [num_tokens, in] · B,
// x as BF16 codes (FP32 when f32, row-major) and B [in, cols] laid out as weights_desc says.
struct MatmulCall {
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t cols = 0;
  int64_t y_stride = 0;
  bool f32 = false;
  const void* x = nullptr;
  dnnl::memory::desc weights_desc;
  const void* weights = nullptr;
  float* y = nullptr;
};

// The matmul primitives of one weight by (tokens, cols, FP32?), created on first use; creation is
// serialised, execution not. Each call runs its own reference to the primitive, so emptying a full
// cache never frees one that another thread (a tile task, a second caller) is still executing.
class MatmulCache {
 public:
  MatmulCache() = default;
  // Moves are for load time (a weight is moved into place before any forward runs).
  MatmulCache(MatmulCache&& other) noexcept;
  MatmulCache& operator=(MatmulCache&& other) noexcept;

  // Runs `call` on the calling thread (oneDNN may fan out over the OpenMP threads), its
  // scratchpad in a per-thread buffer.
  void run(const MatmulCall& call) const;

 private:
  struct Entry {
    dnnl::matmul primitive;
    size_t scratchpad_bytes = 0;
  };
  Entry entry_for(const MatmulCall& call) const;

  mutable std::mutex mutex_;
  mutable std::map<std::tuple<int64_t, int64_t, bool>, Entry> primitives_;
};

}  // namespace dz::kernels::detail
