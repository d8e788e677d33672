#include "server/checkpoint/aws_xml.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace psrt {
namespace {

std::string XmlUnescape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == absl::string_view::npos) {
      out.push_back(s[i]);
      continue;
    }
    absl::string_view entity = s.substr(i + 1, semi - i - 1);
    uint32_t code = 0;
    if (entity == "amp") {
      out.push_back('&');
    } else if (entity == "lt") {
      out.push_back('<');
    } else if (entity == "gt") {
      out.push_back('>');
    } else if (entity == "quot") {
      out.push_back('"');
    } else if (entity == "apos") {
      out.push_back('\'');
    } else if (absl::ConsumePrefix(&entity, "#x") || absl::ConsumePrefix(&entity, "#X")
                   ? absl::SimpleHexAtoi(entity, &code)
                   : (absl::ConsumePrefix(&entity, "#") && absl::SimpleAtoi(entity, &code))) {
      // UTF-8 encode the code point.
      if (code < 0x80) {
        out.push_back(static_cast<char>(code));
      } else if (code < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (code >> 6)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      } else if (code < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (code >> 12)));
        out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      } else {
        out.push_back(static_cast<char>(0xF0 | (code >> 18)));
        out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
      }
    } else {
      absl::StrAppend(&out, s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

}  // namespace

std::string XmlEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::vector<absl::string_view> XmlBlocks(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> blocks;
  const std::string open = absl::StrCat("<", tag, ">");
  const std::string close = absl::StrCat("</", tag, ">");
  size_t pos = 0;
  while (true) {
    const size_t start = xml.find(open, pos);
    if (start == absl::string_view::npos) break;
    const size_t end = xml.find(close, start + open.size());
    if (end == absl::string_view::npos) break;
    blocks.push_back(xml.substr(start + open.size(), end - start - open.size()));
    pos = end + close.size();
  }
  return blocks;
}

std::optional<std::string> XmlTagText(absl::string_view xml, absl::string_view tag) {
  std::vector<absl::string_view> blocks = XmlBlocks(xml, tag);
  if (blocks.empty()) return std::nullopt;
  return XmlUnescape(blocks.front());
}

}  // namespace psrt
