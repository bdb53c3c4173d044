// Tensor compression names and the round-data check (collaboration.hpp).
#include <fmt/format.h>

#include "starling/training/collaboration.hpp"

namespace starling::training {

const char* to_string(Compression c) {
  switch (c) {
    case Compression::none:
      return "none";
    case Compression::float16:
      return "float16";
    case Compression::uint8:
      return "uint8";
  }
  return "?";
}

result<Compression> parse_compression(const std::string& s) {
  if (s == "none") return Compression::none;
  if (s == "float16" || s == "fp16") return Compression::float16;
  if (s == "uint8" || s == "8bit") return Compression::uint8;
  return make_error(errc::invalid_argument,
                    fmt::format("unknown compression '{}' (none|float16|uint8)", s));
}

result<std::size_t> check_round_data(const RoundData& d) {
  std::size_t n = 0;
  for (const auto& [name, size] : d.layout) n += size;
  if (d.input.size() != n || d.output.size() != n)
    return make_error(errc::invalid_argument,
                      fmt::format("round data: {} input and {} output elements, the layout {}",
                                  d.input.size(), d.output.size(), n));
  return n;
}

}  // namespace starling::training
