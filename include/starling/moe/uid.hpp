// Expert uids on a grid: "ffn.3.17" is the expert at coordinates (3, 17) of the grid "ffn".
// A prefix is the grid name followed by some coordinates, each with a trailing dot ("ffn.",
// "ffn.3."). Patterns name many uids at once: "ffn.[0:4].[0:4]" is the 16 uids ffn.0.0 ..
// ffn.3.3 (half-open ranges, like Python's), "ffn.[0:2].7" mixes ranges and fixed indices.
//
// Threading: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/result.hpp"

namespace starling::moe {

// Largest coordinate accepted anywhere (a grid dimension has at most this many experts).
inline constexpr std::uint32_t kMaxCoordinate = 1u << 20;
// At most this many grid dimensions.
inline constexpr std::size_t kMaxGridDims = 8;
// A pattern expands to at most this many uids.
inline constexpr std::size_t kMaxPatternUids = 1u << 16;
// Longest grid name (letters, digits, '_' and '-').
inline constexpr std::size_t kMaxGridName = 64;

struct ExpertUid {
  std::string grid;                   // "ffn"
  std::vector<std::uint32_t> coords;  // {3, 17}

  std::string to_string() const;  // "ffn.3.17"
  // The prefix holding the first `n` coordinates: prefix(0) = "ffn.", prefix(1) = "ffn.3.".
  std::string prefix(std::size_t n) const;
  friend bool operator==(const ExpertUid&, const ExpertUid&) = default;
  friend auto operator<=>(const ExpertUid&, const ExpertUid&) = default;
};

// Parses "ffn.3.17". errc::invalid_argument naming the problem (empty, bad grid name, no
// coordinate, non-numeric or too large coordinate, too many dimensions).
result<ExpertUid> parse_uid(std::string_view text);

// Expands a pattern ("ffn.[0:4].[0:4]", "ffn.3.[0:8]", "ffn.1.2") in row-major order.
// errc::invalid_argument for a malformed pattern, an empty range, or more than
// kMaxPatternUids uids.
result<std::vector<ExpertUid>> expand_pattern(std::string_view pattern);

// Every prefix of `uid` that carries a declaration, with the coordinate that follows it:
// for ffn.3.17 -> {("ffn.", 3), ("ffn.3.", 17)}.
struct PrefixEntry {
  std::string prefix;
  std::uint32_t coordinate = 0;
  bool leaf = false;  // the coordinate is the uid's last one
};
std::vector<PrefixEntry> declaration_prefixes(const ExpertUid& uid);

}  // namespace starling::moe
