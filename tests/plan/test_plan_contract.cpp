// The planner's tensor list is the engine's: for every preset and for each of the brief's
// options, plan::expected_tensors(config) names exactly the tensors Decoder builds, with the
// same shapes. Parameter counts from the planner therefore equal the engine's.
#include <gtest/gtest.h>

#include <map>

#include "model/decoder.h"
#include "plan/params.h"

namespace myriad {
namespace {

void expect_same_tensors(const model::ModelConfig& c, const std::string& what) {
  std::map<std::string, Shape> engine, planner;
  for (const auto& s : model::Decoder::param_specs(c)) engine[s.name] = s.shape;
  for (const auto& [name, shape] : plan::expected_tensors(c)) planner[name] = shape;
  EXPECT_EQ(engine.size(), planner.size()) << what;
  int64_t engine_params = 0, planner_params = 0;
  for (const auto& [name, shape] : engine) {
    engine_params += shape_numel(shape);
    auto it = planner.find(name);
    if (it == planner.end()) {
      ADD_FAILURE() << what << ": the engine builds " << name << " but the planner lacks it";
      continue;
    }
    EXPECT_EQ(it->second, shape) << what << ": " << name;
  }
  for (const auto& [name, shape] : planner) {
    planner_params += shape_numel(shape);
    EXPECT_TRUE(engine.count(name))
        << what << ": the planner counts " << name << " which the engine does not build";
  }
  EXPECT_EQ(engine_params, planner_params) << what;
}

TEST(PlanContract, PresetsMatchTheEngine) {
  for (const auto& name : model::preset_names()) expect_same_tensors(model::preset(name), name);
}

TEST(PlanContract, BriefOptionsMatchTheEngine) {
  for (const char* carry : {"gamma_scalar", "gamma_vector", "gamma_input"}) {
    model::ModelConfig c = model::preset("tiny");
    c.myriad.residual.attn_carry = carry;
    expect_same_tensors(c, std::string("tiny + ") + carry);
  }
  model::ModelConfig r = model::preset("tiny");
  r.myriad.router.mode = "latent_similarity";
  expect_same_tensors(r, "tiny + latent_similarity");
  model::ModelConfig a = model::preset("tiny");
  a.myriad.admission.enabled = true;
  expect_same_tensors(a, "tiny + admission");
}

}  // namespace
}  // namespace myriad
