// psrt-ckpt: lists, verifies and describes checkpoints, and asks a running
// job for one.
//
//   psrt-ckpt ls URI        checkpoints under a root (LATEST marked)
//   psrt-ckpt verify URI    reads every shard, checks every checksum
//   psrt-ckpt inspect URI   what a checkpoint holds (URI: a checkpoint, or a
//                           root for its LATEST)
//   psrt-ckpt save --coordinator=HOST:PORT   checkpoint a running job now
//   psrt-ckpt remove-server --coordinator=HOST:PORT --index=N
//                           move server N's keys to the job's other servers
//                           and let it go ("max_servers")
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/daemon.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/optimizer_proto.h"
#include "kernels/row_optimizer.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "server/checkpoint/catalog.h"

namespace psrt {
namespace {

constexpr char kUsage[] =
    "COMMAND [URI] [flags]\n"
    "  ls URI        list the checkpoints under a root URI (LATEST is marked *)\n"
    "  verify URI    read every shard of a checkpoint (or of every checkpoint\n"
    "                under a root) and check every checksum\n"
    "  inspect URI   print what a checkpoint holds (a root URI: its LATEST)\n"
    "  save          ask a running job's coordinator for a checkpoint now\n"
    "  remove-server move a server's keys to the other servers of a running\n"
    "                job, then let it go (the job needs \"max_servers\")\n"
    "URI: file:///path, /path or s3://bucket/prefix";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "psrt-ckpt: %s\n", std::string(s.message()).c_str());
  return 1;
}

// The checkpoint `uri` names, or nothing when it is a root.
absl::StatusOr<CheckpointRef> MaybeCheckpoint(const std::string& uri) {
  absl::StatusOr<CheckpointRef> ref = OpenCheckpoint(uri);
  if (absl::IsNotFound(ref.status()) || absl::IsInvalidArgument(ref.status())) {
    return absl::NotFoundError("a root");
  }
  return ref;
}

int List(const std::string& uri) {
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(NormalizeUri(uri));
  if (!root.ok()) return Fail(root.status());
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root->get());
  if (!all.ok()) return Fail(all.status());
  std::printf("%-2s%-20s %12s %14s  %s\n", "", "NAME", "STEP", "BYTES", "STATE");
  for (const CheckpointEntry& e : *all) {
    int64_t bytes = 0;
    for (const v1::ManifestShard& s : e.manifest.shards()) bytes += s.bytes();
    std::printf("%-2s%-20s %12s %14s  %s\n", e.latest ? "*" : "", e.name.c_str(),
                e.committed ? absl::StrCat(e.manifest.step()).c_str() : "-",
                e.committed ? absl::StrCat(bytes).c_str() : "-",
                e.committed ? "committed" : "incomplete (no manifest; never restored)");
  }
  if (all->empty()) std::printf("(no checkpoints under %s)\n", (*root)->uri().c_str());
  return 0;
}

int VerifyOne(Storage* root, const v1::Manifest& m) {
  absl::StatusOr<VerifyReport> r = VerifyCheckpoint(root, m);
  if (!r.ok()) {
    std::printf("FAILED %s/%s: %s\n", root->uri().c_str(), m.name().c_str(),
                std::string(r.status().message()).c_str());
    return 1;
  }
  std::printf("OK %s/%s: step %ld, %ld shards, %ld records, %ld bytes\n", root->uri().c_str(),
              m.name().c_str(), static_cast<long>(m.step()), static_cast<long>(r->shards),
              static_cast<long>(r->records), static_cast<long>(r->bytes));
  return 0;
}

int Verify(const std::string& uri) {
  absl::StatusOr<CheckpointRef> one = MaybeCheckpoint(uri);
  if (one.ok()) return VerifyOne(one->root.get(), one->manifest);
  if (!absl::IsNotFound(one.status())) return Fail(one.status());
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(NormalizeUri(uri));
  if (!root.ok()) return Fail(root.status());
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root->get());
  if (!all.ok()) return Fail(all.status());
  int failed = 0, committed = 0;
  for (const CheckpointEntry& e : *all) {
    if (!e.committed) continue;
    ++committed;
    failed += VerifyOne(root->get(), e.manifest);
  }
  if (committed == 0) return Fail(absl::NotFoundError(absl::StrCat("no checkpoint under ", (*root)->uri())));
  return failed == 0 ? 0 : 1;
}

int Inspect(const std::string& uri) {
  absl::StatusOr<CheckpointRef> ref = MaybeCheckpoint(uri);
  if (absl::IsNotFound(ref.status())) ref = ResolveCheckpoint("latest", uri);
  if (!ref.ok()) return Fail(ref.status());
  const v1::Manifest& m = ref->manifest;
  std::printf("checkpoint %s\n", ref->uri().c_str());
  std::printf("  step %ld, %s mode, written by %d servers at %s, partitions of at most %ld bytes\n",
              static_cast<long>(m.step()), m.mode().c_str(), m.num_servers(),
              absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                               absl::FromUnixSeconds(static_cast<int64_t>(m.created_unix_s())),
                               absl::UTCTimeZone()).c_str(),
              static_cast<long>(m.partition_bytes()));
  std::printf("  variables:\n");
  for (const v1::ManifestVariable& v : m.variables()) {
    int keys = 0;
    int64_t lo = INT64_MAX, hi = 0;
    for (const v1::ManifestKey& k : m.keys()) {
      if (k.variable() != v.name()) continue;
      ++keys;
      lo = std::min(lo, k.version());
      hi = std::max(hi, k.version());
    }
    const v1::OptimizerConfig& o = v.optimizer();
    if (v.has_table()) {
      int64_t rows = 0;
      for (const v1::ManifestKey& k : m.keys()) rows += k.variable() == v.name() ? k.rows() : 0;
      absl::StatusOr<OptimizerConfig> opt = OptimizerFromProto(o);
      const int64_t bytes = rows * v.table().dim() * 4 * (1 + (opt.ok() ? RowSlots(*opt) : 0));
      std::printf("    %-24s table of dim %ld, %s: %ld rows, %ld bytes with optimizer state, in %d parts, "
                  "version %s; optimizer %s lr=%g\n",
                  v.name().c_str(), static_cast<long>(v.table().dim()),
                  v.table().vocab() > 0 ? absl::StrCat("vocabulary ", v.table().vocab()).c_str() : "open hash",
                  static_cast<long>(rows), static_cast<long>(bytes), keys,
                  lo == hi ? absl::StrCat(lo).c_str() : absl::StrCat(lo, "..", hi).c_str(), o.name().c_str(), o.lr());
      continue;
    }
    std::printf("    %-24s shape [%s] %s, %d keys, version %s; optimizer %s lr=%g momentum=%g "
                "weight_decay=%g\n",
                v.name().c_str(), absl::StrJoin(v.shape(), ", ").c_str(),
                v1::DType_Name(v.dtype()).c_str(), keys,
                lo == hi ? absl::StrCat(lo).c_str() : absl::StrCat(lo, "..", hi).c_str(),
                o.name().c_str(), o.lr(), o.momentum(), o.weight_decay());
  }
  std::printf("  shards:\n");
  for (const v1::ManifestShard& s : m.shards()) {
    std::printf("    %-44s %12ld bytes, %ld records, crc32c %08x\n", s.path().c_str(),
                static_cast<long>(s.bytes()), static_cast<long>(s.num_records()), s.crc32c());
  }
  return 0;
}

// The commands that ask a running job's coordinator: its flags, then `call`
// with a stub and a context bounded by --timeout.
int AskCoordinator(const char* command, const char* what, int argc, char** argv, int* index,
                   const std::function<int(v1::Coordinator::Stub*, grpc::ClientContext*)>& call) {
  std::string coordinator = EnvOr("PSRT_COORDINATOR", "");
  std::string token = EnvOr("PSRT_JOB_TOKEN", "");
  double timeout_s = 600;
  const std::string name = absl::StrCat("psrt-ckpt ", command);
  Flags flags(name, index != nullptr ? "--coordinator=HOST:PORT --index=N [--token=T]"
                                     : "--coordinator=HOST:PORT [--token=T]");
  flags.Add("coordinator", &coordinator, "The job's psrt-coordinator (env PSRT_COORDINATOR).");
  flags.Add("token", &token, "The job token (env PSRT_JOB_TOKEN).");
  flags.Add("timeout", &timeout_s, absl::StrCat("Seconds to wait for ", what, "."));
  if (index != nullptr) flags.Add("index", index, "The server to remove.");
  flags.ParseOrExit(argc, argv);
  if (coordinator.empty() || timeout_s <= 0 || (index != nullptr && *index < 0)) {
    std::fprintf(stderr, "%s: need --coordinator%s and --timeout > 0\n", name.c_str(),
                 index != nullptr ? ", --index >= 0" : "");
    return 2;
  }
  if (absl::Status s = InitTransportSecurity(); !s.ok()) return Fail(s);
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, token, absl::Seconds(timeout_s));
  return call(stub.get(), &ctx);
}

int FailRpc(const grpc::Status& s) {
  return Fail(absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message()));
}

int Save(int argc, char** argv) {
  return AskCoordinator("save", "the checkpoint to be committed", argc, argv, nullptr,
                        [](v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
                          v1::CheckpointResponse resp;
                          grpc::Status s = stub->Checkpoint(ctx, v1::CheckpointRequest(), &resp);
                          if (!s.ok()) return FailRpc(s);
                          std::printf("%s %s (step %ld)\n",
                                      resp.already_saved() ? "already saved" : "committed",
                                      resp.uri().c_str(), static_cast<long>(resp.step()));
                          return 0;
                        });
}

int RemoveServer(int argc, char** argv) {
  int index = -1;
  return AskCoordinator("remove-server", "the server to leave", argc, argv, &index,
                        [&](v1::Coordinator::Stub* stub, grpc::ClientContext* ctx) {
                          v1::RemoveServerRequest req;
                          req.set_index(index);
                          v1::RemoveServerResponse resp;
                          grpc::Status s = stub->RemoveServer(ctx, req, &resp);
                          if (!s.ok()) return FailRpc(s);
                          std::printf("server %d left the job; its keys are on server%s %s\n",
                                      index, resp.moved_to_size() == 1 ? "" : "s",
                                      absl::StrJoin(resp.moved_to(), ", ").c_str());
                          return 0;
                        });
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "save") return psrt::Save(argc - 1, argv + 1);
  if (command == "remove-server") return psrt::RemoveServer(argc - 1, argv + 1);
  if (command == "--help" || command == "-h") {
    std::printf("usage: psrt-ckpt %s\n", psrt::kUsage);
    return 0;
  }
  if ((command != "ls" && command != "verify" && command != "inspect") || argc != 3) {
    std::fprintf(stderr, "usage: psrt-ckpt %s\n", psrt::kUsage);
    return 2;
  }
  const std::string uri = argv[2];
  if (command == "ls") return psrt::List(uri);
  if (command == "verify") return psrt::Verify(uri);
  return psrt::Inspect(uri);
}
