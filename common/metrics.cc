// Copyright 2024 The psrt Authors.

#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

// Registration mistakes are programming errors that a test run should catch,
// so fail loudly instead of handing out a pointer the caller cannot use.
[[noreturn]] void DieRegistration(const std::string& message) {
  std::fprintf(stderr, "psrt::Metrics: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

std::vector<double> NormalizeBounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(),
                     [](double b) {
                       return std::isnan(b) ||
                              b == std::numeric_limits<double>::infinity();
                     }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

// HELP text escaping per the 0.0.4 format: only backslash and newline.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string FormatPrometheusDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // 15 significant digits always round-trip a decimal that short, so the
  // first precision that reproduces `v` gives the shortest form ("0.1", not
  // "0.10000000000000001"); 17 always succeeds.
  char buf[32];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(NormalizeBounds(std::move(bounds))),
      buckets_(new std::atomic<int64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    buckets_[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::Observe(double v) {
  // First bound >= v is the bucket (Prometheus "le" semantics). NaN compares
  // false with everything, so route it to +Inf explicitly.
  const size_t index =
      std::isnan(v) ? bounds_.size()
                    : static_cast<size_t>(
                          std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                          bounds_.begin());
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  // No fetch_add for atomic<double> before C++20.
  double old_sum = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(old_sum, old_sum + v,
                                     std::memory_order_relaxed)) {
  }
}

std::vector<int64_t> Histogram::bucket_counts() const {
  std::vector<int64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

int64_t Histogram::count() const {
  int64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
  }
  return total;
}

Metrics::Metrics(std::string prefix) : prefix_(std::move(prefix)) {
  if (!prefix_.empty() && !IsValidMetricName(prefix_)) {
    DieRegistration(absl::StrCat("invalid metric prefix \"", prefix_, "\""));
  }
}

Metrics::~Metrics() = default;

Metrics::EntryMap::iterator Metrics::FindOrCreate(absl::string_view name,
                                                  absl::string_view help,
                                                  Type type, bool* created) {
  if (!IsValidMetricName(name)) {
    DieRegistration(absl::StrCat("invalid metric name \"", name, "\""));
  }
  std::string full_name =
      prefix_.empty() ? std::string(name) : absl::StrCat(prefix_, "_", name);
  auto [it, inserted] = entries_.try_emplace(std::move(full_name));
  Entry& entry = it->second;
  *created = inserted;
  if (inserted) {
    entry.type = type;
    entry.help = std::string(help);
  } else if (entry.type != type) {
    auto type_name = [](Type t) {
      return t == Type::kCounter ? "counter"
             : t == Type::kGauge ? "gauge"
                                 : "histogram";
    };
    DieRegistration(absl::StrCat(
        "metric \"", it->first, "\" already registered as a ",
        type_name(entry.type), ", requested as a ", type_name(type)));
  }
  return it;
}

Counter* Metrics::GetCounter(absl::string_view name, absl::string_view help) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  Entry& entry = FindOrCreate(name, help, Type::kCounter, &created)->second;
  if (created) entry.counter = std::make_unique<Counter>();
  return entry.counter.get();
}

Gauge* Metrics::GetGauge(absl::string_view name, absl::string_view help) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  Entry& entry = FindOrCreate(name, help, Type::kGauge, &created)->second;
  if (created) entry.gauge = std::make_unique<Gauge>();
  return entry.gauge.get();
}

Histogram* Metrics::GetHistogram(absl::string_view name, absl::string_view help,
                                 std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  auto it = FindOrCreate(name, help, Type::kHistogram, &created);
  Entry& entry = it->second;
  if (created) {
    entry.histogram = std::make_unique<Histogram>(std::move(bounds));
  } else if (NormalizeBounds(std::move(bounds)) != entry.histogram->bounds()) {
    // Silently returning the old buckets would make the caller's latency
    // SLO buckets quietly wrong.
    DieRegistration(absl::StrCat("histogram \"", it->first,
                                 "\" re-registered with different bounds"));
  }
  return entry.histogram.get();
}

std::string Metrics::PrometheusText() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, entry] : entries_) {
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(entry.help), "\n");
    switch (entry.type) {
      case Type::kCounter:
        absl::StrAppend(&out, "# TYPE ", name, " counter\n", name, " ",
                        entry.counter->value(), "\n");
        break;
      case Type::kGauge:
        absl::StrAppend(&out, "# TYPE ", name, " gauge\n", name, " ",
                        FormatPrometheusDouble(entry.gauge->value()), "\n");
        break;
      case Type::kHistogram: {
        const Histogram& h = *entry.histogram;
        // One read of the buckets so _count matches the +Inf bucket even
        // while other threads keep observing.
        const std::vector<int64_t> counts = h.bucket_counts();
        absl::StrAppend(&out, "# TYPE ", name, " histogram\n");
        int64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le = i < h.bounds().size()
                                     ? FormatPrometheusDouble(h.bounds()[i])
                                     : "+Inf";
          absl::StrAppend(&out, name, "_bucket{le=\"", le, "\"} ", cumulative,
                          "\n");
        }
        absl::StrAppend(&out, name, "_sum ", FormatPrometheusDouble(h.sum()),
                        "\n", name, "_count ", cumulative, "\n");
        break;
      }
    }
  }
  return out;
}

std::map<std::string, double> Metrics::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, double> snapshot;
  for (const auto& [name, entry] : entries_) {
    switch (entry.type) {
      case Type::kCounter:
        snapshot[name] = static_cast<double>(entry.counter->value());
        break;
      case Type::kGauge:
        snapshot[name] = entry.gauge->value();
        break;
      case Type::kHistogram:
        snapshot[absl::StrCat(name, "_sum")] = entry.histogram->sum();
        snapshot[absl::StrCat(name, "_count")] =
            static_cast<double>(entry.histogram->count());
        break;
    }
  }
  return snapshot;
}

}  // namespace psrt
