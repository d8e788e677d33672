#ifndef PSRT_SERVER_CHECKPOINT_AWS_XML_H_
#define PSRT_SERVER_CHECKPOINT_AWS_XML_H_

// The little XML that S3's and STS's answers need: the text of a tag and the
// blocks of a repeated one. Their answers are flat and machine-written, so a
// tag search is enough; no XML library is pulled in for it.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace psrt {

// The text of the first <tag>...</tag> in `xml`, unescaped; nullopt when
// absent.
std::optional<std::string> XmlTagText(absl::string_view xml, absl::string_view tag);

// The raw contents of each <tag>...</tag> block, in order.
std::vector<absl::string_view> XmlBlocks(absl::string_view xml, absl::string_view tag);

// Escapes & < > " for element text.
std::string XmlEscape(absl::string_view s);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_AWS_XML_H_
