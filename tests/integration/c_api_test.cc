// The C API that every framework plugin shares, driven the way a plugin
// drives it: this binary is started by psrt-run as the training process of a
// 2-worker job and talks to real servers through libpsrt_c.so alone.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/c_api.h"

namespace {

int failures = 0;
#define CHECK_OR_COUNT(cond, ...)                                            \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "c_api_test rank check failed: %s: ", #cond);     \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, " (last error: %s)\n", psrt_last_error());        \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

// psrt_allreduce over the job's 2 workers (servers that average): "a" from
// both, "b" from rank 1 only (rank 0 counts as zeros), "c" from neither; the
// group spans several keys (2,000 floats, 4 KiB partitions).
void CheckAllreduce(psrt_client* c, int rank) {
  constexpr int kA = 2000;
  std::vector<float> a(kA), b(3, 4.f), c_in(2, 9.f), a_out(kA, -1.f), b_out(3, -1.f), c_out(2, -1.f);
  for (int i = 0; i < kA; ++i) a[i] = (rank + 1.f) * i;
  const char* names[3] = {"a", "b", "c"};
  const int64_t sizes[3] = {kA, 3, 2};
  const float* in[3] = {a.data(), rank == 1 ? b.data() : nullptr, nullptr};
  float* out[3] = {a_out.data(), b_out.data(), c_out.data()};
  int given[3] = {-1, -1, -1};
  for (int op : {PSRT_REDUCE_MEAN, PSRT_REDUCE_SUM}) {
    const float factor = op == PSRT_REDUCE_MEAN ? 1.f : 2.f;  // the sum is twice the mean
    int servers_factor = -1;
    CHECK_OR_COUNT(psrt_allreduce(c, 3, names, sizes, in, out, given, op, PSRT_COMPRESSION_NONE,
                                  &servers_factor) == 0,
                   "allreduce op %d", op);
    CHECK_OR_COUNT(servers_factor == 1, "factor %d on servers that average", servers_factor);
    for (int i = 0; i < kA; ++i) {
      CHECK_OR_COUNT(a_out[i] == 1.5f * i * factor, "a[%d] = %g (op %d)", i, a_out[i], op);
    }
    for (float v : b_out) CHECK_OR_COUNT(v == 2.f * factor, "b = %g (op %d)", v, op);
    for (float v : c_out) CHECK_OR_COUNT(v == 0.f, "c = %g where no worker gave one", v);
    CHECK_OR_COUNT(given[0] == 1 && given[1] == 1 && given[2] == 0, "given %d %d %d", given[0],
                   given[1], given[2]);
  }
  // Another set with some of the same tensors: "b" alone, whose key is a
  // step ahead of "a"'s now.
  for (int round = 0; round < 2; ++round) {
    CHECK_OR_COUNT(psrt_allreduce(c, 1, names + 1, sizes + 1, in + 1, out + 1, given, PSRT_REDUCE_MEAN,
                                  PSRT_COMPRESSION_NONE, nullptr) == 0, "b alone");
    for (float v : b_out) CHECK_OR_COUNT(v == 2.f, "b alone = %g", v);
  }
  CHECK_OR_COUNT(psrt_allreduce(c, 3, names, sizes, in, out, given, PSRT_REDUCE_MEAN, PSRT_COMPRESSION_NONE,
                                nullptr) == 0, "the three again");
  CHECK_OR_COUNT(a_out[kA - 1] == 1.5f * (kA - 1) && b_out[0] == 2.f, "the three again: %g %g",
                 a_out[kA - 1], b_out[0]);
  // A refused call leaves the outputs alone.
  a_out[0] = -7.f;
  const int64_t bad_sizes[3] = {kA, 0, 2};
  CHECK_OR_COUNT(psrt_allreduce(c, 3, names, bad_sizes, in, out, given, PSRT_REDUCE_MEAN, 0, nullptr) == -3,
                 "a size of 0 accepted");
  CHECK_OR_COUNT(std::strstr(psrt_last_error(), "a size > 0") != nullptr, "message");
  CHECK_OR_COUNT(a_out[0] == -7.f, "a refused reduction wrote its output");
  CHECK_OR_COUNT(psrt_allreduce(c, 1, names, sizes, in, out, given, 5, 0, nullptr) == -3, "op 5 accepted");
}

// The training process: returns its exit code.
int Train() {
  psrt_client* c = psrt_connect_from_env();
  if (c == nullptr) {
    std::fprintf(stderr, "psrt_connect_from_env: %s\n", psrt_last_error());
    return 1;
  }
  const int rank = psrt_rank(c);
  CHECK_OR_COUNT(psrt_num_workers(c) == 2, "%d workers", psrt_num_workers(c));
  CHECK_OR_COUNT(psrt_num_servers(c) == 2, "%d servers", psrt_num_servers(c));
  CHECK_OR_COUNT(psrt_is_sync(c) == 1, "not sync");
  CHECK_OR_COUNT(psrt_averages(c) == 1, "the servers do not average");  // the default mean

  psrt_optimizer opt;
  CHECK_OR_COUNT(psrt_optimizer_defaults("sgd", 0.5, &opt) == 0, "defaults");
  CHECK_OR_COUNT(psrt_optimizer_defaults("lamb", 0.5, &opt) == -3, "lamb accepted");
  CHECK_OR_COUNT(std::strstr(psrt_last_error(), "accepted: sgd, adam, adamw, adagrad") != nullptr, "message");
  psrt_optimizer_defaults("sgd", 0.5, &opt);

  constexpr int kN = 5000;  // 20 KB: several keys with 4 KiB partitions
  const int64_t shape[2] = {50, 100};
  std::vector<float> w(kN), g(kN);
  for (int i = 0; i < kN; ++i) w[i] = rank == 0 ? i * 0.25f : -1e9f;
  CHECK_OR_COUNT(psrt_register(c, "w", shape, 2, w.data(), &opt, PSRT_COMPRESSION_JOB_DEFAULT, PSRT_COMPRESSION_NONE) == 0, "register");
  for (int i = 0; i < kN; ++i) CHECK_OR_COUNT(w[i] == i * 0.25f, "w[%d] = %g after register", i, w[i]);

  // Bad calls fail with a status and a message, and change nothing.
  CHECK_OR_COUNT(psrt_register(c, nullptr, shape, 2, w.data(), &opt, 0, 0) == -3, "NULL name");
  CHECK_OR_COUNT(psrt_register(c, "w2", shape, 2, w.data(), &opt, 7, 0) == -3, "compression 7");
  CHECK_OR_COUNT(std::strstr(psrt_last_error(), "PSRT_COMPRESSION_") != nullptr, "message");
  CHECK_OR_COUNT(psrt_pulled_version(c, "nope") < 0, "version of an unknown variable");
  CHECK_OR_COUNT(psrt_push(c, 0, nullptr, nullptr, 0) == -3, "no variables");
  const char* missing = "nope";
  const float* grads[1] = {g.data()};
  float* outs[1] = {w.data()};
  // Operations are asynchronous: their errors arrive with the wait.
  CHECK_OR_COUNT(psrt_wait(c, psrt_push(c, 1, &missing, grads, 0)) == -5, "unknown variable pushed");
  CHECK_OR_COUNT(std::strstr(psrt_last_error(), "'nope' is not registered") != nullptr, "message");
  CHECK_OR_COUNT(psrt_wait(c, 987654) == -5, "bogus handle");

  // Step 0: rank r pushes r + 1 everywhere; the mean is 1.5.
  for (int i = 0; i < kN; ++i) g[i] = rank + 1.f;
  const char* names[1] = {"w"};
  const int64_t h = psrt_push_pull(c, 1, names, grads, outs, 0);
  CHECK_OR_COUNT(h > 0, "push_pull handle %ld", static_cast<long>(h));
  CHECK_OR_COUNT(psrt_wait(c, h) == 0, "wait");
  for (int i = 0; i < kN; ++i) CHECK_OR_COUNT(w[i] == i * 0.25f - 0.75f, "w[%d] = %g after step 0", i, w[i]);
  CHECK_OR_COUNT(psrt_pulled_version(c, "w") == 1, "pulled version %ld", static_cast<long>(psrt_pulled_version(c, "w")));

  // The learning rate can change; step 1 then moves by 0.25 * 1.5.
  CHECK_OR_COUNT(psrt_set_learning_rate(c, "w", 0.25) == 0, "set lr");
  CHECK_OR_COUNT(psrt_wait(c, psrt_push(c, 1, names, grads, 1)) == 0, "push step 1");
  CHECK_OR_COUNT(psrt_wait(c, psrt_pull(c, 1, names, outs, 2)) == 0, "pull step 2");
  for (int i = 0; i < kN; ++i) {
    CHECK_OR_COUNT(w[i] == i * 0.25f - 0.75f - 0.375f, "w[%d] = %g after step 1", i, w[i]);
  }
  CheckAllreduce(c, rank);
  psrt_close(c);
  std::fprintf(stderr, "c_api_test rank %d: %d failed checks\n", rank, failures);
  return failures == 0 ? 0 : 1;
}

std::string self_path;

TEST(CApiTest, APluginsCallsWorkInARealJob) {
  const std::string cmd = std::string(PSRT_BIN_DIR) +
                          "/psrt-run --local=2 --distribution='{\"parameter_server\": {\"enabled\": true, "
                          "\"partition_bytes\": 4096}}' -- timeout 60 " + self_path + " 2>&1";
  std::FILE* p = popen(("timeout 90 " + cmd).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("c_api_test rank 0: 0 failed checks"), std::string::npos) << out;
  EXPECT_NE(out.find("c_api_test rank 1: 0 failed checks"), std::string::npos) << out;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("PSRT_COORDINATOR") != nullptr) return Train();
  char path[4096] = {};
  if (readlink("/proc/self/exe", path, sizeof(path) - 1) <= 0) return 1;
  self_path = path;
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
