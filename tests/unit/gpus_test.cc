#include "common/gpus.h"

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::function<const char*(const char*)> Env(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(VisibleGpus, TakesCudaVisibleDevicesAsCudaReadsIt) {
  EXPECT_THAT(VisibleGpus(Env({{"CUDA_VISIBLE_DEVICES", "3,5, 7"}})), ElementsAre("3", "5", "7"));
  EXPECT_THAT(VisibleGpus(Env({{"CUDA_VISIBLE_DEVICES", "GPU-a1,MIG-b2"}})),
              ElementsAre("GPU-a1", "MIG-b2"));
  EXPECT_THAT(VisibleGpus(Env({{"CUDA_VISIBLE_DEVICES", "2,-1,4"}})), ElementsAre("2"));
  EXPECT_THAT(VisibleGpus(Env({{"CUDA_VISIBLE_DEVICES", ""}})), IsEmpty());
  EXPECT_THAT(VisibleGpus(Env({{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}})), IsEmpty());
}

TEST(VisibleGpus, CountsTheDriversGpusWhenNothingRestrictsThem) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "psrt_gpus_test_driver";
  std::filesystem::remove_all(dir);
  EXPECT_THAT(VisibleGpus(Env({}), dir.string()), IsEmpty());  // no driver
  for (const char* bus : {"0000:07:00.0", "0000:0a:00.0", "0000:44:00.0"}) {
    std::filesystem::create_directories(dir / bus);
  }
  EXPECT_THAT(VisibleGpus(Env({}), dir.string()), ElementsAre("0", "1", "2"));
  std::filesystem::remove_all(dir);
}

TEST(GpusOfHost, EachTrainingProcessGetsItsOwn) {
  const std::vector<std::string> gpus = {"3", "5", "7", "9"};
  EXPECT_THAT(GpusOfHost(gpus, 0, 1, 4), ElementsAre("3", "5", "7", "9"));
  // Simulated hosts on one machine take consecutive slices.
  EXPECT_THAT(GpusOfHost(gpus, 0, 2, 2), ElementsAre("3", "5"));
  EXPECT_THAT(GpusOfHost(gpus, 1, 2, 2), ElementsAre("7", "9"));
  EXPECT_THAT(GpusOfHost(gpus, 1, 2, 1), ElementsAre("5"));
  // Fewer GPUs than processes: shared round-robin.
  EXPECT_THAT(GpusOfHost({"0", "1"}, 0, 1, 3), ElementsAre("0", "1", "0"));
  // One process on the machine keeps every GPU; no GPUs, nothing to hand out.
  EXPECT_THAT(GpusOfHost(gpus, 0, 1, 1), IsEmpty());
  EXPECT_THAT(GpusOfHost({}, 0, 1, 8), IsEmpty());
}

TEST(GpuForWorker, ByLocalRank) {
  EXPECT_EQ(GpuForWorker({"3", "5"}, 1), "5");
  EXPECT_EQ(GpuForWorker({"3", "5"}, 2), "3");
  EXPECT_EQ(GpuForWorker({}, 0), "");
}

}  // namespace
}  // namespace psrt
