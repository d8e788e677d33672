// A trainer without a framework: linear regression on generated data whose
// exact solution is known, trained through psrt's servers.
//
// Every rank draws its own batches of x ~ N(0, 1) with y = x.w* + b*, where
// w*_j = sin(j + 1) and b* = 0.5, and minimises the mean squared error. The
// data has no noise, so the weights converge to (w*, b*) exactly.
//
// With --table-rows=N each sample also has an id in [0, N) whose offset
// t*_id = cos(id) / 2 adds to y; the offsets are learned as the rows (of one
// value) of a sparse table, pulled and pushed by id.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "worker/client.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "linear_regression: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t dim = 64, batch = 32, steps = 200, log_every = 50, exit_at_step = -1, exit_rank = -1;
  int64_t slow_rank = -1, reference_workers = 0, late_rank = -1, table_rows = 0;
  double lr = 0.1, slowdown = 1, late_s = 0;
  std::string optimizer = "sgd", result, loss_log, aggregation = "mean";
  psrt::Flags flags("psrt-example-linreg", "[flags]  (run under psrt-run)");
  flags.Add("dim", &dim, "Number of features (weights).");
  flags.Add("batch", &batch, "Samples per step on each worker.");
  flags.Add("steps", &steps, "Training steps.");
  flags.Add("lr", &lr, "Learning rate of the server-side optimizer.");
  flags.Add("optimizer", &optimizer, "sgd, momentum, nesterov, adam, adamw or adagrad.");
  flags.Add("log-every", &log_every, "Print the loss every this many steps (rank 0).");
  flags.Add("result", &result, "Write the final loss and error of each rank to RESULT.rankN.json.");
  flags.Add("exit-at-step", &exit_at_step,
            "Exit with code 3 at this step (failure drills; not after a restart or recovery); -1: never.");
  flags.Add("exit-rank", &exit_rank, "The rank that exits at --exit-at-step; -1: every rank.");
  flags.Add("slow-rank", &slow_rank, "This rank computes --slowdown times slower; -1: none.");
  flags.Add("slowdown", &slowdown, "How much slower --slow-rank computes (>= 1).");
  flags.Add("late-rank", &late_rank, "This rank joins --late-seconds after the others (elastic jobs); -1: none.");
  flags.Add("late-seconds", &late_s, "How late --late-rank joins.");
  flags.Add("loss-log", &loss_log, "Rank 0 appends 'seconds step loss' lines to this file.");
  flags.Add("reference", &reference_workers,
            "Run without psrt as one process applying the aggregate gradient of this many workers' "
            "batches each step (sync's exact equivalent), and write RESULT.reference.*.");
  flags.Add("table-rows", &table_rows,
            "Learn per-id offsets of y in a sparse table of this many rows (0: none).");
  flags.Add("aggregation", &aggregation, "With --reference: mean or sum of the workers' gradients.");
  flags.ParseOrExit(argc, argv);
  if (dim <= 0 || batch <= 0 || steps < 0 || lr <= 0 || log_every <= 0 || slowdown < 1 ||
      reference_workers < 0 || late_s < 0 || (aggregation != "mean" && aggregation != "sum") ||
      table_rows < 0 || (table_rows > 0 && reference_workers > 0)) {
    std::fprintf(stderr,
                 "linear_regression: --dim, --batch, --lr and --log-every must be > 0, --steps, "
                 "--reference, --table-rows and --late-seconds >= 0, --slowdown >= 1, "
                 "--aggregation mean or sum; --reference runs without a table\n");
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

  std::vector<float> w_star(dim);
  for (int64_t j = 0; j < dim; ++j) w_star[j] = static_cast<float>(std::sin(j + 1.0));
  const float b_star = 0.5f;

  // One worker's data stream and gradient, identical in psrt and reference runs.
  struct Shard {
    std::mt19937_64 rng;
    std::normal_distribution<float> normal;
    std::vector<float> x, y;
    std::mt19937_64 id_rng;
    std::vector<int64_t> id;     // per sample (--table-rows)
    std::vector<int64_t> ids;    // the batch's ids, each once, sorted
    std::vector<int32_t> which;  // per sample: its id's place in ids
  };
  auto make_shard = [&](int rank) {
    return Shard{std::mt19937_64(1000 + rank), {}, std::vector<float>(batch * dim),
                 std::vector<float>(batch), std::mt19937_64(2000 + rank), std::vector<int64_t>(batch)};
  };
  auto t_star = [](int64_t id) { return 0.5 * std::cos(static_cast<double>(id)); };
  auto draw = [&](Shard& d) {
    for (int64_t i = 0; i < batch; ++i) {
      double yi = b_star;
      if (table_rows > 0) {
        d.id[i] = static_cast<int64_t>(d.id_rng() % static_cast<uint64_t>(table_rows));
        yi += t_star(d.id[i]);
      }
      for (int64_t j = 0; j < dim; ++j) {
        d.x[i * dim + j] = d.normal(d.rng);
        yi += d.x[i * dim + j] * w_star[j];
      }
      d.y[i] = static_cast<float>(yi);
    }
    if (table_rows == 0) return;
    d.ids = d.id;
    std::sort(d.ids.begin(), d.ids.end());
    d.ids.erase(std::unique(d.ids.begin(), d.ids.end()), d.ids.end());
    d.which.resize(batch);
    for (int64_t i = 0; i < batch; ++i) {
      d.which[i] = static_cast<int32_t>(std::lower_bound(d.ids.begin(), d.ids.end(), d.id[i]) - d.ids.begin());
    }
  };
  // Mean squared error / 2 on the shard's batch; fills the gradients if asked.
  // `t`: the rows of the batch's ids (--table-rows), `gt` their gradients.
  auto loss_on = [&](const Shard& d, const std::vector<float>& w, const std::vector<float>& b,
                     std::vector<float>* gw, std::vector<float>* gb,
                     const std::vector<float>* t = nullptr, std::vector<float>* gt = nullptr) {
    double loss = 0;
    if (gw != nullptr) {
      std::fill(gw->begin(), gw->end(), 0.f);
      (*gb)[0] = 0;
    }
    if (gt != nullptr) gt->assign(d.ids.size(), 0.f);
    for (int64_t i = 0; i < batch; ++i) {
      const float* xi = &d.x[i * dim];
      double pred = b[0];
      if (t != nullptr) pred += (*t)[d.which[i]];
      for (int64_t j = 0; j < dim; ++j) pred += xi[j] * w[j];
      const double err = pred - d.y[i];
      loss += 0.5 * err * err / batch;
      if (gw != nullptr) {
        for (int64_t j = 0; j < dim; ++j) (*gw)[j] += static_cast<float>(err * xi[j] / batch);
        (*gb)[0] += static_cast<float>(err / batch);
      }
      if (gt != nullptr) (*gt)[d.which[i]] += static_cast<float>(err / batch);
    }
    return loss;
  };
  auto relative_error = [&](const std::vector<float>& w, const std::vector<float>& b) {
    double err2 = (b[0] - b_star) * (b[0] - b_star), norm2 = b_star * b_star;
    for (int64_t j = 0; j < dim; ++j) {
      err2 += (w[j] - w_star[j]) * (w[j] - w_star[j]);
      norm2 += w_star[j] * w_star[j];
    }
    return std::sqrt(err2 / norm2);
  };
  auto write_result = [&](const std::string& who, double loss, const std::vector<float>& w,
                          const std::vector<float>& b, const std::vector<float>& t = {}) {
    if (result.empty()) return;
    std::ofstream out(absl::StrCat(result, ".", who, ".json"));
    out << "{\"who\": \"" << who << "\", \"steps\": " << steps << ", \"loss\": " << loss
        << ", \"relative_error\": " << relative_error(w, b) << ", \"w0\": " << w[0] << "}\n";
    std::ofstream weights(absl::StrCat(result, ".", who, ".weights"), std::ios::binary);
    weights.write(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
    weights.write(reinterpret_cast<const char*>(b.data()), sizeof(float));
    weights.write(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  };

  if (reference_workers > 0) {
    // What sync training computes, in one process: the aggregate of every
    // worker's gradient at the same weights, then one plain SGD step, in the
    // same float arithmetic as the servers.
    if (optimizer != "sgd") {
      std::fprintf(stderr, "linear_regression: --reference supports --optimizer=sgd\n");
      return 2;
    }
    std::vector<Shard> shards;
    for (int r = 0; r < reference_workers; ++r) shards.push_back(make_shard(r));
    std::vector<float> w(dim, 0.f), b(1, 0.f), gw(dim), gb(1), sw(dim), sb(1);
    const float lr_f = static_cast<float>(lr);
    const float scale = aggregation == "mean" ? 1.0f / reference_workers : 1.0f;
    for (int64_t step = 0; step < steps; ++step) {
      for (int r = 0; r < reference_workers; ++r) {
        draw(shards[r]);
        loss_on(shards[r], w, b, &gw, &gb);
        for (int64_t j = 0; j < dim; ++j) sw[j] = r == 0 ? gw[j] : sw[j] + gw[j];
        sb[0] = r == 0 ? gb[0] : sb[0] + gb[0];
      }
      if (reference_workers > 1 && scale != 1.0f) {
        for (float& v : sw) v *= scale;
        sb[0] *= scale;
      }
      for (int64_t j = 0; j < dim; ++j) w[j] -= lr_f * sw[j];
      b[0] -= lr_f * sb[0];
    }
    draw(shards[0]);
    const double loss = loss_on(shards[0], w, b, nullptr, nullptr);
    std::printf("reference final loss %.6g relative error %.6g\n", loss, relative_error(w, b));
    write_result("reference", loss, w, b);
    return 0;
  }

  absl::StatusOr<psrt::ClientOptions> options = psrt::ClientOptions::FromEnv();
  if (!options.ok()) return Fail(options.status());
  if (options->rank == late_rank) absl::SleepFor(absl::Seconds(late_s));
  absl::StatusOr<std::unique_ptr<psrt::Client>> client = psrt::Client::Connect(*options);
  if (!client.ok()) return Fail(client.status());
  psrt::Client& c = **client;
  const int rank = c.rank();
  // Restarted by its agent, or started again by a recovery.
  auto env_int = [](const char* name) { return std::atoi(std::getenv(name) ? std::getenv(name) : "0"); };
  const bool restarted = env_int("PSRT_RESTART_COUNT") > 0 || env_int("PSRT_GENERATION") > 1;

  // Rank 0's initial value wins; the others start from garbage to show it.
  std::vector<float> w(dim, rank == 0 ? 0.f : 1e3f), b(1, rank == 0 ? 0.f : -1e3f);
  if (absl::Status s = c.RegisterVariable("weight", {dim}, w.data(), opt); !s.ok()) return Fail(s);
  if (absl::Status s = c.RegisterVariable("bias", {1}, b.data(), opt); !s.ok()) return Fail(s);
  if (table_rows > 0) {
    psrt::TableOptions table;
    table.dim = 1;
    table.vocab = table_rows;
    table.init_std = 0;
    table.optimizer = opt;
    if (absl::Status s = c.RegisterTable("offset", table); !s.ok()) return Fail(s);
  }
  std::vector<float> t, gt;  // the step's rows and their gradients
  auto rows_of = [&](std::vector<float>& v) { return table_rows > 0 ? &v : nullptr; };

  Shard shard = make_shard(rank);
  std::vector<float> gw(dim), gb(1);
  std::FILE* loss_file = rank == 0 && !loss_log.empty() ? std::fopen(loss_log.c_str(), "a") : nullptr;
  // A line a step, written as it comes: benchmarks time the first step by it.
  if (loss_file != nullptr) std::setvbuf(loss_file, nullptr, _IOLBF, 1 << 12);
  const absl::Time start = absl::Now();
  // Sync: the step is the least version pulled (a rejoining worker picks up
  // where the job is, and one that pulled while the others were inside a step
  // never pushes for a version a key has not reached; a backup worker whose
  // push came late skips ahead). Async and ssp: the step is this worker's clock.
  auto pulled_version = [&c](int64_t otherwise) {
    return std::min(c.PulledVersion("weight").value_or(otherwise),
                    c.PulledVersion("bias").value_or(otherwise));
  };
  int64_t step = c.sync() ? pulled_version(0) : c.restored_step();
  // Resumed from a checkpoint: skip the batches of the steps already done, so
  // the job goes on as if it had never stopped.
  for (int64_t i = 0; i < step; ++i) draw(shard);
  double loss = 0;
  while (step < steps) {
    if (step == exit_at_step && (exit_rank < 0 || exit_rank == rank) && !restarted) {
      std::fprintf(stderr, "linear_regression: rank %d exits at step %ld as asked\n", rank, static_cast<long>(step));
      return 3;
    }
    const absl::Time compute_start = absl::Now();
    draw(shard);
    if (table_rows > 0) {
      t.resize(shard.ids.size());
      const int64_t n = static_cast<int64_t>(shard.ids.size());
      if (absl::Status s = c.Wait(c.PullRows("offset", shard.ids.data(), n, t.data(), step)); !s.ok()) {
        return Fail(s);
      }
    }
    loss = loss_on(shard, w, b, &gw, &gb, rows_of(t), rows_of(gt));
    if (rank == slow_rank) absl::SleepFor((slowdown - 1) * (absl::Now() - compute_start));
    psrt::Client::Handle rows = 0;
    if (table_rows > 0) {
      rows = c.PushRows("offset", shard.ids.data(), static_cast<int64_t>(shard.ids.size()), gt.data(), step);
    }
    psrt::Client::Handle h = c.PushPull({{"weight", gw.data(), w.data()}, {"bias", gb.data(), b.data()}}, step);
    if (absl::Status s = c.Wait(h); !s.ok()) return Fail(s);
    if (table_rows > 0) {
      if (absl::Status s = c.Wait(rows); !s.ok()) return Fail(s);
    }
    if (rank == 0 && (step % log_every == 0 || step == steps - 1)) {
      std::printf("step %ld loss %.6g\n", static_cast<long>(step), loss);
      std::fflush(stdout);
    }
    if (loss_file != nullptr) {
      std::fprintf(loss_file, "%.6f %ld %.9g\n", absl::ToDoubleSeconds(absl::Now() - start),
                   static_cast<long>(step), loss);
    }
    step = c.sync() ? pulled_version(step + 1) : step + 1;
  }
  if (loss_file != nullptr) std::fclose(loss_file);
  // Final weights: in sync mode every rank reads the same version.
  if (absl::Status s = c.Wait(c.Pull({{"weight", nullptr, w.data()}, {"bias", nullptr, b.data()}},
                                     c.sync() ? steps : step));
      !s.ok()) {
    return Fail(s);
  }
  std::vector<float> t_all;  // every row of the table, by id
  if (table_rows > 0) {
    std::vector<int64_t> all(table_rows);
    for (int64_t id = 0; id < table_rows; ++id) all[id] = id;
    t_all.resize(table_rows);
    if (absl::Status s = c.Wait(c.PullRows("offset", all.data(), table_rows, t_all.data(), c.sync() ? steps : 0));
        !s.ok()) {
      return Fail(s);
    }
  }
  draw(shard);
  t.resize(shard.ids.size());
  for (size_t i = 0; i < shard.ids.size(); ++i) t[i] = t_all[shard.ids[i]];
  loss = loss_on(shard, w, b, nullptr, nullptr, rows_of(t));
  std::printf("rank %d final loss %.6g relative error %.6g\n", rank, loss, relative_error(w, b));
  write_result(absl::StrCat("rank", rank), loss, w, b, t_all);
  if (!std::isfinite(loss) || !std::isfinite(relative_error(w, b))) {
    std::fprintf(stderr, "linear_regression: rank %d ended with a loss of %g: training diverged\n", rank, loss);
    return 4;
  }
  return 0;
}
