// Writes the output of every C++ codec on fixed inputs to one binary file, for the cross-language
// test python/tests/test_formats.py, which recomputes each section with
// python/dayzero_ref/formats.py and compares bit for bit. Usage: dz_codec_dump OUT_FILE
//
// File: a sequence of sections, each [u32 name length][name][u64 byte count][bytes], little-endian.
// Inputs travel in the file too ("inputs_bf16", "hadamard_in"), so the Python side needs no
// generator.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/mx_block.h"
#include "dayzero/kernels/hadamard.h"

namespace {

using dz::formats::Fp8Overflow;

class SectionWriter {
 public:
  explicit SectionWriter(std::FILE* file) : file_(file) {}
  template <typename T>
  void write(const std::string& name, const std::vector<T>& values) {
    const auto name_bytes = static_cast<uint32_t>(name.size());
    const uint64_t num_bytes = values.size() * sizeof(T);
    std::fwrite(&name_bytes, sizeof(name_bytes), 1, file_);
    std::fwrite(name.data(), 1, name.size(), file_);
    std::fwrite(&num_bytes, sizeof(num_bytes), 1, file_);
    std::fwrite(values.data(), 1, num_bytes, file_);
  }

 private:
  std::FILE* file_;
};

template <typename Fn>
std::vector<uint32_t> float_bits(int num_codes, Fn decode) {
  std::vector<uint32_t> out(num_codes);
  for (int c = 0; c < num_codes; ++c) out[c] = std::bit_cast<uint32_t>(decode(c));
  return out;
}

template <typename T, typename Fn>
std::vector<T> encode_all(const std::vector<float>& inputs, Fn encode) {
  std::vector<T> out(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) out[i] = static_cast<T>(encode(inputs[i]));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace f = dz::formats;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_FILE\n", argv[0]);
    return 2;
  }
  std::FILE* file = std::fopen(argv[1], "wb");
  if (!file) {
    std::fprintf(stderr, "cannot open %s\n", argv[1]);
    return 1;
  }
  SectionWriter out(file);

  // Every BF16 code in order, then the same codes permuted (an LCG walk) so that MX blocks and
  // act_quant groups mix magnitudes, signs, NaN and Inf.
  std::vector<uint16_t> inputs_bf16(2 * 65536);
  for (uint32_t c = 0; c < 65536; ++c) inputs_bf16[c] = static_cast<uint16_t>(c);
  for (uint32_t i = 0, c = 12345; i < 65536; ++i) {
    c = (c * 40503u + 1u) & 0xFFFFu;  // full period mod 2^16
    inputs_bf16[65536 + i] = static_cast<uint16_t>(c);
  }
  std::vector<float> widened(inputs_bf16.size());
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = f::decode_bf16(inputs_bf16[i]);
  const std::vector<float> all_bf16(widened.begin(), widened.begin() + 65536);
  out.write("inputs_bf16", inputs_bf16);

  out.write("encode_bf16", encode_all<uint16_t>(all_bf16, f::encode_bf16));
  out.write("encode_fp16", encode_all<uint16_t>(all_bf16, f::encode_fp16));
  out.write("encode_e4m3_sat", encode_all<uint8_t>(all_bf16, [](float x) {
              return f::encode_e4m3(x, Fp8Overflow::kSaturate);
            }));
  out.write("encode_e4m3_nonsat", encode_all<uint8_t>(all_bf16, [](float x) {
              return f::encode_e4m3(x, Fp8Overflow::kNonSaturating);
            }));
  out.write("encode_e5m2_sat", encode_all<uint8_t>(all_bf16, [](float x) {
              return f::encode_e5m2(x, Fp8Overflow::kSaturate);
            }));
  out.write("encode_e5m2_ieee", encode_all<uint8_t>(all_bf16, [](float x) {
              return f::encode_e5m2(x, Fp8Overflow::kNonSaturating);
            }));
  out.write("encode_e2m1", encode_all<uint8_t>(all_bf16, f::encode_e2m1));

  out.write("decode_e4m3",
            float_bits(256, [](int c) { return f::decode_e4m3(static_cast<uint8_t>(c)); }));
  out.write("decode_e5m2",
            float_bits(256, [](int c) { return f::decode_e5m2(static_cast<uint8_t>(c)); }));
  out.write("decode_e8m0",
            float_bits(256, [](int c) { return f::decode_e8m0(static_cast<uint8_t>(c)); }));
  out.write("decode_e2m1",
            float_bits(16, [](int c) { return f::decode_e2m1(static_cast<uint8_t>(c)); }));
  out.write("decode_fp16",
            float_bits(65536, [](int c) { return f::decode_fp16(static_cast<uint16_t>(c)); }));

  const std::pair<const char*, f::MxElem> elems[] = {
      {"e2m1", f::MxElem::kE2M1}, {"e4m3", f::MxElem::kE4M3}, {"e5m2", f::MxElem::kE5M2}};
  const std::pair<const char*, f::MxScaleRule> rules[] = {
      {"floor", f::MxScaleRule::kFloorLog2Amax},
      {"rceil", f::MxScaleRule::kCeilLog2AmaxOverMaxElem},
      {"ceil_emax", f::MxScaleRule::kCeilLog2AmaxMinusEmax},
      {"even", f::MxScaleRule::kFloorLog2AmaxRoundedAt1p75}};
  for (const auto& [elem_name, elem] : elems) {
    for (const auto& [rule_name, rule] : rules) {
      std::vector<uint8_t> codes(widened.size()), scales(widened.size() / 32);
      f::quantize_mx(widened, elem, rule, codes, scales);
      const std::string prefix = std::string("mx_") + elem_name + "_" + rule_name;
      out.write(prefix + "_codes", codes);
      out.write(prefix + "_scales", scales);
    }
  }

  for (const auto& [name, format] : {std::pair{"ue8m0", f::ActScaleFormat::kUe8m0},
                                     std::pair{"plain", f::ActScaleFormat::kPlain}}) {
    std::vector<uint8_t> codes(inputs_bf16.size());
    std::vector<float> scales(inputs_bf16.size() / 128);
    f::act_quant(inputs_bf16, format, codes, scales);
    out.write(std::string("act_quant_") + name + "_codes", codes);
    out.write(std::string("act_quant_") + name + "_scales",
              float_bits(static_cast<int>(scales.size()), [&](int i) { return scales[i]; }));
  }

  // Hadamard, n = 128, on 64 rows of finite FP32 values with varied magnitudes.
  std::vector<float> had(64 * 128);
  for (uint32_t i = 0, c = 777; i < had.size(); ++i) {
    c = c * 1664525u + 1013904223u;
    had[i] = std::ldexp(static_cast<float>(static_cast<int32_t>(c >> 8) % 1000) / 997.0f,
                        static_cast<int>((c >> 3) % 24) - 12);
  }
  out.write("hadamard_in", float_bits(static_cast<int>(had.size()), [&](int i) { return had[i]; }));
  dz::kernels::hadamard_ref(had, 128);
  out.write("hadamard_out",
            float_bits(static_cast<int>(had.size()), [&](int i) { return had[i]; }));

  const bool ok = std::fclose(file) == 0;
  return ok ? 0 : 1;
}
