#include "starling/net/multistream.hpp"

#include <algorithm>

#include "starling/core/log.hpp"

namespace starling::net {

Bytes multistream_encode(std::string_view msg) {
  Bytes out;
  out.reserve(msg.size() + 3);
  append_uvarint(out, msg.size() + 1);
  out.insert(out.end(), msg.begin(), msg.end());
  out.push_back('\n');
  return out;
}

result<std::optional<MultistreamMessage>> multistream_decode(BytesView in) {
  ST_TRY(auto d, decode_uvarint(in));
  if (!d) return std::optional<MultistreamMessage>{};
  if (d->value > kMaxMultistreamMessage)
    return make_error(errc::too_large, "multistream message of " + std::to_string(d->value) +
                                           " bytes exceeds " +
                                           std::to_string(kMaxMultistreamMessage));
  if (d->value == 0) return make_error(errc::protocol_violation, "empty multistream message");
  if (in.size() - d->length < d->value) return std::optional<MultistreamMessage>{};
  auto body = in.subspan(d->length, d->value);
  if (body.back() != '\n')
    return make_error(errc::protocol_violation, "multistream message does not end in newline");
  auto text = as_string(body.first(body.size() - 1));
  if (text.find('\n') != std::string_view::npos)
    return make_error(errc::protocol_violation, "multistream message has an embedded newline");
  return std::optional<MultistreamMessage>(
      MultistreamMessage{std::string(text), d->length + d->value});
}

namespace {

// Reads whole messages from a stream, keeping bytes that follow them.
class MessageReader {
 public:
  explicit MessageReader(ByteStream& s) : s_(s) {}
  awaitable<result<std::string>> next() {
    for (;;) {
      ST_CO_TRY(auto m, multistream_decode(BytesView(buf_).subspan(pos_)));
      if (m) {
        pos_ += m->consumed;
        co_return std::move(m->text);
      }
      if (pos_ > 0) {
        buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
        pos_ = 0;
      }
      std::size_t old = buf_.size();
      buf_.resize(old + 512);
      auto n = co_await s_.read_some(MutableBytesView(buf_).subspan(old));
      if (!n) co_return n.error().with_context("multistream-select");
      buf_.resize(old + n.value());
    }
  }
  Bytes rest() { return Bytes(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end()); }
  // True if a whole message (or a malformed one) is already buffered.
  bool has_message() const {
    auto m = multistream_decode(BytesView(buf_).subspan(pos_));
    return !m || m.value().has_value();
  }

 private:
  ByteStream& s_;
  Bytes buf_;
  std::size_t pos_ = 0;
};

awaitable<result<Negotiated>> select_impl(ByteStreamPtr stream, std::vector<std::string> protos) {
  if (protos.empty()) co_return make_error(errc::invalid_argument, "no protocols to propose");
  MessageReader reader(*stream);
  Bytes first = multistream_encode(kMultistreamHeader);
  auto p0 = multistream_encode(protos[0]);
  first.insert(first.end(), p0.begin(), p0.end());
  ST_CO_TRY(co_await stream->write(first));
  ST_CO_TRY(auto header, co_await reader.next());
  if (header != kMultistreamHeader)
    co_return make_error(errc::protocol_violation,
                         "unexpected multistream header '" + header + "'");
  for (std::size_t i = 0; i < protos.size(); ++i) {
    if (i > 0) {
      ST_CO_TRY(co_await stream->write(multistream_encode(protos[i])));
    }
    ST_CO_TRY(auto answer, co_await reader.next());
    if (answer == protos[i]) {
      co_return Negotiated{protos[i], with_prefix(stream, reader.rest())};
    }
    if (answer != "na")
      co_return make_error(errc::protocol_violation,
                           "peer answered '" + answer + "' to proposal '" + protos[i] + "'");
  }
  std::string names;
  for (auto& p : protos) names += (names.empty() ? "" : ", ") + p;
  co_return make_error(errc::unsupported, "peer supports none of: " + names);
}

// `refused`: set once a proposal was answered "na" (see multistream_handle).
awaitable<result<Negotiated>> handle_impl(ByteStreamPtr stream,
                                          std::function<bool(std::string_view)> supported,
                                          bool& refused) {
  MessageReader reader(*stream);
  ST_CO_TRY(auto header, co_await reader.next());
  if (header != kMultistreamHeader)
    co_return make_error(errc::protocol_violation,
                         "unexpected multistream header '" + header + "'");
  // A dialer that pipelined its proposal (or sent it lazily with data) gets the header and the
  // answer in one write; one that waits for our header gets it now.
  Bytes out = multistream_encode(kMultistreamHeader);
  if (!reader.has_message()) {
    ST_CO_TRY(co_await stream->write(out));
    out.clear();
  }
  for (int i = 0; i < kMaxProposals; ++i) {
    ST_CO_TRY(auto proposal, co_await reader.next());
    const bool accept = proposal != "ls" && supported(proposal);
    auto answer = multistream_encode(accept ? std::string_view(proposal) : "na");
    out.insert(out.end(), answer.begin(), answer.end());
    ST_CO_TRY(co_await stream->write(out));
    out.clear();
    if (accept) co_return Negotiated{std::move(proposal), with_prefix(stream, reader.rest())};
    refused = true;
  }
  co_return make_error(errc::protocol_violation,
                       "peer made more than " + std::to_string(kMaxProposals) + " proposals");
}

}  // namespace

awaitable<result<Negotiated>> multistream_select(ByteStreamPtr stream,
                                                 std::vector<std::string> protocols,
                                                 Duration timeout) {
  auto desc = stream->describe();
  auto r = co_await with_timeout(select_impl(stream, std::move(protocols)), timeout,
                                 "multistream-select on " + desc);
  if (!r) stream->reset();
  co_return r;
}

awaitable<result<Negotiated>> multistream_handle(ByteStreamPtr stream,
                                                 std::function<bool(std::string_view)> supported,
                                                 Duration timeout) {
  auto desc = stream->describe();
  bool refused = false;
  auto r = co_await with_timeout(handle_impl(stream, std::move(supported), refused), timeout,
                                 "multistream-select on " + desc);
  if (!r) {
    logger("net")->debug("negotiation failed on {}: {}", desc, r.error().message());
    // After a refusal, a lazy dialer's data follows its proposal and does not parse: close
    // our side gracefully so it still reads the "na" (a reset could discard it unread).
    if (refused && r.error() != errc::timeout && r.error() != errc::reset)
      (void)co_await stream->close_write();
    else
      stream->reset();
  }
  co_return r;
}

}  // namespace starling::net
