// Enums spelled by words (option values, plan fields): the one way a word
// becomes an enum value; the value's word is words[value].
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rannc {

/// The E spelled `text`, where words[i] spells E(i); nullopt for any other text.
template <typename E, size_t N> std::optional<E> enumFromWord(std::string_view text, const char *const (&words)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (text == words[i]) return E(i);
  return std::nullopt;
}

/// Every word of `words`, in enum order (what --help lists).
template <size_t N> std::vector<std::string> wordList(const char *const (&words)[N]) {
  return {std::begin(words), std::end(words)};
}

} // namespace rannc
