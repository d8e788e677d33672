#ifndef PSRT_COMMON_FLAGS_H_
#define PSRT_COMMON_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace psrt {

// A small command-line parser: `--name=value` or `--name value`, `--help`,
// and everything after `--` kept as the command to run. Every flag carries
// its help text so `--help` explains all of them. Every program gets
// --log-level and --verbose (common/logging.h): Parse sets the process's
// level from them, or else from PSRT_LOG_LEVEL.
class Flags {
 public:
  Flags(std::string program, std::string usage);
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  void Add(const std::string& name, std::string* value, std::string help);
  void Add(const std::string& name, int64_t* value, std::string help);
  void Add(const std::string& name, int* value, std::string help);
  void Add(const std::string& name, double* value, std::string help);
  void Add(const std::string& name, bool* value, std::string help);

  // Parses argv. Returns OK and sets help_requested() for --help; an
  // unknown flag or a value of the wrong type is INVALID_ARGUMENT naming it,
  // as is a --log-level (or, without one, a PSRT_LOG_LEVEL) that names no
  // level.
  absl::Status Parse(int argc, char** argv);
  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& command() const { return command_; }
  std::string Help() const;

  // Parses, prints help or the error, and exits when the program should not
  // go on (exit 0 after --help, 2 after a bad flag).
  void ParseOrExit(int argc, char** argv);

 private:
  enum class Type { kString, kInt64, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Type type;
    void* value;
    std::string help;
    std::string default_text;
  };
  void AddFlag(const std::string& name, Type type, void* value,
               std::string help, std::string default_text);
  absl::Status Set(const Flag& flag, const std::string& text);
  absl::Status ParseArgs(int argc, char** argv);
  absl::Status ApplyLogLevel() const;

  std::string program_;
  std::string usage_;
  std::vector<Flag> flags_;
  std::vector<std::string> command_;
  bool help_requested_ = false;
  std::string log_level_;  // --log-level
  bool verbose_ = false;   // --verbose
};

}  // namespace psrt

#endif  // PSRT_COMMON_FLAGS_H_
