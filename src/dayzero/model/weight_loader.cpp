#include "dayzero/model/weight_loader.h"

#include <cstring>

#include <fmt/format.h>

#include "dayzero/formats/codecs.h"

namespace dz::model {
namespace {

Status tensor_error(StatusCode code, const std::string& name, const std::string& message) {
  return Status(code, fmt::format("tensor \"{}\": {}", name, message));
}

bool is_widenable(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// Element `i` of a float tensor as FP32; `data` may be misaligned.
float load_float(const std::byte* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: {
      float value;
      std::memcpy(&value, data + i * 4, 4);
      return value;
    }
    case DType::kBF16: {
      uint16_t code;
      std::memcpy(&code, data + i * 2, 2);
      return formats::decode_bf16(code);
    }
    case DType::kF16: {
      uint16_t code;
      std::memcpy(&code, data + i * 2, 2);
      return formats::decode_fp16(code);
    }
    default:
      DZ_CHECK(false, "not a widenable float dtype");
      return 0;
  }
}

// Copies elements [begin, end) along `axis` of a contiguous 2-D view into `buffer` and returns
// the contiguous view of them (whole-byte dtypes).
TensorView copy_slice(const TensorView& view, int axis, int64_t begin, int64_t end,
                      std::vector<std::byte>& buffer) {
  const int64_t rows = view.dim(0), cols = view.dim(1);
  const int64_t elem = dtype_bits(view.dtype()) / 8;
  const auto* src = static_cast<const std::byte*>(view.data());
  Shape shape = axis == 0 ? Shape{end - begin, cols} : Shape{rows, end - begin};
  buffer.resize(static_cast<size_t>(shape.num_elems() * elem));
  if (axis == 0) {
    std::memcpy(buffer.data(), src + begin * cols * elem, buffer.size());
  } else {
    const int64_t width = (end - begin) * elem;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(buffer.data() + r * width, src + (r * cols + begin) * elem,
                  static_cast<size_t>(width));
  }
  return TensorView(buffer.data(), view.dtype(), shape);
}

// A slice of a block-scaled axis keeps its scales only when it starts on a block boundary or ends
// inside the block it starts in: otherwise its local blocks would straddle two stored scales.
bool slice_keeps_blocks(int64_t begin, int64_t end, int64_t block) {
  return begin % block == 0 || begin / block == (end - 1) / block;
}

}  // namespace

Result<Embedding> Embedding::from_view(const TensorView& table, const std::string& name,
                                       const TensorSlice& rows) {
  if (table.rank() != 2 || !is_widenable(table.dtype()))
    return tensor_error(StatusCode::kInvalidArgument, name,
                        fmt::format("an embedding table must be a 2-D BF16, F16 or F32 tensor, got "
                                    "{} {}",
                                    dtype_name(table.dtype()), table.shape().to_string()));
  Embedding e;
  e.data_ = static_cast<const std::byte*>(table.data());
  e.dtype_ = table.dtype();
  e.num_rows_ = table.dim(0);
  e.dim_ = table.dim(1);
  e.row_begin_ = rows.begin(e.num_rows_);
  e.row_end_ = rows.whole() ? e.num_rows_ : rows.end(e.num_rows_);
  return e;
}

void Embedding::lookup(std::span<const int32_t> token_ids, float* out) const {
  const int64_t row_bytes = dim_ * dtype_bits(dtype_) / 8;
  for (size_t t = 0; t < token_ids.size(); ++t) {
    DZ_CHECK(token_ids[t] >= 0 && token_ids[t] < num_rows_, "token id {} out of range",
             token_ids[t]);
    float* dst = out + static_cast<int64_t>(t) * dim_;
    if (token_ids[t] < row_begin_ || token_ids[t] >= row_end_) {
      std::fill_n(dst, dim_, 0.0f);
      continue;
    }
    const std::byte* row = data_ + token_ids[t] * row_bytes;
    for (int64_t j = 0; j < dim_; ++j) dst[j] = load_float(row, dtype_, j);
  }
}

bool Embedding::same_bytes(const Embedding& other) const {
  return dtype_ == other.dtype_ && num_rows_ == other.num_rows_ && dim_ == other.dim_ &&
         row_begin_ == other.row_begin_ && row_end_ == other.row_end_ &&
         std::memcmp(data_, other.data_,
                     static_cast<size_t>(num_rows_ * dim_ * dtype_bits(dtype_) / 8)) == 0;
}

WeightLoader::WeightLoader(const formats::Checkpoint& checkpoint,
                           const formats::QuantizationConfig& quant,
                           kernels::Mxfp4Activations mxfp4_activations)
    : checkpoint_(checkpoint), mxfp4_activations_(mxfp4_activations) {
  if (quant.method == formats::QuantMethod::kFp8Block && quant.block_rows > 0 &&
      quant.block_cols > 0) {
    fp8_block_rows_ = quant.block_rows;
    fp8_block_cols_ = quant.block_cols;
  }
  mxfp4_packed_ = quant.method == formats::QuantMethod::kMxfp4CompressedTensors;
}

Result<formats::CheckpointTensor> WeightLoader::find(const std::string& name) const {
  auto found = checkpoint_.find(name);
  if (!found)
    return tensor_error(StatusCode::kNotFound, name,
                        fmt::format("missing from the checkpoint in {}", checkpoint_.dir()));
  return *found;
}

TensorView WeightLoader::aligned_view(const formats::CheckpointTensor& tensor,
                                      std::vector<std::byte>& copy) const {
  TensorView view = tensor.file->view(*tensor.info);
  if (tensor.file->is_aligned(*tensor.info)) return view;
  auto bytes = tensor.file->tensor_bytes(*tensor.info);
  copy.assign(bytes.begin(), bytes.end());
  return TensorView(copy.data(), view.dtype(), view.shape());
}

Result<kernels::LinearWeight> WeightLoader::mxfp4_linear(const std::string& module,
                                                         const TensorSlice& slice) const {
  const std::string packed_name = module + ".weight_packed";
  const std::string scale_name = module + ".weight_scale";
  if (!mxfp4_packed_)
    return tensor_error(StatusCode::kUnsupported, packed_name,
                        "packed MXFP4 weights need a compressed-tensors mxfp4-pack-quantized "
                        "quantization_config");
  for (const char* other : {".weight_global_scale", ".weight_zero_point"})
    if (checkpoint_.find(module + other))
      return tensor_error(StatusCode::kUnsupported, module + other,
                          "MXFP4 with a global scale or zero point is another scheme (NVFP4, "
                          "asymmetric); not supported");
  DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor packed, find(packed_name));
  DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor scale, find(scale_name));
  std::vector<std::byte> packed_copy, scale_copy;
  TensorView packed_view = aligned_view(packed, packed_copy);
  TensorView scale_view = aligned_view(scale, scale_copy);
  std::vector<std::byte> packed_slice, scale_slice;
  if (!slice.whole() && packed_view.rank() == 2) {
    const int64_t out = packed_view.dim(0), in = packed_view.dim(1) * 2;
    const int64_t size = slice.axis == 0 ? out : in;
    const int64_t begin = slice.begin(size), end = slice.end(size);
    if (slice.axis == 1 && (begin % 32 != 0 || end % 32 != 0))
      return tensor_error(
          StatusCode::kInvalidArgument, packed_name,
          fmt::format("columns [{}, {}) of this rank cut an MXFP4 group of 32", begin, end));
    const int64_t per_scale = slice.axis == 0 ? 1 : 32, per_byte = slice.axis == 0 ? 1 : 2;
    packed_view =
        copy_slice(packed_view, slice.axis, begin / per_byte, end / per_byte, packed_slice);
    scale_view =
        copy_slice(scale_view, slice.axis, begin / per_scale, end / per_scale, scale_slice);
  }
  Result<kernels::LinearWeight> linear =
      kernels::LinearWeight::from_mxfp4(packed_view, scale_view, mxfp4_activations_);
  if (!linear.ok()) return linear.status().with_context(fmt::format("tensor \"{}\"", packed_name));
  return linear;
}

Result<kernels::LinearWeight> WeightLoader::linear(const std::string& module,
                                                   const TensorSlice& slice) const {
  if (checkpoint_.find(module + ".weight_packed")) return mxfp4_linear(module, slice);
  const std::string weight_name = module + ".weight";
  DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor weight, find(weight_name));
  if (weight.info->shape.rank() != 2)
    return tensor_error(
        StatusCode::kInvalidArgument, weight_name,
        fmt::format("a linear weight must be 2-D, got {}", weight.info->shape.to_string()));
  std::vector<std::byte> weight_copy, weight_slice;
  TensorView weight_view = aligned_view(weight, weight_copy);
  const int64_t size = weight_view.dim(slice.axis);
  if (size % slice.ways != 0)
    return tensor_error(StatusCode::kInvalidArgument, weight_name,
                        fmt::format("axis {} of {} does not split into {} equal parts", slice.axis,
                                    size, slice.ways));
  const int64_t begin = slice.begin(size), end = slice.whole() ? size : slice.end(size);
  if (!slice.whole()) weight_view = copy_slice(weight_view, slice.axis, begin, end, weight_slice);
  if (weight.info->dtype == DType::kF8E4M3) {
    const std::string scale_name = module + ".weight_scale_inv";
    DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor scale, find(scale_name));
    if (scale.info->dtype != DType::kF32)
      return tensor_error(StatusCode::kInvalidArgument, scale_name,
                          fmt::format("expected F32, got {}", dtype_name(scale.info->dtype)));
    std::vector<std::byte> scale_copy, scale_slice;
    TensorView scale_view = aligned_view(scale, scale_copy);
    if (!slice.whole()) {
      const int64_t block = slice.axis == 0 ? fp8_block_rows_ : fp8_block_cols_;
      if (!slice_keeps_blocks(begin, end, block))
        return tensor_error(StatusCode::kInvalidArgument, weight_name,
                            fmt::format("{} [{}, {}) of this rank cut a {}-wide FP8 scale block",
                                        slice.axis == 0 ? "rows" : "columns", begin, end, block));
      scale_view =
          copy_slice(scale_view, slice.axis, begin / block, (end - 1) / block + 1, scale_slice);
    }
    Result<kernels::LinearWeight> linear = kernels::LinearWeight::from_fp8_block(
        weight_view, scale_view, fp8_block_rows_, fp8_block_cols_);
    if (!linear.ok())
      return linear.status().with_context(fmt::format("tensor \"{}\"", weight_name));
    return linear;
  }
  if (!is_widenable(weight.info->dtype))
    return tensor_error(StatusCode::kUnsupported, weight_name,
                        fmt::format("a linear weight must be F8_E4M3 (with weight_scale_inv), "
                                    "BF16, F16 or F32, got {}",
                                    dtype_name(weight.info->dtype)));
  Result<kernels::LinearWeight> linear = kernels::LinearWeight::from_float(weight_view);
  if (!linear.ok()) return linear.status().with_context(fmt::format("tensor \"{}\"", weight_name));
  return linear;
}

Result<std::vector<float>> WeightLoader::floats(const std::string& name, int64_t num_elems) const {
  DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor tensor, find(name));
  if (!is_widenable(tensor.info->dtype))
    return tensor_error(
        StatusCode::kUnsupported, name,
        fmt::format("expected BF16, F16 or F32, got {}", dtype_name(tensor.info->dtype)));
  if (tensor.info->shape.num_elems() != num_elems)
    return tensor_error(
        StatusCode::kInvalidArgument, name,
        fmt::format("has {} elements ({}), expected {}", tensor.info->shape.num_elems(),
                    tensor.info->shape.to_string(), num_elems));
  const std::byte* data = tensor.file->tensor_bytes(*tensor.info).data();
  std::vector<float> out(static_cast<size_t>(num_elems));
  for (int64_t i = 0; i < num_elems; ++i)
    out[static_cast<size_t>(i)] = load_float(data, tensor.info->dtype, i);
  return out;
}

Result<std::vector<float>> WeightLoader::floats(const std::string& name, const Shape& shape,
                                                const TensorSlice& slice) const {
  DZ_ASSIGN_OR_RETURN(std::vector<float> all, floats(name, shape.num_elems()));
  if (slice.whole()) return all;
  // Rows of the slice's axis: `outer` blocks of [size, inner] elements, each cut to [begin, end).
  int64_t outer = 1, inner = 1;
  for (int a = 0; a < slice.axis; ++a) outer *= shape[a];
  for (int a = slice.axis + 1; a < shape.rank(); ++a) inner *= shape[a];
  const int64_t size = shape[slice.axis];
  if (size % slice.ways != 0)
    return tensor_error(StatusCode::kInvalidArgument, name,
                        fmt::format("axis {} of {} does not split into {} equal parts", slice.axis,
                                    size, slice.ways));
  const int64_t begin = slice.begin(size), end = slice.end(size);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(outer * (end - begin) * inner));
  for (int64_t o = 0; o < outer; ++o) {
    const auto first = all.begin() + (o * size + begin) * inner;
    out.insert(out.end(), first, first + (end - begin) * inner);
  }
  return out;
}

Result<Embedding> WeightLoader::embedding(const std::string& name, const TensorSlice& rows) const {
  DZ_ASSIGN_OR_RETURN(formats::CheckpointTensor tensor, find(name));
  return Embedding::from_view(tensor.file->view(*tensor.info), name, rows);
}

bool WeightLoader::same_bytes(const std::string& a, const std::string& b) const {
  auto ta = checkpoint_.find(a);
  auto tb = checkpoint_.find(b);
  if (!ta || !tb) return false;
  if (ta->info->dtype != tb->info->dtype || !(ta->info->shape == tb->info->shape)) return false;
  auto bytes_a = ta->file->tensor_bytes(*ta->info);
  auto bytes_b = tb->file->tensor_bytes(*tb->info);
  return bytes_a.size() == bytes_b.size() &&
         std::memcmp(bytes_a.data(), bytes_b.data(), bytes_a.size()) == 0;
}

template <typename T>
void WeightReader::keep(Result<T> result, T& into) {
  if (!result.ok()) {
    status_ = result.status();
    return;
  }
  into = std::move(*result);
}

TensorSlice WeightReader::slice_of(Split split, const Shape& shape) const {
  switch (split) {
    case Split::kColumn:
    case Split::kByVocab:
      return {.axis = 0, .index = shard_.tp_rank, .ways = shard_.tp};
    case Split::kRow:
      return {.axis = shape.rank() - 1, .index = shard_.tp_rank, .ways = shard_.tp};
    case Split::kByHead: {
      // The head axis: the first one longer than 1 ([H] or [1, 1, H, 1]).
      int axis = 0;
      while (axis + 1 < shape.rank() && shape[axis] == 1) ++axis;
      return {.axis = axis, .index = shard_.tp_rank, .ways = shard_.tp};
    }
    case Split::kReplicated:
    case Split::kByExpert:  // whole experts: holds_expert() decides which are visited
      return {};
  }
  return {};
}

bool WeightReader::holds_expert(int64_t expert, int64_t num_experts) const {
  return shard_.holds_expert(expert, num_experts);
}

void WeightReader::linear(std::string_view name, int64_t out, int64_t in, Split split,
                          Quantizable /*quantizable*/, kernels::LinearWeight& weight) {
  if (status_.ok()) keep(loader_.linear(full_name(name), slice_of(split, {out, in})), weight);
}

void WeightReader::floats(std::string_view name, const Shape& shape, DType /*published*/,
                          Split split, std::vector<float>& values) {
  if (status_.ok()) keep(loader_.floats(full_name(name), shape, slice_of(split, shape)), values);
}

void WeightReader::embedding(std::string_view name, int64_t rows, int64_t dim, Embedding& table) {
  if (status_.ok())
    keep(loader_.embedding(full_name(name), slice_of(Split::kByVocab, {rows, dim})), table);
}

void WeightReader::tied_linear(std::string_view table_module, kernels::LinearWeight& weight) {
  if (status_.ok())
    keep(loader_.linear(full_name(table_module), slice_of(Split::kByVocab, {})), weight);
}

void WeightReader::embedding_copy(std::string_view name, int64_t /*rows*/, int64_t /*dim*/,
                                  const std::string& original, std::optional<Embedding>& copy) {
  const std::string full = full_name(name);
  if (!status_.ok() || loader_.same_bytes(full, original)) return;
  Result<Embedding> table = loader_.embedding(full, slice_of(Split::kByVocab, {}));
  if (!table.ok()) {
    status_ = table.status();
    return;
  }
  copy = std::move(*table);
}

void WeightReader::linear_copy(std::string_view name, int64_t /*out*/, int64_t /*in*/,
                               const std::string& original,
                               std::optional<kernels::LinearWeight>& copy) {
  const std::string full = full_name(name);
  if (!status_.ok() || loader_.same_bytes(full + ".weight", original + ".weight")) return;
  Result<kernels::LinearWeight> weight = loader_.linear(full, slice_of(Split::kByVocab, {}));
  if (!weight.ok()) {
    status_ = weight.status();
    return;
  }
  copy = std::move(*weight);
}

}  // namespace dz::model
