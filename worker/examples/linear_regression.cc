// A trainer without a framework: linear regression on generated data whose
// exact solution is known, trained through psrt's servers.
//
// Every rank draws its own batches of x ~ N(0, 1) with y = x.w* + b*, where
// w*_j = sin(j + 1) and b* = 0.5, and minimises the mean squared error. The
// data has no noise, so the weights converge to (w*, b*) exactly.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "worker/client.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "linear_regression: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t dim = 64, batch = 32, steps = 200, log_every = 50, exit_at_step = -1;
  double lr = 0.1;
  std::string optimizer = "sgd", result;
  psrt::Flags flags("psrt-example-linreg", "[flags]  (run under psrt-run)");
  flags.Add("dim", &dim, "Number of features (weights).");
  flags.Add("batch", &batch, "Samples per step on each worker.");
  flags.Add("steps", &steps, "Training steps.");
  flags.Add("lr", &lr, "Learning rate of the server-side optimizer.");
  flags.Add("optimizer", &optimizer, "sgd, momentum, nesterov, adam, adamw or adagrad.");
  flags.Add("log-every", &log_every, "Print the loss every this many steps (rank 0).");
  flags.Add("result", &result, "Write the final loss and error of each rank to RESULT.rankN.json.");
  flags.Add("exit-at-step", &exit_at_step, "Exit with code 3 at this step (failure drills); -1: never.");
  flags.ParseOrExit(argc, argv);
  if (dim <= 0 || batch <= 0 || steps < 0 || lr <= 0 || log_every <= 0) {
    std::fprintf(stderr, "linear_regression: --dim, --batch, --lr and --log-every must be > 0, --steps >= 0\n");
    return 2;
  }
  psrt::OptimizerConfig opt;
  if (optimizer == "sgd") {
    opt = psrt::DefaultOptimizer(psrt::OptimizerKind::kSgd, lr);
  } else if (optimizer == "momentum" || optimizer == "nesterov") {
    opt = psrt::DefaultOptimizer(psrt::OptimizerKind::kSgd, lr);
    opt.momentum = 0.9;
    opt.nesterov = optimizer == "nesterov";
  } else if (optimizer == "adam") {
    opt = psrt::DefaultOptimizer(psrt::OptimizerKind::kAdam, lr);
  } else if (optimizer == "adamw") {
    opt = psrt::DefaultOptimizer(psrt::OptimizerKind::kAdamW, lr);
    opt.weight_decay = 0;
  } else if (optimizer == "adagrad") {
    opt = psrt::DefaultOptimizer(psrt::OptimizerKind::kAdaGrad, lr);
  } else {
    std::fprintf(stderr, "linear_regression: unknown --optimizer '%s'\n", optimizer.c_str());
    return 2;
  }

  absl::StatusOr<psrt::ClientOptions> options = psrt::ClientOptions::FromEnv();
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::unique_ptr<psrt::Client>> client = psrt::Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());
  psrt::Client& c = **client;
  const int rank = c.rank();

  std::vector<float> w_star(dim);
  for (int64_t j = 0; j < dim; ++j) w_star[j] = static_cast<float>(std::sin(j + 1.0));
  const float b_star = 0.5f;
  // Rank 0's initial value wins; the others start from garbage to show it.
  std::vector<float> w(dim, rank == 0 ? 0.f : 1e3f), b(1, rank == 0 ? 0.f : -1e3f);
  if (absl::Status s = c.RegisterVariable("weight", {dim}, w.data(), opt); !s.ok()) return Fail(s);
  if (absl::Status s = c.RegisterVariable("bias", {1}, b.data(), opt); !s.ok()) return Fail(s);

  std::mt19937_64 rng(1000 + rank);
  std::normal_distribution<float> normal;
  std::vector<float> x(batch * dim), y(batch), gw(dim), gb(1);
  auto loss_on = [&](bool grad) {
    double loss = 0;
    if (grad) {
      std::fill(gw.begin(), gw.end(), 0.f);
      gb[0] = 0;
    }
    for (int64_t i = 0; i < batch; ++i) {
      const float* xi = &x[i * dim];
      double pred = b[0];
      for (int64_t j = 0; j < dim; ++j) pred += xi[j] * w[j];
      const double err = pred - y[i];
      loss += 0.5 * err * err / batch;
      if (grad) {
        for (int64_t j = 0; j < dim; ++j) gw[j] += static_cast<float>(err * xi[j] / batch);
        gb[0] += static_cast<float>(err / batch);
      }
    }
    return loss;
  };
  auto draw = [&] {
    for (int64_t i = 0; i < batch; ++i) {
      double yi = b_star;
      for (int64_t j = 0; j < dim; ++j) {
        x[i * dim + j] = normal(rng);
        yi += x[i * dim + j] * w_star[j];
      }
      y[i] = static_cast<float>(yi);
    }
  };

  double loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    if (step == exit_at_step) {
      std::fprintf(stderr, "linear_regression: rank %d exits at step %ld as asked\n", rank, static_cast<long>(step));
      return 3;
    }
    draw();
    loss = loss_on(true);
    // Sync: the gradient is for version `step`; the reply is version step+1.
    psrt::Client::Handle h = c.PushPull(
        {{"weight", gw.data(), w.data()}, {"bias", gb.data(), b.data()}}, c.sync() ? step : 0);
    if (absl::Status s = c.Wait(h); !s.ok()) return Fail(s);
    if (rank == 0 && (step % log_every == 0 || step == steps - 1)) {
      std::printf("step %ld loss %.6g\n", static_cast<long>(step), loss);
      std::fflush(stdout);
    }
  }
  // Final weights: in sync mode every rank sees the same version.
  if (absl::Status s = c.Wait(c.Pull({{"weight", nullptr, w.data()}, {"bias", nullptr, b.data()}},
                                     c.sync() ? steps : 0));
      !s.ok()) {
    return Fail(s);
  }
  draw();
  loss = loss_on(false);
  double err2 = (b[0] - b_star) * (b[0] - b_star), norm2 = b_star * b_star;
  for (int64_t j = 0; j < dim; ++j) {
    err2 += (w[j] - w_star[j]) * (w[j] - w_star[j]);
    norm2 += w_star[j] * w_star[j];
  }
  const double rel_error = std::sqrt(err2 / norm2);
  std::printf("rank %d final loss %.6g relative error %.6g\n", rank, loss, rel_error);
  if (!result.empty()) {
    std::ofstream out(absl::StrCat(result, ".rank", rank, ".json"));
    out << "{\"rank\": " << rank << ", \"steps\": " << steps << ", \"loss\": " << loss
        << ", \"relative_error\": " << rel_error << ", \"w0\": " << w[0] << "}\n";
  }
  return 0;
}
