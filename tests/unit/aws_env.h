// Tests of AWS credentials: every variable the credential chain reads,
// cleared for the test (HOME too, so no ~/.aws is read) and restored after.
#ifndef PSRT_TESTS_UNIT_AWS_ENV_H_
#define PSRT_TESTS_UNIT_AWS_ENV_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace psrt {

class AwsTestEnv {
 public:
  explicit AwsTestEnv(const std::string& home) {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      if (value != nullptr) saved_[name] = value;
      unsetenv(name);
    }
    Set("HOME", home);
    // Off EC2 nothing answers at 169.254.169.254; tests that want instance
    // metadata point AWS_EC2_METADATA_SERVICE_ENDPOINT at a server.
    Set("AWS_EC2_METADATA_DISABLED", "true");
  }
  ~AwsTestEnv() {
    for (const char* name : kNames) {
      auto it = saved_.find(name);
      if (it == saved_.end()) {
        unsetenv(name);
      } else {
        setenv(name, it->second.c_str(), 1);
      }
    }
  }
  AwsTestEnv(const AwsTestEnv&) = delete;
  AwsTestEnv& operator=(const AwsTestEnv&) = delete;

  void Set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }
  void Unset(const char* name) { unsetenv(name); }

  // A fresh directory for the running test's shared credentials and config
  // files, which the chain is pointed at; per test and process, since
  // ctest runs the cases in parallel. The caller removes it.
  std::string UseFilesIn(const std::string& prefix) {
    const std::string dir = ::testing::TempDir() + "/" + prefix + "-" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
                            std::to_string(getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    Set("AWS_SHARED_CREDENTIALS_FILE", dir + "/credentials");
    Set("AWS_CONFIG_FILE", dir + "/config");
    return dir;
  }

 private:
  static constexpr const char* kNames[] = {
      "HOME",
      "AWS_ACCESS_KEY_ID",
      "AWS_SECRET_ACCESS_KEY",
      "AWS_SESSION_TOKEN",
      "AWS_PROFILE",
      "AWS_SHARED_CREDENTIALS_FILE",
      "AWS_CONFIG_FILE",
      "AWS_WEB_IDENTITY_TOKEN_FILE",
      "AWS_ROLE_ARN",
      "AWS_ROLE_SESSION_NAME",
      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
      "AWS_CONTAINER_CREDENTIALS_FULL_URI",
      "AWS_CONTAINER_AUTHORIZATION_TOKEN",
      "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
      "AWS_EC2_METADATA_DISABLED",
      "AWS_EC2_METADATA_SERVICE_ENDPOINT",
      "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
      "AWS_ENDPOINT_URL",
      "AWS_ENDPOINT_URL_STS",
      "AWS_REGION",
      "AWS_DEFAULT_REGION",
  };
  std::map<std::string, std::string> saved_;
};

}  // namespace psrt

#endif  // PSRT_TESTS_UNIT_AWS_ENV_H_
