#ifndef PSRT_SERVER_CHECKPOINT_AWS_CONFIG_H_
#define PSRT_SERVER_CHECKPOINT_AWS_CONFIG_H_

// The AWS shared files as the SDKs read them: ~/.aws/config
// (AWS_CONFIG_FILE; sections "[default]" and "[profile NAME]") and
// ~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE; sections "[NAME]"), and
// the region.

#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace psrt {

// The variable's value, "" when unset.
std::string AwsEnv(const char* name);

// `profile` when given, else AWS_PROFILE, else "default".
std::string AwsProfileName(absl::string_view profile);

// One profile, its settings from both files merged; the credentials file's
// win, as in the SDKs.
struct AwsProfile {
  std::string name;
  bool found = false;  // in either file
  std::map<std::string, std::string> values;
  std::string config_path;       // "" when there is no home to find it in
  std::string credentials_path;  // likewise

  std::string Get(absl::string_view key) const;
  // "profile [NAME] of PATH and PATH", for messages.
  std::string Describe() const;
};

AwsProfile ReadAwsProfile(absl::string_view name);

// AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1.
std::string ResolveAwsRegion(absl::string_view profile);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_AWS_CONFIG_H_
