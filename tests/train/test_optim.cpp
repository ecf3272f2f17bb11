#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "model/config.h"
#include "model/decoder.h"
#include "train/optim.h"
#include "train/schedule.h"

namespace myriad::train {
namespace {

Tensor randn(const Shape& s, uint64_t seed, double std = 1.0) {
  Generator g(seed);
  return g.normal(s, 0.0, std);
}
Tensor vals(std::vector<double> v, const Shape& s) {
  return Tensor::from_doubles(v, s);
}
void set_grad(Tensor& p, const Tensor& g) {
  p.set_grad(g.clone());
}

// Eigenvalues of a symmetric matrix (cyclic Jacobi, double).
std::vector<double> sym_eigenvalues(std::vector<double> a, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    if (off < 1e-24) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::abs(apq) < 1e-300) continue;
        const double th = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (th >= 0 ? 1 : -1) / (std::abs(th) + std::sqrt(th * th + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq, a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk, a[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> ev(n);
  for (int64_t i = 0; i < n; ++i) ev[i] = a[i * n + i];
  return ev;
}

// Singular values of an [A, B] row-major matrix via the eigenvalues of the smaller Gram matrix.
std::vector<double> singular_values(const std::vector<double>& m, int64_t A, int64_t B) {
  const int64_t n = std::min(A, B);
  std::vector<double> g(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < std::max(A, B); ++k)
        g[i * n + j] += A <= B ? m[i * B + k] * m[j * B + k] : m[k * B + i] * m[k * B + j];
  auto ev = sym_eigenvalues(g, n);
  for (double& e : ev) e = std::sqrt(std::max(e, 0.0));
  return ev;
}

// The scalar NS5 map applied to one singular value.
double ns5_scalar(double s) {
  for (int i = 0; i < 5; ++i) s = 3.4445 * s - 4.7750 * s * s * s + 2.0315 * std::pow(s, 5);
  return s;
}

TEST(ParamGroups, FollowTheTable) {
  const Shape m{8, 8}, v{8};
  EXPECT_EQ(param_group("model.layers.0.self_attn.q_proj.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.3.self_attn.kv_b_proj.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.self_attn.f_a_proj.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.block_sparse_moe.experts.3.w2.weight", m),
            ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.mlp.experts.gate_up_proj", {4, 8, 8}), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.mlp.shared_experts.up_proj.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.mlp.gate_proj.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.layers.1.self_attn.admission.w1.weight", m), ParamGroup::Matrix);
  EXPECT_EQ(param_group("model.embed_tokens.weight", m), ParamGroup::EmbedHead);
  EXPECT_EQ(param_group("lm_head.weight", m), ParamGroup::EmbedHead);
  EXPECT_EQ(param_group("model.layers.1.block_sparse_moe.gate.weight", m), ParamGroup::Router);
  EXPECT_EQ(param_group("model.layers.1.mlp.gate.latent_proj.weight", m), ParamGroup::Router);
  EXPECT_EQ(param_group("model.layers.1.mlp.gate.expert_embed", m), ParamGroup::Router);
  EXPECT_EQ(param_group("model.layers.1.mlp.gate.e_score_correction_bias", v),
            ParamGroup::BalancerOwned);
  for (auto [n, s] : std::vector<std::pair<const char*, Shape>>{
           {"model.norm.weight", v},
           {"model.layers.0.input_layernorm.weight", v},
           {"model.layers.0.self_attn.A_log", {1, 1, 4, 1}},
           {"model.layers.0.self_attn.dt_bias", v},
           {"model.layers.0.self_attn.q_conv1d.weight", {8, 1, 4}},
           {"model.layers.0.self_attention_res_proj.weight", {1, 8}},
           {"model.output_attn_res_proj.weight", {1, 8}},
           {"model.layers.2.attn_carry.gamma", {1}},
           {"model.layers.1.self_attn.admission.w1.bias", v}})
    EXPECT_EQ(param_group(n, s), ParamGroup::NoDecay) << n;
  // Every tensor of the presets (and of tiny with the §12 options) lands in a group: only the
  // balancer's bias is left out, and the Muon group holds only matrices.
  model::ModelConfig opts = model::tiny();
  opts.myriad.admission.enabled = true;
  opts.myriad.router.mode = "latent_similarity";
  opts.myriad.residual.attn_carry = "gamma_input";
  for (const auto& c : {model::tiny(), model::medium_k3(), model::deepseek_v3(), opts})
    for (const auto& spec : model::Decoder::param_specs(c)) {
      const ParamGroup g = param_group(spec.name, spec.shape);
      EXPECT_EQ(g == ParamGroup::BalancerOwned, !spec.trainable) << spec.name;
      if (g == ParamGroup::Matrix) {
        EXPECT_GE(spec.shape.size(), 2u) << spec.name;
      }
    }
}

TEST(AdamW, TwoStepsMatchHandComputation) {
  OptimConfig cfg;
  cfg.weight_decay = 0.1;
  Tensor w = vals({1.0, -2.0, 0.5}, {1, 3});  // lm_head: AdamW with decay
  Tensor n = vals({1.0, 3.0}, {2});           // a norm: AdamW without decay
  Optimizer opt({{"lm_head.weight", w}, {"model.norm.weight", n}}, cfg);
  const std::vector<std::vector<double>> gw = {{0.5, -1.0, 0.0}, {0.2, 0.3, -0.4}};
  const std::vector<std::vector<double>> gn = {{2.0, -0.1}, {-1.0, 0.5}};
  std::vector<double> W = {1.0, -2.0, 0.5}, N = {1.0, 3.0};
  std::vector<double> mw(3, 0), vw(3, 0), mn(2, 0), vn(2, 0);
  const double lr[] = {0.1, 0.05};
  auto ref = [&](std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                 const std::vector<double>& g, int t, double lr, double wd) {
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
      p[i] -= lr * (mh / (std::sqrt(vh) + 1e-8) + wd * p[i]);
    }
  };
  for (int t = 0; t < 2; ++t) {
    set_grad(w, vals(gw[t], {1, 3}));
    set_grad(n, vals(gn[t], {2}));
    opt.step(lr[t]);
    ref(W, mw, vw, gw[t], t + 1, lr[t], 0.1);
    ref(N, mn, vn, gn[t], t + 1, lr[t], 0.0);
  }
  EXPECT_EQ(opt.step_count(), 2);
  const auto w2 = w.to_doubles(), n2 = n.to_doubles();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(w2[i], W[i], 1e-6) << i;
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(n2[i], N[i], 1e-6) << i;
}

TEST(Muon, NewtonSchulzSingularValuesNearOne) {
  for (auto [A, B] : {std::pair<int64_t, int64_t>{16, 32}, {48, 24}, {8, 64}}) {
    const Tensor g = randn({3, A, B}, 7 + A);
    const auto o = newton_schulz5(g).to_doubles();
    for (int64_t n = 0; n < 3; ++n) {
      std::vector<double> m(o.begin() + n * A * B, o.begin() + (n + 1) * A * B);
      for (double s : singular_values(m, A, B)) {
        // The quintic maps [0.681, 1.2025] into itself (its local minimum at s ≈ 1.050 and
        // maximum at s ≈ 0.555): every direction ends up there, none is left near 0.
        EXPECT_GT(s, 0.68) << A << "x" << B;
        EXPECT_LT(s, 1.21) << A << "x" << B;
      }
    }
  }
}

TEST(Muon, TallMatricesTakeTheTransposePath) {
  // NS of a tall matrix is exactly the transpose of NS of its (wide) transpose.
  const Tensor g = randn({2, 40, 12}, 3);
  const auto gv = g.to_doubles();
  std::vector<double> t(gv.size());
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t j = 0; j < 12; ++j) t[n * 480 + j * 40 + i] = gv[n * 480 + i * 12 + j];
  const auto o = newton_schulz5(g).to_floats();
  const auto ot = newton_schulz5(vals(t, {2, 12, 40})).to_floats();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < 40; ++i)
      for (int64_t j = 0; j < 12; ++j) ASSERT_EQ(o[n * 480 + i * 12 + j], ot[n * 480 + j * 40 + i]);
}

// G with orthogonal rows of equal norm has one singular value σ: NS5 maps it to ns5_scalar(σ/‖G‖_F)
// times G/σ, so the whole Muon update is known in closed form.
TEST(Muon, UpdateScaleRuleExact) {
  for (bool tall : {false, true}) {
    const Shape shape = tall ? Shape{4, 2} : Shape{2, 4};
    std::vector<double> g = {3, 0, 0, 0, 0, 0, 3, 0};  // rows e0, e2 (times 3)
    if (tall) g = {3, 0, 0, 0, 0, 3, 0, 0};            // columns e0, e2 of a [4, 2]
    std::vector<double> w0 = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8};
    OptimConfig cfg;
    cfg.weight_decay = 0.01;
    Tensor w = vals(w0, shape);
    Optimizer opt({{"model.layers.0.mlp.up_proj.weight", w}}, cfg);
    set_grad(w, vals(g, shape));
    const double lr = 0.02;
    opt.step(lr);
    // Nesterov's G' = 1.95 G; ‖G'‖_F = 1.95·3·√2, so X has singular value ≈ 1/√2.
    const double s = ns5_scalar(1.95 * 3 / (1.95 * 3 * std::sqrt(2.0) + 1e-7));
    const double scale = 0.2 * std::sqrt(4.0);
    const auto got = w.to_doubles();
    for (int i = 0; i < 8; ++i)
      EXPECT_NEAR(got[i], w0[i] - lr * (scale * s * g[i] / 3 + 0.01 * w0[i]), 2e-6) << i;
  }
}

TEST(Muon, PerHeadBlocksAreIndependent) {
  const int64_t H = 2, a = 3, B = 5;
  const Tensor g = randn({H * a, B}, 11);
  OptimConfig cfg;
  cfg.per_head = true;
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  Tensor w = Tensor::zeros({H * a, B});
  Optimizer opt({{name, w}}, cfg, {{name, H}});
  set_grad(w, g);
  opt.step(0.1);
  // Block h alone, as a [3, 5] matrix with its own scale 0.2·√5.
  for (int64_t h = 0; h < H; ++h) {
    Tensor wb = Tensor::zeros({a, B});
    Optimizer ob({{name, wb}}, cfg);
    auto gv = g.to_doubles();
    set_grad(wb, vals({gv.begin() + h * a * B, gv.begin() + (h + 1) * a * B}, {a, B}));
    ob.step(0.1);
    const auto full = w.to_floats(), blk = wb.to_floats();
    for (int64_t i = 0; i < a * B; ++i) EXPECT_FLOAT_EQ(full[h * a * B + i], blk[i]);
  }
  // Without per_head the result differs (one NS over the whole [6, 5] matrix).
  Tensor w2 = Tensor::zeros({H * a, B});
  cfg.per_head = false;
  Optimizer o2({{name, w2}}, cfg, {{name, H}});
  set_grad(w2, g);
  o2.step(0.1);
  EXPECT_NE(w2.to_floats(), w.to_floats());
}

TEST(Muon, ExpertTensorsArePerMatrix) {
  const Tensor g = randn({3, 4, 6}, 5);
  Tensor w = Tensor::zeros({3, 4, 6});
  Optimizer opt({{"model.layers.1.mlp.experts.down_proj", w}}, OptimConfig{});
  set_grad(w, g);
  opt.step(0.05);
  const auto gv = g.to_doubles();
  const auto full = w.to_floats();
  for (int64_t e = 0; e < 3; ++e) {
    Tensor we = Tensor::zeros({4, 6});
    Optimizer oe({{"model.layers.1.mlp.experts.0.w1.weight", we}}, OptimConfig{});
    set_grad(we, vals({gv.begin() + e * 24, gv.begin() + (e + 1) * 24}, {4, 6}));
    oe.step(0.05);
    const auto blk = we.to_floats();
    // Equal to f32 rounding (a few ulps on AVX2, where the batched and single products block
    // differently).
    for (int64_t i = 0; i < 24; ++i) EXPECT_NEAR(full[e * 24 + i], blk[i], 1e-7);
  }
}

// Least squares W X ≈ Y with a hand-written gradient; both optimisers drive the loss down.
double regress(const std::string& matrix_optimizer, int steps) {
  const int64_t A = 6, B = 10, n = 40;
  const auto X = randn({B, n}, 21).to_doubles(), Wt = randn({A, B}, 22, 0.3).to_doubles();
  std::vector<double> Y(A * n, 0.0);
  for (int64_t i = 0; i < A; ++i)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < B; ++j) Y[i * n + k] += Wt[i * B + j] * X[j * n + k];
  Tensor w = Tensor::zeros({A, B});
  OptimConfig cfg;
  cfg.matrix_optimizer = matrix_optimizer;
  cfg.weight_decay = 0;
  Optimizer opt({{"model.layers.0.mlp.down_proj.weight", w}}, cfg);
  auto loss_grad = [&](std::vector<double>* grad) {
    const auto W = w.to_doubles();
    double loss = 0;
    if (grad) grad->assign(A * B, 0.0);
    for (int64_t i = 0; i < A; ++i)
      for (int64_t k = 0; k < n; ++k) {
        double r = -Y[i * n + k];
        for (int64_t j = 0; j < B; ++j) r += W[i * B + j] * X[j * n + k];
        loss += 0.5 * r * r / n;
        if (grad)
          for (int64_t j = 0; j < B; ++j) (*grad)[i * B + j] += r * X[j * n + k] / n;
      }
    return loss;
  };
  const double l0 = loss_grad(nullptr);
  const Schedule sched{"cosine", 0.05, 0.0, 10, steps};
  std::vector<double> g;
  for (int t = 0; t < steps; ++t) {
    loss_grad(&g);
    set_grad(w, vals(g, {A, B}));
    opt.clip_grad_norm();
    opt.step(lr_at(sched, t));
  }
  return loss_grad(nullptr) / l0;
}

TEST(Optimizer, RegressionConvergesWithMuonAndAdamW) {
  EXPECT_LT(regress("muon", 300), 1e-3);
  EXPECT_LT(regress("adamw", 300), 1e-3);
}

TEST(Optimizer, ClipGradNorm) {
  Tensor a = Tensor::zeros({2}), b = Tensor::zeros({1, 1}), bias = Tensor::zeros({3});
  OptimConfig cfg;
  cfg.clip_norm = 1.0;
  Optimizer opt({{"model.norm.weight", a},
                 {"lm_head.weight", b},
                 {"model.layers.0.mlp.gate.e_score_correction_bias", bias}},
                cfg);
  set_grad(a, vals({3, 4}, {2}));
  set_grad(b, vals({12}, {1, 1}));
  set_grad(bias, vals({100, 100, 100}, {3}));  // the balancer's: not counted, not scaled
  std::map<std::string, double> groups;
  EXPECT_DOUBLE_EQ(opt.clip_grad_norm(&groups), 13.0);
  EXPECT_DOUBLE_EQ(groups.at("no_decay"), 5.0);
  EXPECT_DOUBLE_EQ(groups.at("embed_head"), 12.0);
  EXPECT_EQ(groups.count("balancer"), 0u);
  // The scale is step()'s to apply; the gradients are left as they are.
  EXPECT_EQ(opt.grad_scale(), static_cast<float>(1.0 / 13));
  EXPECT_EQ(a.grad().to_doubles(), (std::vector<double>{3, 4}));
  EXPECT_EQ(b.grad().to_doubles()[0], 12.0);
  EXPECT_EQ(bias.grad().to_doubles()[0], 100.0);
  EXPECT_DOUBLE_EQ(opt.clip_grad_norm(), 13.0);  // measured afresh: the same scale
  EXPECT_EQ(opt.grad_scale(), static_cast<float>(1.0 / 13));
  opt.zero_grad();
  EXPECT_EQ(opt.grad_scale(), 1.0f);
  set_grad(a, vals({0.3, 0.4}, {2}));
  set_grad(b, vals({0}, {1, 1}));
  set_grad(bias, vals({100, 100, 100}, {3}));
  EXPECT_NEAR(opt.clip_grad_norm(), 0.5, 1e-7);  // within the limit: no scale
  EXPECT_EQ(opt.grad_scale(), 1.0f);
  // The balancer-owned tensor is never updated.
  opt.step(0.1);
  EXPECT_EQ(bias.to_doubles(), std::vector<double>(3, 0.0));
}

// A clipped step (the scale applied as step() reads each gradient) has the bits of a step on
// gradients scaled in place by the same f32 factor, for AdamW and Muon parameters alike; step()
// then drops the scale.
TEST(Optimizer, ClippedStepEqualsStepOnScaledGradients) {
  const std::vector<std::pair<std::string, Shape>> specs = {
      {"model.layers.0.self_attn.q_proj.weight", {6, 4}},
      {"model.embed_tokens.weight", {5, 4}},
      {"model.norm.weight", {4}}};
  for (const char* matrix : {"muon", "adamw"}) {
    OptimConfig cfg;
    cfg.matrix_optimizer = matrix;
    cfg.clip_norm = 0.5;
    OptimConfig unclipped = cfg;
    unclipped.clip_norm = 0;
    NamedParams pa, pb;
    for (size_t i = 0; i < specs.size(); ++i) {
      pa.push_back({specs[i].first, randn(specs[i].second, 7 + i)});
      pb.push_back({specs[i].first, pa.back().second.clone()});
    }
    Optimizer a(pa, cfg), b(pb, unclipped);
    for (int t = 0; t < 3; ++t) {
      for (size_t i = 0; i < specs.size(); ++i)
        set_grad(pa[i].second, randn(specs[i].second, 50 + 10 * t + i));
      const double norm = a.clip_grad_norm();
      ASSERT_GT(norm, 0.5);
      const float scale = static_cast<float>(0.5 / norm);
      EXPECT_EQ(a.grad_scale(), scale);
      for (size_t i = 0; i < specs.size(); ++i) {
        std::vector<float> g = pa[i].second.grad().to_floats();
        for (float& x : g) x *= scale;
        pb[i].second.set_grad(Tensor::from_floats(g, specs[i].second));
      }
      b.clip_grad_norm();
      a.step(0.01);
      b.step(0.01);
      EXPECT_EQ(a.grad_scale(), 1.0f);
      for (size_t i = 0; i < specs.size(); ++i)
        EXPECT_EQ(pa[i].second.to_floats(), pb[i].second.to_floats())
            << matrix << " step " << t << " " << specs[i].first;
    }
  }
}

// Mixed precision's hand-over: a bf16 gradient is read as the f32 it widens to (the same norm and
// update bits), and a mirrored parameter's bf16 copy is written by every update (AdamW's own
// pass, after Muon's) with the bits of param.to(BF16); tensors not mirrored are not touched.
TEST(Optimizer, Bf16GradientsAndMirrorsMatchTheF32Path) {
  const std::vector<std::pair<std::string, Shape>> specs = {
      {"model.layers.0.self_attn.q_proj.weight", {6, 4}},
      {"model.layers.0.mlp.experts.gate_up_proj", {2, 4, 3}},
      {"model.embed_tokens.weight", {5, 40000}},  // over one kGrain block: threaded
      {"model.norm.weight", {4}},
      {"model.layers.0.mlp.gate.e_score_correction_bias", {2}}};
  for (const char* matrix : {"muon", "adamw"}) {
    OptimConfig cfg;
    cfg.matrix_optimizer = matrix;
    cfg.clip_norm = 0.1;
    NamedParams pa, pb, low;
    for (size_t i = 0; i < specs.size(); ++i) {
      pa.push_back({specs[i].first, randn(specs[i].second, 3 + i)});
      pb.push_back({specs[i].first, pa.back().second.clone()});
      low.push_back({specs[i].first, Tensor::zeros(specs[i].second, DType::BF16)});
    }
    Optimizer a(pa, cfg), b(pb, cfg);
    const std::vector<std::string> taken = b.mirror_into(low);
    EXPECT_EQ(taken.size(), specs.size() - 1) << "the balancer's bias is not mirrored";
    for (int t = 0; t < 2; ++t) {
      for (size_t i = 0; i < specs.size(); ++i) {
        const Tensor g16 = randn(specs[i].second, 90 + 10 * t + i).to(DType::BF16);
        pa[i].second.set_grad(g16.to(DType::F32));
        pb[i].second.set_grad(g16);
      }
      EXPECT_EQ(a.clip_grad_norm(), b.clip_grad_norm());
      a.step(0.01);
      b.step(0.01);
      for (size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(pa[i].second.to_floats(), pb[i].second.to_floats())
            << matrix << " " << specs[i].first;
        if (i + 1 < specs.size())
          EXPECT_EQ(low[i].second.to_floats(), pb[i].second.to(DType::BF16).to_floats())
              << matrix << " " << specs[i].first;
        else
          EXPECT_EQ(low[i].second.to_floats(), std::vector<float>(2, 0.0f));
      }
    }
  }
  Optimizer c({{"model.norm.weight", Tensor::zeros({4})}}, OptimConfig{});
  try {
    c.mirror_into({{"model.norm.weight", Tensor::zeros({4})}});
    ADD_FAILURE() << "an f32 mirror was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("mirror_into"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(c.mirror_into({{"model.other.weight", Tensor::zeros({4}, DType::BF16)}}).empty());
}

TEST(Optimizer, NonFiniteNormIsReportedUnscaled) {
  Tensor a = Tensor::zeros({3});
  Optimizer opt({{"model.norm.weight", a}}, OptimConfig{});
  set_grad(a, vals({std::numeric_limits<double>::quiet_NaN(), 50, 1}, {3}));
  EXPECT_TRUE(std::isnan(opt.clip_grad_norm()));
  EXPECT_EQ(a.grad().to_doubles()[1], 50.0);
  set_grad(a, vals({std::numeric_limits<double>::infinity(), 50, 1}, {3}));
  EXPECT_TRUE(std::isinf(opt.clip_grad_norm()));
  EXPECT_EQ(a.grad().to_doubles()[1], 50.0);
}

TEST(Optimizer, StateDictRoundTripContinuesBitIdentically) {
  const std::vector<std::pair<std::string, Shape>> specs = {
      {"model.layers.0.self_attn.q_proj.weight", {6, 4}},
      {"model.layers.0.mlp.experts.gate_up_proj", {2, 4, 3}},
      {"model.embed_tokens.weight", {5, 4}},
      {"model.layers.0.block_sparse_moe.gate.weight", {3, 4}},
      {"model.norm.weight", {4}}};
  OptimConfig cfg;
  cfg.per_head = true;
  const std::map<std::string, int64_t> heads = {{specs[0].first, 2}};
  auto make = [&](uint64_t seed) {
    NamedParams ps;
    for (size_t i = 0; i < specs.size(); ++i)
      ps.push_back({specs[i].first, randn(specs[i].second, seed + i)});
    return ps;
  };
  auto run = [&](NamedParams& ps, Optimizer& opt, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (size_t i = 0; i < ps.size(); ++i)
        set_grad(ps[i].second, randn(ps[i].second.shape(), 100 * t + i));
      opt.clip_grad_norm();
      opt.step(0.01 * (t + 1));
    }
  };
  NamedParams pa = make(1);
  Optimizer a(pa, cfg, heads);
  run(pa, a, 0, 3);
  const auto sd = a.state_dict();
  NamedParams pb;
  for (auto& [n, t] : pa) pb.push_back({n, t.clone()});
  run(pa, a, 3, 6);
  EXPECT_EQ(a.step_count(), 6);
  EXPECT_EQ(sd.at("step").to_ints()[0], 3);  // a copy, unaffected by later steps
  Optimizer b(pb, cfg, heads);
  b.load_state_dict(sd);
  EXPECT_EQ(b.step_count(), 3);
  run(pb, b, 3, 6);
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_floats(), pb[i].second.to_floats()) << pa[i].first;
  const auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [k, v] : sa) EXPECT_EQ(v.to_doubles(), sb.at(k).to_doubles()) << k;
  EXPECT_TRUE(sa.count("model.layers.0.self_attn.q_proj.weight.momentum_buffer"));
  EXPECT_TRUE(sa.count("model.norm.weight.exp_avg_sq"));
  auto bad = sd;
  bad.erase("model.norm.weight.exp_avg");
  EXPECT_THROW(b.load_state_dict(bad), Error);
}

TEST(Optimizer, RejectsBadConfig) {
  OptimConfig cfg;
  cfg.matrix_optimizer = "sgd";
  EXPECT_THROW(Optimizer({}, cfg), Error);
  cfg.matrix_optimizer = "muon";
  cfg.per_head = true;
  const std::string n = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_THROW(Optimizer({{n, Tensor::zeros({5, 4})}}, cfg, {{n, 2}}), Error);
}

TEST(QkClip, RescalesExactlyTheNamedRows) {
  const int64_t H = 2, dn = 3, dr = 2, dv = 4, r = 5, d = 6, rq = 7;
  const std::string p0 = "model.layers.0.self_attn.", p1 = "model.layers.1.self_attn.";
  NamedParams ps = {{p0 + "q_b_proj.weight", randn({H * (dn + dr), rq}, 1)},
                    {p0 + "q_a_proj.weight", randn({rq, d}, 2)},
                    {p0 + "kv_a_proj_with_mqa.weight", randn({r + dr, d}, 3)},
                    {p0 + "kv_b_proj.weight", randn({H * (dn + dv), r}, 4)},
                    {p1 + "q_proj.weight", randn({H * (dn + dr), d}, 5)},
                    {p1 + "kv_a_proj_with_mqa.weight", randn({r + dr, d}, 6)},
                    {p1 + "kv_b_proj.weight", randn({H * (dn + dv), r}, 7)}};
  std::vector<std::vector<double>> before;
  for (auto& [n, t] : ps) before.push_back(t.to_doubles());
  // Layer 0: head 1 clipped with γ = 1/4; layer 1: head 0 clipped with γ = 100/400 too.
  const double frac = qk_clip(ps, {{0, {50.0, 400.0}}, {1, {400.0, 100.0}}}, 100.0, H, dn, dr);
  EXPECT_DOUBLE_EQ(frac, 0.5);
  // Expected row factors per tensor.
  auto q_factor = [&](int64_t row, int64_t clipped) {
    const int64_t h = row / (dn + dr), i = row % (dn + dr);
    return h != clipped ? 1.0 : i < dn ? 0.5 : 0.25;
  };
  auto kvb_factor = [&](int64_t row, int64_t clipped) {
    const int64_t h = row / (dn + dv), i = row % (dn + dv);
    return h == clipped && i < dn ? 0.5 : 1.0;
  };
  for (size_t t = 0; t < ps.size(); ++t) {
    const auto& [name, w] = ps[t];
    const auto now = w.to_doubles();
    const int64_t cols = w.size(1), clipped = name.starts_with(p0) ? 1 : 0;
    for (int64_t row = 0; row < w.size(0); ++row) {
      double f = 1.0;
      if (name.ends_with("q_b_proj.weight") || name.ends_with("q_proj.weight"))
        f = q_factor(row, clipped);
      else if (name.ends_with("kv_b_proj.weight"))
        f = kvb_factor(row, clipped);
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_FLOAT_EQ(now[row * cols + c], static_cast<float>(before[t][row * cols + c] * f))
            << name << " row " << row;
    }
  }
  // Nothing above τ: nothing changes.
  EXPECT_DOUBLE_EQ(qk_clip(ps, {{0, {100.0, 3.0}}}, 100.0, H, dn, dr), 0.0);
  EXPECT_THROW(qk_clip(ps, {{2, {1.0, 1.0}}}, 100.0, H, dn, dr), Error);
  EXPECT_THROW(qk_clip(ps, {{0, {1.0}}}, 100.0, H, dn, dr), Error);
}

}  // namespace
}  // namespace myriad::train
