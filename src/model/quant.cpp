#include "model/quant.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/dtype.h"
#include "core/error.h"
#include "io/file.h"

namespace myriad::model::quant {

namespace fs = std::filesystem;
using json = nlohmann::json;
using safetensors::RawTensor;

// ---- Element codes ----

float fp8_e4m3_to_float(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // m/8 * 2^-6
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

float fp8_e5m2_to_float(uint8_t code) {
  const int e = (code >> 2) & 31, m = code & 3;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (e == 31)
    return m == 0 ? sign * std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -16);  // m/4 * 2^-14
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 4.0f, e - 15);
}

float fp4_e2m1_to_float(uint8_t nibble) {
  const int e = (nibble >> 1) & 3, m = nibble & 1;
  const float sign = (nibble & 8) ? -1.0f : 1.0f;
  if (e == 0) return sign * 0.5f * static_cast<float>(m);
  return sign * std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
}

float e8m0_to_float(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(code) - 127);
}

int32_t unpack_int(const uint8_t* words, int64_t stride, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint32_t w;
  std::memcpy(&w, words + 4 * (bit / 32) * stride, 4);
  const uint32_t field = (w >> (bit % 32)) & ((bits == 32 ? 0u : (1u << bits)) - 1u);
  return static_cast<int32_t>(field) - (1 << (bits - 1));
}

// ---- Shared pieces ----

namespace {

// A stored scale (or scale_inv) tensor as floats.
std::vector<float> decode_floats(const RawTensor& t, std::string_view what) {
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  const uint8_t* p = t.bytes.data();
  MYRIAD_CHECK(t.bytes.size() == static_cast<size_t>(n) * safetensors::st_dtype_size(t.st_dtype),
               what, ": ", t.bytes.size(), " bytes for shape ", shape_str(t.shape), " of ",
               t.st_dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (t.st_dtype == "F32") {
      std::memcpy(&v[i], p + 4 * i, 4);
    } else if (t.st_dtype == "BF16" || t.st_dtype == "F16") {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      v[i] = t.st_dtype == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
    } else if (t.st_dtype == "F8_E8M0" || t.st_dtype == "U8") {  // U8: e8m0 exponents (MX)
      v[i] = e8m0_to_float(p[i]);
    } else {
      throw Error(cat(what, " has dtype ", t.st_dtype,
                      "; scales must be F32, BF16, F16, or e8m0 (F8_E8M0 / U8)"));
    }
  }
  return v;
}

// A scale grid must be [gr, gc] (or [gr] when gc == 1, or one element for a 1 x 1 grid).
void check_grid(const RawTensor& s, int64_t gr, int64_t gc, std::string_view what) {
  const bool ok = s.shape == Shape{gr, gc} || (gc == 1 && s.shape == Shape{gr}) ||
                  (gr * gc == 1 && s.numel() == 1 && s.shape.size() <= 2);
  MYRIAD_CHECK(ok, what, " has shape ", shape_str(s.shape), ", expected [", gr, ", ", gc, "]");
}

Tensor finish(std::vector<float>& v, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::F32);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
  return dtype == DType::F32 ? t : t.to(dtype);
}

bool is_pow2_divisor_of_32(int bits) {
  return bits == 1 || bits == 2 || bits == 4 || bits == 8;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

// ---- Dequantizers ----

Tensor dequantize_fp8(const RawTensor& weight, const RawTensor& scale_inv, int64_t b0, int64_t b1,
                      DType dtype, std::string_view name) {
  const bool e4m3 = weight.st_dtype == "F8_E4M3";
  MYRIAD_CHECK(e4m3 || weight.st_dtype == "F8_E5M2", "quant: fp8 tensor ", name, " has dtype ",
               weight.st_dtype, ", expected F8_E4M3 or F8_E5M2");
  MYRIAD_CHECK(weight.shape.size() == 2, "quant: fp8 tensor ", name, " has shape ",
               shape_str(weight.shape), "; only 2-D weights are supported");
  MYRIAD_CHECK(b0 > 0 && b1 > 0, "quant: fp8 tensor ", name, ": block [", b0, ", ", b1,
               "] is not positive");
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const int64_t gc = ceil_div(cols, b1);
  check_grid(scale_inv, ceil_div(rows, b0), gc,
             cat("quant: ", name, "_scale_inv (fp8 block [", b0, ", ", b1, "] of a ",
                 shape_str(weight.shape), " weight)"));
  const std::vector<float> s = decode_floats(scale_inv, cat("quant: ", name, "_scale_inv"));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const uint8_t* q = weight.bytes.data();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t c = q[i * cols + j];
      const float v = e4m3 ? fp8_e4m3_to_float(c) : fp8_e5m2_to_float(c);
      out[i * cols + j] = v * s[(i / b0) * gc + j / b1];
    }
  return finish(out, weight.shape, dtype);
}

Tensor dequantize_packed_int(const RawTensor& packed, const RawTensor& scale,
                             const RawTensor* zero_point, int64_t rows, int64_t cols, int bits,
                             int64_t group, bool per_tensor, DType dtype, std::string_view name) {
  MYRIAD_CHECK(is_pow2_divisor_of_32(bits), "quant: ", name, ": ", bits,
               "-bit pack-quantized weights are not supported (1, 2, 4 or 8 bits: other widths "
               "straddle words, and their layout changed between compressed-tensors releases)");
  MYRIAD_CHECK(packed.st_dtype == "I32", "quant: ", name, "_packed has dtype ", packed.st_dtype,
               ", expected I32");
  const int64_t words = ceil_div(cols * bits, 32);
  MYRIAD_CHECK(rows >= 0 && cols >= 0 && packed.shape == Shape({rows, words}), "quant: ", name,
               "_packed has shape ", shape_str(packed.shape), ", expected [", rows, ", ", words,
               "] for a [", rows, ", ", cols, "] weight of ", bits, "-bit values");
  if (!per_tensor)
    MYRIAD_CHECK(group > 0 && cols % group == 0, "quant: ", name, ": group size ", group,
                 " does not divide the ", cols, " columns");
  const int64_t gr = per_tensor ? 1 : rows, gc = per_tensor ? 1 : cols / group;
  const std::string sname = cat("quant: ", name, "_scale");
  check_grid(scale, gr, gc, sname);
  const std::vector<float> s = decode_floats(scale, sname);
  std::vector<float> z;
  if (zero_point) {
    const std::string zname = cat("quant: ", name, "_zero_point");
    z.resize(static_cast<size_t>(gr * gc));
    if (zero_point->st_dtype == "I32") {  // packed along the output dimension
      const int64_t zw = ceil_div(gr * bits, 32);
      MYRIAD_CHECK(zero_point->shape == Shape({zw, gc}), zname, " has shape ",
                   shape_str(zero_point->shape), ", expected [", zw, ", ", gc, "]");
      for (int64_t r = 0; r < gr; ++r)
        for (int64_t g = 0; g < gc; ++g)
          z[r * gc + g] =
              static_cast<float>(unpack_int(zero_point->bytes.data() + 4 * g, gc, r, bits));
    } else if (zero_point->st_dtype == "I8") {
      check_grid(*zero_point, gr, gc, zname);
      for (int64_t k = 0; k < gr * gc; ++k)
        z[k] = static_cast<float>(static_cast<int8_t>(zero_point->bytes[k]));
    } else {
      throw Error(cat(zname, " has dtype ", zero_point->st_dtype, ", expected I32 or I8"));
    }
  }
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* row = packed.bytes.data() + 4 * i * words;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t k = per_tensor ? 0 : i * gc + j / group;
      const float q = static_cast<float>(unpack_int(row, 1, j, bits));
      out[i * cols + j] = (z.empty() ? q : q - z[k]) * s[k];
    }
  }
  return finish(out, {rows, cols}, dtype);
}

Tensor dequantize_mxfp4(const RawTensor& packed, const RawTensor& scale, int64_t group, DType dtype,
                        std::string_view name) {
  MYRIAD_CHECK(packed.st_dtype == "U8", "quant: ", name, "_packed has dtype ", packed.st_dtype,
               ", expected U8 (two fp4 codes per byte)");
  MYRIAD_CHECK(packed.shape.size() == 2, "quant: ", name, "_packed has shape ",
               shape_str(packed.shape), "; only 2-D weights are supported");
  MYRIAD_CHECK(scale.st_dtype == "U8" || scale.st_dtype == "F8_E8M0", "quant: ", name,
               "_scale has dtype ", scale.st_dtype, ", expected e8m0 exponents (U8 or F8_E8M0)");
  const int64_t rows = packed.shape[0], cols = 2 * packed.shape[1];
  MYRIAD_CHECK(group > 0 && cols % group == 0, "quant: ", name, ": group size ", group,
               " does not divide the ", cols, " columns");
  const int64_t gc = cols / group;
  const std::string sname = cat("quant: ", name, "_scale");
  check_grid(scale, rows, gc, sname);
  const std::vector<float> s = decode_floats(scale, sname);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const uint8_t* p = packed.bytes.data();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t byte = p[i * (cols / 2) + j / 2];
      const uint8_t code = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
      out[i * cols + j] = fp4_e2m1_to_float(code) * s[i * gc + j / group];
    }
  return finish(out, {rows, cols}, dtype);
}

// ---- quantization_config ----

std::string WeightArgs::describe() const {
  std::string s = cat(type, num_bits, symmetric ? " symmetric " : " asymmetric ", strategy);
  if (strategy == "group") s += cat(" ", group_size);
  return s;
}

namespace {

std::string str_or(const json& o, const char* key, std::string fallback, std::string_view where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  MYRIAD_CHECK(it->is_string(), where, ": ", key, " is not a string");
  return it->get<std::string>();
}

std::vector<std::string> str_list(const json& o, const char* key, std::string_view where) {
  std::vector<std::string> out;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return out;
  MYRIAD_CHECK(it->is_array(), where, ": ", key, " is not a list");
  for (const auto& v : *it) {
    MYRIAD_CHECK(v.is_string(), where, ": ", key, " holds a non-string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::vector<int64_t> int_list(const json& o, const char* key, std::string_view where) {
  std::vector<int64_t> out;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return out;
  MYRIAD_CHECK(it->is_array(), where, ": ", key, " is not a list");
  for (const auto& v : *it) {
    MYRIAD_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, where, ": ", key, " holds ",
                 v.dump(), ", not a positive integer");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

WeightArgs parse_args(const json& w, std::string_view where) {
  MYRIAD_CHECK(w.is_object(), where, " is not an object");
  WeightArgs a;
  auto nb = w.find("num_bits");
  a.num_bits = 8;  // compressed-tensors' defaults: int8 symmetric
  if (nb != w.end() && !nb->is_null()) {
    MYRIAD_CHECK(nb->is_number_integer(), where, ": num_bits is not an integer");
    a.num_bits = nb->get<int>();
  }
  a.type = str_or(w, "type", "int", where);
  if (auto s = w.find("symmetric"); s != w.end() && !s->is_null()) {
    MYRIAD_CHECK(s->is_boolean(), where, ": symmetric is not a boolean");
    a.symmetric = s->get<bool>();
  }
  if (auto g = w.find("group_size"); g != w.end() && !g->is_null()) {
    MYRIAD_CHECK(g->is_number_integer(), where, ": group_size is not an integer");
    a.group_size = g->get<int64_t>();
  }
  a.strategy = str_or(w, "strategy", "", where);
  if (a.strategy.empty())  // compressed-tensors' inference (QuantizationArgs validator)
    a.strategy = a.group_size > 0 ? "group" : a.group_size == -1 ? "channel" : "tensor";
  a.block_structure = int_list(w, "block_structure", where);
  if (auto o = w.find("actorder"); o != w.end() && !o->is_null())
    a.actorder = o->is_string() ? o->get<std::string>() : o->dump();
  return a;
}

}  // namespace

QuantConfig QuantConfig::parse(std::string_view text, std::string_view source) {
  json q;
  try {
    q = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(source, ": quantization_config is not valid JSON: ", e.what()));
  }
  MYRIAD_CHECK(q.is_object(), source, ": quantization_config is not an object");
  QuantConfig c;
  c.quant_method = str_or(q, "quant_method", "(no quant_method)", source);
  if (c.quant_method == "fp8") {
    c.weight_block_size = int_list(q, "weight_block_size", source);
    MYRIAD_CHECK(c.weight_block_size.empty() || c.weight_block_size.size() == 2, source,
                 ": weight_block_size must hold two integers");
    c.fmt = str_or(q, "fmt", "", source);
    c.scale_fmt = str_or(q, "scale_fmt", "", source);
    c.expert_dtype = str_or(q, "expert_dtype", "", source);
  } else if (c.quant_method == "compressed-tensors") {
    c.format = str_or(q, "format", "", source);
    c.ignore = str_list(q, "ignore", source);
    if (auto sp = q.find("sparsity_config"); sp != q.end() && sp->is_object())
      c.sparsity = str_or(*sp, "format", "dense", source) != "dense";
    if (auto g = q.find("config_groups"); g != q.end() && !g->is_null()) {
      MYRIAD_CHECK(g->is_object(), source, ": config_groups is not an object");
      for (const auto& [name, grp] : g->items()) {
        const std::string where = cat(source, ": config_groups.", name);
        MYRIAD_CHECK(grp.is_object(), where, " is not an object");
        ConfigGroup cg;
        cg.name = name;
        cg.targets = str_list(grp, "targets", where);
        cg.format = str_or(grp, "format", "", where);
        if (auto w = grp.find("weights"); w != grp.end() && !w->is_null())
          cg.weights = parse_args(*w, where + ".weights");
        c.groups.push_back(std::move(cg));
      }
    }
  }
  return c;
}

QuantConfig QuantConfig::from_config_json(std::string_view text, std::string_view source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(source, " is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return {};
  for (const json* o : {&j, j.contains("text_config") ? &j["text_config"] : nullptr})
    if (o && o->is_object())
      if (auto it = o->find("quantization_config"); it != o->end() && !it->is_null())
        return parse(it->dump(), source);
  return {};
}

QuantConfig QuantConfig::for_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const fs::path cfg = dir / "config.json";
  if (!fs::exists(cfg, ec)) return {};
  return from_config_json(io::read_file(cfg.string(), 64 << 20), cfg.string());
}

// ---- Dequantizer ----

namespace {

// compressed-tensors' match_name: "re:" regexes match at the start (Python re.match), other
// targets equal the module name. A target that looks like a class name ("Linear") cannot be
// checked from names alone and matches any module.
enum class Match { None, Name, Class };
Match match_target(const std::string& target, const std::string& module) {
  if (target.starts_with("re:")) {
    try {
      thread_local std::map<std::string, std::regex> compiled;  // a few patterns per config
      auto it = compiled.find(target);
      if (it == compiled.end())
        it = compiled.emplace(target, std::regex(target.substr(3), std::regex::ECMAScript)).first;
      return std::regex_search(module, it->second, std::regex_constants::match_continuous)
                 ? Match::Name
                 : Match::None;
    } catch (const std::regex_error& e) {
      throw Error(cat("quant: compressed-tensors target '", target, "' is not a regex Myriad can ",
                      "read: ", e.what()));
    }
  }
  if (target == module) return Match::Name;
  return !target.empty() && std::isupper(static_cast<unsigned char>(target[0])) ? Match::Class
                                                                                : Match::None;
}

const ConfigGroup& group_for(const QuantConfig& c, const std::string& module,
                             const std::string& x) {
  std::vector<const ConfigGroup*> by_name, by_class;
  for (const auto& g : c.groups) {
    Match best = Match::None;
    for (const auto& t : g.targets) {
      const Match m = match_target(t, module);
      if (m == Match::Name || (m == Match::Class && best == Match::None)) best = m;
    }
    if (best == Match::Name) by_name.push_back(&g);
    if (best == Match::Class) by_class.push_back(&g);
  }
  auto& found = by_name.empty() ? by_class : by_name;
  if (found.empty() && c.groups.size() == 1) found.push_back(&c.groups[0]);
  MYRIAD_CHECK(!found.empty(), "quant: tensor ", x,
               " is stored compressed, but no config group of ",
               "the compressed-tensors quantization_config targets module ", module);
  for (const auto* g : found)
    MYRIAD_CHECK(g->weights == found[0]->weights && g->format == found[0]->format, "quant: tensor ",
                 x, ": config groups ", found[0]->name, " and ", g->name, " both target module ",
                 module, " with different schemes");
  return *found[0];
}

}  // namespace

const QuantConfig& Dequantizer::config() const {
  std::call_once(read_, [&] {
    if (!config_) config_ = std::make_shared<QuantConfig>(QuantConfig::for_checkpoint(path_));
  });
  return *config_;
}

std::optional<Tensor> Dequantizer::load(const std::string& x, DType dtype,
                                        std::vector<std::string>* parts_out) const {
  std::vector<std::string> parts;
  Tensor t;
  if (ck_.contains(x)) {
    const bool inv = ck_.contains(x + "_scale_inv"), scale = ck_.contains(x + "_scale");
    const std::string st = ck_.info(x).st_dtype;
    if (inv) {
      t = load_fp8(x, dtype, parts);
    } else if (scale) {
      const QuantConfig& c = config();
      throw Error(cat("quant: tensor ", x, " (", st, ") comes with ", x, "_scale: ",
                      c.quant_method == "compressed-tensors"
                          ? cat("compressed-tensors format '", c.format, "'")
                          : cat("quant_method '", c.empty() ? "(none)" : c.quant_method, "'"),
                      ", which Myriad cannot dequantize (supported: fp8 with ", x,
                      "_scale_inv, compressed-tensors pack-quantized and mxfp4-pack-quantized)"));
    } else if (st.starts_with("F8_")) {
      throw Error(cat("quant: tensor ", x, " is stored as ", st, " without ", x,
                      "_scale_inv beside it: an fp8 weight needs its block scales"));
    } else {
      return std::nullopt;
    }
  } else if (x.ends_with("weight") && ck_.contains(x + "_packed")) {
    t = load_compressed(x, dtype, parts);
  } else if (const std::string m =
                 x.substr(0, x.rfind('.') == std::string::npos ? 0 : x.rfind('.'));
             x.ends_with(".weight") && ck_.contains(m + ".qweight")) {
    const QuantConfig& c = config();
    throw Error(cat("quant: tensor ", x, " is stored as ", m, ".qweight (GPTQ/AWQ layout, ",
                    "quant_method '", c.empty() ? "(none)" : c.quant_method,
                    "'), which Myriad cannot dequantize"));
  } else {
    return std::nullopt;
  }
  if (parts_out) *parts_out = std::move(parts);
  return t;
}

Tensor Dequantizer::load(const ParamSpec& spec, DType dtype, std::set<std::string>& used) const {
  std::vector<std::string> names = {spec.name};
  if (!spec.save_as.empty()) names.push_back(spec.save_as);
  names.insert(names.end(), spec.aliases.begin(), spec.aliases.end());
  for (const auto& n : names) {
    const size_t dot = n.rfind('.');
    const bool present = ck_.contains(n) ||
                         (n.ends_with("weight") && ck_.contains(n + "_packed")) ||
                         (dot != std::string::npos && n.ends_with(".weight") &&
                          ck_.contains(n.substr(0, dot) + ".qweight"));
    if (!present) continue;
    std::vector<std::string> parts;
    std::optional<Tensor> t = load(n, dtype, &parts);
    if (!t) return {};
    MYRIAD_CHECK(t->shape() == spec.shape, "quant: tensor ", n, " dequantizes to shape ",
                 shape_str(t->shape()), ", expected ", shape_str(spec.shape));
    used.insert(parts.begin(), parts.end());
    return *t;
  }
  return {};
}

Tensor Dequantizer::load_fp8(const std::string& x, DType dtype,
                             std::vector<std::string>& parts) const {
  const QuantConfig& c = config();
  MYRIAD_CHECK(c.empty() || c.quant_method == "fp8", "quant: tensor ", x, " has ", x,
               "_scale_inv (the fine-grained fp8 layout), but config.json's quantization_config ",
               "has quant_method '", c.quant_method, "'");
  const RawTensor w = ck_.load_raw(x), s = ck_.load_raw(x + "_scale_inv");
  MYRIAD_CHECK(c.expert_dtype != "fp4" || w.st_dtype.starts_with("F8_"), "quant: tensor ", x,
               " is stored as ", w.st_dtype, " with expert_dtype 'fp4' (DeepSeek-V4 FP4 experts), ",
               "which Myriad cannot dequantize");
  MYRIAD_CHECK(w.shape.size() == 2, "quant: fp8 tensor ", x, " has shape ", shape_str(w.shape),
               "; only 2-D weights are supported");
  const int64_t rows = w.shape[0], cols = w.shape[1];
  int64_t b0 = rows, b1 = cols;  // per-tensor
  if (c.weight_block_size.size() == 2) {
    b0 = c.weight_block_size[0];
    b1 = c.weight_block_size[1];
  } else if (c.empty() && s.numel() != 1) {  // no config: the block the grid implies
    MYRIAD_CHECK(s.shape.size() == 2 && s.shape[0] > 0 && s.shape[1] > 0 &&
                     rows % s.shape[0] == 0 && cols % s.shape[1] == 0,
                 "quant: tensor ", x, ": without a quantization_config (weight_block_size) the ",
                 "block of a ", shape_str(w.shape), " weight cannot be read off a ",
                 shape_str(s.shape), " scale grid");
    b0 = rows / s.shape[0];
    b1 = cols / s.shape[1];
  }
  Tensor t = dequantize_fp8(w, s, std::max<int64_t>(b0, 1), std::max<int64_t>(b1, 1), dtype, x);
  parts = {x, x + "_scale_inv"};
  return t;
}

Tensor Dequantizer::load_compressed(const std::string& x, DType dtype,
                                    std::vector<std::string>& parts) const {
  const QuantConfig& c = config();
  MYRIAD_CHECK(c.quant_method == "compressed-tensors", "quant: tensor ", x,
               " is stored compressed (", x, "_packed), but config.json beside the checkpoint ",
               c.empty() ? std::string("has no quantization_config")
                         : cat("has quant_method '", c.quant_method, "'"),
               "; expected compressed-tensors");
  MYRIAD_CHECK(!c.sparsity, "quant: tensor ", x, ": compressed-tensors sparsity formats are not ",
               "supported");
  const std::string module = x.ends_with(".weight") ? x.substr(0, x.size() - 7) : x;
  const ConfigGroup& g = group_for(c, module, x);
  MYRIAD_CHECK(g.weights.has_value(), "quant: tensor ", x, ": config group ", g.name,
               " quantizes no weights, yet the checkpoint stores ", x, "_packed");
  const WeightArgs& a = *g.weights;
  const std::string format = g.format.empty() ? c.format : g.format;
  const std::string scheme = cat("compressed-tensors ", format, ", ", a.describe());
  for (const char* extra : {"_global_scale", "_g_idx"})
    MYRIAD_CHECK(!ck_.contains(x + extra), "quant: tensor ", x, " (", scheme, ") has ", x, extra,
                 extra == std::string("_g_idx")
                     ? ": activation-ordered group indices are not supported"
                     : ": global scales (NVFP4) are not supported");
  MYRIAD_CHECK(ck_.contains(x + "_scale"), "quant: tensor ", x, " (", scheme, ") lacks ", x,
               "_scale");
  const RawTensor packed = ck_.load_raw(x + "_packed"), scale = ck_.load_raw(x + "_scale");
  parts = {x + "_packed", x + "_scale"};
  // The weight's shape: weight_shape when stored (pack-quantized always stores it).
  std::optional<Shape> shape;
  if (ck_.contains(x + "_shape")) {
    const RawTensor s = ck_.load_raw(x + "_shape");
    MYRIAD_CHECK((s.st_dtype == "I64" || s.st_dtype == "I32") && s.shape == Shape{2}, "quant: ", x,
                 "_shape is ", s.st_dtype, " ", shape_str(s.shape), ", expected I64 [2]");
    Shape v(2);
    for (int k = 0; k < 2; ++k) {
      if (s.st_dtype == "I64") {
        std::memcpy(&v[k], s.bytes.data() + 8 * k, 8);
      } else {
        int32_t i32;
        std::memcpy(&i32, s.bytes.data() + 4 * k, 4);
        v[k] = i32;
      }
      MYRIAD_CHECK(v[k] >= 0, "quant: ", x, "_shape holds a negative size");
    }
    shape = v;
    parts.push_back(x + "_shape");
  }
  const bool has_zp = ck_.contains(x + "_zero_point");
  MYRIAD_CHECK(has_zp == !a.symmetric, "quant: tensor ", x, " (", scheme, ") ",
               has_zp ? cat("has ", x, "_zero_point, but the scheme is symmetric")
                      : cat("lacks ", x, "_zero_point"));

  if (format == "pack-quantized") {
    MYRIAD_CHECK(a.type == "int", "quant: tensor ", x, " (", scheme,
                 "): pack-quantized weights must be integers");
    MYRIAD_CHECK(a.strategy == "group" || a.strategy == "channel" || a.strategy == "tensor",
                 "quant: tensor ", x, " (", scheme, "): strategy '", a.strategy,
                 "' is not supported (group, channel, tensor)");
    MYRIAD_CHECK(shape.has_value(), "quant: tensor ", x, " (", scheme, ") lacks ", x, "_shape");
    MYRIAD_CHECK(is_pow2_divisor_of_32(a.num_bits), "quant: tensor ", x, " (", scheme,
                 "): num_bits ", a.num_bits, " is not supported (1, 2, 4 or 8)");
    const int64_t rows = (*shape)[0], cols = (*shape)[1];
    RawTensor zp;
    if (has_zp) {
      zp = ck_.load_raw(x + "_zero_point");
      parts.push_back(x + "_zero_point");
    }
    const int64_t group = a.strategy == "group" ? a.group_size : cols;
    return dequantize_packed_int(packed, scale, has_zp ? &zp : nullptr, rows, cols, a.num_bits,
                                 group, a.strategy == "tensor", dtype, x);
  }
  if (format == "mxfp4-pack-quantized") {
    MYRIAD_CHECK(a.type == "float" && a.num_bits == 4 && a.strategy == "group" &&
                     a.group_size == 32 && a.symmetric,
                 "quant: tensor ", x, " (", scheme, "): mxfp4 needs symmetric float4 groups of 32");
    Tensor t = dequantize_mxfp4(packed, scale, a.group_size, dtype, x);
    MYRIAD_CHECK(!shape || *shape == t.shape(), "quant: ", x, "_shape says ", shape_str(*shape),
                 " but ", x, "_packed holds ", shape_str(t.shape()));
    return t;
  }
  throw Error(cat("quant: tensor ", x, " (", scheme, "): compressed-tensors format '", format,
                  "' is not supported (pack-quantized, mxfp4-pack-quantized)"));
}

}  // namespace myriad::model::quant
