#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "model/quant.h"
#include "ops/matmul.h"
#include "ops/shape.h"

namespace myriad::model {

Weights Weights::load(const std::string& path, const std::vector<ParamSpec>& specs, DType dtype) {
  auto ck = safetensors::Checkpoint::open(path);
  const quant::Dequantizer dq(ck, path);  // quantized tensors (model/quant.h)
  Weights w;
  w.specs_ = specs;
  std::set<std::string> used;
  std::map<std::string, Tensor> fused;
  std::vector<std::string> missing;
  for (const auto& s : specs) {
    if (Tensor q = dq.load(s, dtype, used); q.defined()) {
      w.tensors_[s.name] = q;
      continue;
    }
    std::string found;
    if (ck.contains(s.name)) found = s.name;
    if (found.empty() && !s.save_as.empty() && ck.contains(s.save_as)) found = s.save_as;
    for (const auto& a : s.aliases)
      if (found.empty() && ck.contains(a)) found = a;
    if (found.empty()) {
      for (const auto& f : s.fused) {
        if (!ck.contains(f.name)) continue;
        auto it = fused.find(f.name);
        if (it == fused.end()) it = fused.emplace(f.name, ck.load(f.name)).first;
        const Tensor& t = it->second;
        MYRIAD_CHECK(t.dim() == 3 && f.index < t.size(0) && f.end <= t.size(1), "weights: fused ",
                     "tensor ", f.name, " in ", path, " has shape ", shape_str(t.shape()),
                     ", too small for ", s.name);
        const int64_t end = f.end > f.begin ? f.end : t.size(1);
        Tensor part =
            ops::squeeze(ops::slice(ops::slice(t, 0, f.index, f.index + 1), 1, f.begin, end), 0)
                .clone();
        MYRIAD_CHECK(part.shape() == s.shape, "weights: ", s.name, " from fused ", f.name, " in ",
                     path, " has shape ", shape_str(part.shape()), ", expected ",
                     shape_str(s.shape));
        w.tensors_[s.name] = part.to(dtype);
        used.insert(f.name);
        found = f.name;
        break;
      }
      if (found.empty()) missing.push_back(s.name);
      continue;
    }
    const auto info = ck.info(found);
    const bool stored_shape = !s.stored_shape.empty() && info.shape == s.stored_shape;
    MYRIAD_CHECK(info.shape == s.shape || stored_shape, "weights: tensor ", found, " in ", path,
                 " has shape ", shape_str(info.shape), ", expected ", shape_str(s.shape),
                 s.stored_shape.empty() ? "" : " or " + shape_str(s.stored_shape));
    MYRIAD_CHECK(info.supported && is_floating(info.dtype), "weights: tensor ", found, " in ", path,
                 " has unsupported dtype ", info.st_dtype);
    Tensor t = ck.load(found);
    if (stored_shape) t = ops::reshape(t, s.shape);
    w.tensors_[s.name] = t.dtype() == dtype ? t : t.to(dtype);
    used.insert(found);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 8) list += cat(", ... (", missing.size(), " in all)");
    throw Error(cat("weights: ", path, " lacks tensor(s) ", list));
  }
  const bool has_vision = std::any_of(specs.begin(), specs.end(), [](const ParamSpec& s) {
    return s.name.starts_with("vision_tower.");
  });
  // DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers) follow the last
  // decoder layer, each marked by an eh_proj; Myriad does not run them.
  std::vector<std::string> mtp;
  for (const auto& n : ck.names())
    if (n.ends_with(".eh_proj.weight") && !used.count(n))
      mtp.push_back(n.substr(0, n.size() - std::string(".eh_proj.weight").size() + 1));
  for (const auto& n : ck.names()) {
    if (used.count(n)) continue;
    if (std::any_of(mtp.begin(), mtp.end(),
                    [&](const std::string& p) { return n.starts_with(p); })) {
      w.skipped_.push_back(n);
      continue;
    }
    if (!has_vision && (n.starts_with("vision_tower.") || n.starts_with("mm_projector."))) {
      w.skipped_.push_back(n);
      continue;
    }
    throw Error(
        cat("weights: unexpected tensor ", n, " in ", path, " (not part of this model's config)"));
  }
  return w;
}

Weights Weights::init(const std::vector<ParamSpec>& specs, uint64_t seed, double std, DType dtype) {
  Generator gen(seed);
  Weights w;
  w.specs_ = specs;
  for (const auto& s : specs) {
    Tensor t;
    switch (s.init) {
      case Init::Normal:
        t = gen.normal(s.shape, 0.0, std, dtype);
        break;
      case Init::Zeros:
        t = Tensor::zeros(s.shape, dtype);
        break;
      case Init::Ones:
        t = Tensor::ones(s.shape, dtype);
        break;
      case Init::Const:
        t = Tensor::full(s.shape, s.value, dtype);
        break;
      case Init::ALog: {  // log U(1, 16)
        std::vector<double> v(shape_numel(s.shape));
        for (auto& x : v) x = std::log(1.0 + 15.0 * gen.uniform());
        t = Tensor::from_doubles(v, s.shape, dtype);
        break;
      }
      case Init::DtBias: {  // inverse softplus of dt, log dt ~ U(ln 1e-3, ln 1e-1), dt >= 1e-4
        std::vector<double> v(shape_numel(s.shape));
        for (auto& x : v) {
          double dt = std::exp(std::log(1e-3) + gen.uniform() * (std::log(1e-1) - std::log(1e-3)));
          dt = std::max(dt, 1e-4);
          x = dt + std::log(-std::expm1(-dt));
        }
        t = Tensor::from_doubles(v, s.shape, dtype);
        break;
      }
    }
    w.tensors_[s.name] = t;
  }
  return w;
}

Weights Weights::from(const std::vector<ParamSpec>& specs, std::map<std::string, Tensor> tensors) {
  Weights w;
  w.specs_ = specs;
  for (const auto& s : specs) {
    auto it = tensors.find(s.name);
    MYRIAD_CHECK(it != tensors.end(), "weights: no tensor given for ", s.name);
    MYRIAD_CHECK(it->second.shape() == s.shape, "weights: ", s.name, " given as ",
                 it->second.desc(), ", expected shape ", shape_str(s.shape));
    w.tensors_[s.name] = it->second;
    tensors.erase(it);
  }
  MYRIAD_CHECK(tensors.empty(), "weights: unexpected tensor ",
               tensors.empty() ? "" : tensors.begin()->first);
  return w;
}

const Tensor& Weights::get(const std::string& name) const {
  auto it = tensors_.find(name);
  MYRIAD_CHECK(it != tensors_.end(), "weights: no tensor named ", name);
  return it->second;
}

std::map<std::string, Tensor> Weights::tensors() const {
  return {tensors_.begin(), tensors_.end()};
}

void Weights::set(const std::string& name, const Tensor& t) {
  auto it = tensors_.find(name);
  MYRIAD_CHECK(it != tensors_.end(), "weights: no tensor named ", name);
  MYRIAD_CHECK(it->second.shape() == t.shape(), "weights: set ", name, " to ", t.desc(),
               ", expected shape ", shape_str(it->second.shape()));
  it->second = t;
}

std::string Weights::canonical(const std::string& name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return name;
    if (std::find(s.aliases.begin(), s.aliases.end(), name) != s.aliases.end()) return s.name;
  }
  return name;
}

void Weights::requires_grad_(bool on) {
  for (const auto& s : specs_) {
    Tensor& t = tensors_.at(s.name);
    t = t.detach();
    t.requires_grad_(on && s.trainable);
  }
}

Weights Weights::to(DType dtype) const {
  Weights w;
  w.specs_ = specs_;
  for (const auto& [n, t] : tensors_) w.tensors_[n] = t.detach().to(dtype);
  return w;
}

Weights Weights::to(Device device) const {
  Weights w;
  w.specs_ = specs_;
  w.skipped_ = skipped_;
  for (const auto& [n, t] : tensors_) w.tensors_[n] = t.detach().to(device);
  for (const auto& [n, q] : quant_) w.quant_.emplace(n, q.to(device));
  return w;
}

void Weights::save(const std::string& path) const {
  std::map<std::string, const ParamSpec*> spec;
  for (const auto& s : specs_) spec[s.name] = &s;
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : tensors_) {
    const auto it = spec.find(n);
    const ParamSpec* s = it == spec.end() ? nullptr : it->second;
    Tensor out = t.detach();
    if (s && s->save_stored_shape) out = ops::reshape(out, s->stored_shape);
    m[s && !s->save_as.empty() ? s->save_as : n] = out;
  }
  safetensors::save(path, m);
}

void Weights::quantize(const std::vector<std::string>& names, int bits, int act_bits) {
  for (const std::string& n : names)
    quant_.insert_or_assign(n, ops::quantize(get(n), bits, act_bits));
}

const ops::QuantWeight* Weights::quant(const std::string& name) const {
  const auto it = quant_.find(name);
  return it == quant_.end() ? nullptr : &it->second;
}

int64_t Weights::quant_bytes() const {
  int64_t b = 0;
  for (const auto& [n, q] : quant_) b += q.bytes();
  return b;
}

Tensor project(const Tensor& x, const Weights& w, const std::string& name) {
  if (const ops::QuantWeight* q = w.quant(name)) return ops::linear_quant(x, *q);
  return ops::linear(x, w.get(name));
}

Tensor project_cat(const Tensor& x, const Weights& w, const std::vector<std::string>& names) {
  std::vector<const ops::QuantWeight*> q;
  for (const std::string& n : names)
    if (const ops::QuantWeight* p = w.quant(n)) q.push_back(p);
  if (!q.empty() && q.size() == names.size()) return ops::linear_quant_cat(x, q);
  std::vector<Tensor> parts;
  if (q.empty()) {
    for (const std::string& n : names) parts.push_back(w.get(n));
    return ops::linear_cat(x, parts);
  }
  for (const std::string& n : names) parts.push_back(project(x, w, n));
  return ops::concat(parts, -1);
}

Tensor project_grouped(const Tensor& x, const std::vector<int64_t>& offsets, const Weights& w,
                       const std::vector<std::string>& names) {
  std::vector<const ops::QuantWeight*> q;
  for (const std::string& n : names)
    if (const ops::QuantWeight* p = w.quant(n)) q.push_back(p);
  if (!q.empty() && q.size() == names.size()) return ops::grouped_linear_quant(x, offsets, q);
  std::vector<Tensor> t;
  for (const std::string& n : names) t.push_back(w.get(n));
  return ops::grouped_linear(x, offsets, t);
}

Tensor project_grouped_cat(const Tensor& x, const std::vector<int64_t>& offsets, const Weights& w,
                           const std::vector<std::vector<std::string>>& names) {
  bool quantized = false;  // a set with every weight quantized runs project_grouped's int8 path
  for (const auto& set : names)
    quantized = quantized || std::all_of(set.begin(), set.end(), [&](const std::string& n) {
                  return w.quant(n) != nullptr;
                });
  if (quantized) {
    std::vector<Tensor> parts;
    for (const auto& set : names) parts.push_back(project_grouped(x, offsets, w, set));
    return ops::concat(parts, -1);
  }
  std::vector<std::vector<Tensor>> t(names.size());
  for (size_t s = 0; s < names.size(); ++s)
    for (const std::string& n : names[s]) t[s].push_back(w.get(n));
  return ops::grouped_linear_cat(x, offsets, t);
}

}  // namespace myriad::model
