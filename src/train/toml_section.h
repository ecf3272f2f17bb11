// TOML recipe reading shared by the training recipes (recipe.cpp) and the RL recipes (rl.cpp):
// a table reader that refuses unknown keys and names the dotted key in every error.
#pragma once
#include <toml++/toml.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "train/optim.h"

namespace myriad::train::toml_recipe {

// Reads the keys of one table, refusing unknown ones; every error names the dotted key.
class Section {
 public:
  Section(const toml::table* t, std::string prefix) : t_(t), prefix_(std::move(prefix)) {}
  ~Section() = default;
  std::string key(std::string_view k) const { return prefix_ + std::string(k); }
  const toml::node* node(std::string_view k) {
    seen_.insert(std::string(k));
    return t_ ? t_->get(k) : nullptr;
  }
  template <class T>
  void get(std::string_view k, std::vector<T>& out) {
    const toml::node* n = node(k);
    if (!n) return;
    MYRIAD_CHECK(n->is_array(), key(k), ": expected an array");
    out.clear();
    for (const auto& e : *n->as_array()) out.push_back(value<T>(e, k));
  }
  template <class T>
  void get(std::string_view k, T& out) {
    if (const toml::node* n = node(k)) out = value<T>(*n, k);
  }
  template <class T>
  T value(const toml::node& nr, std::string_view k) const {
    const toml::node* n = &nr;
    T out{};
    if constexpr (std::is_same_v<T, bool>) {
      MYRIAD_CHECK(n->is_boolean(), key(k), ": expected true or false");
      out = *n->value<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      MYRIAD_CHECK(n->is_string(), key(k), ": expected a string");
      out = *n->value<std::string>();
    } else if constexpr (std::is_floating_point_v<T>) {
      MYRIAD_CHECK(n->is_number(), key(k), ": expected a number");
      out = *n->value<double>();
      MYRIAD_CHECK(std::isfinite(out), key(k), ": must be finite");
    } else {
      MYRIAD_CHECK(n->is_integer(), key(k), ": expected an integer");
      const int64_t v = *n->value<int64_t>();
      MYRIAD_CHECK(std::is_signed_v<T> || v >= 0, key(k), ": must not be negative");
      out = static_cast<T>(v);
    }
    return out;
  }
  void check_positive(std::string_view k, double v) const {
    MYRIAD_CHECK(v > 0, key(k), ": must be positive, got ", v);
  }
  // Every key of the table was read.
  void finish() const {
    if (!t_) return;
    for (auto&& [k, v] : *t_)
      MYRIAD_CHECK(seen_.count(std::string(k.str())), "unknown key ", key(k.str()));
  }

 private:
  const toml::table* t_;
  std::string prefix_;
  std::set<std::string> seen_;
};

inline const toml::table* subtable(const toml::table& root, std::string_view k) {
  const toml::node* n = root.get(k);
  if (!n) return nullptr;
  MYRIAD_CHECK(n->is_table(), k, ": expected a table [", k, "]");
  return n->as_table();
}

inline nlohmann::json to_json(const toml::node& n, const std::string& key) {
  if (const auto* t = n.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (auto&& [k, v] : *t) j[std::string(k.str())] = to_json(v, key + "." + std::string(k.str()));
    return j;
  }
  if (const auto* a = n.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(to_json(v, key));
    return j;
  }
  if (n.is_string()) return *n.value<std::string>();
  if (n.is_integer()) return *n.value<int64_t>();
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  throw Error(cat(key, ": dates and times are not config values"));
}

inline void one_of(const std::string& key, const std::string& v,
                   std::initializer_list<const char*> ok) {
  std::string list;
  for (const char* o : ok) {
    if (v == o) return;
    list += list.empty() ? o : std::string(", ") + o;
  }
  throw Error(cat(key, ": \"", v, "\" is not one of ", list));
}

// The [optimizer] table into oc (whose values are the defaults), validated.
inline void read_optimizer(const toml::table& root, OptimConfig& oc) {
  Section o(subtable(root, "optimizer"), "optimizer.");
  o.get("matrix_optimizer", oc.matrix_optimizer);
  o.get("lr", oc.lr);
  o.get("weight_decay", oc.weight_decay);
  o.get("beta1", oc.beta1);
  o.get("beta2", oc.beta2);
  o.get("eps", oc.eps);
  o.get("momentum", oc.momentum);
  o.get("nesterov", oc.nesterov);
  o.get("per_head", oc.per_head);
  o.get("clip_norm", oc.clip_norm);
  o.get("qk_clip_tau", oc.qk_clip_tau);
  o.finish();
  one_of("optimizer.matrix_optimizer", oc.matrix_optimizer, {"muon", "adamw"});
  o.check_positive("lr", oc.lr);
  MYRIAD_CHECK(oc.beta1 >= 0 && oc.beta1 < 1, "optimizer.beta1: must be in [0, 1)");
  MYRIAD_CHECK(oc.beta2 >= 0 && oc.beta2 < 1, "optimizer.beta2: must be in [0, 1)");
}

}  // namespace myriad::train::toml_recipe
