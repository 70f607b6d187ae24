#pragma once
// Walsh–Hadamard transform, docs/models.md §1.4: Had_n(x) = H_n x / sqrt(n) with the Sylvester
// matrix H_n[i][j] = (−1)^popcount(i & j) (natural order, not sequency order). Orthonormal and
// symmetric, so Had(Had(x)) = x. The DSA indexer applies it with n = 128 to q and k before FP8
// quantization.

#include <cstdint>
#include <span>

namespace dz::kernels {

// In place on rows: x is [num_rows, n], n a power of two. log2(n) FP32 butterfly stages
// (a, b → a + b, a − b on elements h apart, h = 1, 2, …, n/2), then one multiply by
// fl32(1/sqrt(n)). The stage and element order is fixed so that python/dayzero_ref/formats.py
// hadamard() matches it bit for bit. The reference rounds the output to BF16; callers do that
// (formats::round_to_bf16).
void hadamard_ref(std::span<float> x, int64_t n);

// The same transform bit for bit: rows of 128 (the indexer's) in AVX-512 registers where the CPU
// has them (each butterfly is the same FP32 add or subtract, only done 16 lanes at a time), the
// reference otherwise.
void hadamard(std::span<float> x, int64_t n);

namespace detail {
// n = 128, x.size() a multiple of 128.
void hadamard128_avx512(std::span<float> x);
}  // namespace detail

}  // namespace dz::kernels
