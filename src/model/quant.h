// Quantized checkpoints, dequantized at load (docs: the header of tools/reference/quant_fixtures.py
// lists the fixtures). Three published weight formats are read, each into f32 first and then
// converted to the requested dtype (one rounding: for bf16, the value the packages compute):
//
//  * fine-grained FP8 (quantization_config.quant_method "fp8": DeepSeek-V3, Kimi K2; transformers'
//    FineGrainedFP8Config): `X` F8_E4M3 (or F8_E5M2) [out, in] and `X_scale_inv` [ceil(out/b0),
//    ceil(in/b1)] for weight_block_size [b0, b1] (F32, or F8_E8M0 for scale_fmt "ue8m0"):
//      w[i, j] = fp8(X[i, j]) * scale_inv[i / b0, j / b1].
//    Without a config the block is read off the scale grid when it divides the weight exactly.
//  * compressed-tensors "pack-quantized" (Kimi K2 Thinking's INT4): `X_packed` I32 [out,
//    ceil(in * bits / 32)], `X_scale` (F32/BF16/F16) [out, in / group] (group), [out, 1]
//    (channel) or [1] (tensor), `X_shape` I64 [2], and for asymmetric schemes `X_zero_point`
//    (I32 packed along the output dimension, or I8): element j of a row sits at bits
//    [j * bits, (j + 1) * bits) of the row's little-endian 32-bit words, stored with the offset
//    2^(bits-1) (compressed_tensors pack_to_int32 / unpack_from_int32); w = (q - z) * scale.
//    bits 1, 2, 4, 8 (the widths whose layout every compressed-tensors release shares).
//  * compressed-tensors "mxfp4-pack-quantized": `X_packed` U8 [out, in / 2] two e2m1 codes per
//    byte, element 2k in the low nibble (compressed_tensors pack_fp4_to_uint8), and `X_scale` U8
//    e8m0 [out, in / 32]: w = fp4 * 2^(scale - 127).
// X is a spec'd tensor name ending in "weight" (so `...proj.weight_packed`). Only weights are
// dequantized: activation quantization in a scheme (DeepSeek's dynamic fp8 activations, a
// compressed-tensors input_activations group) is not applied; the model computes in its dtype.
// Anything else (another quant_method or format, 3/5/6/7-bit packing, group indices, NVFP4's
// global scale, a scale of the wrong shape) is an Error naming the tensor and the scheme.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/weights.h"

namespace myriad::model::quant {

// ---- Element codes (reference decoders) ----

// OCP FP8 E4M3 ("e4m3fn", torch.float8_e4m3fn): bias 7, subnormals, no infinities, S.1111.111 NaN.
float fp8_e4m3_to_float(uint8_t code);
// OCP FP8 E5M2 (torch.float8_e5m2): bias 15, subnormals, infinities and NaNs as in IEEE.
float fp8_e5m2_to_float(uint8_t code);
// FP4 E2M1 of the low 4 bits (S.EE.M): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float fp4_e2m1_to_float(uint8_t nibble);
// E8M0 scale (torch.float8_e8m0fnu, OCP MX): 2^(code - 127); 0xFF is NaN.
float e8m0_to_float(uint8_t code);
// Field i of a bit stream of little-endian int32 words read `stride` words apart (1: a row;
// the row count of a [words, columns] matrix: a column), bits-wide, minus the offset
// 2^(bits-1). bits must divide 32.
int32_t unpack_int(const uint8_t* words, int64_t stride, int64_t i, int bits);

// ---- quantization_config ----

// A compressed-tensors QuantizationArgs for weights (the fields the dequantizer needs).
struct WeightArgs {
  int num_bits = 0;
  std::string type{};  // "int" | "float"
  bool symmetric = true;
  std::string strategy{};  // "group" | "channel" | "tensor" | "block" | ...
  int64_t group_size = 0;  // 0: none
  std::vector<int64_t> block_structure{};
  std::string actorder{};  // empty: none
  bool operator==(const WeightArgs&) const = default;
  std::string describe() const;  // e.g. "int4 symmetric group 32"
};

struct ConfigGroup {
  std::string name{};
  std::vector<std::string> targets{};
  std::optional<WeightArgs> weights{};
  std::string format{};  // the group's own format; empty: the config's
};

struct QuantConfig {
  std::string quant_method{};  // empty: the checkpoint has no quantization_config
  // fp8
  std::vector<int64_t> weight_block_size{};  // empty: per-tensor scales
  std::string fmt{};                         // "e4m3" (DeepSeek-V3's key), may be empty
  std::string scale_fmt{};                   // "float" | "ue8m0", may be empty
  std::string expert_dtype{};                // "fp8" | "fp4" (DeepSeek-V4), may be empty
  // compressed-tensors
  std::string format{};
  std::vector<ConfigGroup> groups{};
  std::vector<std::string> ignore{};
  bool sparsity = false;  // a sparsity_config other than "dense"

  bool empty() const { return quant_method.empty(); }
  // Parses a quantization_config object (JSON text); `source` names it in errors. Malformed
  // fields raise; unknown methods and formats parse and are refused per tensor.
  static QuantConfig parse(std::string_view json, std::string_view source);
  // The quantization_config of a config.json text (top level, else text_config's); none: empty.
  static QuantConfig from_config_json(std::string_view json, std::string_view source);
  // The config.json beside a checkpoint (`path`/config.json for a directory, else the file's
  // directory's); empty when there is no config.json.
  static QuantConfig for_checkpoint(const std::string& path);
};

// ---- Dequantizers on stored tensors (plain loops) ----

// FP8 weight [rows, cols] with a scale_inv grid for blocks of b0 x b1 (a grid of one element:
// per-tensor). Scale dtypes: F32, BF16, F16, F8_E8M0, U8 (e8m0).
Tensor dequantize_fp8(const safetensors::RawTensor& weight, const safetensors::RawTensor& scale_inv,
                      int64_t b0, int64_t b1, DType dtype, std::string_view name = "weight");
// compressed-tensors pack-quantized: the [rows, cols] weight from I32 words [rows,
// ceil(cols * bits / 32)], with a scale per row and group of `group` columns ([rows, cols /
// group]; group == cols: per channel) or, with per_tensor, one scale; the zero point (nullptr:
// symmetric) is I32 packed along rows ([ceil(rows * bits / 32), groups]) or I8 [rows, groups].
Tensor dequantize_packed_int(const safetensors::RawTensor& packed,
                             const safetensors::RawTensor& scale,
                             const safetensors::RawTensor* zero_point, int64_t rows, int64_t cols,
                             int bits, int64_t group, bool per_tensor, DType dtype,
                             std::string_view name = "weight");
// compressed-tensors mxfp4-pack-quantized: [rows, 2 * packed cols] from U8 codes and e8m0 scales
// for groups of `group` columns.
Tensor dequantize_mxfp4(const safetensors::RawTensor& packed, const safetensors::RawTensor& scale,
                        int64_t group, DType dtype, std::string_view name = "weight");

// ---- Loading ----

// Finds and dequantizes the quantized tensors of one checkpoint. Reads the quantization_config
// of the config.json beside the checkpoint on first need (a checkpoint with no quantized tensor
// never reads it). Holds a reference to the checkpoint.
class Dequantizer {
 public:
  Dequantizer(const safetensors::Checkpoint& ck, std::string path)
      : ck_(ck), path_(std::move(path)) {}
  Dequantizer(const safetensors::Checkpoint& ck, QuantConfig config)
      : ck_(ck), config_(std::make_shared<QuantConfig>(std::move(config))) {}

  // The spec'd tensor when the checkpoint stores it quantized under its name, save_as or an
  // alias (the first spelling present in any form decides): dequantized to `dtype`, its shape
  // checked, and the checkpoint tensors it read added to `used`. Undefined when the tensor is
  // stored plain (or not at all). Unsupported schemes raise an Error naming the tensor.
  Tensor load(const ParamSpec& spec, DType dtype, std::set<std::string>& used) const;
  // The same for one checkpoint name `x` (ending in "weight"); nullopt when not quantized.
  // `parts` receives the checkpoint tensors read.
  std::optional<Tensor> load(const std::string& x, DType dtype,
                             std::vector<std::string>* parts = nullptr) const;
  const QuantConfig& config() const;

 private:
  Tensor load_fp8(const std::string& x, DType dtype, std::vector<std::string>& parts) const;
  Tensor load_compressed(const std::string& x, DType dtype, std::vector<std::string>& parts) const;
  const safetensors::Checkpoint& ck_;
  std::string path_;
  mutable std::shared_ptr<QuantConfig> config_;
  mutable std::once_flag read_;
};

}  // namespace myriad::model::quant
