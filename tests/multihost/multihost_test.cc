// Jobs across three hosts made of network namespaces (netns_hosts.h), each
// host started as a cluster starts it: by IP with the address to announce
// taken from an interface, by the host names SageMaker gives (resolved
// through the hosts' own /etc/hosts), with hosts that come late or never,
// and on links that are shaped or blip. Every process on every host exits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/multihost/linreg_rate.h"
#include "tests/multihost/netns_job.h"

namespace psrt {
namespace {

constexpr int kBatch = 64;
constexpr char kTrainer[] = "--dim=2048 --batch=64 --log-every=10";

// TCP: the hosts share this machine's /dev/shm, so shared memory would carry
// the tensors past the links.
std::string Distribution(const std::string& more = "") {
  return absl::StrCat(
      R"({"parameter_server":{"enabled":true,"transport":"tcp","partition_bytes":4096)", more,
      "}}");
}

class MultiHostTest : public NetnsJobTest {
 protected:
  std::string Linreg(int steps) const {
    return absl::StrCat(kBin, "/psrt-example-linreg ", kTrainer, " --steps=", steps,
                        " --result=", dir_, "/r --loss-log=", dir_, "/loss");
  }
  // SageMaker's names for the hosts: algo-1, algo-2, ...
  static std::string Algo(int h) { return absl::StrCat("algo-", h + 1); }
  std::string SmHosts() const {
    std::vector<std::string> names;
    for (int h = 0; h < kHosts; ++h) names.push_back("\"" + Algo(h) + "\"");
    return "[" + absl::StrJoin(names, ",") + "]";
  }
  std::map<std::string, std::string> AlgoNames(int first_host) const {
    std::map<std::string, std::string> names;
    for (int h = first_host; h < kHosts; ++h) names[Algo(h)] = hosts_->address(h);
    return names;
  }
};

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(MultiHostTest, HostsByIpAnnounceTheirInterfaceOnFixedPortsOverShapedLinks) {
  absl::StatusOr<std::string> shape = hosts_->Shape("2ms", "1gbit");
  ASSERT_TRUE(shape.ok()) << shape.status();
  for (int h = 0; h < kHosts; ++h) {
    StartPsrtRun(
        h,
        absl::StrCat("--hosts=", IpHosts(), " --current-host=", h, " --interface=eth", h,
                     " --distribution='",
                     Distribution(R"(,"servers_per_host":2,"server_port_base":7100)"), "'"),
        Linreg(300));
  }
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(kHosts, 0)) << out;
  ExpectLearned();
  // Each host's two servers announce its interface's address on 7100, 7101.
  for (int h = 0; h < kHosts; ++h) {
    for (int port : {7100, 7101}) {
      EXPECT_TRUE(absl::StrContains(HostOutput(h),
                                    absl::StrCat("serving on ", hosts_->address(h), ":", port)))
          << "host " << h << " port " << port << "\n"
          << out;
    }
  }
  const double rate = LinregSamplesPerSecond(dir_ + "/loss", 50, kBatch * kHosts);
  EXPECT_GT(rate, 0) << ReadFile(dir_ + "/loss");
  RecordProperty("samples_per_second", absl::StrCat(static_cast<int>(rate)));
  RecordProperty("links", *shape);
  std::printf("3 hosts, links shaped with %s: %.0f samples/s\n", shape->c_str(), rate);
  ExpectNothingLeft();
}

TEST_F(MultiHostTest, SageMakerHostNamesThatResolveLateAndAHostThatStarts15sLate) {
  // algo-1, the coordinator's host, has no name yet: the others wait for it.
  ASSERT_TRUE(hosts_->SetHostNames(AlgoNames(1)).ok());
  // SM_HOSTS and SM_CURRENT_HOST exactly as SageMaker sets them.
  auto start = [&](int h) {
    StartHost(h, absl::StrCat("env SM_HOSTS='", SmHosts(), "' SM_CURRENT_HOST=", Algo(h), " ", kBin,
                              "/psrt-run --token=", token_, " --distribution='",
                              Distribution(R"(,"barrier_timeout_s":90)"), "' -- ", Linreg(200)));
  };
  start(1);
  ASSERT_TRUE(runs_[1].WaitForOutput("host name 'algo-1' of the coordinator does not resolve yet",
                                     absl::Seconds(30)))
      << Output();
  ASSERT_TRUE(hosts_->SetHostNames(AlgoNames(0)).ok());
  start(0);
  absl::SleepFor(absl::Seconds(15));
  start(2);
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(kHosts, 0)) << out;
  ExpectLearned();
  // One line while it waited, one when the name came.
  const std::string host1 = HostOutput(1);
  EXPECT_EQ(Count(host1, "host name 'algo-1' of the coordinator does not resolve yet"), 1) << host1;
  EXPECT_TRUE(absl::StrContains(host1, "host name 'algo-1' of the coordinator resolves now"))
      << host1;
  EXPECT_TRUE(absl::StrContains(HostOutput(2), "serving on algo-3:")) << out;
  ExpectNothingLeft();
}

TEST_F(MultiHostTest, AHostThatNeverComesFailsTheBarrierNamingItAndEveryProcessExits) {
  for (int h = 0; h < 2; ++h) {
    StartPsrtRun(h,
                 absl::StrCat("--hosts=", IpHosts(), " --current-host=", h, " --distribution='",
                              Distribution(R"(,"barrier_timeout_s":6)"), "'"),
                 Linreg(100));
  }
  const std::vector<int> codes = WaitAll(absl::Seconds(90));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(2, 1)) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("readiness barrier timed out after 6s; not arrived: .*10\\.213\\.0\\.3")))
      << out;
  EXPECT_FALSE(std::regex_search(out, std::regex("not arrived: [^\\n]*10\\.213\\.0\\.[12]\\b")))
      << out;
  ExpectNothingLeft();
}

TEST_F(MultiHostTest, ABlipShorterThanTheHeartbeatTimeoutIsSurvived) {
  for (int h = 0; h < kHosts; ++h) {
    StartPsrtRun(h,
                 absl::StrCat("--hosts=", IpHosts(), " --current-host=", h, " --distribution='",
                              Distribution(R"(,"heartbeat_timeout_s":8)"), "'"),
                 Linreg(400));
  }
  ASSERT_TRUE(runs_[0].WaitForOutput("step 100 ", absl::Seconds(90))) << Output();
  ASSERT_TRUE(hosts_->Cut(2).ok());
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(hosts_->Restore(2).ok());
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  // on_failure is "fail": had anything been declared lost, the job would
  // have ended with it.
  EXPECT_EQ(codes, std::vector<int>(kHosts, 0)) << out;
  EXPECT_FALSE(absl::StrContains(out, "was lost")) << out;
  ExpectLearned();
  ExpectNothingLeft();
}

// A SageMaker training job as the platform starts it: on every host the
// files SageMaker writes under its base directory and the variables it sets,
// and the image's entry point, psrt-sagemaker, which runs the user's script
// (the PyTorch digits demo as a SageMaker script) under psrt-run.
TEST_F(MultiHostTest, TheSageMakerEntryPointTrainsThePyTorchDemoAcrossHosts) {
  ASSERT_TRUE(hosts_->SetHostNames(AlgoNames(0)).ok());
  for (int h = 0; h < kHosts; ++h) {
    const std::string base = absl::StrCat(dir_, "/sm", h);
    ASSERT_EQ(std::system(("mkdir -p " + base + "/input/config").c_str()), 0);
    std::ofstream(base + "/input/config/resourceconfig.json")
        << R"({"current_host": ")" << Algo(h)
        << R"(", "current_group_name": "homogeneousCluster", )"
        << R"("hosts": )" << SmHosts() << R"(, "network_interface_name": "eth)" << h << "\"}";
    // SageMaker's SDK JSON-encodes every hyperparameter's value.
    std::ofstream(base + "/input/config/hyperparameters.json")
        << R"({"sagemaker_program": "\"sagemaker_digits.py\"", )"
        << R"("sagemaker_parameter_server_enabled": "true", "sagemaker_region": "\"us-west-2\"", )"
        << R"("epochs": "4", "threshold": "0.9", "psrt_distribution": )"
        << R"("{\"compression\": \"fp16\", \"transport\": \"tcp\", \"barrier_timeout_s\": 180}"})";
    StartHost(
        h, absl::StrCat("env SAGEMAKER_BASE_DIR=", base, " SM_HOSTS='", SmHosts(),
                        "' SM_CURRENT_HOST=", Algo(h), " SM_MODULE_DIR=", PSRT_SOURCE_DIR,
                        "/examples PSRT_BIN_DIR=", kBin, " PYTHONPATH=", kBin,
                        "/../python PSRT_JOB_TOKEN=", token_, " ", python_, " -m psrt.sagemaker"));
  }
  const std::vector<int> codes = WaitAll(absl::Seconds(280));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(kHosts, 0)) << out;
  for (int h = 0; h < kHosts; ++h) {
    const std::string base = absl::StrCat(dir_, "/sm", h);
    EXPECT_EQ(access((base + "/output/success").c_str(), F_OK), 0) << "host " << h << "\n" << out;
    // The model is left on host 0 alone (rank 0 saves it).
    EXPECT_EQ(access((base + "/model/model.pth").c_str(), F_OK) == 0, h == 0)
        << "host " << h << "\n"
        << out;
    // network_interface_name chose what the servers announce.
    EXPECT_TRUE(
        absl::StrContains(HostOutput(h), absl::StrCat("serving on ", hosts_->address(h), ":")))
        << out;
  }
  ExpectNothingLeft();
}

// Kubeflow's TFJob (deploy/k8s/tfjob.yaml): each replica is a host that
// gets TF_CONFIG exactly as the training operator writes it
// (tests/deploy/tfjob_tf_config.py) and resolves the pods' DNS names.
class TfJobTest : public MultiHostTest {
 protected:
  int NumHosts() const override { return static_cast<int>(Replicas().size()); }

  struct Replica {
    std::string type, host, tf_config;
  };
  // "TYPE INDEX HOST TF_CONFIG" lines of the generator, in psrt's host order.
  static const std::vector<Replica>& Replicas() {
    static const std::vector<Replica>* replicas = [] {
      auto* r = new std::vector<Replica>;
      const std::string cmd = absl::StrCat(PSRT_SOURCE_DIR, "/.venv/bin/python ", PSRT_SOURCE_DIR,
                                           "/tests/deploy/tfjob_tf_config.py ", PSRT_SOURCE_DIR,
                                           "/deploy/k8s/tfjob.yaml");
      std::FILE* p = popen(cmd.c_str(), "r");
      char line[8192];
      while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) {
        std::istringstream in(line);
        Replica x;
        int index;
        in >> x.type >> index >> x.host;
        std::getline(in >> std::ws, x.tf_config);
        r->push_back(x);
      }
      if (p != nullptr) pclose(p);
      return r;
    }();
    return *replicas;
  }
};

TEST_F(TfJobTest, TheTfConfigOfTheKubeflowManifestStartsTheJob) {
  const std::vector<Replica>& replicas = Replicas();
  ASSERT_GE(replicas.size(), 3u) << "tests/deploy/tfjob_tf_config.py gave no replicas";
  EXPECT_EQ(replicas[0].type, "chief");
  std::map<std::string, std::string> names;
  for (int h = 0; h < hosts_->size(); ++h) names[replicas[h].host] = hosts_->address(h);
  ASSERT_TRUE(hosts_->SetHostNames(names).ok());
  for (int h = 0; h < hosts_->size(); ++h) {
    ASSERT_EQ(replicas[h].tf_config.find('\''), std::string::npos);
    StartHost(h, absl::StrCat("env TF_CONFIG='", replicas[h].tf_config, "' ", kBin,
                              "/psrt-run --token=", token_, " --distribution='",
                              Distribution(R"(,"server_port_base":7071)"), "' -- ", Linreg(200)));
  }
  const std::vector<int> codes = WaitAll(absl::Seconds(180));
  const std::string out = Output();
  EXPECT_EQ(codes, std::vector<int>(hosts_->size(), 0)) << out;
  ExpectLearned();
  // Servers announce their pod's DNS name on the manifest's port.
  for (int h = 0; h < hosts_->size(); ++h) {
    EXPECT_TRUE(absl::StrContains(HostOutput(h), "serving on " + replicas[h].host + ":7071"))
        << out;
  }
  ExpectNothingLeft();
}

}  // namespace
}  // namespace psrt
