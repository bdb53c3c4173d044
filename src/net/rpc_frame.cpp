// RPC frame codecs: request header, request/response message frames, the response envelope
// and the final status. Pure functions over bytes (fuzzed by fuzz/fuzz_rpc.cpp).
#include <climits>

#include "starling/net/rpc.hpp"
#include "starling/pb/rpc.pb.h"

namespace starling::net::detail {

namespace {

// Returns `s` cut to at most `max` bytes, with invalid UTF-8 (and any sequence cut by the
// limit) replaced by '?', so it is a valid proto3 string.
std::string sanitize_utf8(std::string_view s, std::size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max));
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xe  ? 3
                      : (c >> 3) == 0x1e ? 4
                                         : 0;
    bool ok = len > 0 && i + len <= s.size();
    std::uint32_t cp = 0;
    if (ok && len > 1) {
      cp = c & (0x7f >> len);
      for (std::size_t k = 1; k < len; ++k) {
        auto cc = static_cast<unsigned char>(s[i + k]);
        if ((cc & 0xc0) != 0x80) {
          ok = false;
          break;
        }
        cp = cp << 6 | (cc & 0x3f);
      }
      // Reject overlong forms, surrogates and values past U+10FFFF.
      static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (ok && (cp < kMin[len] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)) ok = false;
    }
    if (!ok) len = 1;
    if (out.size() + len > max) break;
    if (ok)
      out.append(s.substr(i, len));
    else
      out.push_back('?');
    i += len;
  }
  return out;
}

Error too_large(const char* what, std::size_t n, std::size_t limit) {
  return make_error(errc::too_large, std::string(what) + " message of " + std::to_string(n) +
                                         " bytes exceeds limit " + std::to_string(limit));
}

}  // namespace

result<void> check_message_size(const google::protobuf::MessageLite& msg, std::size_t limit,
                                const char* what) {
  std::size_t n = msg.ByteSizeLong();
  if (n > limit || n > static_cast<std::size_t>(INT_MAX)) return too_large(what, n, limit);
  return success();
}

result<Bytes> encode_payload_frame(const google::protobuf::MessageLite& msg, std::size_t limit,
                                   const char* what) {
  std::size_t n = msg.ByteSizeLong();
  if (n > limit || n > static_cast<std::size_t>(INT_MAX)) return too_large(what, n, limit);
  std::size_t inner = 1 + uvarint_size(n) + n;  // RpcResponseFrame { bytes payload = 1; }
  Bytes out;
  out.reserve(uvarint_size(inner) + inner);
  append_uvarint(out, inner);
  out.push_back(0x0a);  // field 1, wire type 2 (length-delimited)
  append_uvarint(out, n);
  std::size_t at = out.size();
  out.resize(at + n);
  msg.SerializeWithCachedSizesToArray(out.data() + at);
  return out;
}

result<Bytes> encode_message_frame(const google::protobuf::MessageLite& msg, std::size_t limit,
                                   const char* what) {
  std::size_t n = msg.ByteSizeLong();
  if (n > limit || n > static_cast<std::size_t>(INT_MAX)) return too_large(what, n, limit);
  Bytes out;
  out.reserve(uvarint_size(n) + n);
  append_uvarint(out, n);
  std::size_t at = out.size();
  out.resize(at + n);
  msg.SerializeWithCachedSizesToArray(out.data() + at);
  return out;
}

Bytes encode_status_frame(std::uint32_t code, std::string_view message) {
  pb::RpcResponseFrame f;
  auto* st = f.mutable_status();
  st->set_code(code);
  st->set_message(sanitize_utf8(message, kMaxStatusMessage));
  std::string body = f.SerializeAsString();
  return length_prefixed(as_bytes(body));
}

Bytes encode_header_frame(std::uint64_t timeout_ms, std::uint64_t max_response_size) {
  pb::RpcRequestHeader h;
  h.set_timeout_ms(timeout_ms);
  h.set_max_response_size(max_response_size);
  std::string body = h.SerializeAsString();
  return length_prefixed(as_bytes(body));
}

result<ResponseFrame> decode_response_frame(BytesView frame) {
  ResponseFrame out;
  // Fast path: exactly one payload field, as encode_payload_frame writes it; the payload is
  // then parsed in place without copying it out of the envelope.
  if (frame.size() >= 2 && frame[0] == 0x0a) {
    auto len = decode_uvarint(frame.subspan(1));
    if (len && len.value() && 1 + len.value()->length + len.value()->value == frame.size()) {
      out.view_ = frame.subspan(1 + len.value()->length);
      return out;
    }
  }
  if (frame.size() > static_cast<std::size_t>(INT_MAX))
    return make_error(errc::too_large, "response frame too large to parse");
  pb::RpcResponseFrame f;
  if (!f.ParseFromArray(frame.data(), static_cast<int>(frame.size())))
    return make_error(errc::invalid_argument,
                      "malformed response frame (" + std::to_string(frame.size()) + " bytes)");
  switch (f.kind_case()) {
    case pb::RpcResponseFrame::kPayload:
      out.owned_ = std::move(*f.mutable_payload());
      return out;
    case pb::RpcResponseFrame::kStatus:
      out.is_status = true;
      out.code = f.status().code();
      out.message = f.status().message();
      return out;
    case pb::RpcResponseFrame::KIND_NOT_SET:
      break;
  }
  return make_error(errc::protocol_violation, "response frame with neither payload nor status");
}

result<RequestHeader> decode_header(BytesView frame) {
  pb::RpcRequestHeader h;
  if (!h.ParseFromArray(frame.data(), static_cast<int>(frame.size())))
    return make_error(errc::invalid_argument,
                      "malformed request header (" + std::to_string(frame.size()) + " bytes)");
  return RequestHeader{h.timeout_ms(), h.max_response_size()};
}

result<void> parse_message(BytesView bytes, google::protobuf::MessageLite& out, const char* what) {
  if (bytes.size() > static_cast<std::size_t>(INT_MAX))
    return too_large(what, bytes.size(), static_cast<std::size_t>(INT_MAX));
  if (!out.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return make_error(errc::invalid_argument, "malformed " + std::string(what) + " message (" +
                                                  std::to_string(bytes.size()) + " bytes)");
  return success();
}

}  // namespace starling::net::detail

namespace starling::net::detail {

awaitable<result<std::optional<std::uint64_t>>> read_frame_length(BufferedReader& r) {
  auto len = co_await r.read_uvarint();
  if (len) co_return std::optional<std::uint64_t>(len.value());
  if (len.error() == errc::closed) {
    if (r.buffered() > 0)
      co_return make_error(errc::protocol_violation, "stream ended inside a frame length");
    co_return std::optional<std::uint64_t>{};
  }
  co_return len.error();
}

awaitable<result<Bytes>> read_frame_body(BufferedReader& r, std::size_t n) {
  auto got = co_await r.read_bytes(n);
  if (got) co_return std::move(got).value();
  if (got.error() == errc::closed)
    co_return make_error(errc::protocol_violation,
                         "stream ended inside a frame of " + std::to_string(n) + " bytes");
  co_return got.error();
}

std::uint64_t payload_size_of_frame(std::uint64_t frame_len) {
  // frame_len = 1 (tag) + uvarint_size(n) + n
  for (std::size_t k = 1; k <= kMaxUvarintLen; ++k) {
    if (frame_len < 1 + k) break;
    std::uint64_t n = frame_len - 1 - k;
    if (uvarint_size(n) == k) return n;
  }
  return frame_len;
}

}  // namespace starling::net::detail
