#include "common/gpus.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace psrt {

std::vector<std::string> VisibleGpus(const std::function<const char*(const char*)>& getenv_fn,
                                     const std::string& driver_dir) {
  const char* visible =
      getenv_fn ? getenv_fn("CUDA_VISIBLE_DEVICES") : std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> gpus;
  if (visible != nullptr) {
    for (absl::string_view entry : absl::StrSplit(visible, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      // CUDA stops at the first entry it cannot use; Slurm writes
      // "NoDevFiles" for a step without GPUs.
      if (entry.empty() || absl::StartsWith(entry, "-") || entry == "NoDevFiles") break;
      gpus.emplace_back(entry);
    }
    return gpus;
  }
  std::error_code error;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(driver_dir, error)) {
    if (e.is_directory(error)) ++n;
  }
  for (int i = 0; i < n; ++i) gpus.push_back(absl::StrCat(i));
  return gpus;
}

std::vector<std::string> GpusOfHost(const std::vector<std::string>& gpus, int host, int hosts,
                                    int workers) {
  if (gpus.empty() || workers < 1 || (hosts <= 1 && workers == 1)) return {};
  std::vector<std::string> share;
  for (int i = 0; i < workers; ++i) {
    share.push_back(gpus[(static_cast<size_t>(host) * workers + i) % gpus.size()]);
  }
  return share;
}

std::string GpuForWorker(const std::vector<std::string>& gpus, int local_rank) {
  if (gpus.empty() || local_rank < 0) return "";
  return gpus[static_cast<size_t>(local_rank) % gpus.size()];
}

}  // namespace psrt
