#include "tests/ops/op_test.h"

#include <cmath>

namespace myriad::testing {

bool cuda_available() {
  return has_allocator(DeviceType::CUDA);
}
Device device_of(ops::Backend b) {
  return b == ops::Backend::CUDA ? cuda(0) : kCPU;
}

std::string backend_param_name(const ::testing::TestParamInfo<ops::Backend>& info) {
  return ops::backend_name(info.param);
}

Tensor randn(const Shape& shape, uint64_t seed, double scale) {
  Generator g(seed);
  return g.normal(shape, 0.0, scale);
}
Tensor randu(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return g.uniform(shape, lo, hi);
}
Tensor randint(const Shape& shape, uint64_t seed, int64_t lo, int64_t hi) {
  Generator g(seed);
  return g.randint(shape, lo, hi);
}

namespace {

struct Run {
  Tensor out;
  std::vector<std::vector<double>> grads;  // per input; empty when it needs none
};

// Prepares inputs (dtype/device), runs fn and the backward from a seed. In reference mode the
// inputs stay f32 on the host. The seed is rounded to seed_dtype first, so both runs see it alike.
Run run(const OpFn& fn, const std::vector<Tensor>& inputs, Device dev, DType dtype, bool reference,
        uint64_t seed_id, DType seed_dtype) {
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) {
    Tensor x = is_floating(t.dtype()) ? t.detach().to(dtype) : t.detach();
    if (x.same(t) || x.storage() == t.storage()) x = x.clone();
    x = x.to(dev);
    if (t.requires_grad()) x.requires_grad_();
    xs.push_back(x);
  }
  std::optional<ops::ReferenceMode> ref;
  if (reference) ref.emplace();
  Run r;
  r.out = fn(xs);
  if (r.out.requires_grad()) {
    Tensor seed = randn(r.out.shape(), 1000 + seed_id).to(seed_dtype).to(r.out.dtype()).to(dev);
    r.out.backward(seed);
  }
  for (const Tensor& x : xs) {
    if (x.requires_grad() && x.grad().defined())
      r.grads.push_back(x.grad().to_doubles());
    else if (x.requires_grad())
      r.grads.push_back(std::vector<double>(x.numel(), 0.0));
    else
      r.grads.emplace_back();
  }
  return r;
}

}  // namespace

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, Tolerance tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // The absolute part scales with the tensor's largest magnitude: sums over many terms carry
  // rounding proportional to the terms, not to a (possibly cancelled) result.
  double scale = 1.0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(got[i] - want[i]);
    double allowed = tol.atol * scale + tol.rtol * std::abs(want[i]);
    bool nan_ok = std::isnan(got[i]) && std::isnan(want[i]);
    if (!(err <= allowed) && !nan_ok) {
      ++bad;
      if (!(err <= worst)) worst = err, worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance; worst at " << worst_i << ": got "
                     << got[worst_i] << ", want " << want[worst_i];
}

void expect_matches_reference(const std::string& what, const OpFn& fn,
                              const std::vector<Tensor>& inputs, ops::Backend b, DType dtype,
                              Tolerance tol) {
  SCOPED_TRACE(what + " [" + ops::backend_name(b) + ", " + std::string(dtype_name(dtype)) + "]");
  // The reference sees the same (dtype-rounded) input values.
  std::vector<Tensor> rounded;
  for (const Tensor& t : inputs) {
    Tensor r = is_floating(t.dtype()) ? t.detach().to(dtype).to(DType::F32) : t.detach();
    if (r.storage() == t.storage()) r = r.clone();
    if (t.requires_grad()) r.requires_grad_();
    rounded.push_back(r);
  }
  Run want = run(fn, rounded, kCPU, DType::F32, /*reference=*/true, 0, dtype);
  Run got = run(fn, inputs, device_of(b), dtype, /*reference=*/false, 0, dtype);
  ASSERT_EQ(got.out.shape(), want.out.shape());
  expect_close(what + " output", got.out.to_doubles(), want.out.to_doubles(), tol);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!want.grads[i].empty())
      expect_close(what + " grad of input " + std::to_string(i), got.grads[i], want.grads[i], tol);
}

void expect_matches_reference_all(const std::string& what, const OpFn& fn,
                                  const std::vector<Tensor>& inputs, ops::Backend b, bool bf16) {
  expect_matches_reference(what, fn, inputs, b, DType::F32, {});
  if (bf16) expect_matches_reference(what, fn, inputs, b, DType::BF16, bf16_tolerance());
}

void expect_gradcheck(const std::string& what, const OpFn& fn, const std::vector<Tensor>& inputs,
                      double tol) {
  SCOPED_TRACE(what + " [gradcheck f64]");
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) {
    Tensor x = is_floating(t.dtype()) ? t.detach().to(DType::F64) : t.detach();
    if (x.storage() == t.storage()) x = x.clone();
    if (t.requires_grad()) x.requires_grad_();
    xs.push_back(x);
  }
  Tensor out = fn(xs);
  ASSERT_EQ(out.dtype(), DType::F64) << what << ": f64 inputs gave " << out.desc();
  Tensor seed = randn(out.shape(), 77).to(DType::F64);
  std::vector<double> seed_v = seed.to_doubles();
  out.backward(seed);
  auto objective = [&]() {
    NoGradGuard ng;
    std::vector<double> o = fn(xs).to_doubles();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * seed_v[i];
    return s;
  };
  const double h = 1e-6;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (!xs[k].requires_grad()) continue;
    std::vector<double> analytic =
        xs[k].grad().defined() ? xs[k].grad().to_doubles() : std::vector<double>(xs[k].numel());
    double* p = xs[k].data<double>();
    for (int64_t i = 0; i < xs[k].numel(); ++i) {
      double keep = p[i];
      p[i] = keep + h;
      double up = objective();
      p[i] = keep - h;
      double down = objective();
      p[i] = keep;
      double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[i], numeric, tol + 1e-5 * std::abs(numeric))
          << what << ": d/d input " << k << " element " << i;
    }
  }
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a myriad::Error mentioning '" << (parts.empty() ? "" : parts[0])
                  << "', but nothing was thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos)
          << "error message '" << msg << "' lacks '" << p << "'";
  }
}

}  // namespace myriad::testing
