#ifndef PSRT_COMMON_THREAD_POOL_H_
#define PSRT_COMMON_THREAD_POOL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace psrt {

// A fixed set of threads running queued tasks in order of arrival.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  void Schedule(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

  // Runs fn(0), ..., fn(n - 1) on the calling thread and on up to all of
  // the pool's threads, and returns when every call has returned. The
  // caller works through the items itself, so this never waits for a
  // queued task to start (safe from a pool thread too).
  void ParallelFor(int n, const std::function<void(int)>& fn) {
    struct State {
      std::atomic<int> next{0};
      absl::Mutex mu;
      int done ABSL_GUARDED_BY(mu) = 0;
    };
    auto state = std::make_shared<State>();
    // Helpers that start after every item was taken return at once and
    // never touch `fn`, which lives until every taken item is done.
    auto work = [state, n, &fn] {
      int i, finished = 0;
      while ((i = state->next.fetch_add(1)) < n) {
        fn(i);
        ++finished;
      }
      absl::MutexLock lock(&state->mu);
      state->done += finished;
    };
    const int helpers = std::min<int>(n - 1, static_cast<int>(threads_.size()));
    for (int h = 0; h < helpers; ++h) Schedule(work);
    work();
    absl::MutexLock lock(&state->mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->done == n; };
    state->mu.Await(absl::Condition(&all));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;  // stopping, and nothing left to run
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_THREAD_POOL_H_
