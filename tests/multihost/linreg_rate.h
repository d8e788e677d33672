// Steady-state samples per second of psrt-example-linreg, from rank 0's
// --loss-log lines ("seconds step loss"): shared by the multi-host test,
// which reports it, and multihost_bench, which compares it.
#ifndef PSRT_TESTS_MULTIHOST_LINREG_RATE_H_
#define PSRT_TESTS_MULTIHOST_LINREG_RATE_H_

#include <fstream>
#include <string>

namespace psrt {

// Samples per second over the steps from `skip_steps` (past start-up) to the
// last logged one, at `samples_per_step` (batch times workers); 0 when the
// log has fewer than two such lines.
inline double LinregSamplesPerSecond(const std::string& loss_log, int skip_steps,
                                     int samples_per_step) {
  std::ifstream in(loss_log);
  double t, loss, t0 = -1, t1 = 0;
  long step, s0 = 0, s1 = 0;
  while (in >> t >> step >> loss) {
    if (step < skip_steps) continue;
    if (t0 < 0) t0 = t, s0 = step;
    t1 = t, s1 = step;
  }
  return t1 > t0 && t0 >= 0 ? (s1 - s0) * samples_per_step / (t1 - t0) : 0;
}

}  // namespace psrt

#endif  // PSRT_TESTS_MULTIHOST_LINREG_RATE_H_
