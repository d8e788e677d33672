#include "server/checkpoint/catalog.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/key_map.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/shard_format.h"

namespace psrt {
namespace {

constexpr absl::string_view kStepPrefix = "step-";

// The first path component of an object ("step-1/MANIFEST.json" -> "step-1").
absl::string_view Folder(absl::string_view path) {
  const size_t slash = path.find('/');
  return slash == absl::string_view::npos ? absl::string_view() : path.substr(0, slash);
}

std::string NamesOf(const std::vector<CheckpointEntry>& entries) {
  std::vector<std::string> names;
  for (const CheckpointEntry& e : entries) {
    if (e.committed) names.push_back(e.name);
  }
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%012d", step); }

std::string ShardPath(absl::string_view name, int index, int count) {
  return absl::StrFormat("%s/shard-%05d-of-%05d.psrt", name, index, count);
}

std::string ManifestPath(absl::string_view name) { return absl::StrCat(name, "/", kManifestFile); }

std::string NormalizeUri(absl::string_view uri_or_path) {
  if (absl::StartsWith(uri_or_path, "/")) return absl::StrCat("file://", uri_or_path);
  return std::string(uri_or_path);
}

std::string CheckpointRef::uri() const { return absl::StrCat(root->uri(), "/", name); }

absl::StatusOr<v1::Manifest> ReadManifest(Storage* root, absl::string_view name) {
  const std::string path = ManifestPath(name);
  absl::StatusOr<std::string> text = root->Get(path);
  if (!text.ok()) return text.status();
  const std::string where = absl::StrCat(root->uri(), "/", path);
  absl::StatusOr<v1::Manifest> parsed = ParseManifest(*text, where);
  if (!parsed.ok()) return parsed.status();
  v1::Manifest& m = *parsed;
  if (m.name() != name) {
    return absl::DataLossError(absl::StrCat("manifest ", where, " names checkpoint '", m.name(),
                                            "', not the folder it is in"));
  }
  return m;
}

absl::StatusOr<v1::Manifest> ParseManifest(absl::string_view text, absl::string_view where) {
  v1::Manifest m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // newer writers may add fields
  auto st = google::protobuf::util::JsonStringToMessage(std::string(text), &m, options);
  if (!st.ok()) {
    return absl::DataLossError(absl::StrCat("manifest ", where, " is not valid: ", st.ToString()));
  }
  if (absl::Status s = CheckManifest(m, where); !s.ok()) return s;
  return m;
}

absl::Status WriteManifest(Storage* root, const v1::Manifest& manifest) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto st = google::protobuf::util::MessageToJsonString(manifest, &text, options);
  if (!st.ok()) return absl::InternalError(absl::StrCat("cannot encode the manifest: ", st.ToString()));
  return root->Put(ManifestPath(manifest.name()), text);
}

absl::Status CheckManifest(const v1::Manifest& m, absl::string_view where) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("manifest ", where, ": ", what));
  };
  if (m.format_version() > kManifestFormatVersion) {
    return absl::UnimplementedError(absl::StrCat("manifest ", where, " has format version ",
                                                 m.format_version(), "; this build reads up to ",
                                                 kManifestFormatVersion));
  }
  if (m.format_version() < 1) return bad("no format_version");
  if (m.step() < 0) return bad(absl::StrCat("step ", m.step(), " is negative"));
  for (const v1::ManifestShard& s : m.shards()) {
    if (absl::Status st = ValidateObjectPath(s.path()); !st.ok()) {
      return bad(absl::StrCat("shard path: ", st.message()));
    }
  }
  std::map<std::string, std::vector<const v1::ManifestKey*>> keys;
  for (const v1::ManifestKey& k : m.keys()) {
    if (k.shard() < 0 || k.shard() >= m.shards_size()) {
      return bad(absl::StrCat("key '", KeyName(k.variable(), k.partition()), "' names shard ",
                              k.shard(), " of ", m.shards_size()));
    }
    keys[k.variable()].push_back(&k);
  }
  std::set<std::string> names;
  for (const v1::ManifestVariable& v : m.variables()) {
    if (!names.insert(v.name()).second) return bad(absl::StrCat("variable '", v.name(), "' appears twice"));
    int64_t n = 1;
    for (int64_t d : v.shape()) {
      if (d < 0 || (d != 0 && n > INT64_MAX / d)) return bad(absl::StrCat("variable '", v.name(), "' has a bad shape"));
      n *= d;
    }
    std::vector<const v1::ManifestKey*>& ks = keys[v.name()];
    if (v.has_table()) {
      // A table: one part per server that saved it, each with its rows.
      const int64_t dim = v.table().dim();
      std::set<uint32_t> parts;
      for (const v1::ManifestKey* k : ks) {
        if (dim <= 0 || k->rows() < 0 || k->num_elements() != k->rows() * dim || !parts.insert(k->partition()).second) {
          return bad(absl::StrCat("table '", v.name(), "': part ", k->partition(), " holds ", k->num_elements(),
                                  " values for ", k->rows(), " rows of dim ", dim, ", or appears twice"));
        }
      }
      keys.erase(v.name());
      continue;
    }
    std::sort(ks.begin(), ks.end(), [](auto* a, auto* b) { return a->offset() < b->offset(); });
    int64_t next = 0;
    for (const v1::ManifestKey* k : ks) {
      if (k->offset() != next || k->num_elements() <= 0 || k->num_elements() > n - next) {
        return bad(absl::StrCat("the keys of variable '", v.name(), "' do not tile its ", n,
                                " elements (key '", KeyName(k->variable(), k->partition()),
                                "' covers [", k->offset(), ", +", k->num_elements(), ") after ", next, ")"));
      }
      next += k->num_elements();
    }
    if (next != n) {
      return bad(absl::StrCat("the keys of variable '", v.name(), "' cover ", next, " of its ", n, " elements"));
    }
    keys.erase(v.name());
  }
  if (!keys.empty()) return bad(absl::StrCat("keys of unknown variable '", keys.begin()->first, "'"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadLatest(Storage* root) {
  absl::StatusOr<std::string> latest = root->Get(kLatestFile);
  if (!latest.ok()) return latest.status();
  return std::string(absl::StripAsciiWhitespace(*latest));
}

namespace {

// The objects of each checkpoint folder (one List), sorted by folder name:
// zero-padded steps, so oldest first.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> Folders(Storage* root) {
  absl::StatusOr<std::vector<std::string>> objects = root->List(kStepPrefix);
  if (!objects.ok()) return objects.status();
  std::map<std::string, std::vector<std::string>> folders;
  for (const std::string& path : *objects) {
    const absl::string_view folder = Folder(path);
    if (!folder.empty()) folders[std::string(folder)].push_back(path);
  }
  return folders;
}

bool HasManifest(const std::string& name, const std::vector<std::string>& objects) {
  return std::find(objects.begin(), objects.end(), ManifestPath(name)) != objects.end();
}

// LATEST's content, or "" when there is none.
absl::StatusOr<std::string> LatestOrEmpty(Storage* root) {
  absl::StatusOr<std::string> latest = ReadLatest(root);
  if (absl::IsNotFound(latest.status())) return std::string();
  return latest;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(Storage* root) {
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> folders = Folders(root);
  if (!folders.ok()) return folders.status();
  absl::StatusOr<std::string> latest = LatestOrEmpty(root);
  if (!latest.ok()) return latest.status();
  std::vector<CheckpointEntry> out;
  for (const auto& [name, objects] : *folders) {
    CheckpointEntry e;
    e.name = name;
    e.committed = HasManifest(name, objects);
    e.latest = name == *latest;
    if (e.committed) {
      absl::StatusOr<v1::Manifest> m = ReadManifest(root, name);
      if (!m.ok()) return m.status();
      e.manifest = *std::move(m);
    }
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<CheckpointRef> OpenCheckpoint(absl::string_view uri_in) {
  std::string uri = NormalizeUri(uri_in);
  while (absl::EndsWith(uri, "/")) uri.pop_back();
  const size_t slash = uri.rfind('/');
  const size_t scheme = uri.find("://");
  if (slash == std::string::npos || scheme == std::string::npos || slash <= scheme + 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", uri_in, "' names no checkpoint; give ROOT/step-NNNNNNNNNNNN (as psrt-ckpt ls shows)"));
  }
  CheckpointRef ref;
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(uri.substr(0, slash));
  if (!root.ok()) return root.status();
  ref.root = *std::move(root);
  ref.name = uri.substr(slash + 1);
  absl::StatusOr<v1::Manifest> m = ReadManifest(ref.root.get(), ref.name);
  if (absl::IsNotFound(m.status())) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", uri, ": it has no ", kManifestFile,
                                            " (missing, or a checkpoint that was never committed)"));
  }
  if (!m.ok()) return m.status();
  ref.manifest = *std::move(m);
  return ref;
}

absl::StatusOr<CheckpointRef> ResolveCheckpoint(absl::string_view restore, absl::string_view root_uri) {
  if (absl::StrContains(restore, "://") || absl::StartsWith(restore, "/")) return OpenCheckpoint(restore);
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(NormalizeUri(root_uri));
  if (!root.ok()) return root.status();
  std::string name;
  if (restore == "latest") {
    absl::StatusOr<std::string> latest = ReadLatest(root->get());
    if (absl::IsNotFound(latest.status())) {
      absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root->get());
      return absl::NotFoundError(absl::StrCat(
          "restore 'latest': no checkpoint under ", (*root)->uri(), " (no ", kLatestFile,
          "); committed checkpoints there: ", all.ok() ? NamesOf(*all) : all.status().ToString()));
    }
    if (!latest.ok()) return latest.status();
    name = *latest;
  } else {
    int64_t step;
    if (!absl::SimpleAtoi(restore, &step) || step < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore '", restore, "' is neither 'latest', a step number nor a checkpoint URI"));
    }
    name = CheckpointName(step);
    absl::StatusOr<bool> exists = (*root)->Exists(ManifestPath(name));
    if (!exists.ok()) return exists.status();
    if (!*exists) {
      absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root->get());
      return absl::NotFoundError(absl::StrCat(
          "restore step ", step, ": no committed checkpoint ", name, " under ", (*root)->uri(),
          "; committed checkpoints there: ", all.ok() ? NamesOf(*all) : all.status().ToString()));
    }
  }
  return OpenCheckpoint(absl::StrCat((*root)->uri(), "/", name));
}

absl::StatusOr<std::string> ReadShard(Storage* root, const v1::Manifest& m, int index) {
  const v1::ManifestShard& shard = m.shards(index);
  const std::string where = absl::StrCat(root->uri(), "/", shard.path());
  absl::StatusOr<std::string> bytes = root->Get(shard.path());
  if (absl::IsNotFound(bytes.status())) {
    return absl::DataLossError(absl::StrCat("shard ", where, " of checkpoint ", m.name(), " is missing"));
  }
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(bytes->size()) != shard.bytes()) {
    return absl::DataLossError(absl::StrCat("shard ", where, " has ", bytes->size(),
                                            " bytes; the manifest says ", shard.bytes()));
  }
  if (Crc32c(*bytes) != shard.crc32c()) {
    // Decoding names the record that is bad; the whole-file CRC only says
    // that something is.
    absl::StatusOr<std::vector<KeyRecord>> records = DecodeShard(*bytes, where);
    if (!records.ok()) return records.status();
    return absl::DataLossError(absl::StrCat("shard ", where, ": CRC32C mismatch against the manifest"));
  }
  return bytes;
}

absl::StatusOr<VerifyReport> VerifyCheckpoint(Storage* root, const v1::Manifest& m) {
  VerifyReport report;
  std::vector<std::set<std::string>> expected(m.shards_size());
  for (const v1::ManifestKey& k : m.keys()) expected[k.shard()].insert(KeyName(k.variable(), k.partition()));
  for (int i = 0; i < m.shards_size(); ++i) {
    absl::StatusOr<std::string> bytes = ReadShard(root, m, i);
    if (!bytes.ok()) return bytes.status();
    const std::string where = absl::StrCat(root->uri(), "/", m.shards(i).path());
    absl::StatusOr<std::vector<KeyRecord>> records = DecodeShard(*bytes, where);
    if (!records.ok()) return records.status();
    std::set<std::string> got;
    for (const KeyRecord& r : *records) got.insert(KeyName(r.variable, r.partition));
    if (got != expected[i]) {
      return absl::DataLossError(absl::StrCat("shard ", where, " holds ", got.size(),
                                              " keys that differ from the ", expected[i].size(),
                                              " the manifest lists for it"));
    }
    ++report.shards;
    report.records += static_cast<int64_t>(records->size());
    report.bytes += static_cast<int64_t>(bytes->size());
  }
  return report;
}

absl::Status PruneCheckpoints(Storage* root, int keep, absl::string_view in_progress) {
  // Names and objects are enough here: no manifest is read.
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> folders = Folders(root);
  if (!folders.ok()) return folders.status();
  absl::StatusOr<std::string> latest = LatestOrEmpty(root);
  if (!latest.ok()) return latest.status();
  int committed = 0;
  for (const auto& [name, objects] : *folders) committed += HasManifest(name, objects);
  int to_drop = keep > 0 ? committed - keep : 0;
  for (const auto& [name, objects] : *folders) {  // oldest first
    if (name == in_progress || name == *latest) continue;
    if (HasManifest(name, objects)) {
      if (to_drop <= 0) continue;
      --to_drop;
      if (absl::Status s = root->Delete(ManifestPath(name)); !s.ok()) return s;
    }
    for (const std::string& path : objects) {
      if (absl::Status s = root->Delete(path); !s.ok()) return s;
    }
  }
  return root->RemoveUnfinished("");
}

}  // namespace psrt
