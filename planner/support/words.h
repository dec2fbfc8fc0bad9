// Enums spelled by words (option values, plan fields): the one way a word
// becomes an enum value; the value's word is words[value].
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace rannc {

/// The E spelled `text`, where words[i] spells E(i); nullopt for any other text.
template <typename E, size_t N> std::optional<E> enumFromWord(std::string_view text, const char *const (&words)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (text == words[i]) return E(i);
  return std::nullopt;
}

} // namespace rannc
