#include "dayzero/kernels/linear_onednn.h"

#include <omp.h>

#include <utility>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/kernels/linear_common.h"

namespace dz::kernels::detail {

namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

constexpr size_t kMaxCachedPrimitives = 64;

memory::desc x_desc(const MatmulCall& call) {
  return memory::desc({call.num_tokens, call.in_features}, call.f32 ? Dt::f32 : Dt::bf16, Tag::ab);
}

memory::desc y_desc(const MatmulCall& call) {
  return memory::desc({call.num_tokens, call.cols}, Dt::f32, memory::dims{call.y_stride, 1});
}

}  // namespace

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

OmpThreads::OmpThreads(int num_threads) : saved_(omp_get_max_threads()) {
  omp_set_num_threads(num_threads < 1 ? 1 : num_threads);
}

OmpThreads::~OmpThreads() {
  omp_set_num_threads(saved_);
}

memory::desc tile_weights_desc(int64_t in, int64_t tile_rows, bool f32) {
  return memory::desc({in, tile_rows}, f32 ? Dt::f32 : Dt::bf16, Tag::ba);
}

MatmulCache::MatmulCache(MatmulCache&& other) noexcept
    : primitives_(std::move(other.primitives_)) {}

MatmulCache& MatmulCache::operator=(MatmulCache&& other) noexcept {
  primitives_ = std::move(other.primitives_);
  return *this;
}

MatmulCache::Entry MatmulCache::entry_for(const MatmulCall& call) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_tuple(call.num_tokens, call.cols, call.f32);
  if (auto it = primitives_.find(key); it != primitives_.end()) return it->second;
  // Primitives still executing elsewhere live on in their callers' copies.
  if (primitives_.size() >= kMaxCachedPrimitives) primitives_.clear();
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(x_desc(call), call.weights_desc, y_desc(call)), user_scratchpad_attr(),
      cpu_engine());
  Entry entry{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
  return primitives_.emplace(key, std::move(entry)).first->second;
}

void MatmulCache::run(const MatmulCall& call) const {
  const Entry mm = entry_for(call);
  const dnnl::engine& engine = cpu_engine();
  dnnl::stream stream(engine);
  thread_local AlignedBuffer scratchpad;
  std::byte* scratch = ensure(scratchpad, mm.scratchpad_bytes + 64);
  memory::desc scratch_desc({static_cast<memory::dim>(mm.scratchpad_bytes)}, Dt::u8, Tag::a);
  mm.primitive.execute(
      stream,
      {{DNNL_ARG_SRC, memory(x_desc(call), engine, const_cast<void*>(call.x))},
       {DNNL_ARG_WEIGHTS, memory(call.weights_desc, engine, const_cast<void*>(call.weights))},
       {DNNL_ARG_DST, memory(y_desc(call), engine, call.y)},
       {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, engine, scratch)}});
  stream.wait();
}

}  // namespace dz::kernels::detail
