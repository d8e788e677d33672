#include "server/ps_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/tensor_coding.h"

namespace psrt {

PsService::PsService(Store* store, Metrics* metrics, std::string token, int max_calls_per_worker)
    : store_(store),
      metrics_(metrics),
      token_(std::move(token)),
      rejected_(metrics->GetCounter("rejected_requests_total", "Requests refused as invalid")),
      saver_(store),
      max_calls_per_worker_(max_calls_per_worker),
      calls_(new std::atomic<int>[store->num_workers()]()) {}

absl::Status PsService::Enter(int worker, bool pull) {
  if (!store_->CheckWorker(worker).ok()) return absl::OkStatus();  // the store refuses it
  // A quarter of the calls are kept for pushes (and push-pulls), which
  // release waiting pulls: a worker's own pulls never starve its pushes.
  const int reserved = max_calls_per_worker_ > 1 ? (max_calls_per_worker_ + 3) / 4 : 0;
  const int limit = pull ? max_calls_per_worker_ - reserved : max_calls_per_worker_;
  const int before = calls_[worker].fetch_add(1, std::memory_order_relaxed);
  if (max_calls_per_worker_ > 0 && before >= limit) {
    calls_[worker].fetch_sub(1, std::memory_order_relaxed);
    if (pull) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "worker ", worker, " has ", before, " calls in flight to this server, the most a pull may find: its limit "
          "(limits.max_calls_per_worker) is ", max_calls_per_worker_, ", of which ", reserved,
          " are kept for pushes"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, " has ", before, " calls in flight to this server, its limit (limits.max_calls_per_worker)"));
  }
  return absl::OkStatus();
}

void PsService::Leave(int worker) {
  if (store_->CheckWorker(worker).ok()) calls_[worker].fetch_sub(1, std::memory_order_relaxed);
}

absl::Status PsService::Refused(const absl::Status& s) {
  if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded &&
      s.code() != absl::StatusCode::kCancelled && s.code() != absl::StatusCode::kUnavailable) {
    rejected_->Add();
    LogWarning("refused a request: ", s.ToString());
  }
  return s;
}

// A pull may wait for a version; it stops a little before the caller's
// deadline so that its answer, which says what it waited for, still arrives.
static absl::Time Deadline(const grpc::ServerContextBase* ctx) {
  const absl::Duration left = TimeLeft(ctx, absl::Hours(1));
  return absl::Now() + left - std::min(left / 10, absl::Milliseconds(500));
}

grpc::Status PsService::RegisterKeys(grpc::ServerContext* ctx, const v1::RegisterKeysRequest* req,
                                     v1::RegisterKeysResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return Finish(store_->RegisterKeys(
      *req, Deadline(ctx), [ctx] { return ctx->IsCancelled(); }, resp));
}

absl::Status PsService::ResolveShared(WireMessage* m) {
  absl::MutexLock lock(&regions_mu_);
  for (WireKey& k : m->keys) {
    if (!k.has_shared) continue;
    const std::string key = absl::StrCat("key '", k.variable, "#", k.partition, "'");
    auto it = regions_.find(k.shared.region);
    if (it == regions_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          key, " names shared-memory region ", k.shared.region, ", which is not attached here"));
    }
    if (it->second.rank != m->worker_rank) {
      return absl::PermissionDeniedError(
          absl::StrCat(key, ": shared-memory region ", k.shared.region, " belongs to worker ",
                       it->second.rank, ", not to worker ", m->worker_rank));
    }
    const SharedRegion& r = *it->second.memory;
    if (!r.Contains(k.shared.offset, std::max(k.shared.size, k.shared.capacity))) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": shared span [", k.shared.offset, ", +",
                                                     std::max(k.shared.size, k.shared.capacity),
                                                     ") lies outside its region of ", r.size(),
                                                     " bytes"));
    }
    if (k.shared.size > 0 && !k.data.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " carries values both in `data` and in shared memory"));
    }
    k.shared_at = r.data() + k.shared.offset;
    if (k.shared.size > 0) k.data.Add(absl::string_view(k.shared_at, k.shared.size));
  }
  return absl::OkStatus();
}

grpc::Status PsService::AttachSharedMemory(grpc::ServerContext* ctx,
                                           const v1::AttachSharedMemoryRequest* req,
                                           v1::AttachSharedMemoryResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  if (absl::Status s = store_->CheckWorker(req->worker_rank()); !s.ok()) return Finish(s);
  if (req->size() <= 0 || req->size() > kMaxSharedBytes) {
    return Finish(absl::InvalidArgumentError(absl::StrCat(
        "a shared-memory region has 1 to ", kMaxSharedBytes, " bytes; asked for ", req->size())));
  }
  {
    absl::MutexLock lock(&regions_mu_);
    if (regions_.size() >= kMaxRegions) {
      return Finish(absl::ResourceExhaustedError(
          absl::StrCat("this server already maps ", kMaxRegions, " shared-memory regions")));
    }
  }
  // A server on another host finds no such name: NOT_FOUND, and the worker
  // uses TCP with it (not an error worth counting).
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Attach(req->name(), req->size());
  if (!region.ok()) {
    return region.status().code() == absl::StatusCode::kNotFound ? ToGrpc(region.status())
                                                                 : Finish(region.status());
  }
  absl::MutexLock lock(&regions_mu_);
  const uint64_t id = next_region_++;
  regions_[id] = Region{req->worker_rank(), *std::move(region)};
  resp->set_region(id);
  LogInfo("worker ", req->worker_rank(), " shares ", req->size() >> 20,
          " MiB of memory with this server");
  return grpc::Status::OK;
}

// One per thread, reused: parsing a request allocates nothing once warm.
// A request is done with it before its handler returns.
static WireMessage& Scratch() {
  thread_local WireMessage message;
  return message;
}

void PsService::ServeData(FrameKind method, absl::string_view text, const grpc::ByteBuffer& req,
                          absl::Time deadline, std::function<bool()> cancelled, DataDone done) {
  if (method == FrameKind::kReplicate) {
    return done(ReplicateRefused(ReplicateFrame(text, req)), grpc::ByteBuffer(nullptr, 0));
  }
  WireMessage& msg = Scratch();
  absl::Status s = method == FrameKind::kPush       ? ParsePushRequest(req, &msg)
                   : method == FrameKind::kPull     ? ParsePullRequest(req, &msg)
                   : method == FrameKind::kPushPull ? ParsePushPullRequest(req, &msg)
                                                    : absl::InvalidArgumentError("no data method");
  if (s.ok()) s = Enter(msg.worker_rank, method == FrameKind::kPull);
  if (s.ok() && !(s = ResolveShared(&msg)).ok()) Leave(msg.worker_rank);
  if (!s.ok()) {
    msg.slices.clear();
    return done(Refused(s), grpc::ByteBuffer());
  }
  const int worker = msg.worker_rank;
  if (method == FrameKind::kPush) {
    s = store_->Push(msg);
    msg.slices.clear();
    Leave(worker);
    return done(Refused(s), grpc::ByteBuffer(nullptr, 0));  // an empty PushResponse
  }
  auto reply = [this, worker, done = std::move(done)](absl::Status s, std::vector<OutKey> keys) {
    grpc::ByteBuffer answer;
    if (s.ok()) answer = EncodeKeysResponse(keys);
    Leave(worker);
    done(Refused(s), std::move(answer));
  };
  if (method == FrameKind::kPull) {
    store_->PullAsync(msg, deadline, std::move(cancelled), std::move(reply));
  } else {
    store_->PushPullAsync(msg, deadline, std::move(cancelled), std::move(reply));
  }
  msg.slices.clear();  // the request's buffers may go now
}

grpc::ServerUnaryReactor* PsService::Serve(grpc::CallbackServerContext* ctx, FrameKind method,
                                           const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  ServeData(method, {}, *req, Deadline(ctx), [ctx] { return ctx->IsCancelled(); },
            [reactor, resp](const absl::Status& s, grpc::ByteBuffer answer) {
              if (s.ok()) *resp = std::move(answer);
              reactor->Finish(ToGrpc(s));
            });
  return reactor;
}

grpc::ServerUnaryReactor* PsService::Push(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  return Serve(ctx, FrameKind::kPush, req, resp);
}

grpc::ServerUnaryReactor* PsService::Pull(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  return Serve(ctx, FrameKind::kPull, req, resp);
}

grpc::ServerUnaryReactor* PsService::PushPull(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* req, grpc::ByteBuffer* resp) {
  return Serve(ctx, FrameKind::kPushPull, req, resp);
}

grpc::Status PsService::DataChannel(grpc::ServerContext* ctx, const v1::DataChannelRequest* req,
                                    v1::DataChannelResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  if (!req->from_server()) {
    if (absl::Status s = store_->CheckWorker(req->worker_rank()); !s.ok()) return Finish(s);
  }
  resp->set_port(data_port_.load());
  return grpc::Status::OK;
}

grpc::Status PsService::SetLearningRate(grpc::ServerContext* ctx,
                                        const v1::SetLearningRateRequest* req,
                                        v1::SetLearningRateResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  absl::StatusOr<int64_t> n = store_->SetLearningRate(*req);
  if (!n.ok()) return Finish(n.status());
  resp->set_keys_changed(*n);
  return grpc::Status::OK;
}

grpc::Status PsService::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                              v1::StatsResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  resp->set_num_keys(store_->num_keys());
  resp->set_bytes_stored(store_->bytes_stored());
  for (const auto& [name, value] : metrics_->Snapshot()) (*resp->mutable_metrics())[name] = value;
  for (int64_t c : store_->WorkerClocks()) resp->add_worker_clocks(c);
  resp->set_membership_epoch(store_->membership_epoch());
  const auto [lo, hi] = store_->VersionRange();
  resp->set_min_version(lo);
  resp->set_max_version(hi);
  return grpc::Status::OK;
}

grpc::Status PsService::Replicate(grpc::ServerContext* ctx, const v1::ReplicateRequest* req,
                                  v1::ReplicateResponse*) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return ToGrpc(ReplicateRefused(store_->Replicate(*req, req->gradient())));
}

absl::Status PsService::ReplicateRefused(const absl::Status& s) {
  // No copy here yet: expected while the sender builds it (it sends the
  // copy after), and the sender says so where it is not.
  return absl::IsNotFound(s) ? s : Refused(s);
}

absl::Status PsService::ReplicateFrame(absl::string_view text, const grpc::ByteBuffer& gradient) {
  v1::ReplicateRequest req;
  if (!req.ParseFromArray(text.data(), static_cast<int>(text.size())) || !req.gradient().empty()) {
    return absl::InvalidArgumentError(
        "a Replicate frame whose text is no ReplicateRequest without its gradient");
  }
  // The data channel reads a payload into one pooled buffer.
  std::vector<grpc::Slice> slices;
  if (gradient.Valid() && !gradient.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("a Replicate frame's gradient cannot be read");
  }
  if (slices.size() > 1) {
    return absl::InternalError("a Replicate frame's gradient arrived in pieces");
  }
  const absl::string_view bytes =
      slices.empty() ? absl::string_view()
                     : absl::string_view(reinterpret_cast<const char*>(slices[0].begin()),
                                         slices[0].size());
  return store_->Replicate(req, bytes);
}

grpc::Status PsService::Seed(grpc::ServerContext* ctx, const v1::SeedRequest* req, v1::SeedResponse*) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  return Finish(store_->Seed(*req));
}

grpc::Status PsService::SaveShard(grpc::ServerContext* ctx, const v1::SaveShardRequest* req,
                                  v1::SaveShardResponse* resp) {
  if (grpc::Status s = CheckToken(ctx, token_); !s.ok()) return s;
  absl::Status s = saver_.Save(*req, Deadline(ctx), resp);
  // A step already passed is the coordinator's cue to pick a later one.
  if (s.code() == absl::StatusCode::kFailedPrecondition) return ToGrpc(s);
  return Finish(s);
}

}  // namespace psrt
