// libFuzzer target for libp2p Noise: arbitrary bytes as handshake messages to an initiator and a
// responder, as handshake payloads behind valid encryption, and as a transport byte stream (a
// mix of genuine frames, garbage and bit flips, delivered in arbitrary chunks) read through a
// NoiseStream. Nothing may crash; uncorrupted transport data must come out unchanged.
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "net/noise_handshake.hpp"
#include "net/noise_stream.hpp"
#include "starling/core/log.hpp"

using namespace starling;
using namespace starling::net;

namespace {

struct Input {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t byte() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(byte() << 8 | byte()); }
  BytesView take(std::size_t k) {
    k = std::min(k, n);
    BytesView v(p, k);
    p += k;
    n -= k;
    return v;
  }
  BytesView rest() { return take(n); }
};

noise::X25519KeyPair fixed_x(std::uint8_t fill) {
  return noise::X25519KeyPair::from_secret(Bytes(32, fill)).value();
}

const crypto::KeyPair& identity(int which) {
  static const crypto::KeyPair a = crypto::KeyPair::from_seed(Bytes(32, 1)).value();
  static const crypto::KeyPair b = crypto::KeyPair::from_seed(Bytes(32, 2)).value();
  return which ? b : a;
}

noise::HandshakeConfig fixed_config(std::uint8_t s, std::uint8_t e) {
  noise::HandshakeConfig c;
  c.static_key = fixed_x(s);
  c.ephemeral_key = fixed_x(e);
  return c;
}

// Fuzzed messages into a libp2p responder: message 1, then (after its reply) message 3.
void fuzz_responder(Input in) {
  noise::Libp2pHandshake r(noise::Role::responder, identity(1), fixed_config(3, 4));
  if (!r.read_message(in.take(in.u16()))) return;
  // Message 1 is only an ephemeral key (no DH yet), so a low-order key from the peer (e.g. all
  // zeros) is accepted there and refused by message 2's first DH (all-zero shared secret): a
  // clean error, and the handshake goes no further.
  if (!r.write_message()) return;
  (void)r.read_message(in.rest());
}

// Fuzzed message 2 into a libp2p initiator.
void fuzz_initiator(Input in) {
  noise::Libp2pHandshake i(noise::Role::initiator, identity(0), fixed_config(5, 6));
  if (!i.write_message()) std::abort();
  if (i.read_message(in.rest()) && !i.write_message()) std::abort();
}

// A genuine XX peer that sends fuzzed payloads, so parsing is reached behind valid encryption.
void fuzz_payloads(Input in) {
  bool peer_is_responder = in.byte() & 1;
  BytesView payload = in.rest();
  (void)noise::verify_handshake_payload(payload, fixed_x(11).public_key);
  if (peer_is_responder) {
    noise::Libp2pHandshake i(noise::Role::initiator, identity(0), fixed_config(5, 6));
    noise::XXHandshake peer(noise::Role::responder, fixed_x(7), {}, fixed_x(8));
    if (!peer.read_message(i.write_message().value())) std::abort();
    auto m2 = peer.write_message(payload);
    if (m2) (void)i.read_message(m2.value());
  } else {
    noise::Libp2pHandshake r(noise::Role::responder, identity(1), fixed_config(3, 4));
    noise::XXHandshake peer(noise::Role::initiator, fixed_x(9), {}, fixed_x(10));
    if (!r.read_message(peer.write_message({}).value())) std::abort();
    if (!peer.read_message(r.write_message().value())) std::abort();
    auto m3 = peer.write_message(payload);
    if (m3) (void)r.read_message(m3.value());
  }
}

// Serves a fixed byte string in chunks of fuzzed sizes, then end of stream.
class ChunkStream final : public ByteStream {
 public:
  ChunkStream(asio::any_io_executor ex, Bytes data, std::deque<std::size_t> chunks)
      : ex_(std::move(ex)), data_(std::move(data)), chunks_(std::move(chunks)) {}
  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    if (pos_ == data_.size()) co_return make_error(errc::closed);
    std::size_t k = chunks_.empty() ? data_.size() : std::max<std::size_t>(1, chunks_.front());
    if (!chunks_.empty()) chunks_.pop_front();
    k = std::min({k, buf.size(), data_.size() - pos_});
    std::memcpy(buf.data(), data_.data() + pos_, k);
    pos_ += k;
    co_return k;
  }
  awaitable<result<void>> write(BytesView) override { co_return success(); }
  awaitable<result<void>> close_write() override { co_return success(); }
  void reset() override {}
  asio::any_io_executor get_executor() override { return ex_; }
  std::string describe() const override { return "fuzz"; }

 private:
  asio::any_io_executor ex_;
  Bytes data_;
  std::deque<std::size_t> chunks_;
  std::size_t pos_ = 0;
};

void fuzz_transport(Input in) {
  noise::Key key{};
  key[0] = 42;
  noise::CipherState sender(key);
  noise::TransportCiphers rx;
  rx.recv = noise::CipherState(key);
  rx.send = noise::CipherState(key);
  Bytes wire, expected;
  bool corrupted = false;
  std::deque<std::size_t> chunks;
  std::vector<std::size_t> read_sizes;
  for (int ops = 0; in.n && ops < 24; ++ops) {
    switch (in.byte() % 5) {
      case 0: {  // a genuine frame
        std::size_t len = in.u16() % (noise::kMaxPlaintext + 1);
        Bytes pt(len);
        for (std::size_t j = 0; j < len; ++j) pt[j] = static_cast<std::uint8_t>(j * 31 + ops);
        std::size_t at = wire.size();
        wire.resize(at + 2 + len + noise::kTagLen);
        wire[at] = static_cast<std::uint8_t>((len + noise::kTagLen) >> 8);
        wire[at + 1] = static_cast<std::uint8_t>(len + noise::kTagLen);
        if (!sender.seal(pt.data(), len, wire.data() + at + 2)) std::abort();
        expected.insert(expected.end(), pt.begin(), pt.end());
        break;
      }
      case 1: {  // raw bytes
        auto raw = in.take(in.byte());
        wire.insert(wire.end(), raw.begin(), raw.end());
        corrupted |= !raw.empty();
        break;
      }
      case 2:  // flip a bit
        if (!wire.empty()) {
          wire[in.u16() % wire.size()] ^= static_cast<std::uint8_t>(1u << (in.byte() % 8));
          corrupted = true;
        }
        break;
      case 3:
        chunks.push_back(in.u16());
        break;
      case 4:
        read_sizes.push_back(in.u16() % 70000 + 1);
        break;
    }
  }
  if (read_sizes.empty()) read_sizes.push_back(4096);
  asio::io_context io;
  auto raw = std::make_shared<ChunkStream>(io.get_executor(), wire, chunks);
  auto stream = std::make_shared<NoiseStream>(raw, rx, "fuzz noise");
  Bytes got;
  bool ended_cleanly = false;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        Bytes buf;
        for (std::size_t i = 0;; ++i) {
          buf.resize(read_sizes[i % read_sizes.size()]);
          auto n = co_await stream->read_some(buf);
          if (!n) {
            ended_cleanly = n.error() == errc::closed;
            co_return;
          }
          if (n.value() == 0 || n.value() > buf.size()) std::abort();
          got.insert(got.end(), buf.begin(), buf.begin() + static_cast<long>(n.value()));
        }
      },
      asio::detached);
  io.run();
  if (!corrupted && (!ended_cleanly || got != expected)) {
    std::fprintf(stderr, "uncorrupted transport data came out wrong\n");
    std::abort();
  }
  // Without the key nothing can forge a frame: whatever came out is a prefix of what was sent.
  if (got.size() > expected.size() || !std::equal(got.begin(), got.end(), expected.begin()))
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level("off");  // rejected input is logged as a warning; keep the fuzzer quiet
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in{data, size};
  switch (in.byte() % 4) {
    case 0:
      fuzz_responder(in);
      break;
    case 1:
      fuzz_initiator(in);
      break;
    case 2:
      fuzz_payloads(in);
      break;
    case 3:
      fuzz_transport(in);
      break;
  }
  return 0;
}
