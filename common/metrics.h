// Copyright 2024 The psrt Authors.
//
// A daemon's metrics, kept in a prometheus-cpp registry (which also writes
// the Prometheus text format and, through MetricsServer, serves it) behind a
// small interface of psrt's own, and as a flat map for stats RPCs.
//
// Registration takes a lock; updates do not, so hot paths look a metric up
// once and keep the returned pointer:
//
//   Metrics metrics("psrt_server");
//   Counter* pulls = metrics.GetCounter("pull_requests_total", "Pulls served.");
//   Histogram* latency = metrics.GetHistogram("pull_latency_seconds", "Pull latency.",
//                                             {0.001, 0.01, 0.1, 1});
//   ...
//   pulls->Add();
//   latency->Observe(elapsed_seconds);

#ifndef PSRT_COMMON_METRICS_H_
#define PSRT_COMMON_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace psrt {

// A monotonically increasing count. Values are kept as doubles (Prometheus'
// own type), exact up to 2^53.
class Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // `v` must be non-negative; Prometheus treats a decrease as a reset.
  void Add(int64_t v = 1) { counter_.Increment(static_cast<double>(v)); }
  int64_t value() const { return static_cast<int64_t>(counter_.Value()); }

 private:
  friend class Metrics;
  explicit Counter(prometheus::Counter& counter) : counter_(counter) {}
  prometheus::Counter& counter_;
};

// A value that can go up and down (queue depth, memory in use, ...).
class Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { gauge_.Set(v); }
  double value() const { return gauge_.Value(); }

 private:
  friend class Metrics;
  explicit Gauge(prometheus::Gauge& gauge) : gauge_(gauge) {}
  prometheus::Gauge& gauge_;
};

// Counts observations into fixed buckets: bucket i takes v <= bounds()[i]
// that fell into no earlier bucket, a final +Inf bucket the rest and NaN.
class Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double v);

  // bounds().size() + 1 counts, per bucket (not cumulative), the last being
  // the +Inf bucket.
  std::vector<int64_t> bucket_counts() const;
  double sum() const;
  int64_t count() const;
  // Sorted, without duplicates, NaN or +Inf.
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class Metrics;
  Histogram(prometheus::Histogram& histogram, std::vector<double> bounds);
  prometheus::Histogram& histogram_;
  const std::vector<double> bounds_;
  // One observation in the +Inf bucket: where NaN goes (prometheus-cpp would
  // put it in the first bucket).
  const std::vector<double> nan_increments_;
};

// Owns a daemon's metrics. Get*() registers on first use and returns the same
// object for the same name afterwards; pointers stay valid for the lifetime of
// the Metrics object. All methods are thread-safe.
//
// Registering an invalid name, reusing a name with a different metric type,
// or re-registering a histogram with different bounds is a programming error
// and aborts the process with a message, like a failed CHECK.
class Metrics {
 public:
  // `prefix` (e.g. "psrt_server") is prepended as "prefix_name" to every
  // metric; an empty prefix leaves names unchanged.
  explicit Metrics(std::string prefix);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;
  ~Metrics();

  // `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*. `help` is taken from the first
  // registration.
  Counter* GetCounter(absl::string_view name, absl::string_view help);
  Gauge* GetGauge(absl::string_view name, absl::string_view help);
  // `bounds` are sorted and de-duplicated; NaN and +Inf are dropped because
  // the +Inf bucket always exists.
  Histogram* GetHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds);

  // The Prometheus text exposition format (0.0.4) as prometheus-cpp writes it,
  // metric families sorted by name.
  std::string PrometheusText() const;

  // Full metric name -> value: counters, gauges, and for each histogram
  // "<name>_sum" and "<name>_count".
  std::map<std::string, double> Snapshot() const;

  const std::string& prefix() const { return prefix_; }
  // What MetricsServer serves.
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Entry {
    Type type;
    // Exactly one is set, matching `type`.
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  using EntryMap = std::map<std::string, Entry>;

  // The entry for `name`, created with `type` if absent (`*created` says so);
  // aborts if it exists with another type or the name is invalid.
  EntryMap::iterator FindOrCreate(absl::string_view name, Type type, bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string prefix_;
  const std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  EntryMap entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace psrt

#endif  // PSRT_COMMON_METRICS_H_
