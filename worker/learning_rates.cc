#include "worker/learning_rates.h"

namespace psrt {

void LearningRates::Registered(const std::string& name, double lr, bool known) {
  absl::MutexLock lock(&mu_);
  held_[name] = known ? std::optional<double>(lr) : std::nullopt;
}

bool LearningRates::Held(const std::string& variable, double lr) const {
  absl::MutexLock lock(&mu_);
  if (!variable.empty()) {
    auto it = held_.find(variable);
    return it != held_.end() && it->second == lr;
  }
  if (held_.empty()) return false;
  for (const auto& [name, held] : held_) {
    if (held != lr) return false;
  }
  return true;
}

void LearningRates::Sent(const std::string& variable, double lr) {
  absl::MutexLock lock(&mu_);
  if (!variable.empty()) {
    // A table stays untracked: its rate is sent whenever it is set.
    if (auto it = held_.find(variable); it != held_.end()) it->second = lr;
    return;
  }
  for (auto& [name, held] : held_) held = lr;
}

}  // namespace psrt
