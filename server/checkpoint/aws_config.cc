#include "server/checkpoint/aws_config.h"

#include <cstdlib>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace psrt {
namespace {

std::string HomeFile(const char* env_override, const char* relative) {
  std::string path = AwsEnv(env_override);
  if (!path.empty()) return path;
  std::string home = AwsEnv("HOME");
  if (home.empty()) return "";
  return absl::StrCat(home, "/", relative);
}

// The key/value pairs of section `section` of an INI file; nullopt when the
// file or the section is missing. Indented lines (a nested setting's
// members) are skipped.
std::optional<std::map<std::string, std::string>> IniSection(const std::string& path,
                                                             absl::string_view section) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::optional<std::map<std::string, std::string>> result;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      text.remove_prefix(1);
      text.remove_suffix(1);
      inside = absl::StripAsciiWhitespace(text) == section;
      if (inside && !result) result.emplace();
      continue;
    }
    const size_t eq = text.find('=');
    if (!inside || indented || eq == absl::string_view::npos) continue;
    (*result)[std::string(absl::StripAsciiWhitespace(text.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(text.substr(eq + 1)));
  }
  return result;
}

}  // namespace

std::string AwsEnv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string AwsProfileName(absl::string_view profile) {
  if (!profile.empty()) return std::string(profile);
  std::string env = AwsEnv("AWS_PROFILE");
  return env.empty() ? "default" : env;
}

std::string AwsProfile::Get(absl::string_view key) const {
  auto it = values.find(std::string(key));
  return it == values.end() ? "" : it->second;
}

std::string AwsProfile::Describe() const {
  return absl::StrCat("profile [", name, "] of ",
                      config_path.empty() ? "~/.aws/config" : config_path, " and ",
                      credentials_path.empty() ? "~/.aws/credentials" : credentials_path);
}

AwsProfile ReadAwsProfile(absl::string_view name) {
  AwsProfile profile;
  profile.name = std::string(name);
  profile.config_path = HomeFile("AWS_CONFIG_FILE", ".aws/config");
  profile.credentials_path = HomeFile("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  auto config = IniSection(profile.config_path, name == "default" ? std::string("default")
                                                                  : absl::StrCat("profile ", name));
  if (!config && name != "default") config = IniSection(profile.config_path, name);
  if (config) {
    profile.found = true;
    profile.values = *std::move(config);
  }
  if (auto credentials = IniSection(profile.credentials_path, name)) {
    profile.found = true;
    for (auto& [key, value] : *credentials) profile.values[key] = value;
  }
  return profile;
}

std::string ResolveAwsRegion(absl::string_view profile) {
  for (const char* var : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    std::string region = AwsEnv(var);
    if (!region.empty()) return region;
  }
  std::string region = ReadAwsProfile(AwsProfileName(profile)).Get("region");
  return region.empty() ? "us-east-1" : region;
}

}  // namespace psrt
