// The parameter server's request handling, fuzzed: a sequence of
// RegisterKeys, Push, Pull, PushPull, SetLearningRate, Replicate, Seed,
// membership changes and checkpoint snapshots against a real Store (sync,
// async or ssp), the data-path requests going through the wire parser as
// the server receives them. Mutations are structure-aware (calls.h): they
// change the decoded requests, so most reach the store's checks.
//
// Beyond "no crash, leak or undefined behaviour": every snapshot the store
// encodes must decode (checkpoints are never unreadable), and no call may
// take longer than its bounded wait.

#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "common/tensor_coding.h"
#include "psrt/v1/coordinator.pb.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/shard_format.h"
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
void AwaitPull(const std::function<void(Store::PullDone)>& start) {
  absl::Notification done;
  start([&](absl::Status, std::vector<OutKey>) { done.Notify(); });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) std::abort();  // a hang
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
  for (const Call& call : calls) {
    std::unique_ptr<google::protobuf::Message> m(Prototypes()[call.kind % Prototypes().size()]->New());
    const bool parsed = m->ParseFromString(call.bytes);
    const absl::Time deadline = absl::Now() + absl::Milliseconds(1);
    switch (call.kind % Prototypes().size()) {
      case kRegister:
        if (parsed) (void)store.RegisterKeys(static_cast<v1::RegisterKeysRequest&>(*m));
        break;
      case kPush: {  // as the server receives it: the wire parser, then the store
        WireMessage wire;
        if (ParsePushRequest(Received(call.bytes), &wire).ok()) (void)store.Push(wire);
        break;
      }
      case kPull: {
        WireMessage wire;
        if (!ParsePullRequest(Received(call.bytes), &wire).ok()) break;
        AwaitPull([&](Store::PullDone done) {
          store.PullAsync(wire, deadline, [] { return false; }, std::move(done));
        });
        break;
      }
      case kPushPull: {
        WireMessage wire;
        if (!ParsePushPullRequest(Received(call.bytes), &wire).ok()) break;
        AwaitPull([&](Store::PullDone done) {
          store.PushPullAsync(wire, deadline, [] { return false; }, std::move(done));
        });
        break;
      }
      case kLearningRate:
        if (parsed) (void)store.SetLearningRate(static_cast<v1::SetLearningRateRequest&>(*m));
        break;
      case kReplicate:
        if (parsed) (void)store.Replicate(static_cast<v1::ReplicateRequest&>(*m));
        break;
      case kSeed:
        if (parsed) (void)store.Seed(static_cast<v1::SeedRequest&>(*m));
        break;
      case kSnapshot: {
        if (!parsed) break;
        const auto& req = static_cast<v1::SaveShardRequest&>(*m);
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
  }
  return 0;
}
