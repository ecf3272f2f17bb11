// generation_config.json, the file transformers writes beside a model's config.json: the token
// ids that end a reply and the default sampling (HF GenerationConfig fields). Absent fields stay
// unset; the server and `myriad generate` / `chat` apply what is set where a request or flag
// does not say otherwise.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace myriad::infer {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // eos_token_id: one id or a list
  std::optional<int32_t> bos_token_id, pad_token_id;
  std::optional<bool> do_sample;  // false: greedy whatever the temperature says
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> max_new_tokens;
  bool present = false;  // the file was there

  // Reads <dir>/generation_config.json; absent: an empty config. Bad JSON or a field of the
  // wrong type or range is an error naming the file and field.
  static GenerationConfig from_model_dir(const std::string& dir);
  static GenerationConfig parse(const std::string& text, const std::string& origin);
  // The default temperature: 0 (greedy) when do_sample is false, else temperature or 1.
  double default_temperature() const;
};

}  // namespace myriad::infer
