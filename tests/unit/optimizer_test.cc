#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 5;

// Independent double-precision reference of torch.optim's formulas, written
// as plain scalar loops so it shares no code or vector tricks with the kernel.
struct Reference {
  OptimizerConfig c;
  std::vector<double> p, s0, s1;  // s0: buf/exp_avg/sum, s1: exp_avg_sq.

  Reference(const OptimizerConfig& config, const std::vector<float>& param)
      : c(config), p(param.begin(), param.end()) {
    const double init =
        c.kind == OptimizerKind::kAdaGrad ? c.initial_accumulator_value : 0.0;
    s0.assign(p.size(), init);
    s1.assign(p.size(), 0.0);
  }

  void Step(double lr, int64_t step, const std::vector<float>& grad) {
    const double t = static_cast<double>(step);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      switch (c.kind) {
        case OptimizerKind::kSgd: {
          g += c.weight_decay * p[i];
          if (c.momentum != 0.0) {
            s0[i] =
                step == 1 ? g : c.momentum * s0[i] + (1.0 - c.dampening) * g;
            g = c.nesterov ? g + c.momentum * s0[i] : s0[i];
          }
          p[i] -= lr * g;
          break;
        }
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW: {
          if (c.kind == OptimizerKind::kAdamW) {
            p[i] *= 1.0 - lr * c.weight_decay;
          } else {
            g += c.weight_decay * p[i];
          }
          s0[i] = c.beta1 * s0[i] + (1.0 - c.beta1) * g;
          s1[i] = c.beta2 * s1[i] + (1.0 - c.beta2) * g * g;
          const double m_hat = s0[i] / (1.0 - std::pow(c.beta1, t));
          const double v_hat = s1[i] / (1.0 - std::pow(c.beta2, t));
          p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
          break;
        }
        case OptimizerKind::kAdaGrad: {
          g += c.weight_decay * p[i];
          const double clr = lr / (1.0 + (t - 1.0) * c.lr_decay);
          s0[i] += g * g;
          p[i] -= clr * g / (std::sqrt(s0[i]) + c.eps);
          break;
        }
      }
    }
  }
};

// |actual - expected| <= rel * max(|expected|, floor). The floor is the scale
// of the operands: momentum buffers and exp_avg mix O(1) terms of both signs
// and can cancel to ~0, leaving float rounding of the operands, not of the
// result.
void ExpectAllClose(const std::vector<float>& actual,
                    const std::vector<double>& expected, double rel,
                    double floor, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = rel * std::max(std::abs(expected[i]), floor);
    if (!(std::abs(actual[i] - expected[i]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", want "
                    << expected[i] << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements out of tolerance";
}

std::vector<float> InitialParams(size_t n) {
  std::vector<float> p(n);
  for (size_t i = 0; i < n; ++i) {
    const float mag = 0.5f + 0.03f * static_cast<float>(i % 40);
    p[i] = (i % 3 == 1) ? -mag : mag;
  }
  return p;
}

// Different per step and per element, mixed signs and magnitudes.
std::vector<float> Gradient(size_t n, int64_t step) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const double x = 0.7 * static_cast<double>(i) + 1.3 * step;
    g[i] = static_cast<float>(std::sin(x) * (1.0 + 0.25 * step) +
                              0.1 * std::cos(3.0 * x));
  }
  return g;
}

// A run-time schedule, so that the `lr` argument (not c.lr) is exercised.
double LrAt(double base, int64_t step) {
  return base * (1.0 - 0.1 * (step - 1));
}

struct Case {
  std::string name;
  OptimizerConfig config;
  double lr;
};

// Keeps gtest from dumping raw bytes for parameters on failure.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // c.lr is deliberately far from the lr passed to ApplyUpdate: a kernel that
  // read c.lr would fail every case.
  auto make = [](OptimizerKind kind) {
    OptimizerConfig c;
    c.kind = kind;
    c.lr = 7.0;
    return c;
  };
  {
    OptimizerConfig c = make(OptimizerKind::kSgd);
    cases.push_back({"SgdPlain", c, 0.1});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kSgd);
    c.momentum = 0.9;
    c.dampening = 0.3;
    cases.push_back({"SgdMomentumDampening", c, 0.05});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kSgd);
    c.momentum = 0.8;
    c.nesterov = true;
    cases.push_back({"SgdNesterov", c, 0.05});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kSgd);
    c.weight_decay = 0.1;
    cases.push_back({"SgdWeightDecay", c, 0.1});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kSgd);
    c.momentum = 0.9;
    c.weight_decay = 0.05;
    cases.push_back({"SgdMomentumWeightDecay", c, 0.05});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kAdam);
    cases.push_back({"Adam", c, 0.01});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kAdam);
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    c.eps = 1e-6;
    cases.push_back({"AdamWeightDecay", c, 0.02});
  }
  {
    // beta1 = 0.3 makes the lerp weight 0.7 >= 0.5: torch's other lerp form.
    OptimizerConfig c = make(OptimizerKind::kAdam);
    c.beta1 = 0.3;
    cases.push_back({"AdamLargeLerpWeight", c, 0.01});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kAdamW);
    c.weight_decay = 0.1;
    cases.push_back({"AdamW", c, 0.01});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kAdaGrad);
    c.eps = 1e-10;
    c.lr_decay = 0.1;
    c.initial_accumulator_value = 0.5;
    c.weight_decay = 0.01;
    cases.push_back({"AdaGrad", c, 0.1});
  }
  return cases;
}

// (case, length): 37 is odd so any vector tail is covered; 1031 spans several
// internal blocks and ends in a ragged one.
class OptimizerMatchesReference
    : public ::testing::TestWithParam<std::tuple<Case, size_t>> {};

TEST_P(OptimizerMatchesReference, FiveSteps) {
  const Case& tc = std::get<0>(GetParam());
  const size_t n = std::get<1>(GetParam());
  const OptimizerConfig& c = tc.config;
  ASSERT_TRUE(ValidateOptimizerConfig(c).ok()) << ValidateOptimizerConfig(c);

  std::vector<float> param = InitialParams(n);
  Reference ref(c, param);
  const int num_slots = NumSlots(c);
  std::vector<std::vector<float>> slot_storage(num_slots,
                                               std::vector<float>(n, -1.0f));
  std::vector<float*> slots;
  for (auto& s : slot_storage) slots.push_back(s.data());
  InitSlots(c, slots.data(), n);

  for (int64_t step = 1; step <= kSteps; ++step) {
    const double lr = LrAt(tc.lr, step);
    const std::vector<float> grad = Gradient(n, step);
    ApplyUpdate(c, lr, step, param.data(), grad.data(), slots.data(), n);
    ref.Step(lr, step, grad);
    const std::string at = tc.name + " step " + std::to_string(step);
    ExpectAllClose(param, ref.p, 1e-6, 1.0, at + " param");
    if (num_slots >= 1) {
      ExpectAllClose(slot_storage[0], ref.s0, 1e-6, 1.0, at + " slot0");
    }
    if (num_slots >= 2) {
      ExpectAllClose(slot_storage[1], ref.s1, 1e-6, 1e-6, at + " slot1");
    }
  }
  // The run must actually move the parameters, or the check is vacuous.
  const std::vector<float> initial = InitialParams(n);
  double moved = 0.0;
  for (size_t i = 0; i < n; ++i) moved += std::abs(param[i] - initial[i]);
  EXPECT_GT(moved / n, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    AllOptimizers, OptimizerMatchesReference,
    ::testing::Combine(::testing::ValuesIn(Cases()),
                       ::testing::Values(size_t{37}, size_t{1031})),
    [](const ::testing::TestParamInfo<std::tuple<Case, size_t>>& info) {
      return std::get<0>(info.param).name + "_n" +
             std::to_string(std::get<1>(info.param));
    });

TEST(OptimizerHandComputed, SgdMomentumTwoSteps) {
  // lr = 0.1, momentum = 0.9, dampening = 0.5, p0 = 1.0, grads 0.5 then 0.25.
  // Step 1: buf = g = 0.5 (dampening ignored on the first step);
  //         p = 1.0 - 0.1 * 0.5 = 0.95.
  // Step 2: buf = 0.9 * 0.5 + (1 - 0.5) * 0.25 = 0.45 + 0.125 = 0.575;
  //         p = 0.95 - 0.1 * 0.575 = 0.8925.
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.momentum = 0.9;
  c.dampening = 0.5;
  float p = 1.0f, buf = -1.0f;
  float* slots[] = {&buf};
  ASSERT_EQ(NumSlots(c), 1);
  InitSlots(c, slots, 1);
  const float g1 = 0.5f, g2 = 0.25f;
  ApplyUpdate(c, 0.1, 1, &p, &g1, slots, 1);
  EXPECT_NEAR(buf, 0.5, 1e-7);
  EXPECT_NEAR(p, 0.95, 1e-6);
  ApplyUpdate(c, 0.1, 2, &p, &g2, slots, 1);
  EXPECT_NEAR(buf, 0.575, 1e-6);
  EXPECT_NEAR(p, 0.8925, 1e-6);
}

TEST(OptimizerHandComputed, AdamTwoSteps) {
  // lr = 0.1, betas = (0.9, 0.999), eps = 1e-8, p0 = 1.0, grads 0.5, -0.25.
  // Step 1: m = 0.1 * 0.5 = 0.05; v = 0.001 * 0.25 = 0.00025;
  //         m_hat = 0.05 / 0.1 = 0.5; v_hat = 0.00025 / 0.001 = 0.25;
  //         p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002.
  // Step 2: m = 0.9 * 0.05 + 0.1 * -0.25 = 0.02;
  //         v = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00031225;
  //         bc1 = 1 - 0.81 = 0.19; bc2 = 1 - 0.998001 = 0.001999;
  //         m_hat = 0.02 / 0.19 = 0.1052631579;
  //         sqrt(v_hat) = sqrt(0.00031225 / 0.001999) = 0.3952253807;
  //         p = 0.900000002 - 0.1 * 0.1052631579 / (0.3952253807 + 1e-8)
  //           = 0.900000002 - 0.0266337033 = 0.8733662987.
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  float p = 1.0f, m = -1.0f, v = -1.0f;
  float* slots[] = {&m, &v};
  ASSERT_EQ(NumSlots(c), 2);
  InitSlots(c, slots, 1);
  EXPECT_EQ(m, 0.0f);
  EXPECT_EQ(v, 0.0f);
  const float g1 = 0.5f, g2 = -0.25f;
  ApplyUpdate(c, 0.1, 1, &p, &g1, slots, 1);
  EXPECT_NEAR(m, 0.05, 1e-8);
  EXPECT_NEAR(v, 0.00025, 1e-10);
  EXPECT_NEAR(p, 0.900000002, 1e-6);
  ApplyUpdate(c, 0.1, 2, &p, &g2, slots, 1);
  EXPECT_NEAR(m, 0.02, 1e-8);
  EXPECT_NEAR(v, 0.00031225, 1e-10);
  EXPECT_NEAR(p, 0.8733662987, 1e-6);
}

// torch's sqrt is exact even for subnormal inputs. An approximate sqrt (e.g.
// Eigen's EIGEN_FAST_MATH rsqrt path) flushes them to 0 and divides by zero.
TEST(OptimizerNumerics, AdaGradSqrtOfSubnormalAccumulator) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdaGrad;
  c.eps = 0.0;
  constexpr size_t kN = 37;
  const float g_val = 1e-20f;  // g * g = 1e-40 is subnormal in float.
  ASSERT_LT(g_val * g_val, std::numeric_limits<float>::min());
  ASSERT_GT(g_val * g_val, 0.0f);
  std::vector<float> p(kN, 1.0f), g(kN, g_val), sum(kN);
  float* slots[] = {sum.data()};
  InitSlots(c, slots, kN);
  ApplyUpdate(c, 0.5, 1, p.data(), g.data(), slots, kN);
  // sum = g^2, so p -= 0.5 * g / |g| = 0.5 (up to subnormal rounding).
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(p[i], 0.5, 1e-3) << i;
  }
}

TEST(OptimizerNumerics, ZeroWeightDecayLeavesInfiniteParamAlone) {
  // torch skips grad.add(param, alpha=0), so an inf param does not make the
  // gradient NaN (0 * inf); it stays inf.
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  float p = std::numeric_limits<float>::infinity();
  const float g = 1.0f;
  ApplyUpdate(c, 0.1, 1, &p, &g, nullptr, 1);
  EXPECT_TRUE(std::isinf(p));
}

TEST(OptimizerNumerics, EmptyPartitionIsNoOp) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam,
                          OptimizerKind::kAdamW, OptimizerKind::kAdaGrad}) {
    OptimizerConfig c;
    c.kind = k;
    ApplyUpdate(c, 0.1, 1, nullptr, nullptr, nullptr, 0);
  }
}

TEST(OptimizerSlots, NumSlotsAndInit) {
  OptimizerConfig c;
  EXPECT_EQ(NumSlots(c), 0);
  c.momentum = 0.5;
  EXPECT_EQ(NumSlots(c), 1);
  c.kind = OptimizerKind::kAdam;
  EXPECT_EQ(NumSlots(c), 2);
  c.kind = OptimizerKind::kAdamW;
  EXPECT_EQ(NumSlots(c), 2);
  c.kind = OptimizerKind::kAdaGrad;
  c.initial_accumulator_value = 0.25;
  EXPECT_EQ(NumSlots(c), 1);

  std::vector<float> sum(37, -1.0f);
  float* slots[] = {sum.data()};
  InitSlots(c, slots, sum.size());
  for (float s : sum) EXPECT_EQ(s, 0.25f);
}

// Assign and hold: the aggregate (hold: rank 0's value) becomes the value.
TEST(OptimizerAssign, TheAggregateBecomesTheValueWithoutSlots) {
  for (const auto& [kind, name] :
       {std::pair{OptimizerKind::kAssign, "assign"}, std::pair{OptimizerKind::kHold, "hold"}}) {
    OptimizerConfig c;
    c.kind = kind;
    EXPECT_TRUE(ValidateOptimizerConfig(c).ok());
    EXPECT_EQ(NumSlots(c), 0);
    std::vector<float> param = {1.0f, -2.0f, 3.0f};
    const std::vector<float> grad = {0.5f, 0.25f, -7.0f};
    ApplyUpdate(c, /*lr=*/0.1, /*step=*/3, param.data(), grad.data(), nullptr, param.size());
    EXPECT_EQ(param, grad);
    EXPECT_STREQ(OptimizerName(kind), name);
    absl::StatusOr<OptimizerKind> k = ParseOptimizerKind(name);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(*k, kind);
  }
}

TEST(OptimizerName, Names) {
  EXPECT_STREQ(OptimizerName(OptimizerKind::kSgd), "sgd");
  EXPECT_STREQ(OptimizerName(OptimizerKind::kAdam), "adam");
  EXPECT_STREQ(OptimizerName(OptimizerKind::kAdamW), "adamw");
  EXPECT_STREQ(OptimizerName(OptimizerKind::kAdaGrad), "adagrad");
}

TEST(ValidateOptimizerConfig, DefaultsAreValid) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam,
                          OptimizerKind::kAdamW, OptimizerKind::kAdaGrad}) {
    OptimizerConfig c;
    c.kind = k;
    EXPECT_TRUE(ValidateOptimizerConfig(c).ok()) << OptimizerName(k);
  }
  OptimizerConfig c;
  c.momentum = 0.9;
  c.nesterov = true;
  EXPECT_TRUE(ValidateOptimizerConfig(c).ok());
}

struct BadConfig {
  std::string name;
  OptimizerConfig config;
  std::vector<std::string> must_mention;
};

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.name; }

std::vector<BadConfig> BadConfigs() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<BadConfig> out;
  auto add = [&](std::string name, OptimizerKind kind, auto mutate,
                 std::vector<std::string> words) {
    OptimizerConfig c;
    c.kind = kind;
    mutate(c);
    out.push_back({std::move(name), c, std::move(words)});
  };
  add("SgdNegativeLr", OptimizerKind::kSgd,
      [](OptimizerConfig& c) { c.lr = -0.5; }, {"lr", "-0.5"});
  add("SgdNanLr", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.lr = nan; },
      {"lr", "nan"});
  add("SgdNegativeMomentum", OptimizerKind::kSgd,
      [](OptimizerConfig& c) { c.momentum = -0.25; }, {"momentum", "-0.25"});
  add("SgdNegativeWeightDecay", OptimizerKind::kSgd,
      [](OptimizerConfig& c) { c.weight_decay = -0.125; },
      {"weight_decay", "-0.125"});
  add("SgdNesterovWithoutMomentum", OptimizerKind::kSgd,
      [](OptimizerConfig& c) { c.nesterov = true; }, {"Nesterov", "momentum"});
  add("SgdNesterovWithDampening", OptimizerKind::kSgd,
      [](OptimizerConfig& c) {
        c.nesterov = true;
        c.momentum = 0.9;
        c.dampening = 0.375;
      },
      {"Nesterov", "dampening", "0.375"});
  add("AdamNegativeLr", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.lr = -0.001; }, {"lr", "-0.001"});
  add("AdamBeta1One", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.beta1 = 1.0; }, {"beta1", "1"});
  add("AdamBeta1Negative", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.beta1 = -0.1; }, {"beta1", "-0.1"});
  add("AdamBeta2TooLarge", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.beta2 = 1.5; }, {"beta2", "1.5"});
  add("AdamNanBeta2", OptimizerKind::kAdam,
      [&](OptimizerConfig& c) { c.beta2 = nan; }, {"beta2", "nan"});
  add("AdamNegativeEps", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.eps = -1e-8; }, {"eps", "-1e-08"});
  add("AdamNegativeWeightDecay", OptimizerKind::kAdam,
      [](OptimizerConfig& c) { c.weight_decay = -0.01; },
      {"weight_decay", "-0.01"});
  add("AdamWBeta1One", OptimizerKind::kAdamW,
      [](OptimizerConfig& c) { c.beta1 = 1.0; }, {"beta1"});
  add("AdamWNegativeWeightDecay", OptimizerKind::kAdamW,
      [](OptimizerConfig& c) { c.weight_decay = -0.01; }, {"weight_decay"});
  add("AdaGradNegativeLrDecay", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.lr_decay = -0.2; }, {"lr_decay", "-0.2"});
  add("AdaGradNegativeInitialAccumulator", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.initial_accumulator_value = -1.0; },
      {"initial_accumulator_value", "-1"});
  add("AdaGradNegativeEps", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.eps = -1e-10; }, {"eps", "-1e-10"});
  add("AdaGradNegativeLr", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.lr = -2.0; }, {"lr", "-2"});
  add("UnknownKind", static_cast<OptimizerKind>(9), [](OptimizerConfig&) {},
      {"kind", "9"});
  // Finite as doubles or not, every value must be finite as the float32 the
  // kernels use, and so must the first update's step.
  const double inf = std::numeric_limits<double>::infinity();
  add("SgdInfLr", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.lr = inf; }, {"lr", "inf"});
  add("SgdLrPastFloat32", OptimizerKind::kSgd, [](OptimizerConfig& c) { c.lr = 1e300; },
      {"lr", "1e+300", "float32"});
  add("SgdInfMomentum", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.momentum = inf; },
      {"momentum", "inf"});
  add("SgdMinusInfDampening", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.dampening = -inf; },
      {"dampening", "-inf"});
  add("SgdInfWeightDecay", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.weight_decay = inf; },
      {"weight_decay", "inf"});
  add("AdamZeroEps", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.eps = 0; }, {"eps", "must be > 0"});
  add("AdamEpsZeroAsFloat32", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.eps = 1e-50; },
      {"eps", "1e-50"});
  add("AdamInfEps", OptimizerKind::kAdam, [&](OptimizerConfig& c) { c.eps = inf; }, {"eps", "inf"});
  add("AdamFirstStepOverflows", OptimizerKind::kAdam,
      [](OptimizerConfig& c) {
        c.lr = 1e38;
        c.beta1 = 0.99;
      },
      {"lr", "1e+38", "first update", "adam"});
  add("AdamWDecayOverflows", OptimizerKind::kAdamW,
      [](OptimizerConfig& c) {
        c.lr = 1e30;
        c.weight_decay = 1e30;
      },
      {"lr", "first update"});
  add("AdaGradInfLrDecay", OptimizerKind::kAdaGrad, [&](OptimizerConfig& c) { c.lr_decay = inf; },
      {"lr_decay", "inf"});
  add("AdaGradInfInitialAccumulator", OptimizerKind::kAdaGrad,
      [&](OptimizerConfig& c) { c.initial_accumulator_value = inf; }, {"initial_accumulator_value", "inf"});
  add("AdaGradZeroEpsAndAccumulator", OptimizerKind::kAdaGrad, [](OptimizerConfig& c) { c.eps = 0; },
      {"eps", "> 0", "initial_accumulator_value"});
  add("SgdNanInAFieldItDoesNotUse", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.ftrl_beta = nan; },
      {"ftrl_beta", "nan"});
  add("FtrlLrWhoseInverseOverflows", OptimizerKind::kFtrl, [](OptimizerConfig& c) { c.lr = 1e-39; },
      {"lr", "1e-39", "first update"});
  return out;
}

class ValidateRejects : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ValidateRejects, NamesFieldAndValue) {
  const absl::Status s = ValidateOptimizerConfig(GetParam().config);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& word : GetParam().must_mention) {
    EXPECT_THAT(std::string(s.message()), HasSubstr(word));
  }
}

INSTANTIATE_TEST_SUITE_P(All, ValidateRejects,
                         ::testing::ValuesIn(BadConfigs()),
                         [](const ::testing::TestParamInfo<BadConfig>& info) {
                           return info.param.name;
                         });

TEST(ValidateOptimizerConfig, AdaGradMayHaveZeroEpsWhenItsAccumulatorStartsAboveZero) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdaGrad;
  c.eps = 0;
  c.initial_accumulator_value = 0.1;  // as Keras's and MXNet's plugins send it
  EXPECT_TRUE(ValidateOptimizerConfig(c).ok()) << ValidateOptimizerConfig(c);
}

TEST(ValidateLearningRate, ChecksTheRateAgainstTheOptimizersOtherSettings) {
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  adam.beta1 = 0.99;
  EXPECT_TRUE(ValidateLearningRate(adam, 1e30).ok());
  // 1e37 / (1 - 0.99) passes float32's largest value.
  const absl::Status s = ValidateLearningRate(adam, 1e37);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("first update"));
  OptimizerConfig sgd;
  EXPECT_TRUE(ValidateLearningRate(sgd, 1e37).ok());
  EXPECT_FALSE(ValidateLearningRate(sgd, 1e39).ok());
  EXPECT_FALSE(ValidateLearningRate(sgd, -1).ok());
  OptimizerConfig assign;
  assign.kind = OptimizerKind::kAssign;
  EXPECT_TRUE(ValidateLearningRate(assign, 1e300).ok()) << "assign keys have no learning rate";
}

}  // namespace
}  // namespace psrt
