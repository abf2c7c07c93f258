// Small string helpers used across modules.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gantry {

std::string trim(std::string_view s);
// The last non-empty line of `text`, trimmed (a program's closing message).
std::string last_line(std::string_view text);
// Splits on `sep`, trims each piece, drops empty pieces.
std::vector<std::string> split_list(std::string_view s, char sep);
// ASCII letters in lower case, every other byte as it is (header names, media types, INI keys).
std::string lower(std::string s);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
// Human-readable byte count: "1.5 GiB".
std::string format_bytes(unsigned long long bytes);

}  // namespace gantry
