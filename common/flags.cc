#include "common/flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace psrt {

Flags::Flags(std::string program, std::string usage)
    : program_(std::move(program)), usage_(std::move(usage)) {
  AddFlag("log-level", Type::kString, &log_level_,
          "What this process logs: error, warning, info or debug (default: PSRT_LOG_LEVEL, else "
          "warning: warnings, errors and psrt-run's notices).",
          "");
  AddFlag("verbose", Type::kBool, &verbose_, "Logs at info: --log-level=info.", "false");
}

void Flags::AddFlag(const std::string& name, Type type, void* value,
                    std::string help, std::string default_text) {
  flags_.push_back({name, type, value, std::move(help), std::move(default_text)});
}
void Flags::Add(const std::string& name, std::string* value, std::string help) {
  AddFlag(name, Type::kString, value, std::move(help),
          value->empty() ? "" : "\"" + *value + "\"");
}
void Flags::Add(const std::string& name, int64_t* value, std::string help) {
  AddFlag(name, Type::kInt64, value, std::move(help), absl::StrCat(*value));
}
void Flags::Add(const std::string& name, int* value, std::string help) {
  AddFlag(name, Type::kInt, value, std::move(help), absl::StrCat(*value));
}
void Flags::Add(const std::string& name, double* value, std::string help) {
  AddFlag(name, Type::kDouble, value, std::move(help), absl::StrCat(*value));
}
void Flags::Add(const std::string& name, bool* value, std::string help) {
  AddFlag(name, Type::kBool, value, std::move(help), *value ? "true" : "false");
}

absl::Status Flags::Set(const Flag& flag, const std::string& text) {
  // Parse into a temporary: a bad value leaves the flag as it was.
  bool ok = true;
  const char* expected = "";
  switch (flag.type) {
    case Type::kString:
      *static_cast<std::string*>(flag.value) = text;
      break;
    case Type::kInt64: {
      int64_t v;
      ok = absl::SimpleAtoi(text, &v);
      if (ok) *static_cast<int64_t*>(flag.value) = v;
      expected = "an integer";
      break;
    }
    case Type::kInt: {
      int v;
      ok = absl::SimpleAtoi(text, &v);
      if (ok) *static_cast<int*>(flag.value) = v;
      expected = "an integer";
      break;
    }
    case Type::kDouble: {
      double v;
      ok = absl::SimpleAtod(text, &v);
      if (ok) *static_cast<double*>(flag.value) = v;
      expected = "a number";
      break;
    }
    case Type::kBool: {
      bool v;
      ok = absl::SimpleAtob(text, &v);
      if (ok) *static_cast<bool*>(flag.value) = v;
      expected = "true or false";
      break;
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag.name, " must be ", expected, "; got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status Flags::Parse(int argc, char** argv) {
  if (absl::Status s = ParseArgs(argc, argv); !s.ok()) return s;
  return ApplyLogLevel();
}

absl::Status Flags::ApplyLogLevel() const {
  absl::StatusOr<LogLevel> level = LogLevel::kInfo;
  if (!log_level_.empty()) {
    level = ParseLogLevel(log_level_);
    if (!level.ok()) return absl::InvalidArgumentError(absl::StrCat("--log-level: ", level.status().message()));
  } else if (!verbose_) {
    level = LogLevelFromEnv();
    if (!level.ok()) return level.status();
  }
  SetLogLevel(*level);
  return absl::OkStatus();
}

absl::Status Flags::ParseArgs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      command_.assign(argv + i + 1, argv + argc);
      return absl::OkStatus();
    }
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg,
          "'; flags look like --name=value and a command follows '--'"));
    }
    std::string name = arg.substr(2), text;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      text = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      std::vector<std::string> names;
      for (const Flag& f : flags_) names.push_back("--" + f.name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; accepted: ",
                       absl::StrJoin(names, ", "), " (see --help)"));
    }
    if (!has_value) {
      if (flag->type == Type::kBool) {
        text = "true";
      } else if (i + 1 < argc && std::string(argv[i + 1]) != "--") {
        text = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Set(*flag, text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string Flags::Help() const {
  std::string out = absl::StrCat("Usage: ", program_, " ", usage_, "\n\nFlags:\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, "\n      ", f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  --help\n      Prints this text.\n");
  return out;
}

void Flags::ParseOrExit(int argc, char** argv) {
  absl::Status s = Parse(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(), std::string(s.message()).c_str());
    std::exit(2);
  }
  if (help_requested_) {
    std::fputs(Help().c_str(), stdout);
    std::exit(0);
  }
}

}  // namespace psrt
