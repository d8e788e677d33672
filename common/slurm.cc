#include "common/slurm.h"

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace psrt {
namespace {

// Parsed here rather than with libslurm's slurm_hostlist_create: linking
// libslurm would tie every psrt binary (SageMaker and Kubernetes images too)
// to one Slurm release's library, and the grammar is small.
constexpr size_t kMaxHosts = 65536;
// Nine digits fit an int without overflow; longer numbers are no node names.
constexpr size_t kMaxDigits = 9;

absl::Status Error(absl::string_view what, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", message));
}

absl::string_view GetEnv(const std::function<const char*(const char*)>& getenv_fn,
                         const char* name) {
  const char* value = getenv_fn ? getenv_fn(name) : std::getenv(name);
  if (value == nullptr) return "";
  return absl::StripAsciiWhitespace(value);
}

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > kMaxDigits) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Splits at the commas outside brackets, checking that brackets pair up and
// do not nest.
absl::StatusOr<std::vector<absl::string_view>> SplitItems(absl::string_view list) {
  std::vector<absl::string_view> items;
  size_t start = 0;
  bool open = false;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == '[') {
      if (open) return Error(list, absl::StrCat("nested '[' at offset ", i));
      open = true;
    } else if (c == ']') {
      if (!open) return Error(list, absl::StrCat("']' without '[' at offset ", i));
      open = false;
    } else if (c == ',' && !open) {
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    } else if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return Error(list, absl::StrCat("whitespace at offset ", i));
    }
  }
  if (open) return Error(list, "'[' without ']'");
  items.push_back(list.substr(start));
  return items;
}

// The numbers of one bracket's body ("01-04,07"), each formatted with its
// range's padding.
absl::StatusOr<std::vector<std::string>> ExpandBracket(absl::string_view list,
                                                       absl::string_view body) {
  std::vector<std::string> out;
  for (absl::string_view range : absl::StrSplit(body, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(range, absl::MaxSplits('-', 1));
    const absl::string_view lo = ends[0];
    const absl::string_view hi = ends.size() > 1 ? ends[1] : ends[0];
    if (range.empty()) return Error(list, absl::StrCat("empty range in '[", body, "]'"));
    if (!AllDigits(lo) || !AllDigits(hi)) {
      return Error(
          list, absl::StrCat("range '", range, "' in '[", body, "]' must be N or N-M with at most ",
                             kMaxDigits, " digits each"));
    }
    int a = 0, b = 0;
    if (!absl::SimpleAtoi(lo, &a) || !absl::SimpleAtoi(hi, &b)) {
      return Error(list, absl::StrCat("range '", range, "' is not numeric"));
    }
    if (a > b) return Error(list, absl::StrCat("range '", range, "' is reversed"));
    if (static_cast<size_t>(b - a) >= kMaxHosts) {
      return Error(list, absl::StrCat("range '", range, "' has more than ", kMaxHosts, " names"));
    }
    for (int v = a; v <= b; ++v) {
      std::string digits = absl::StrCat(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
  }
  return out;
}

// Appends every name of one item ("gpu-[01-02]x[1-2]") to `out`.
absl::Status ExpandItem(absl::string_view list, absl::string_view item, const std::string& head,
                        std::vector<std::string>* out) {
  const size_t open = item.find('[');
  if (open == absl::string_view::npos) {
    if (out->size() >= kMaxHosts) {
      return Error(list, absl::StrCat("names more than ", kMaxHosts, " hosts"));
    }
    out->push_back(absl::StrCat(head, item));
    return absl::OkStatus();
  }
  const size_t close = item.find(']', open);  // SplitItems checked it pairs
  absl::StatusOr<std::vector<std::string>> numbers =
      ExpandBracket(list, item.substr(open + 1, close - open - 1));
  if (!numbers.ok()) return numbers.status();
  const std::string prefix = absl::StrCat(head, item.substr(0, open));
  for (const std::string& n : *numbers) {
    absl::Status s = ExpandItem(list, item.substr(close + 1), prefix + n, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int IndexOf(const std::vector<std::string>& hosts, absl::string_view host) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == host) return static_cast<int>(i);
  }
  return -1;
}

// An optional count variable that must agree with what the list says.
absl::Status CheckCount(const std::function<const char*(const char*)>& getenv_fn, const char* name,
                        size_t expected, absl::string_view list_name) {
  const absl::string_view value = GetEnv(getenv_fn, name);
  int n = 0;
  if (value.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return Error(name, absl::StrCat("'", value, "' is not a count"));
  }
  if (static_cast<size_t>(n) != expected) {
    return Error(name, absl::StrCat("says ", n, " nodes but ", list_name, " names ", expected));
  }
  return absl::OkStatus();
}

// A step must run psrt-run once a node; several tasks of a node would each
// start a job of their own.
absl::Status CheckOneTaskPerNode(const std::function<const char*(const char*)>& getenv_fn,
                                 const std::vector<std::string>& hosts) {
  const absl::string_view per_node = GetEnv(getenv_fn, "SLURM_STEP_TASKS_PER_NODE");
  if (per_node.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<int>> counts = ExpandSlurmCounts(per_node);
  if (!counts.ok()) {
    return Error("SLURM_STEP_TASKS_PER_NODE", counts.status().message());
  }
  for (size_t i = 0; i < counts->size(); ++i) {
    if ((*counts)[i] == 1) continue;
    return Error(
        "Slurm",
        absl::StrCat("this step runs ", (*counts)[i], " tasks on node ",
                     i < hosts.size() ? hosts[i] : absl::StrCat("#", i),
                     " (SLURM_STEP_TASKS_PER_NODE=", per_node,
                     "), but psrt-run must run once per node: it starts the node's training "
                     "processes itself (--workers, or one per GPU). Start it with `srun "
                     "--ntasks-per-node=1 psrt-run ...`"));
  }
  if (counts->size() != hosts.size()) {
    return Error("SLURM_STEP_TASKS_PER_NODE",
                 absl::StrCat("'", per_node, "' counts ", counts->size(),
                              " nodes but SLURM_STEP_NODELIST names ", hosts.size()));
  }
  return absl::OkStatus();
}

// This node's index in the step: its name, else SLURM_NODEID.
absl::StatusOr<int> CurrentNode(const std::function<const char*(const char*)>& getenv_fn,
                                const std::vector<std::string>& hosts, absl::string_view list) {
  const absl::string_view name = GetEnv(getenv_fn, "SLURMD_NODENAME");
  if (!name.empty()) {
    const int index = IndexOf(hosts, name);
    if (index >= 0) return index;
    return Error("SLURMD_NODENAME",
                 absl::StrCat("node '", name, "' is not in the node list ", list));
  }
  const absl::string_view id = GetEnv(getenv_fn, "SLURM_NODEID");
  if (id.empty() && hosts.size() == 1) return 0;
  int index = -1;
  if (!absl::SimpleAtoi(id, &index) || index < 0 || index >= static_cast<int>(hosts.size())) {
    return Error("SLURM_NODEID", absl::StrCat("'", id, "' is not an index 0..", hosts.size() - 1,
                                              " of ", list, " (and SLURMD_NODENAME is not set)"));
  }
  return index;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandSlurmHostList(absl::string_view list) {
  absl::StatusOr<std::vector<absl::string_view>> items = SplitItems(list);
  if (!items.ok()) return items.status();
  std::vector<std::string> hosts;
  for (size_t i = 0; i < items->size(); ++i) {
    const absl::string_view item = (*items)[i];
    if (item.empty() || item[0] == '[') {
      return Error(list, absl::StrCat("item ", i + 1, item.empty() ? " is empty" : " has no name"));
    }
    absl::Status s = ExpandItem(list, item, "", &hosts);
    if (!s.ok()) return s;
  }
  std::set<absl::string_view> seen;
  for (const std::string& h : hosts) {
    if (!seen.insert(h).second) return Error(list, absl::StrCat("names '", h, "' twice"));
  }
  return hosts;
}

absl::StatusOr<std::vector<int>> ExpandSlurmCounts(absl::string_view counts) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(counts, ',')) {
    absl::string_view count = item;
    int repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != absl::string_view::npos) {
      count = item.substr(0, paren);
      absl::string_view times = item.substr(paren + 2);
      if (times.empty() || times.back() != ')' ||
          !absl::SimpleAtoi(times.substr(0, times.size() - 1), &repeat) || repeat < 1) {
        return Error(counts, absl::StrCat("item '", item, "' must be N or N(xM)"));
      }
    }
    int n = 0;
    if (!absl::SimpleAtoi(count, &n) || n < 0) {
      return Error(counts, absl::StrCat("item '", item, "' must be N or N(xM)"));
    }
    if (out.size() + repeat > kMaxHosts) {
      return Error(counts, absl::StrCat("counts more than ", kMaxHosts, " nodes"));
    }
    out.insert(out.end(), repeat, n);
  }
  return out;
}

bool InSlurmJob(const std::function<const char*(const char*)>& getenv_fn) {
  return !GetEnv(getenv_fn, "SLURM_JOB_ID").empty();
}

absl::StatusOr<ClusterSpec> ClusterFromSlurm(
    const std::function<const char*(const char*)>& getenv_fn) {
  const bool in_step = !GetEnv(getenv_fn, "SLURM_STEP_ID").empty();
  const char* list_name = in_step ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  const absl::string_view list = GetEnv(getenv_fn, list_name);
  if (list.empty()) {
    return Error("Slurm", absl::StrCat("SLURM_JOB_ID is set but ", list_name, " is not"));
  }
  absl::StatusOr<std::vector<std::string>> hosts = ExpandSlurmHostList(list);
  if (!hosts.ok()) return Error(list_name, hosts.status().message());
  absl::Status s = CheckCount(getenv_fn, in_step ? "SLURM_STEP_NUM_NODES" : "SLURM_JOB_NUM_NODES",
                              hosts->size(), list_name);
  if (!s.ok()) return s;
  if (!in_step && hosts->size() > 1) {
    return Error(
        "Slurm",
        absl::StrCat("psrt-run runs outside a step of Slurm job ",
                     GetEnv(getenv_fn, "SLURM_JOB_ID"), " (in its batch script?), on one of its ",
                     hosts->size(), " nodes (", list,
                     "); alone it would train on this node only. Start it on every node "
                     "with `srun --ntasks-per-node=1 psrt-run ...`"));
  }
  if (in_step) {
    s = CheckOneTaskPerNode(getenv_fn, *hosts);
    if (!s.ok()) return s;
  }
  absl::StatusOr<int> current = CurrentNode(getenv_fn, *hosts, list);
  if (!current.ok()) return current.status();
  ClusterSpec spec;
  spec.hosts = *std::move(hosts);
  spec.current = *current;
  spec.source = "Slurm";
  const absl::string_view gpus = GetEnv(getenv_fn, "SLURM_GPUS_ON_NODE");
  if (!gpus.empty() && (!absl::SimpleAtoi(gpus, &spec.gpus_per_host) || spec.gpus_per_host < 0)) {
    return Error("SLURM_GPUS_ON_NODE", absl::StrCat("'", gpus, "' is not a count"));
  }
  return spec;
}

}  // namespace psrt
