// Copyright 2024 The psrt Authors.
//
// A small, thread-safe metrics registry for psrt daemons, exported in the
// Prometheus text exposition format (0.0.4) and as a flat map for stats RPCs.
//
// Metric objects are created once (registration takes a lock) and then
// updated lock-free, so hot paths should look a metric up once and keep the
// returned pointer:
//
//   Metrics metrics("psrt_server");
//   Counter* pulls = metrics.GetCounter("pull_requests_total", "Pulls
//   served."); Histogram* latency = metrics.GetHistogram(
//       "pull_latency_seconds", "Pull latency.", {0.001, 0.01, 0.1, 1});
//   ...
//   pulls->Add();
//   latency->Observe(elapsed_seconds);

#ifndef PSRT_COMMON_METRICS_H_
#define PSRT_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace psrt {

// A monotonically increasing integer. Relaxed atomics: counters carry no
// ordering obligations towards other memory, they are only ever summed.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // `v` must be non-negative; Prometheus treats a decrease as a reset.
  void Add(int64_t v = 1) { value_.fetch_add(v, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// A value that can go up and down (queue depth, memory in use, ...).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into fixed buckets. Bucket i counts observations
// v <= bounds()[i] that fell into no earlier bucket; a final implicit +Inf
// bucket takes the rest (and NaN). Counts here are per bucket, not
// cumulative; PrometheusText() makes them cumulative as the format requires.
class Histogram {
 public:
  // `bounds` are sorted and de-duplicated; NaN and +Inf entries are dropped
  // because the +Inf bucket always exists.
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double v);

  // bounds().size() + 1 entries, the last being the +Inf bucket.
  std::vector<int64_t> bucket_counts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  // Derived from the buckets (no separate atomic), so it always equals the
  // +Inf cumulative count and Observe() stays one increment plus the sum.
  int64_t count() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  const std::unique_ptr<std::atomic<int64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
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
  Histogram* GetHistogram(absl::string_view name, absl::string_view help,
                          std::vector<double> bounds);

  // Prometheus text exposition format 0.0.4, metric families sorted by full
  // name.
  std::string PrometheusText() const;

  // Full metric name -> value: counters, gauges, and for each histogram
  // "<name>_sum" and "<name>_count".
  std::map<std::string, double> Snapshot() const;

  const std::string& prefix() const { return prefix_; }

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Entry {
    Type type;
    std::string help;
    // Exactly one is set, matching `type`.
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };

  // Keyed by full name; std::map gives the sorted output for free.
  using EntryMap = std::map<std::string, Entry>;

  // Returns the entry for `name`, creating it with `type` and `help` if
  // absent; aborts if it exists with another type. `*created` tells whether
  // it was new so the caller can construct the metric.
  EntryMap::iterator FindOrCreate(absl::string_view name,
                                  absl::string_view help, Type type,
                                  bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string prefix_;
  mutable absl::Mutex mu_;
  EntryMap entries_ ABSL_GUARDED_BY(mu_);
};

// Formats `v` the way Prometheus expects: the shortest decimal string that
// round-trips to the same double, and "+Inf", "-Inf", "NaN" for the special
// values. Exposed for tests and for callers building label values.
std::string FormatPrometheusDouble(double v);

}  // namespace psrt

#endif  // PSRT_COMMON_METRICS_H_
