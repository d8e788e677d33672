#include "kernels/row_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/optimizer.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 6;
constexpr int64_t kDim = 5;  // odd, so no kernel can assume pairs
constexpr int64_t kSteps = 5;
constexpr uint64_t kSeed = 1234;
constexpr double kInitStd = 0.5;

// The rows each table step pushes. Rows 3 and 5 are never pushed; row 2 and
// row 0 skip steps, so Adam's bias correction must use the table's step, not
// a per-row count.
const std::vector<std::vector<int64_t>>& PushedRows() {
  static const auto* rows =
      new std::vector<std::vector<int64_t>>{{1, 4, 2}, {4, 0}, {1, 4}, {2}, {0, 1, 4}};
  return *rows;
}

// Different per row, step and element, mixed signs and magnitudes.
float GradAt(int64_t id, int64_t step, int64_t j) {
  const double x = 0.7 * static_cast<double>(id * kDim + j) + 1.3 * static_cast<double>(step);
  return static_cast<float>(std::sin(x) * (1.0 + 0.25 * step) + 0.1 * std::cos(3.0 * x));
}

// A run-time schedule, so that the `lr` argument (not c.lr) is exercised.
double LrAt(double base, int64_t step) { return base * (1.0 - 0.1 * (step - 1)); }

// Independent double-precision reference, one row at a time, in the
// textbook forms (not torch's or TF's operation order).
struct RowReference {
  OptimizerConfig c;
  std::vector<double> w, s0, s1;

  RowReference(const OptimizerConfig& config, const float* row) : c(config), w(row, row + kDim) {
    const bool accumulates = c.kind == OptimizerKind::kAdaGrad || c.kind == OptimizerKind::kFtrl;
    s0.assign(kDim, accumulates ? c.initial_accumulator_value : 0.0);
    s1.assign(kDim, 0.0);
  }

  void Step(double lr, int64_t step, const std::vector<float>& grad) {
    const double t = static_cast<double>(step);
    for (int64_t j = 0; j < kDim; ++j) {
      const double g = grad[j];
      switch (c.kind) {
        case OptimizerKind::kSgd:
          w[j] -= lr * g;
          break;
        case OptimizerKind::kAdaGrad: {
          const double clr = lr / (1.0 + (t - 1.0) * c.lr_decay);
          s0[j] += g * g;
          w[j] -= clr * g / (std::sqrt(s0[j]) + c.eps);
          break;
        }
        case OptimizerKind::kAdam: {
          // SparseAdam adds eps to the uncorrected sqrt(v), unlike dense
          // Adam: eps / sqrt(bc2) in the corrected form.
          s0[j] = c.beta1 * s0[j] + (1.0 - c.beta1) * g;
          s1[j] = c.beta2 * s1[j] + (1.0 - c.beta2) * g * g;
          const double m_hat = s0[j] / (1.0 - std::pow(c.beta1, t));
          const double bc2_sqrt = std::sqrt(1.0 - std::pow(c.beta2, t));
          w[j] -= lr * m_hat / (std::sqrt(s1[j]) / bc2_sqrt + c.eps / bc2_sqrt);
          break;
        }
        case OptimizerKind::kFtrl: {
          // McMahan et al. 2013, Algorithm 1, with TF's lr = alpha.
          const double n_new = s0[j] + g * g;
          const double sigma = (std::sqrt(n_new) - std::sqrt(s0[j])) / lr;
          s1[j] += g - sigma * w[j];
          s0[j] = n_new;
          const double z = s1[j];
          w[j] = std::abs(z) <= c.l1 ? 0.0
                                     : -(z - std::copysign(c.l1, z)) /
                                           ((c.ftrl_beta + std::sqrt(n_new)) / lr + 2.0 * c.l2);
          break;
        }
        case OptimizerKind::kAdamW:
          FAIL() << "adamw has no row-wise reference";
      }
    }
  }
};

// |actual - expected| <= rel * max(|expected|, floor); the floor is the scale
// of the operands, for values that cancel towards 0.
void ExpectAllClose(const float* actual, const std::vector<double>& expected, double rel,
                    double floor, const std::string& what) {
  for (size_t i = 0; i < expected.size(); ++i) {
    const double tol = rel * std::max(std::abs(expected[i]), floor);
    EXPECT_LE(std::abs(actual[i] - expected[i]), tol)
        << what << "[" << i << "]: got " << actual[i] << ", want " << expected[i];
  }
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * n) == 0;
}

// A table of kRows rows with their slots, rows made by InitRow.
struct Table {
  OptimizerConfig c;
  std::vector<float> w;
  std::vector<std::vector<float>> slots;

  explicit Table(const OptimizerConfig& config)
      : c(config), w(kRows * kDim), slots(RowSlots(config), std::vector<float>(kRows * kDim, -1)) {
    for (int64_t id = 0; id < kRows; ++id) {
      InitRow(kSeed, id, kInitStd, Row(id), kDim);
      std::vector<float*> s = Slots(id);
      InitRowSlots(c, s.data(), kDim);
    }
  }
  float* Row(int64_t id) { return w.data() + id * kDim; }
  std::vector<float*> Slots(int64_t id) {
    std::vector<float*> out;
    for (auto& s : slots) out.push_back(s.data() + id * kDim);
    return out;
  }
};

struct Case {
  std::string name;
  OptimizerConfig config;
  double lr;
  double slot1_floor;  // Adam's exp_avg_sq is tiny; compare it relatively.
  bool expect_zeros;   // FTRL's l1 must clip some weights to exactly 0.
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  // c.lr is far from the lr passed in: a kernel reading c.lr fails.
  auto make = [](OptimizerKind kind) {
    OptimizerConfig c;
    c.kind = kind;
    c.lr = 7.0;
    return c;
  };
  std::vector<Case> cases;
  cases.push_back({"Sgd", make(OptimizerKind::kSgd), 0.1, 1.0, false});
  {
    OptimizerConfig c = make(OptimizerKind::kAdaGrad);
    c.eps = 1e-10;
    c.lr_decay = 0.1;
    c.initial_accumulator_value = 0.5;
    cases.push_back({"AdaGrad", c, 0.1, 1.0, false});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kAdaGrad);
    c.eps = 1e-10;
    cases.push_back({"AdaGradZeroAccumulator", c, 0.05, 1.0, false});
  }
  cases.push_back({"Adam", make(OptimizerKind::kAdam), 0.01, 1e-6, false});
  {
    OptimizerConfig c = make(OptimizerKind::kAdam);
    c.beta1 = 0.3;
    c.beta2 = 0.99;
    c.eps = 1e-6;
    cases.push_back({"AdamBetas", c, 0.02, 1e-6, false});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kFtrl);
    c.initial_accumulator_value = 0.1;
    cases.push_back({"FtrlPlain", c, 0.1, 1.0, false});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kFtrl);
    c.initial_accumulator_value = 0.1;
    c.l1 = 0.01;
    c.l2 = 0.02;
    c.ftrl_beta = 0.5;
    cases.push_back({"FtrlRegularized", c, 0.2, 1.0, false});
  }
  {
    OptimizerConfig c = make(OptimizerKind::kFtrl);
    c.l1 = 1.0;
    c.l2 = 0.1;
    c.ftrl_beta = 1.0;
    cases.push_back({"FtrlStrongL1", c, 0.5, 1.0, true});
  }
  return cases;
}

class RowOptimizerMatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(RowOptimizerMatchesReference, PushedRowsFollowUntouchedRowsStay) {
  const Case& tc = GetParam();
  const OptimizerConfig& c = tc.config;
  ASSERT_TRUE(ValidateRowOptimizer(c).ok()) << ValidateRowOptimizer(c);
  Table table(c);
  Table initial = table;
  std::vector<RowReference> ref;
  for (int64_t id = 0; id < kRows; ++id) ref.emplace_back(c, table.Row(id));

  int zeros = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    const double lr = LrAt(tc.lr, step);
    const std::vector<int64_t>& pushed = PushedRows()[step - 1];
    Table before = table;
    for (int64_t id : pushed) {
      std::vector<float> grad(kDim);
      for (int64_t j = 0; j < kDim; ++j) grad[j] = GradAt(id, step, j);
      std::vector<float*> slots = table.Slots(id);
      ApplyRowUpdate(c, lr, step, table.Row(id), grad.data(), slots.data(), kDim);
      ref[id].Step(lr, step, grad);
    }
    for (int64_t id = 0; id < kRows; ++id) {
      const std::string at =
          tc.name + " step " + std::to_string(step) + " row " + std::to_string(id);
      const bool was_pushed = std::count(pushed.begin(), pushed.end(), id) > 0;
      if (!was_pushed) {
        EXPECT_TRUE(SameBits(table.Row(id), before.Row(id), kDim)) << at;
        for (size_t s = 0; s < table.slots.size(); ++s) {
          EXPECT_TRUE(SameBits(table.Slots(id)[s], before.Slots(id)[s], kDim))
              << at << " slot " << s;
        }
        continue;
      }
      ExpectAllClose(table.Row(id), ref[id].w, 1e-6, 1.0, at + " row");
      if (!table.slots.empty()) {
        ExpectAllClose(table.Slots(id)[0], ref[id].s0, 1e-6, 1.0, at + " slot0");
      }
      if (table.slots.size() >= 2) {
        ExpectAllClose(table.Slots(id)[1], ref[id].s1, 1e-6, tc.slot1_floor, at + " slot1");
      }
      for (int64_t j = 0; j < kDim; ++j) zeros += table.Row(id)[j] == 0.0f;
    }
  }
  // Rows 3 and 5 were never pushed: still exactly InitRow's and
  // InitRowSlots' values.
  for (int64_t id : {3, 5}) {
    EXPECT_TRUE(SameBits(table.Row(id), initial.Row(id), kDim)) << id;
    for (size_t s = 0; s < table.slots.size(); ++s) {
      EXPECT_TRUE(SameBits(table.Slots(id)[s], initial.Slots(id)[s], kDim)) << id;
    }
  }
  if (tc.expect_zeros) {
    EXPECT_GT(zeros, 0) << "l1 never clipped a weight: the case tests nothing";
  }
  // The pushed rows must actually move, or the comparison is vacuous.
  double moved = 0.0;
  for (int64_t i = 0; i < kRows * kDim; ++i) moved += std::abs(table.w[i] - initial.w[i]);
  EXPECT_GT(moved, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(AllRowOptimizers, RowOptimizerMatchesReference,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(RowOptimizerHandComputed, FtrlThreeSteps) {
  // lr = 0.5, l1 = 0.1, l2 = 0.25, beta = 1, n0 = z0 = w0 = 0.
  // Step 1, g = 2: n = 4; sigma = (2 - 0) / 0.5 = 4; z = 2 - 4 * 0 = 2;
  //   w = -(2 - 0.1) / ((1 + 2) / 0.5 + 2 * 0.25) = -1.9 / 6.5 = -0.2923076923.
  // Step 2, g = -1: n = 5; sigma = (sqrt(5) - 2) / 0.5 = 0.4721359550;
  //   z = 2 - 1 + 0.4721359550 * 0.2923076923 = 1.1380089714;
  //   w = -1.0380089714 / ((1 + sqrt(5)) / 0.5 + 0.5) = -0.1488796229.
  // Step 3, g = 0.05: n = 5.0025; sigma = 0.0011178943;
  //   z = 1.1380089714 + 0.05 + 0.0011178943 * 0.1488796229 = 1.1881754031;
  //   w = -1.0881754031 / ((1 + sqrt(5.0025)) / 0.5 + 0.5) = -0.1560498767.
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.lr = 0.5;
  c.l1 = 0.1;
  c.l2 = 0.25;
  c.ftrl_beta = 1.0;
  ASSERT_TRUE(ValidateRowOptimizer(c).ok());
  ASSERT_EQ(RowSlots(c), 2);
  float w = 0.0f, n = -1.0f, z = -1.0f;
  float* slots[] = {&n, &z};
  InitRowSlots(c, slots, 1);
  EXPECT_EQ(n, 0.0f);
  EXPECT_EQ(z, 0.0f);
  const float g1 = 2.0f, g2 = -1.0f, g3 = 0.05f;
  ApplyRowUpdate(c, 0.5, 1, &w, &g1, slots, 1);
  EXPECT_EQ(n, 4.0f);
  EXPECT_EQ(z, 2.0f);
  EXPECT_NEAR(w, -0.2923076923, 1e-7);
  ApplyRowUpdate(c, 0.5, 2, &w, &g2, slots, 1);
  EXPECT_NEAR(z, 1.1380089714, 1e-6);
  EXPECT_NEAR(w, -0.1488796229, 1e-7);
  ApplyRowUpdate(c, 0.5, 3, &w, &g3, slots, 1);
  EXPECT_NEAR(n, 5.0025, 1e-6);
  EXPECT_NEAR(z, 1.1881754031, 1e-6);
  EXPECT_NEAR(w, -0.1560498767, 1e-7);

  // |z| <= l1: the weight is exactly 0.
  float w0 = 0.0f, n0 = 0.0f, z0 = 0.0f;
  float* slots0[] = {&n0, &z0};
  const float small = 0.05f;
  ApplyRowUpdate(c, 0.5, 1, &w0, &small, slots0, 1);
  EXPECT_EQ(z0, 0.05f);
  EXPECT_EQ(w0, 0.0f);
}

TEST(RowOptimizerHandComputed, AdamBiasCorrectionUsesTableStep) {
  // A row first pushed at table step 3: lr = 0.1, betas (0.9, 0.999), g = 0.5.
  // m = 0.05, v = 0.00025; bc1 = 1 - 0.729 = 0.271, bc2 = 1 - 0.997002999
  // = 0.002997001; step_size = 0.1 * sqrt(0.002997001) / 0.271 = 0.0202010;
  // w = 1 - 0.0202010 * 0.05 / (sqrt(0.00025) + 1e-8) = 1 - 0.0638813 =
  // 0.9361187 (the first update of a fresh row, were its own count used,
  // would move it by lr = 0.1).
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  float w = 1.0f, m = -1.0f, v = -1.0f;
  float* slots[] = {&m, &v};
  InitRowSlots(c, slots, 1);
  const float g = 0.5f;
  ApplyRowUpdate(c, 0.1, 3, &w, &g, slots, 1);
  EXPECT_NEAR(m, 0.05, 1e-8);
  EXPECT_NEAR(v, 0.00025, 1e-10);
  const double step_size = 0.1 * std::sqrt(1.0 - std::pow(0.999, 3)) / (1.0 - std::pow(0.9, 3));
  EXPECT_NEAR(w, 1.0 - step_size * 0.05 / (std::sqrt(0.00025) + 1e-8), 1e-6);
  EXPECT_NEAR(w, 0.9361187, 1e-6);
}

TEST(RowOptimizerHandComputed, AdaGradLrDecayUsesTableStep) {
  // lr = 0.1, lr_decay = 0.5, step 3: clr = 0.1 / (1 + 2 * 0.5) = 0.05.
  // sum = 0.5 + 2^2 = 4.5; w = 1 - 0.05 * 2 / (sqrt(4.5) + 1e-10) = 0.9528595.
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdaGrad;
  c.lr_decay = 0.5;
  c.initial_accumulator_value = 0.5;
  c.eps = 1e-10;
  float w = 1.0f, sum = -1.0f;
  float* slots[] = {&sum};
  InitRowSlots(c, slots, 1);
  EXPECT_EQ(sum, 0.5f);
  const float g = 2.0f;
  ApplyRowUpdate(c, 0.1, 3, &w, &g, slots, 1);
  EXPECT_EQ(sum, 4.5f);
  EXPECT_NEAR(w, 0.95285955, 1e-6);
}

// Bits from the frameworks themselves, recorded once on x86-64 (AVX-512):
// torch 2.15 (SGD, Adagrad and SparseAdam stepping nn.Parameter with a sparse
// gradient of row 0) and TensorFlow 2.21 (ResourceSparseApplyFtrl with
// lr_power -0.5 and l2 + beta / (2 lr) in float32, as Keras 2 passes it).
// Unlike the reference above, these catch a change of operation order or
// rounding; the SGD bits also tell torch's fused axpy from a separate
// multiply and add.
struct FrameworkBits {
  static constexpr int64_t kN = 8;
  const float w0[kN] = {0x1.427a32p-11f, 0x1.31ea5ap-3f,  -0x1.18b798p-3f, -0x1.c7fba8p-2f,
                        -0x1.d19538p-3f, -0x1.fbb918p-2f, 0x1.ecb246p-6f,  0x1.571858p-1f};
  const float g[3][kN] = {{-0x1.f804fcp-2f, -0x1.3daee2p-1f, 0x1.f59928p-2f, 0x1.6d73cap-2f,
                           0x1.afc6dap-4f, -0x1.dc664ep-1f, -0x1.df430ap-6f, 0x1.63fec8p-1f},
                          {-0x1.9cf156p-2f, -0x1.1928bcp-3f, -0x1.24071ep-1f, -0x1.8c256p-2f,
                           -0x1.1ae3f8p-1f, -0x1.20e146p-4f, -0x1.855c0cp-2f, 0x1.4d5464p-4f},
                          {0x1.4106b6p-2f, -0x1.7ed5a6p-2f, -0x1.42252ep+2f, -0x1.13cf8ep+0f,
                           -0x1.8d51dap-4f, 0x1.d01d16p-3f, -0x1.87b6fap+1f, -0x1.e93828p-1f}};

  // Three steps at a constant lr from w0; returns the row and its slots.
  std::vector<std::vector<float>> Run(const OptimizerConfig& c, double lr) const {
    std::vector<std::vector<float>> out(1 + RowSlots(c), std::vector<float>(kN, -1.0f));
    out[0].assign(w0, w0 + kN);
    std::vector<float*> slots;
    for (size_t s = 1; s < out.size(); ++s) slots.push_back(out[s].data());
    InitRowSlots(c, slots.data(), kN);
    for (int64_t step = 1; step <= 3; ++step) {
      ApplyRowUpdate(c, lr, step, out[0].data(), g[step - 1], slots.data(), kN);
    }
    return out;
  }
};

void ExpectBits(const std::vector<float>& actual, const std::vector<float>& want,
                const std::string& what) {
  ASSERT_EQ(actual.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(SameBits(&actual[i], &want[i], 1))
        << what << "[" << i << "]: got " << actual[i] << " (" << std::hexfloat << actual[i]
        << "), want " << want[i] << std::defaultfloat;
  }
}

TEST(RowOptimizerFrameworkBits, TorchSgd) {
  OptimizerConfig c;
  const auto out = FrameworkBits().Run(c, 0.1);
  ExpectBits(out[0],
             {0x1.e1c998p-5f, 0x1.0cd5f4p-2f, 0x1.7f51cep-2f, -0x1.5696ep-2f, -0x1.622648p-3f,
              -0x1.ac6d42p-2f, 0x1.8218cp-2f, 0x1.60403ap-1f},
             "row");
}

TEST(RowOptimizerFrameworkBits, TorchAdagrad) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdaGrad;
  c.lr_decay = 0.1;
  c.initial_accumulator_value = 0.5;
  c.eps = 1e-10;
  const auto out = FrameworkBits().Run(c, 0.1);
  ExpectBits(out[0],
             {0x1.1f8a9ap-4f, 0x1.092b2ep-2f, -0x1.fd0f56p-5f, -0x1.8b390ap-2f, -0x1.6bb63cp-3f,
              -0x1.b4cd68p-2f, 0x1.433e26p-3f, 0x1.4cf16ap-1f},
             "row");
  ExpectBits(out[1],
             {0x1.00cff2p+0f, 0x1.0b29f4p+0f, 0x1.a66cep+4f, 0x1.f01304p+0f, 0x1.a6cf52p-1f,
              0x1.6c0ecap+0f, 0x1.40579ep+3f, 0x1.e72f1p+0f},
             "sum");
}

TEST(RowOptimizerFrameworkBits, TorchSparseAdam) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  const auto out = FrameworkBits().Run(c, 0.01);
  ExpectBits(out[0],
             {0x1.9245ecp-6f, 0x1.68d854p-3f, -0x1.1d550cp-3f, -0x1.cb1244p-2f, -0x1.cdfe4ap-3f,
              -0x1.e609d8p-2f, 0x1.c3653p-5f, 0x1.4f0184p-1f},
             "row");
  ExpectBits(out[1],
             {-0x1.6f1a34p-5f, -0x1.9999e4p-4f, -0x1.07af18p-1f, -0x1.d180d4p-4f, -0x1.a0e0e2p-5f,
              -0x1.e3c452p-5f, -0x1.5ed726p-2f, -0x1.0561bcp-5f},
             "exp_avg");
  ExpectBits(out[2],
             {0x1.0777eap-11f, 0x1.1c982p-11f, 0x1.a85bbcp-6f, 0x1.78cd58p-10f, 0x1.55487ep-12f,
              0x1.e2894cp-11f, 0x1.37a446p-7f, 0x1.6f8c98p-10f},
             "exp_avg_sq");
}

TEST(RowOptimizerFrameworkBits, TensorFlowFtrl) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.initial_accumulator_value = 0.1;
  c.l1 = 0.05;
  c.l2 = 0.02;
  c.ftrl_beta = 0.5;
  const auto out = FrameworkBits().Run(c, 0.2);
  ExpectBits(out[0],
             {0x1.933a4cp-4f, 0x1.c59f32p-3f, 0x1.2f1d5cp-3f, 0x1.7787fep-5f, 0x1.3d0416p-4f,
              -0x1.c4be6ep-4f, 0x1.ee3c46p-3f, 0x1.ba8ddcp-3f},
             "row");
  ExpectBits(out[1],
             {0x1.34d316p-1f, 0x1.49871ap-1f, 0x1.a0067ap+4f, 0x1.89ac9ep+0f, 0x1.b40508p-2f,
              0x1.05a862p+0f, 0x1.338ad2p+3f, 0x1.80c8acp+0f},
             "n");
  ExpectBits(out[2],
             {-0x1.5d5a2p-1f, -0x1.80464p+0f, -0x1.0cc3e2p+2f, -0x1.cd7c6p-2f, -0x1.ff15b2p-2f,
              0x1.c76bbcp-1f, -0x1.19d57cp+2f, -0x1.ec6a9cp+0f},
             "z");
}

TEST(RowOptimizer, EmptyRowIsNoOp) {
  for (OptimizerKind k :
       {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdaGrad, OptimizerKind::kFtrl}) {
    OptimizerConfig c;
    c.kind = k;
    ApplyRowUpdate(c, 0.1, 1, nullptr, nullptr, nullptr, 0);
  }
}

TEST(RowOptimizer, RowSlotsAndInit) {
  OptimizerConfig c;
  EXPECT_EQ(RowSlots(c), 0);
  c.kind = OptimizerKind::kAdam;
  EXPECT_EQ(RowSlots(c), 2);
  c.kind = OptimizerKind::kAdaGrad;
  EXPECT_EQ(RowSlots(c), 1);
  c.kind = OptimizerKind::kFtrl;
  EXPECT_EQ(RowSlots(c), 2);

  c.initial_accumulator_value = 0.25;
  std::vector<float> n(7, -1.0f), z(7, -1.0f);
  float* slots[] = {n.data(), z.data()};
  InitRowSlots(c, slots, 7);
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(n[j], 0.25f);
    EXPECT_EQ(z[j], 0.0f);
  }
  c.kind = OptimizerKind::kAdam;
  InitRowSlots(c, slots, 7);
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(n[j], 0.0f);
    EXPECT_EQ(z[j], 0.0f);
  }
}

// The dense path runs the row kernel over the whole partition: same bits.
TEST(RowOptimizer, DenseFtrlEqualsRowUpdate) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.initial_accumulator_value = 0.1;
  c.l1 = 0.05;
  c.l2 = 0.01;
  c.ftrl_beta = 0.5;
  ASSERT_EQ(NumSlots(c), 2);
  constexpr int64_t kN = 1031;
  std::vector<float> dense(kN), row(kN);
  InitRow(kSeed, 99, 0.3, dense.data(), kN);
  row = dense;
  std::vector<float> dn(kN, -1), dz(kN, -1), rn(kN, -2), rz(kN, -2);
  float* dense_slots[] = {dn.data(), dz.data()};
  float* row_slots[] = {rn.data(), rz.data()};
  InitSlots(c, dense_slots, kN);
  InitRowSlots(c, row_slots, kN);
  ASSERT_TRUE(SameBits(dn.data(), rn.data(), kN));
  ASSERT_TRUE(SameBits(dz.data(), rz.data(), kN));
  for (int64_t step = 1; step <= kSteps; ++step) {
    std::vector<float> grad(kN);
    for (int64_t i = 0; i < kN; ++i) grad[i] = GradAt(i / kDim, step, i % kDim);
    const double lr = LrAt(0.2, step);
    ApplyUpdate(c, lr, step, dense.data(), grad.data(), dense_slots, kN);
    ApplyRowUpdate(c, lr, step, row.data(), grad.data(), row_slots, kN);
    EXPECT_TRUE(SameBits(dense.data(), row.data(), kN)) << step;
    EXPECT_TRUE(SameBits(dn.data(), rn.data(), kN)) << step;
    EXPECT_TRUE(SameBits(dz.data(), rz.data(), kN)) << step;
  }
}

TEST(InitRow, SameSeedAndIdSameBits) {
  std::vector<float> a(33), b(33);
  InitRow(kSeed, 77, 0.1, a.data(), 33);
  InitRow(kSeed, 77, 0.1, b.data(), 33);
  EXPECT_TRUE(SameBits(a.data(), b.data(), 33));
  // Element j does not depend on the row's length.
  std::vector<float> prefix(8);
  InitRow(kSeed, 77, 0.1, prefix.data(), 8);
  EXPECT_TRUE(SameBits(a.data(), prefix.data(), 8));
}

TEST(InitRow, DifferentIdOrSeedDiffers) {
  constexpr int64_t kN = 16;
  std::vector<float> base(kN), other_id(kN), other_seed(kN), neighbor_seed(kN);
  InitRow(kSeed, 77, 0.1, base.data(), kN);
  InitRow(kSeed, 78, 0.1, other_id.data(), kN);
  InitRow(kSeed + 1, 77, 0.1, other_seed.data(), kN);
  // (seed + 1, id - 1) must not be (seed, id) shifted.
  InitRow(kSeed + 1, 76, 0.1, neighbor_seed.data(), kN);
  for (const auto* v : {&other_id, &other_seed, &neighbor_seed}) {
    int same = 0;
    for (int64_t j = 0; j < kN; ++j) same += (*v)[j] == base[j];
    EXPECT_EQ(same, 0);
  }
}

TEST(InitRow, PinnedValues) {
  // Computed once in Python from the documented construction (splitmix64
  // draws keyed by Mix64(Mix64(seed + gamma) ^ id), Box-Muller, cosine then
  // sine), so a change to the generator shows up here: servers of different
  // builds must make the same rows.
  std::vector<float> a(5);
  InitRow(7, 42, 1.0, a.data(), 5);
  const double want_a[] = {-0.25408610701560974, -0.4626026451587677, -1.3703069686889648,
                           -0.5539760589599609, -0.4644942283630371};
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(a[j], want_a[j], 1e-7) << j;
  std::vector<float> b(3);
  InitRow(0, -3, 0.25, b.data(), 3);
  const double want_b[] = {0.4677899181842804, 0.2587555944919586, -0.2823050320148468};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(b[j], want_b[j], 1e-7) << j;
}

TEST(InitRow, MeanAndStd) {
  constexpr int64_t kIds = 1000, kN = 100;  // 100k values
  constexpr double kStd = 0.5;
  double sum = 0.0, sum_sq = 0.0;
  std::vector<float> row(kN);
  for (int64_t id = 0; id < kIds; ++id) {
    InitRow(kSeed, id, kStd, row.data(), kN);
    for (float v : row) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
  }
  const double count = static_cast<double>(kIds * kN);
  const double mean = sum / count;
  const double sd = std::sqrt(sum_sq / count - mean * mean);
  EXPECT_LT(std::abs(mean), 0.03 * kStd);
  EXPECT_NEAR(sd / kStd, 1.0, 0.03);
  InitRow(kSeed, 5, 0.0, row.data(), kN);
  for (float v : row) EXPECT_EQ(v, 0.0f);
}

TEST(RowShard, PinnedValues) {
  // splitmix64's finalizer of the id, modulo the server count, computed once
  // in Python. INT_MAX servers expose 31 bits of the mix.
  const int64_t ids[] = {0,
                         1,
                         2,
                         42,
                         123456789,
                         -1,
                         int64_t{1} << 40,
                         std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min()};
  const int want3[] = {0, 1, 1, 2, 2, 0, 0, 1, 0};
  const int want8[] = {0, 5, 2, 2, 0, 3, 0, 5, 2};
  const int want_max[] = {0,          1026503200, 1909425595, 589711988, 125373708,
                          1550608759, 2105347926, 775304379,  1163101909};
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(RowShard(ids[i], 3), want3[i]) << ids[i];
    EXPECT_EQ(RowShard(ids[i], 8), want8[i]) << ids[i];
    EXPECT_EQ(RowShard(ids[i], std::numeric_limits<int>::max()), want_max[i]) << ids[i];
    EXPECT_EQ(RowShard(ids[i], 1), 0);
  }
}

TEST(RowShard, BalancedOverConsecutiveIds) {
  constexpr int64_t kIds = 1000000;
  for (int servers : {2, 3, 8}) {
    std::vector<int64_t> count(servers, 0);
    for (int64_t id = 0; id < kIds; ++id) {
      const int s = RowShard(id, servers);
      ASSERT_GE(s, 0);
      ASSERT_LT(s, servers);
      ++count[s];
    }
    const double expected = static_cast<double>(kIds) / servers;
    for (int s = 0; s < servers; ++s) {
      EXPECT_NEAR(count[s], expected, 0.02 * expected) << servers << " servers, server " << s;
    }
  }
}

TEST(OptimizerName, Ftrl) {
  EXPECT_STREQ(OptimizerName(OptimizerKind::kFtrl), "ftrl");
  absl::StatusOr<OptimizerKind> k = ParseOptimizerKind("ftrl");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, OptimizerKind::kFtrl);
  EXPECT_THAT(std::string(ParseOptimizerKind("ftrl2").status().message()), HasSubstr("ftrl"));
}

TEST(ValidateRowOptimizer, AcceptsRowWiseDefaults) {
  for (OptimizerKind k :
       {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdaGrad, OptimizerKind::kFtrl}) {
    OptimizerConfig c;
    c.kind = k;
    EXPECT_TRUE(ValidateRowOptimizer(c).ok()) << OptimizerName(k) << ValidateRowOptimizer(c);
    EXPECT_TRUE(ValidateOptimizerConfig(c).ok()) << OptimizerName(k);
  }
  OptimizerConfig c;
  c.dampening = 0.5;  // unused without momentum, as in torch
  EXPECT_TRUE(ValidateRowOptimizer(c).ok());
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
  add("SgdMomentum", OptimizerKind::kSgd, [](OptimizerConfig& c) { c.momentum = 0.9; },
      {"momentum is not row-wise", "0.9", "use adagrad or adam for tables"});
  add("SgdNanMomentum", OptimizerKind::kSgd, [&](OptimizerConfig& c) { c.momentum = nan; },
      {"momentum is not row-wise", "nan"});
  add("SgdNesterov", OptimizerKind::kSgd, [](OptimizerConfig& c) { c.nesterov = true; },
      {"nesterov is not row-wise"});
  add("SgdWeightDecay", OptimizerKind::kSgd, [](OptimizerConfig& c) { c.weight_decay = 0.01; },
      {"weight_decay is not row-wise", "0.01", "every row"});
  add("AdaGradWeightDecay", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.weight_decay = 0.125; },
      {"weight_decay is not row-wise", "0.125"});
  add("AdamWeightDecay", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.weight_decay = 0.25; },
      {"weight_decay is not row-wise", "0.25"});
  add("AdamW", OptimizerKind::kAdamW, [](OptimizerConfig&) {}, {"adamw is not row-wise", "adam"});
  add("AdamZeroLr", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.lr = 0.0; },
      {"lr", "must be > 0"});
  add("AdamZeroEps", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.eps = 0.0; },
      {"eps", "must be > 0"});
  add("AdamBeta1One", OptimizerKind::kAdam, [](OptimizerConfig& c) { c.beta1 = 1.0; },
      {"beta1", "1"});
  add("AdaGradNegativeLrDecay", OptimizerKind::kAdaGrad,
      [](OptimizerConfig& c) { c.lr_decay = -0.2; }, {"lr_decay", "-0.2"});
  add("FtrlZeroLr", OptimizerKind::kFtrl, [](OptimizerConfig& c) { c.lr = 0.0; },
      {"lr", "must be > 0"});
  add("FtrlNegativeL1", OptimizerKind::kFtrl, [](OptimizerConfig& c) { c.l1 = -0.5; },
      {"l1", "-0.5"});
  add("FtrlNanL1", OptimizerKind::kFtrl, [&](OptimizerConfig& c) { c.l1 = nan; }, {"l1", "nan"});
  add("FtrlNegativeL2", OptimizerKind::kFtrl, [](OptimizerConfig& c) { c.l2 = -0.25; },
      {"l2", "-0.25"});
  add("FtrlNegativeBeta", OptimizerKind::kFtrl, [](OptimizerConfig& c) { c.ftrl_beta = -1.0; },
      {"ftrl_beta", "-1"});
  add("FtrlNegativeInitialAccumulator", OptimizerKind::kFtrl,
      [](OptimizerConfig& c) { c.initial_accumulator_value = -0.1; },
      {"initial_accumulator_value", "-0.1"});
  add("Assign", OptimizerKind::kAssign, [](OptimizerConfig&) {}, {"assign", "dense keys"});
  add("Hold", OptimizerKind::kHold, [](OptimizerConfig&) {}, {"hold", "dense keys"});
  add("UnknownKind", static_cast<OptimizerKind>(9), [](OptimizerConfig&) {}, {"kind", "9"});
  return out;
}

class ValidateRowOptimizerRejects : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ValidateRowOptimizerRejects, NamesFieldAndWhy) {
  const absl::Status s = ValidateRowOptimizer(GetParam().config);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& word : GetParam().must_mention) {
    EXPECT_THAT(std::string(s.message()), HasSubstr(word));
  }
}

INSTANTIATE_TEST_SUITE_P(All, ValidateRowOptimizerRejects, ::testing::ValuesIn(BadConfigs()),
                         [](const ::testing::TestParamInfo<BadConfig>& info) {
                           return info.param.name;
                         });

// The dense validation covers FTRL too (a dense variable may use it).
TEST(ValidateOptimizerConfig, Ftrl) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kFtrl;
  c.l1 = -1.0;
  const absl::Status s = ValidateOptimizerConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("l1"));
}

}  // namespace
}  // namespace psrt
