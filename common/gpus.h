// Which GPU each training process of a host uses. psrt-run gives every
// training process its own: it sets CUDA_VISIBLE_DEVICES to one device per
// process, so a framework that takes every visible GPU (TensorFlow, the
// Hugging Face Trainer, MXNet) or its first (torch's "cuda") uses that one.

#ifndef PSRT_COMMON_GPUS_H_
#define PSRT_COMMON_GPUS_H_

#include <functional>
#include <string>
#include <vector>

namespace psrt {

// The GPUs this machine's training processes share out, as CUDA names them:
// the entries of CUDA_VISIBLE_DEVICES when it is set (indices, GPU-... or
// MIG-... UUIDs; an empty value, "NoDevFiles", or the first entry starting
// with '-' ends the list as it ends CUDA's), else "0".."n-1" for the NVIDIA
// GPUs the driver lists in `driver_dir` (one entry per GPU), else none.
std::vector<std::string> VisibleGpus(const std::function<const char*(const char*)>& getenv_fn,
                                     const std::string& driver_dir = "/proc/driver/nvidia/gpus");

// The GPUs the agent of host `host` hands out, of `hosts` hosts on this
// machine (1, or --local's simulated hosts) each running `workers` training
// processes: consecutive slices of `gpus`, shared round-robin only when
// there are fewer GPUs than processes. Empty: leave CUDA_VISIBLE_DEVICES as
// it is (no GPUs, or a machine of one training process, which keeps every
// GPU it sees).
std::vector<std::string> GpusOfHost(const std::vector<std::string>& gpus, int host, int hosts,
                                    int workers);

// The CUDA_VISIBLE_DEVICES of the training process of `local_rank` on a
// host whose agent hands out `gpus`; empty: none.
std::string GpuForWorker(const std::vector<std::string>& gpus, int local_rank);

}  // namespace psrt

#endif  // PSRT_COMMON_GPUS_H_
