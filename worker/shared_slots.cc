#include "worker/shared_slots.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/failpoint.h"
#include "common/logging.h"

namespace psrt {

uint64_t SharedSlots::Lease::region() const { return link_->id; }

char* SharedSlots::Lease::base() const { return link_->region->data() + offset(); }

const char* SharedSlots::Lease::at(int64_t offset) const { return link_->region->data() + offset; }

void SharedSlots::Offer(int rank, int servers, const std::function<bool(int)>& skip,
                        const Attach& attach) {
  links_.resize(servers);
  std::vector<int> with;
  std::string why_not;
  for (int s = 0; s < servers; ++s) {
    if (skip(s)) continue;  // joins later
    absl::StatusOr<std::unique_ptr<SharedRegion>> region =
        SharedRegion::Create(kSlots * kRequestBytes);
    absl::Status st = region.status();
    uint64_t id = 0;
    if (st.ok()) {
      absl::StatusOr<uint64_t> attached =
          attach(s, (*region)->name(), static_cast<int64_t>((*region)->size()));
      st = attached.status();
      if (st.ok()) id = *attached;
      Failpoint("shared_memory.offered");  // drills: the name left in /dev/shm
      (*region)->Unlink();                 // attached or not, nobody else may open it now
      // Its pages only now: a server on another host cost nothing above.
      if (st.ok()) st = (*region)->Reserve();
    }
    if (!st.ok()) {
      if (why_not.empty()) why_not = std::string(st.message());
      continue;
    }
    auto link = std::make_unique<Link>();
    link->region = *std::move(region);
    link->id = id;
    {
      absl::MutexLock lock(&link->mu);  // not shared yet; the lock is for the analysis
      for (int i = kSlots - 1; i >= 0; --i) link->free_slots.push_back(i);
    }
    links_[s] = std::move(link);
    with.push_back(s);
  }
  if (static_cast<int>(with.size()) == servers) {
    LogInfo("worker ", rank, ": tensors travel through shared memory with every server");
  } else {
    LogInfo("worker ", rank, ": ",
            with.empty() ? "TCP with every server"
                         : absl::StrCat("shared memory with servers ", absl::StrJoin(with, ", "),
                                        ", TCP with the others"),
            " (", why_not, ")");
  }
}

SharedSlots::Lease SharedSlots::Take(int s) {
  Lease l;
  if (!Has(s)) return l;
  Link* link = links_[s].get();
  absl::MutexLock lock(&link->mu);
  if (link->free_slots.empty()) return l;  // all busy: this one goes by TCP
  l.link_ = link;
  l.slot_ = link->free_slots.back();
  link->free_slots.pop_back();
  return l;
}

void SharedSlots::Give(Lease* l, bool ok) {
  if (l->link_ == nullptr) return;
  if (ok) {
    absl::MutexLock lock(&l->link_->mu);
    l->link_->free_slots.push_back(l->slot_);
  }
  l->link_ = nullptr;
}

}  // namespace psrt
