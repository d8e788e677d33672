// A checkpoint's MANIFEST.json on arbitrary text: refused with an error, or
// accepted as a manifest that CheckManifest passes and that prints and
// parses back to the same message.

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/checkpoint/catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<psrt::v1::Manifest> m = psrt::ParseManifest(text, "fuzz");
  if (!m.ok()) return 0;
  // protobuf's JSON reader keeps some ill-named keys as unknown fields,
  // which psrt never reads and never prints.
  m->DiscardUnknownFields();
  std::string printed;
  if (!google::protobuf::util::MessageToJsonString(*m, &printed).ok()) std::abort();
  absl::StatusOr<psrt::v1::Manifest> again = psrt::ParseManifest(printed, "printed");
  if (!again.ok() || !google::protobuf::util::MessageDifferencer::Equals(*m, *again)) {
    std::fprintf(stderr, "manifest_fuzz: %s printed as %s, read back as %s\n", m->ShortDebugString().c_str(), printed.c_str(),
                 again.ok() ? again->ShortDebugString().c_str() : again.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
