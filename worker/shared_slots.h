#ifndef PSRT_WORKER_SHARED_SLOTS_H_
#define PSRT_WORKER_SHARED_SLOTS_H_

// A worker's shared memory with the servers on its host: per server a
// region of kSlots slots of kRequestBytes, one per request in flight, each
// leased by one request at a time. A server elsewhere (or one the offer
// failed for) has none: its requests go by TCP.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"
#include "worker/request_codec.h"

namespace psrt {

class SharedSlots {
  struct Link;

 public:
  // Slots per server: one for each request a server's window holds.
  static constexpr int kSlots = 8;

  // A slot of a server's region, held by one request (none: TCP).
  class Lease {
   public:
    bool held() const { return link_ != nullptr; }
    uint64_t region() const;  // the server's id of the region
    char* base() const;       // the slot
    int64_t offset() const { return static_cast<int64_t>(slot_) * kRequestBytes; }
    // Where `offset` (in the region) lies in this process.
    const char* at(int64_t offset) const;

   private:
    friend class SharedSlots;
    Link* link_ = nullptr;
    int slot_ = -1;
  };

  // Asks a server to attach the region `name` of `size` bytes: its id for
  // the region, or why not.
  using Attach =
      std::function<absl::StatusOr<uint64_t>(int server, const std::string& name, int64_t size)>;
  // Offers each of `servers` servers but those `skip` names (not joined
  // yet) a region and says in one line, as worker `rank`, which servers it
  // is used with. Called once, before any request.
  void Offer(int rank, int servers, const std::function<bool(int)>& skip, const Attach& attach);

  // Whether server `s` shares a region with this process.
  bool Has(int s) const { return s < static_cast<int>(links_.size()) && links_[s] != nullptr; }

  // A free slot of server `s`'s region: none when it has no region or every
  // slot is busy.
  Lease Take(int s);

  // Gives a slot back after its call ended well. After a failed call the
  // server might still write into it, so it is never used again.
  static void Give(Lease* l, bool ok);

 private:
  struct Link {
    std::unique_ptr<SharedRegion> region;
    uint64_t id = 0;
    absl::Mutex mu;
    std::vector<int> free_slots ABSL_GUARDED_BY(mu);
  };
  std::vector<std::unique_ptr<Link>> links_;  // per server (null: TCP)
};

}  // namespace psrt

#endif  // PSRT_WORKER_SHARED_SLOTS_H_
