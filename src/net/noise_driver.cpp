// The async side of libp2p Noise: drives a Libp2pHandshake over a ByteStream (messages framed
// with a 2-byte big-endian length), under one deadline, then wraps the stream in a NoiseStream.
#include <cstring>

#include "net/noise_handshake.hpp"
#include "net/noise_stream.hpp"
#include "starling/core/log.hpp"
#include "starling/net/noise.hpp"

namespace starling::net {

namespace {

awaitable<result<void>> write_message(ByteStream& s, BytesView msg) {
  Bytes framed;
  framed.reserve(2 + msg.size());
  append_be16(framed, static_cast<std::uint16_t>(msg.size()));
  framed.insert(framed.end(), msg.begin(), msg.end());
  co_return co_await s.write(framed);
}

// Reads exactly one message: never past it, so transport frames that follow stay unread.
awaitable<result<Bytes>> read_message(ByteStream& s) {
  std::uint8_t header[2];
  ST_CO_TRY(co_await read_exact(s, header));
  Bytes msg(load_be16(header));
  if (!msg.empty()) {
    auto r = co_await read_exact(s, msg);
    if (!r) {
      if (r.error() == errc::closed)
        co_return make_error(errc::protocol_violation,
                             "connection closed inside a handshake message of " +
                                 std::to_string(msg.size()) + " bytes");
      co_return r.error();
    }
  }
  co_return msg;
}

awaitable<result<SecureChannel>> run_handshake(ByteStreamPtr raw, noise::Role role,
                                               const crypto::KeyPair& identity,
                                               noise::HandshakeConfig config) {
  noise::Libp2pHandshake hs(role, identity, std::move(config));
  while (!hs.complete()) {
    if (hs.failed()) co_return make_error(errc::internal, "noise handshake failed");
    if (hs.is_my_turn()) {
      ST_CO_TRY(auto msg, hs.write_message());
      ST_CO_TRY(co_await write_message(*raw, msg));
    } else {
      ST_CO_TRY(auto msg, co_await read_message(*raw));
      ST_CO_TRY(hs.read_message(msg));
    }
  }
  ST_CO_TRY(auto ciphers, hs.split());
  const auto& remote = *hs.remote();
  SecureChannel out;
  out.remote_peer = remote.peer;
  out.remote_key = remote.key;
  out.remote_stream_muxers = remote.stream_muxers;
  out.stream = std::make_shared<NoiseStream>(
      raw, std::move(ciphers), "noise " + remote.peer.short_string() + " over " + raw->describe());
  co_return out;
}

// `identity` is taken by value: the coroutine frame owns its copy.
awaitable<result<SecureChannel>> secure(ByteStreamPtr raw, crypto::KeyPair identity,
                                        noise::Role role, std::optional<PeerId> expected_remote,
                                        Duration timeout) {
  std::string what = std::string("noise handshake (") +
                     (role == noise::Role::initiator ? "outbound" : "inbound") + ") over " +
                     raw->describe();
  if (expected_remote) what += " to " + expected_remote->to_string();
  noise::HandshakeConfig config;
  config.expected_remote = std::move(expected_remote);
  auto r = co_await with_timeout(run_handshake(raw, role, identity, std::move(config)), timeout,
                                 what + ": no progress within the deadline");
  if (r) co_return r;
  raw->reset();
  Error e = r.error() == errc::timeout ? r.error() : r.error().with_context(what);
  if (e == errc::protocol_violation || e == errc::too_large || e == errc::invalid_argument)
    logger("net")->warn("{}", e.message());
  else
    logger("net")->debug("{}", e.message());
  co_return e;
}

}  // namespace

awaitable<result<SecureChannel>> noise_secure_outbound(ByteStreamPtr raw,
                                                       const crypto::KeyPair& identity,
                                                       std::optional<PeerId> expected_remote,
                                                       Duration timeout) {
  return secure(std::move(raw), identity, noise::Role::initiator, std::move(expected_remote),
                timeout);
}

awaitable<result<SecureChannel>> noise_secure_inbound(ByteStreamPtr raw,
                                                      const crypto::KeyPair& identity,
                                                      Duration timeout) {
  return secure(std::move(raw), identity, noise::Role::responder, std::nullopt, timeout);
}

}  // namespace starling::net
