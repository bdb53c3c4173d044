// Expert uids and patterns (see uid.hpp).
#include "starling/moe/uid.hpp"

#include <charconv>

namespace starling::moe {

namespace {

Error bad(std::string_view text, const std::string& why) {
  return Error(errc::invalid_argument,
               "expert uid '" + std::string(text.substr(0, 128)) + "': " + why);
}

bool valid_grid(std::string_view g) {
  if (g.empty() || g.size() > kMaxGridName) return false;
  for (char c : g) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    auto dot = s.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, dot - start));
    start = dot + 1;
  }
}

bool parse_u32(std::string_view s, std::uint32_t& out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

std::string ExpertUid::to_string() const {
  std::string s = grid;
  for (auto c : coords) {
    s += '.';
    s += std::to_string(c);
  }
  return s;
}

std::string ExpertUid::prefix(std::size_t n) const {
  std::string s = grid + ".";
  for (std::size_t i = 0; i < n && i < coords.size(); ++i) {
    s += std::to_string(coords[i]);
    s += '.';
  }
  return s;
}

result<ExpertUid> parse_uid(std::string_view text) {
  auto parts = split_dots(text);
  if (!valid_grid(parts[0])) return bad(text, "grid name must be 1-64 of [A-Za-z0-9_-]");
  if (parts.size() < 2) return bad(text, "no coordinate");
  if (parts.size() - 1 > kMaxGridDims) return bad(text, "more than 8 dimensions");
  ExpertUid uid;
  uid.grid = std::string(parts[0]);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    std::uint32_t v = 0;
    if (!parse_u32(parts[i], v) || v >= kMaxCoordinate)
      return bad(text, "coordinate '" + std::string(parts[i].substr(0, 16)) +
                           "' is not a number below 2^20");
    uid.coords.push_back(v);
  }
  return uid;
}

result<std::vector<ExpertUid>> expand_pattern(std::string_view pattern) {
  auto parts = split_dots(pattern);
  if (!valid_grid(parts[0])) return bad(pattern, "grid name must be 1-64 of [A-Za-z0-9_-]");
  if (parts.size() < 2) return bad(pattern, "no coordinate");
  if (parts.size() - 1 > kMaxGridDims) return bad(pattern, "more than 8 dimensions");
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;  // [lo, hi)
  std::size_t total = 1;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    auto p = parts[i];
    std::uint32_t lo = 0, hi = 0;
    if (!p.empty() && p.front() == '[') {
      if (p.back() != ']') return bad(pattern, "range without ']'");
      auto inner = p.substr(1, p.size() - 2);
      auto colon = inner.find(':');
      if (colon == std::string_view::npos) return bad(pattern, "range needs 'lo:hi'");
      if (!parse_u32(inner.substr(0, colon), lo) || !parse_u32(inner.substr(colon + 1), hi))
        return bad(pattern, "range bounds must be numbers");
      if (hi > kMaxCoordinate) return bad(pattern, "range bound above 2^20");
      if (lo >= hi)
        return bad(pattern, "empty range [" + std::to_string(lo) + ":" + std::to_string(hi) + "]");
    } else {
      if (!parse_u32(p, lo) || lo >= kMaxCoordinate)
        return bad(pattern, "coordinate '" + std::string(p.substr(0, 16)) + "' is not a number");
      hi = lo + 1;
    }
    total *= hi - lo;
    if (total > kMaxPatternUids) return bad(pattern, "expands to more than 65536 uids");
    ranges.emplace_back(lo, hi);
  }
  std::vector<ExpertUid> out;
  out.reserve(total);
  std::vector<std::uint32_t> cur;
  for (auto& r : ranges) cur.push_back(r.first);
  for (;;) {
    out.push_back(ExpertUid{std::string(parts[0]), cur});
    std::size_t d = ranges.size();
    while (d > 0) {
      --d;
      if (++cur[d] < ranges[d].second) break;
      cur[d] = ranges[d].first;
      if (d == 0) return out;
    }
    if (ranges.empty()) return out;
  }
}

std::vector<PrefixEntry> declaration_prefixes(const ExpertUid& uid) {
  std::vector<PrefixEntry> out;
  for (std::size_t i = 0; i < uid.coords.size(); ++i)
    out.push_back(PrefixEntry{uid.prefix(i), uid.coords[i], i + 1 == uid.coords.size()});
  return out;
}

}  // namespace starling::moe
