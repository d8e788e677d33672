// What a job is configured with, on arbitrary text: the parameter_server
// distribution JSON, command-line flags, and the cluster as --hosts,
// SageMaker's SM_HOSTS / SM_CURRENT_HOST or TF_CONFIG give it. Each is
// accepted or refused with an error; an accepted cluster names its current
// host among its hosts.

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/cluster.h"
#include "common/distribution.h"
#include "common/flags.h"
#include "common/logging.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  psrt::SilenceLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)psrt::ParseDistribution(text);

  // Flags: the text's lines are the arguments.
  std::vector<std::string> args = absl::StrSplit(text, '\n');
  if (args.size() > 32) args.resize(32);
  std::vector<char*> argv = {const_cast<char*>("fuzz")};
  for (std::string& a : args) argv.push_back(a.data());
  std::string s;
  int64_t i64 = 0;
  int i = 0;
  double d = 0;
  bool b = false;
  psrt::Flags flags("fuzz", "[flags]");
  flags.Add("name", &s, "a string");
  flags.Add("steps", &i64, "an int64");
  flags.Add("port", &i, "an int");
  flags.Add("lr", &d, "a double");
  flags.Add("color", &b, "a bool");
  (void)flags.Parse(static_cast<int>(argv.size()), argv.data());

  // The cluster: NUL-separated --hosts, --current, SM_HOSTS, SM_CURRENT_HOST, TF_CONFIG.
  std::vector<std::string> parts = absl::StrSplit(text, '\0');
  parts.resize(5);
  const std::map<std::string, std::string> env = {
      {"SM_HOSTS", parts[2]}, {"SM_CURRENT_HOST", parts[3]}, {"TF_CONFIG", parts[4]}};
  auto getenv_fn = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  absl::StatusOr<psrt::ClusterSpec> cluster = psrt::ResolveCluster(parts[0], parts[1], getenv_fn);
  if (cluster.ok() && (cluster->current < 0 || cluster->current >= static_cast<int>(cluster->hosts.size()))) {
    std::abort();
  }
  return 0;
}
