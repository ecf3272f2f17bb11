#include "infer/generation_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file.h"

namespace myriad::infer {

namespace {

using nlohmann::json;

int32_t token_id(const json& v, const std::string& origin, const char* key) {
  MYRIAD_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
               origin, ": ", key, " must be a token id (a non-negative integer), got ", v.dump());
  return static_cast<int32_t>(v.get<int64_t>());
}

std::optional<double> number(const json& j, const char* key, double lo, double hi,
                             const std::string& origin) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  MYRIAD_CHECK(it->is_number(), origin, ": ", key, " must be a number, got ", it->dump());
  const double v = it->get<double>();
  MYRIAD_CHECK(v >= lo && v <= hi, origin, ": ", key, " = ", v, " is outside [", lo, ", ", hi, "]");
  return v;
}

}  // namespace

GenerationConfig GenerationConfig::parse(const std::string& text, const std::string& origin) {
  const json j = json::parse(text, nullptr, false);
  MYRIAD_CHECK(!j.is_discarded(), origin, ": not valid JSON");
  MYRIAD_CHECK(j.is_object(), origin, ": expected a JSON object");
  GenerationConfig g;
  g.present = true;
  if (const auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_array()) {
      for (const json& v : *it) g.eos_token_ids.push_back(token_id(v, origin, "eos_token_id"));
    } else {
      g.eos_token_ids.push_back(token_id(*it, origin, "eos_token_id"));
    }
  }
  for (auto [key, out] :
       {std::pair{"bos_token_id", &g.bos_token_id}, std::pair{"pad_token_id", &g.pad_token_id}})
    if (const auto it = j.find(key); it != j.end() && !it->is_null())
      *out = token_id(it->is_array() && !it->empty() ? it->front() : *it, origin, key);
  if (const auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    MYRIAD_CHECK(it->is_boolean(), origin, ": do_sample must be true or false, got ", it->dump());
    g.do_sample = it->get<bool>();
  }
  g.temperature = number(j, "temperature", 0.0, 100.0, origin);
  g.top_p = number(j, "top_p", 0.0, 1.0, origin);
  g.min_p = number(j, "min_p", 0.0, 1.0, origin);
  g.repetition_penalty = number(j, "repetition_penalty", 0.0, 100.0, origin);
  if (const auto v = number(j, "top_k", 0.0, 1 << 30, origin)) {
    MYRIAD_CHECK(*v == static_cast<int>(*v), origin, ": top_k must be an integer, got ", *v);
    g.top_k = static_cast<int>(*v);
  }
  if (const auto v = number(j, "max_new_tokens", 1.0, 1e15, origin)) {
    MYRIAD_CHECK(*v == static_cast<double>(static_cast<int64_t>(*v)), origin,
                 ": max_new_tokens must be an integer, got ", *v);
    g.max_new_tokens = static_cast<int64_t>(*v);
  }
  return g;
}

GenerationConfig GenerationConfig::from_model_dir(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  return parse(io::read_file(path.string()), path.string());
}

double GenerationConfig::default_temperature() const {
  if (do_sample && !*do_sample) return 0.0;
  return temperature.value_or(1.0);
}

}  // namespace myriad::infer
