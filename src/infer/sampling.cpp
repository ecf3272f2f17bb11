#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace myriad::infer {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("sampling: " + what);
}

// Indices sorted by value, largest first (lowest index on ties).
std::vector<int32_t> order_desc(const std::vector<double>& v) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  return idx;
}

// Bytes at the end of s that may still change: an incomplete UTF-8 sequence, or U+FFFD, which
// byte-fallback detokenisers emit for bytes whose sequence has not completed yet.
size_t unstable_tail(const std::string& s) {
  size_t end = s.size();
  for (;;) {
    if (end >= 3 && s.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) {
      end -= 3;
      continue;
    }
    // A lead byte whose sequence runs past the end.
    for (size_t back = 1; back <= 3 && back <= end; ++back) {
      const auto c = static_cast<unsigned char>(s[end - back]);
      if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
      const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (len > back) end -= back;
      break;
    }
    return s.size() - end;
  }
}

}  // namespace

void validate_sampling(const SamplingParams& p) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    bad("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  if (p.top_k < 0) bad("top_k must be >= 0 (0: off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    bad("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    bad("min_p must be in [0, 1], got " + std::to_string(p.min_p));
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    bad("repetition_penalty must be > 0, got " + std::to_string(p.repetition_penalty));
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    bad("presence_penalty and frequency_penalty must be finite");
  if (p.max_tokens < 1) bad("max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
  if (p.top_logprobs < -1 || p.top_logprobs > 20)
    bad("top_logprobs must be -1 (off) or 0..20, got " + std::to_string(p.top_logprobs));
  for (const auto& s : p.stop)
    if (s.empty()) bad("a stop sequence is empty");
}

void apply_penalties(std::vector<double>& logits, const SamplingParams& p,
                     const std::unordered_set<int32_t>& seen,
                     const std::unordered_map<int32_t, int64_t>& counts) {
  const auto V = static_cast<int64_t>(logits.size());
  if (p.repetition_penalty != 1.0)
    for (int32_t t : seen) {
      if (t < 0 || t >= V) continue;
      double& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
    for (const auto& [t, n] : counts) {
      if (t < 0 || t >= V || n <= 0) continue;
      logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<double>(n);
    }
}

std::vector<double> sampling_probs(const std::vector<double>& logits, const SamplingParams& p) {
  const size_t V = logits.size();
  std::vector<double> z(V);
  for (size_t i = 0; i < V; ++i) z[i] = logits[i] / p.temperature;
  const std::vector<int32_t> order = order_desc(z);
  size_t keep = V;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  // Softmax over the kept ones (in descending order).
  const double zmax = z[order[0]];
  std::vector<double> e(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += e[i] = std::exp(z[order[i]] - zmax);
  if (p.top_p < 1.0) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += e[n++] / sum;
      if (cum >= p.top_p) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0) {
    size_t n = 1;  // e[0] is the largest: e[i] / e[0] = p_i / p_max
    while (n < keep && e[n] >= p.min_p * e[0]) ++n;
    keep = n;
  }
  std::vector<double> probs(V, 0.0);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += e[i];
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = e[i] / total;
  return probs;
}

std::vector<double> log_softmax(std::span<const float> logits) {
  double m = -std::numeric_limits<double>::infinity();
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  double s = 0;
  for (float l : logits) s += std::exp(static_cast<double>(l) - m);
  const double lse = m + std::log(s);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

Sampler::Sampler(SamplingParams p, std::span<const int32_t> prompt, uint64_t seed)
    : p_(std::move(p)), rng_(seed), seen_(prompt.begin(), prompt.end()) {}

Pick Sampler::sample(std::span<const float> logits) {
  std::vector<double> l(logits.begin(), logits.end());
  apply_penalties(l, p_, seen_, counts_);
  Pick pk;
  if (p_.temperature == 0) {
    pk.token = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  } else {
    const std::vector<double> probs = sampling_probs(l, p_);
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    double cum = 0;
    pk.token = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] <= 0) continue;
      pk.token = static_cast<int32_t>(i);  // the last allowed one absorbs rounding
      cum += probs[i];
      if (u < cum) break;
    }
  }
  if (p_.top_logprobs >= 0) {
    const std::vector<double> lp = log_softmax(logits);
    pk.logprob = lp[pk.token];
    const std::vector<int32_t> order = order_desc(lp);
    for (int i = 0; i < p_.top_logprobs && i < static_cast<int>(order.size()); ++i)
      pk.top.emplace_back(order[i], lp[order[i]]);
  }
  seen_.insert(pk.token);
  ++counts_[pk.token];
  return pk;
}

TextStream::TextStream(std::vector<std::string> stop, Decode decode)
    : stop_(std::move(stop)), decode_(std::move(decode)) {}

std::string TextStream::current() {
  // Incremental detokenisation: decode only the tokens since the last stable point (where the
  // text ended in a complete character) together with the chunk before it, and take the
  // difference; the chunk keeps context-dependent rendering (SentencePiece's leading space) right.
  using It = std::vector<int32_t>::const_iterator;
  const It p = tokens_.cbegin() + static_cast<std::ptrdiff_t>(prefix_);
  const It r = tokens_.cbegin() + static_cast<std::ptrdiff_t>(read_);
  const std::string a = decode_({p, r}), b = decode_({p, tokens_.cend()});
  if (b.size() < a.size() || b.compare(0, a.size(), a) != 0) return decode_(tokens_);
  std::string fresh = b.substr(a.size());
  if (fresh.empty() || unstable_tail(fresh) != 0) return stable_ + fresh;
  stable_ += fresh;
  prefix_ = read_, read_ = tokens_.size();
  return stable_;
}

TextStream::Step TextStream::push(int32_t token) {
  tokens_.push_back(token);
  const std::string full = current();
  const size_t from = std::min(released_.size(), full.size());
  Step st;
  // The earliest completed stop string ends the text.
  size_t stop_at = std::string::npos;
  for (const auto& s : stop_) {
    const size_t start = from >= s.size() ? from - s.size() + 1 : 0;
    const size_t p = full.find(s, start);
    if (p != std::string::npos) stop_at = std::min(stop_at, std::max(p, from));
  }
  if (stop_at != std::string::npos) {
    st.text = full.substr(from, stop_at - from);
    st.stopped = true;
    released_ += st.text;
    return st;
  }
  // Hold back an unfinished character and the longest suffix that begins a stop string.
  size_t safe = full.size() - unstable_tail(full);
  size_t hold = 0;
  for (const auto& s : stop_)
    for (size_t k = std::min(s.size() - 1, safe); k > hold; --k)
      if (full.compare(safe - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  safe -= hold;
  if (safe > from) st.text = full.substr(from, safe - from);
  released_ += st.text;
  return st;
}

std::string TextStream::flush() {
  const std::string full = current();
  std::string rest = full.size() > released_.size() ? full.substr(released_.size()) : "";
  released_ += rest;
  return rest;
}

}  // namespace myriad::infer
