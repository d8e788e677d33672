// The parameter server's request handling, fuzzed: a sequence of
// RegisterKeys, Push, Pull, PushPull, SetLearningRate, Replicate, Seed,
// membership changes and checkpoint snapshots against a real Store (sync,
// async or ssp), the data-path requests going through the wire parser as
// the server receives them. Mutations are structure-aware (calls.h): they
// change the decoded requests, so most reach the store's checks.
//
// Beyond "no crash, leak or undefined behaviour", oracles:
// - every snapshot the store encodes decodes (checkpoints are never
//   unreadable), and no call takes longer than its bounded wait;
// - state: a refused request (any error but a wait that ended) leaves the
//   store's bytes (a snapshot of every key: weights, slots, versions,
//   learning rates, rows) as they were;
// - hyperparameters: an accepted optimizer holds only values finite as
//   float32, and when they are all of moderate size (<= 1e18) one update of
//   a weight of 0.5 by a gradient of 0 or 1 leaves it finite, as does an
//   accepted learning rate for the keys it changes;
// - checkpoint paths: a SaveShard (snapshot calls naming a root_uri) is
//   accepted only for the one root the server is confined to, and answers
//   by its deadline.

#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "common/tensor_coding.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.pb.h"
#include "common/optimizer_proto.h"
#include "kernels/optimizer.h"
#include "server/checkpoint/shard_format.h"
#include "server/checkpoint_io.h"
#include "server/store.h"
#include "tests/fuzz/calls.h"

namespace psrt::fuzz {
namespace {

enum Kind : uint8_t { kRegister, kPush, kPull, kPushPull, kLearningRate, kReplicate, kSeed, kSnapshot, kMembers };

const std::vector<const google::protobuf::Message*>& Prototypes() {
  static const auto* p = new std::vector<const google::protobuf::Message*>{
      &v1::RegisterKeysRequest::default_instance(), &v1::PushRequest::default_instance(),
      &v1::PullRequest::default_instance(),         &v1::PushPullRequest::default_instance(),
      &v1::SetLearningRateRequest::default_instance(), &v1::ReplicateRequest::default_instance(),
      &v1::SeedRequest::default_instance(),         &v1::SaveShardRequest::default_instance(),
      &v1::Membership::default_instance()};
  return *p;
}

grpc::ByteBuffer Received(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A dense variable and a table that the mutated requests can name.
void RegisterBase(Store* store) {
  v1::RegisterKeysRequest req;
  v1::KeySpec* w = req.add_keys();
  w->set_variable("w");
  w->set_dtype(v1::DTYPE_FLOAT32);
  w->add_shape(16);
  w->set_num_elements(16);
  w->mutable_optimizer()->set_name("adam");
  w->mutable_optimizer()->set_lr(0.1);
  w->mutable_optimizer()->set_beta1(0.9);
  w->mutable_optimizer()->set_beta2(0.999);
  w->mutable_optimizer()->set_eps(1e-8);
  w->set_init(std::string(16 * 4, '\0'));
  v1::KeySpec* t = req.add_keys();
  t->set_variable("t");
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_shape(0);
  t->add_shape(4);
  t->mutable_optimizer()->set_name("adagrad");
  t->mutable_optimizer()->set_lr(0.1);
  t->mutable_optimizer()->set_eps(1e-10);
  t->mutable_table()->set_dim(4);
  t->mutable_table()->set_init_std(0.1);
  t->mutable_table()->set_max_rows(64);
  t->mutable_table()->set_evict_after_steps(4);
  t->mutable_table()->set_num_shards(1);
  if (!store->RegisterKeys(req).ok()) std::abort();
}

// Waits for a pull; its deadline is at most a sweep away.
void AwaitPull(const std::function<void(Store::PullDone)>& start, absl::Status* status) {
  absl::Notification done;
  start([&](absl::Status s, std::vector<OutKey>) {
    *status = std::move(s);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();  // a hang
}

// Every key's bytes as a checkpoint would hold them (nothing armed after).
std::string StateOf(Store* store) {
  std::string out;
  if (!store->ArmSnapshot(-1).ok()) std::abort();  // step < 0 is never refused
  store->WaitSnapshot(absl::Now());
  v1::SaveShardResponse info;
  store->EncodeSnapshot(&out, &info);
  return out;
}

// A refusal, as opposed to a wait that ended (its push part may have been
// applied) or a store that is closing.
bool Refusal(const absl::Status& s) {
  return !s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded &&
         s.code() != absl::StatusCode::kCancelled && s.code() != absl::StatusCode::kUnavailable;
}

void CheckHyperparameters(const OptimizerConfig& c, double lr) {
  if (c.kind == OptimizerKind::kAssign) return;
  const double values[] = {lr,   c.momentum, c.dampening, c.weight_decay, c.beta1,    c.beta2,
                           c.eps, c.lr_decay, c.initial_accumulator_value, c.l1, c.l2, c.ftrl_beta};
  bool moderate = true;
  for (double v : values) {
    if (!std::isfinite(static_cast<float>(v))) std::abort();  // accepted, yet not finite as float32
    moderate = moderate && std::fabs(v) <= 1e18;
  }
  if (!moderate || (c.kind == OptimizerKind::kFtrl && lr < 1e-18)) return;
  for (float g : {0.0f, 1.0f}) {
    float param = 0.5f, grad = g;
    std::vector<float> slots(NumSlots(c));
    std::vector<float*> ptrs;
    for (float& v : slots) ptrs.push_back(&v);
    InitSlots(c, ptrs.data(), 1);
    ApplyUpdate(c, lr, 1, &param, &grad, ptrs.data(), 1);
    if (!std::isfinite(param)) std::abort();  // finite inputs, a non-finite weight
  }
}

}  // namespace
}  // namespace psrt::fuzz

using namespace psrt;        // NOLINT
using namespace psrt::fuzz;  // NOLINT

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  fuzz::QuietLogs();
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return MutateCalls(data, size, max_size, seed, Prototypes());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Call> calls = DecodeCalls(data, size);
  if (calls.size() > 64) return 0;
  StoreOptions options;
  const int mode = static_cast<int>(size % 3);  // sync, async, ssp
  options.sync = mode == 0;
  options.staleness = mode == 2 ? 1 : -1;
  options.num_workers = 2;
  options.max_key_bytes = 1 << 16;
  options.max_bytes = 16 << 20;
  options.apply_threads = 1;
  options.max_pull_wait = absl::Milliseconds(5);
  Metrics metrics("psrt_server");
  Store store(options, &metrics);
  RegisterBase(&store);
  // Accepted optimizers (variable, config), for the hyperparameter oracle.
  std::vector<std::pair<std::string, OptimizerConfig>> optimizers;
  static const std::string root = absl::StrCat("file:///tmp/psrt-store-fuzz-", getpid());
  ShardSaver saver(&store);
  saver.Confine(root);
  for (const Call& call : calls) {
    std::unique_ptr<google::protobuf::Message> m(Prototypes()[call.kind % Prototypes().size()]->New());
    const bool parsed = m->ParseFromString(call.bytes);
    const absl::Time deadline = absl::Now() + absl::Milliseconds(1);
    const int kind = call.kind % Prototypes().size();
    const bool checked = kind != kSnapshot && kind != kMembers;
    const std::string before = checked ? StateOf(&store) : "";
    absl::Status status;
    switch (kind) {
      case kRegister:
        if (!parsed) break;
        status = store.RegisterKeys(static_cast<v1::RegisterKeysRequest&>(*m));
        if (status.ok()) {
          for (const v1::KeySpec& spec : static_cast<v1::RegisterKeysRequest&>(*m).keys()) {
            absl::StatusOr<OptimizerConfig> c = OptimizerFromProto(spec.optimizer());
            if (!c.ok()) std::abort();  // accepted, yet not a valid optimizer
            CheckHyperparameters(*c, c->lr);
            optimizers.emplace_back(spec.variable(), *c);
          }
        }
        break;
      case kPush: {  // as the server receives it: the wire parser, then the store
        WireMessage wire;
        if (ParsePushRequest(Received(call.bytes), &wire).ok()) status = store.Push(wire);
        break;
      }
      case kPull: {
        WireMessage wire;
        if (!ParsePullRequest(Received(call.bytes), &wire).ok()) break;
        AwaitPull([&](Store::PullDone done) {
          store.PullAsync(wire, deadline, [] { return false; }, std::move(done));
        }, &status);
        break;
      }
      case kPushPull: {
        WireMessage wire;
        if (!ParsePushPullRequest(Received(call.bytes), &wire).ok()) break;
        AwaitPull([&](Store::PullDone done) {
          store.PushPullAsync(wire, deadline, [] { return false; }, std::move(done));
        }, &status);
        break;
      }
      case kLearningRate: {
        if (!parsed) break;
        const auto& req = static_cast<v1::SetLearningRateRequest&>(*m);
        absl::StatusOr<int64_t> changed = store.SetLearningRate(req);
        status = changed.status();
        if (!changed.ok()) break;
        for (const auto& [variable, c] : optimizers) {
          if (req.variable().empty() || req.variable() == variable) CheckHyperparameters(c, req.lr());
        }
        break;
      }
      case kReplicate:
        if (parsed) {
          const auto& r = static_cast<v1::ReplicateRequest&>(*m);
          status = store.Replicate(r, r.gradient());
        }
        break;
      case kSeed:
        if (parsed) status = store.Seed(static_cast<v1::SeedRequest&>(*m));
        break;
      case kSnapshot: {
        if (!parsed) break;
        const auto& req = static_cast<v1::SaveShardRequest&>(*m);
        if (!req.root_uri().empty()) {  // as the server's SaveShard
          v1::SaveShardResponse resp;
          const absl::Time start = absl::Now();
          const absl::Status saved = saver.Save(req, start + absl::Milliseconds(5), &resp);
          if (saved.ok() && req.root_uri() != root) std::abort();  // written outside the job's root
          if (absl::Now() - start > absl::Seconds(2)) std::abort();  // outlived its deadline
          break;
        }
        if (!store.ArmSnapshot(req.step() < 0 ? -1 : req.step() % 8).ok()) break;
        store.WaitSnapshot(absl::Now());
        std::string shard;
        v1::SaveShardResponse info;
        store.EncodeSnapshot(&shard, &info);
        if (!DecodeShard(shard, "snapshot").ok()) std::abort();  // an unreadable checkpoint
        break;
      }
      case kMembers: {
        if (!parsed) break;
        const auto& req = static_cast<v1::Membership&>(*m);
        store.SetMembership(req.epoch(), std::vector<int>(req.active_workers().begin(), req.active_workers().end()));
        break;
      }
    }
    if (checked && Refusal(status) && StateOf(&store) != before) std::abort();  // refused, yet changed
  }
  return 0;
}
