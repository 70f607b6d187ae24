#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/arena.h"
#include "dayzero/core/dtype.h"
#include "dayzero/core/mapped_file.h"
#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor.h"
#include "dayzero/core/weight_pool_asan.h"

namespace dz {
namespace core_test {

Result<int> parse_positive(int value) {
  if (value <= 0)
    return make_error(StatusCode::kInvalidArgument, "value {} is not positive", value);
  return value;
}

Status add_positive(int value, int& sum) {
  DZ_ASSIGN_OR_RETURN(int checked, parse_positive(value));
  sum += checked;
  return {};
}

TEST(Status, CarriesCodeMessageAndContext) {
  int sum = 0;
  EXPECT_TRUE(add_positive(3, sum).ok());
  Status error = add_positive(-2, sum).with_context("config.json: field \"x\"");
  EXPECT_EQ(error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(error.message(), "config.json: field \"x\": value -2 is not positive");
  EXPECT_EQ(sum, 3);
}

TEST(DType, NamesRoundTripAndBitsMatchFormats) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
                      DType::kF8E8M0, DType::kF4E2M1, DType::kU8, DType::kI8, DType::kI32,
                      DType::kI64, DType::kBool, DType::kF64})
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
  EXPECT_EQ(dtype_bits(DType::kF4E2M1), 4);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_FALSE(dtype_from_name("F8_E4M3FNUZ").has_value());
}

TEST(TensorView, StridesAndSlices) {
  std::vector<float> values(24);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  TensorView view(values.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(view.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(view.size_bytes(), 96);
  TensorView second = view.slice0(1);
  EXPECT_EQ(second.shape(), (Shape{3, 4}));
  EXPECT_EQ(second.data_as<float>()[5], 17.0f);
  EXPECT_EQ(TensorView(nullptr, DType::kF4E2M1, {3, 5}).size_bytes(), 8);
}

TEST(Tensor, CopyIsDeep) {
  Tensor original(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) original.data_as<int32_t>()[i] = i + 7;
  Tensor copy = Tensor::copy_of(original.view());
  original.data_as<int32_t>()[0] = -1;
  EXPECT_EQ(copy.data_as<int32_t>()[0], 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data()) % kBufferAlignment, 0u);
}

TEST(AlignedBuffer, SmallAndMappedBuffersAreZeroAlignedWritableAndMovable) {
  for (const size_t size : {size_t{2}, size_t{4096}, kMappedBufferBytes - 1, kMappedBufferBytes,
                            (size_t{3} << 20) + 5}) {
    AlignedBuffer a(size);
    ASSERT_EQ(a.size_bytes(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kBufferAlignment, 0u);
    size_t nonzero = 0;
    for (std::byte b : a.bytes()) nonzero += b != std::byte{0} ? 1 : 0;
    EXPECT_EQ(nonzero, 0u) << size;
    a.data()[0] = std::byte{7};
    a.data()[size - 1] = std::byte{9};
    AlignedBuffer b = std::move(a);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(b.data()[0], std::byte{7});
    EXPECT_EQ(b.data()[size - 1], std::byte{9});
    AlignedBuffer c(16);
    c = std::move(b);  // frees c's own buffer, takes b's
    EXPECT_EQ(c.size_bytes(), size);
    EXPECT_EQ(c.data()[size - 1], std::byte{9});
  }
}

TEST(WeightPool, BuffersAreZeroAlignedDisjointAndTheirSlabsGoWithTheLast) {
  const int slabs_before = weight_pool::live_slabs();
  {
    // Mixed sizes, one larger than a slab (a slab of its own; only its ends are touched).
    const std::vector<size_t> sizes = {1,  63, 64, 4096, (size_t{3} << 20) + 5, size_t{300} << 20,
                                       100};
    std::vector<AlignedBuffer> buffers;
    for (const size_t size : sizes) buffers.push_back(AlignedBuffer::for_weights(size));
    EXPECT_GT(weight_pool::live_slabs(), slabs_before);
    for (size_t i = 0; i < buffers.size(); ++i) {
      AlignedBuffer& b = buffers[i];
      ASSERT_EQ(b.size_bytes(), sizes[i]);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kBufferAlignment, 0u);
      const size_t checked = std::min<size_t>(sizes[i], size_t{4} << 20);
      for (size_t j = 0; j < checked; ++j) ASSERT_EQ(b.data()[j], std::byte{0}) << i << " " << j;
      EXPECT_EQ(b.data()[sizes[i] - 1], std::byte{0});
      // Under AddressSanitizer the byte past the end is poisoned (a read there is reported).
      EXPECT_EQ(weight_pool::is_poisoned(b.data() + sizes[i]), weight_pool::kAddressSanitizer) << i;
      b.data()[0] = static_cast<std::byte>(i + 1);
      b.data()[sizes[i] - 1] = static_cast<std::byte>(i + 1);
    }
    // No buffer overlaps another: each still holds its own marks.
    for (size_t i = 0; i < buffers.size(); ++i) {
      EXPECT_EQ(buffers[i].data()[0], static_cast<std::byte>(i + 1));
      EXPECT_EQ(buffers[i].data()[sizes[i] - 1], static_cast<std::byte>(i + 1));
    }
    AlignedBuffer moved = std::move(buffers[2]);  // released once, by its last owner
    EXPECT_EQ(buffers[2].data(), nullptr);
    buffers.clear();
    EXPECT_EQ(moved.data()[0], std::byte{3});
  }
  EXPECT_EQ(weight_pool::live_slabs(), slabs_before);
}

TEST(Arena, AlignsResetsAndTracksPeak) {
  Arena arena(1024);
  auto a = arena.allocate(10, 16);
  auto b = arena.allocate(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  EXPECT_GE(b.data(), a.data() + 10);
  TensorView t = arena.allocate_tensor(DType::kBF16, {3, 5});
  EXPECT_EQ(t.size_bytes(), 30);
  size_t peak = arena.peak_bytes();
  arena.reset();
  EXPECT_EQ(arena.used_bytes(), 0u);
  EXPECT_EQ(arena.peak_bytes(), peak);
  EXPECT_DEATH(arena.allocate(2048), "arena of 1024 bytes exhausted");
}

TEST(Arena, ReleaseGivesBackWhatFollowedTheMark) {
  Arena arena(1024);
  arena.allocate(100);
  const size_t mark = arena.mark();
  for (int call = 0; call < 10; ++call) {  // ten workspaces of 500 bytes fit one at a time
    const size_t inner = arena.mark();
    auto workspace = arena.allocate(500);
    EXPECT_EQ(workspace.size(), 500u);
    arena.release(inner);
  }
  EXPECT_EQ(arena.used_bytes(), mark);
  EXPECT_DEATH(arena.release(mark + 64), "arena release to");
}

TEST(ParallelFor, CoversEveryItemOnce) {
  std::mt19937 rng(42);
  for (int64_t num_items : {1, 7, 64, 1000, 4097}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(num_items));
    int64_t grain = 1 + static_cast<int64_t>(rng() % 50);
    parallel_for(ExecContext{.num_threads = 2}, num_items, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (auto& hit : hits) ASSERT_EQ(hit.load(), 1);
  }
}

TEST(MappedFile, MapsContentsAndReportsMissingFiles) {
  std::string path = ::testing::TempDir() + "/mapped_file_test.bin";
  { std::ofstream(path, std::ios::binary) << "dayzero"; }
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->size_bytes(), 7u);
  EXPECT_EQ(static_cast<char>(file->data()[3]), 'z');
  auto missing = MappedFile::open(path + ".nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("mapped_file_test.bin.nope"), std::string::npos);
  std::remove(path.c_str());
}

}  // namespace core_test
}  // namespace dz
