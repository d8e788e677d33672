// Copyright 2024 The psrt Authors.

#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

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
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!alpha && !(digit && i > 0)) return false;
  }
  return true;
}

std::vector<double> NormalizeBounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(
          bounds.begin(), bounds.end(),
          [](double b) { return std::isnan(b) || b == std::numeric_limits<double>::infinity(); }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

// HELP text escaping of the 0.0.4 format (backslash and newline), which
// prometheus-cpp 1.0 leaves to the caller.
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

Histogram::Histogram(prometheus::Histogram& histogram, std::vector<double> bounds)
    : histogram_(histogram), bounds_(std::move(bounds)), nan_increments_([this] {
        std::vector<double> v(bounds_.size() + 1, 0.0);
        v.back() = 1;
        return v;
      }()) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) {
    histogram_.ObserveMultiple(nan_increments_, v);
    return;
  }
  histogram_.Observe(v);
}

std::vector<int64_t> Histogram::bucket_counts() const {
  const prometheus::ClientMetric m = histogram_.Collect();
  std::vector<int64_t> counts;
  counts.reserve(m.histogram.bucket.size());
  uint64_t previous = 0;
  for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
    counts.push_back(static_cast<int64_t>(b.cumulative_count - previous));
    previous = b.cumulative_count;
  }
  return counts;
}

double Histogram::sum() const { return histogram_.Collect().histogram.sample_sum; }

int64_t Histogram::count() const {
  return static_cast<int64_t>(histogram_.Collect().histogram.sample_count);
}

Metrics::Metrics(std::string prefix)
    : prefix_(std::move(prefix)), registry_(std::make_shared<prometheus::Registry>()) {
  if (!prefix_.empty() && !IsValidMetricName(prefix_)) {
    DieRegistration(absl::StrCat("invalid metric prefix \"", prefix_, "\""));
  }
}

Metrics::~Metrics() = default;

Metrics::EntryMap::iterator Metrics::FindOrCreate(absl::string_view name, Type type,
                                                  bool* created) {
  if (!IsValidMetricName(name)) {
    DieRegistration(absl::StrCat("invalid metric name \"", name, "\""));
  }
  std::string full_name = prefix_.empty() ? std::string(name) : absl::StrCat(prefix_, "_", name);
  auto [it, inserted] = entries_.try_emplace(std::move(full_name));
  *created = inserted;
  if (inserted) {
    it->second.type = type;
  } else if (it->second.type != type) {
    auto type_name = [](Type t) {
      return t == Type::kCounter ? "counter" : t == Type::kGauge ? "gauge" : "histogram";
    };
    DieRegistration(absl::StrCat("metric \"", it->first, "\" already registered as a ",
                                 type_name(it->second.type), ", requested as a ", type_name(type)));
  }
  return it;
}

Counter* Metrics::GetCounter(absl::string_view name, absl::string_view help) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  auto it = FindOrCreate(name, Type::kCounter, &created);
  if (created) {
    prometheus::Counter& c = prometheus::BuildCounter()
                                 .Name(it->first)
                                 .Help(EscapeHelp(help))
                                 .Register(*registry_)
                                 .Add({});
    it->second.counter.reset(new Counter(c));
  }
  return it->second.counter.get();
}

Gauge* Metrics::GetGauge(absl::string_view name, absl::string_view help) {
  absl::MutexLock lock(&mu_);
  bool created = false;
  auto it = FindOrCreate(name, Type::kGauge, &created);
  if (created) {
    prometheus::Gauge& g = prometheus::BuildGauge()
                               .Name(it->first)
                               .Help(EscapeHelp(help))
                               .Register(*registry_)
                               .Add({});
    it->second.gauge.reset(new Gauge(g));
  }
  return it->second.gauge.get();
}

Histogram* Metrics::GetHistogram(absl::string_view name, absl::string_view help,
                                 std::vector<double> bounds) {
  bounds = NormalizeBounds(std::move(bounds));
  absl::MutexLock lock(&mu_);
  bool created = false;
  auto it = FindOrCreate(name, Type::kHistogram, &created);
  if (created) {
    prometheus::Histogram& h = prometheus::BuildHistogram()
                                   .Name(it->first)
                                   .Help(EscapeHelp(help))
                                   .Register(*registry_)
                                   .Add({}, prometheus::Histogram::BucketBoundaries(bounds));
    it->second.histogram.reset(new Histogram(h, std::move(bounds)));
  } else if (bounds != it->second.histogram->bounds()) {
    // Silently returning the old buckets would make the caller's latency
    // buckets quietly wrong.
    DieRegistration(
        absl::StrCat("histogram \"", it->first, "\" re-registered with different bounds"));
  }
  return it->second.histogram.get();
}

std::string Metrics::PrometheusText() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) {
              return a.name < b.name;
            });
  return prometheus::TextSerializer().Serialize(families);
}

std::map<std::string, double> Metrics::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, double> snapshot;
  for (const auto& [name, entry] : entries_) {
    switch (entry.type) {
      case Type::kCounter:
        snapshot[name] = entry.counter->counter_.Value();
        break;
      case Type::kGauge:
        snapshot[name] = entry.gauge->value();
        break;
      case Type::kHistogram: {
        const prometheus::ClientMetric m = entry.histogram->histogram_.Collect();
        snapshot[absl::StrCat(name, "_sum")] = m.histogram.sample_sum;
        snapshot[absl::StrCat(name, "_count")] = static_cast<double>(m.histogram.sample_count);
        break;
      }
    }
  }
  return snapshot;
}

}  // namespace psrt
