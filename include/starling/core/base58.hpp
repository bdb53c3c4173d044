// base58btc (Bitcoin alphabet) and multibase base32 (RFC 4648 lower-case, no padding).
// Decoders are strict (every byte string has exactly one accepted encoding) and return
// errc::invalid_argument naming the bad character. Pure functions, any thread.
#pragma once

#include <string>
#include <string_view>

#include "starling/core/bytes.hpp"

namespace starling {

std::string base58_encode(BytesView data);
result<Bytes> base58_decode(std::string_view s);
std::string base32_encode(BytesView data);  // lower-case, unpadded
result<Bytes> base32_decode(std::string_view s);

}  // namespace starling
