// Error text for the user: LibTorch's exceptions (c10::Error) carry a C++
// backtrace after their message, which the tools never print (one line per
// error, Note [hostile inputs] in files.h).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

namespace rannc {

/// `text` without a LibTorch backtrace (from "Exception raised from" or the
/// first "frame #" line on); a message of several lines keeps them.
inline std::string withoutTrace(std::string_view text) {
  size_t cut = std::min(text.find("\nException raised from"), text.find("\nframe #"));
  if (text.rfind("frame #", 0) == 0) cut = 0;
  return std::string(text.substr(0, cut));
}

} // namespace rannc
