// Lazy ("optimistic") multistream-select for a dialer that proposes a single protocol: the
// header and the proposal travel with the first application bytes, and the listener's answer
// is checked in front of the first response bytes. See multistream.hpp for the contract.
#include <algorithm>
#include <cstring>

#include "starling/core/log.hpp"
#include "starling/net/multistream.hpp"

namespace starling::net {

result<std::optional<std::size_t>> multistream_parse_answer(BytesView in,
                                                            std::string_view protocol) {
  using Consumed = std::optional<std::size_t>;
  ST_TRY(auto header, multistream_decode(in));
  if (!header) return Consumed{};
  if (header->text != kMultistreamHeader)
    return make_error(errc::protocol_violation,
                      "unexpected multistream header '" + header->text + "'");
  ST_TRY(auto answer, multistream_decode(in.subspan(header->consumed)));
  if (!answer) return Consumed{};
  if (answer->text == "na")
    return make_error(errc::unsupported, "peer does not support " + std::string(protocol) +
                                             " (multistream-select answered na)");
  if (answer->text != protocol)
    return make_error(
        errc::protocol_violation,
        "peer answered '" + answer->text + "' to proposal '" + std::string(protocol) + "'");
  return Consumed(header->consumed + answer->consumed);
}

namespace {

class LazySelectStream final : public ByteStream {
 public:
  LazySelectStream(ByteStreamPtr inner, std::string protocol)
      : inner_(std::move(inner)),
        protocol_(std::move(protocol)),
        header_done_(inner_->get_executor()),
        answer_ev_(inner_->get_executor()) {
    pending_ = multistream_encode(kMultistreamHeader);
    auto p = multistream_encode(protocol_);
    pending_.insert(pending_.end(), p.begin(), p.end());
  }

  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    if (!accepted_) {
      ST_CO_TRY(co_await send_header());
      ST_CO_TRY(co_await await_answer());
    }
    if (in_pos_ < in_.size()) co_return take_leftover(buf);
    co_return co_await inner_->read_some(buf);
  }

  awaitable<result<void>> write(BytesView data) override {
    if (error_) co_return *error_;
    if (!header_sent_) {
      // The header, the proposal and the first bytes in one write: one frame on the wire.
      header_sent_ = true;
      const std::size_t n = take_optimistic(data.size());
      Bytes first = std::move(pending_);
      first.insert(first.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n));
      ST_CO_TRY(co_await inner_->write(first));
      data = data.subspan(n);
    } else {
      ST_CO_TRY(co_await send_header());
    }
    if (!accepted_ && !data.empty()) {
      const std::size_t n = take_optimistic(data.size());
      if (n > 0) {
        ST_CO_TRY(co_await inner_->write(data.first(n)));
        data = data.subspan(n);
      }
      if (!data.empty()) {
        ST_CO_TRY(co_await await_answer());
      }
    }
    if (data.empty()) co_return success();
    co_return co_await inner_->write(data);
  }

  awaitable<result<void>> close_write() override {
    if (error_) co_return *error_;
    ST_CO_TRY(co_await send_header());
    co_return co_await inner_->close_write();
  }

  // Buffered reads pass through (yamux over a lazily negotiated Noise channel keeps its
  // zero-copy path); the answer is consumed first, like read_some.
  bool buffered_reads() const override { return inner_->buffered_reads(); }
  awaitable<result<void>> wait_readable() override {
    if (!accepted_) {
      ST_CO_TRY(co_await send_header());
      ST_CO_TRY(co_await await_answer());
    }
    if (in_pos_ < in_.size()) co_return success();
    co_return co_await inner_->wait_readable();
  }
  result<std::size_t> read_buffered(MutableBytesView buf) override {
    if (!accepted_) return std::size_t{0};
    if (in_pos_ < in_.size()) return take_leftover(buf);
    return inner_->read_buffered(buf);
  }

  void reset() override { inner_->reset(); }
  asio::any_io_executor get_executor() override { return inner_->get_executor(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  // Response bytes that arrived with the answer.
  std::size_t take_leftover(MutableBytesView buf) {
    const std::size_t k = std::min(buf.size(), in_.size() - in_pos_);
    std::memcpy(buf.data(), in_.data() + in_pos_, k);
    in_pos_ += k;
    if (in_pos_ == in_.size()) {
      in_ = Bytes();
      in_pos_ = 0;
    }
    return k;
  }

  std::size_t take_optimistic(std::size_t want) {
    const std::size_t n = std::min(want, optimistic_left_);
    optimistic_left_ -= n;
    return n;
  }

  // Sends the header and proposal if nothing was written yet; waits while another operation
  // (a read or close_write racing a write) is sending them.
  awaitable<result<void>> send_header() {
    if (!header_sent_) {
      header_sent_ = true;
      header_writing_ = true;
      auto r = co_await inner_->write(pending_);
      header_writing_ = false;
      pending_ = Bytes();
      header_done_.set();
      if (!r) fail(r.error().with_context("multistream-select for " + protocol_));
      co_return r;
    }
    while (header_writing_) {
      ST_CO_TRY(co_await header_done_.wait());
    }
    if (error_) co_return *error_;
    co_return success();
  }

  // The listener's answer, read once by whichever operation needs it first; the others wait.
  awaitable<result<void>> await_answer() {
    for (;;) {
      if (accepted_) co_return success();
      if (error_) co_return *error_;
      if (answer_reading_) {
        ST_CO_TRY(co_await answer_ev_.wait());
        continue;
      }
      answer_reading_ = true;
      auto r = co_await read_answer();
      answer_reading_ = false;
      if (accepted_ || error_)
        answer_ev_.set();
      else
        answer_ev_.pulse();  // this reader was cancelled: a waiter takes over
      if (!r) co_return r.error();
    }
  }

  awaitable<result<void>> read_answer() {
    for (;;) {
      auto parsed = multistream_parse_answer(in_, protocol_);
      if (!parsed) co_return fail(parsed.error());
      if (parsed.value()) {
        in_pos_ = *parsed.value();
        accepted_ = true;
        co_return success();
      }
      const std::size_t old = in_.size();
      in_.resize(old + 256);
      auto n = co_await inner_->read_some(MutableBytesView(in_).subspan(old));
      if (!n) {
        in_.resize(old);
        if (n.error() == errc::cancelled) co_return n.error();  // the stream is still usable
        co_return fail(n.error().with_context("multistream-select for " + protocol_));
      }
      in_.resize(old + n.value());
    }
  }

  Error fail(Error e) {
    logger("net")->debug("{}: {}", inner_->describe(), e.message());
    error_ = e;
    inner_->reset();
    return e;
  }

  ByteStreamPtr inner_;
  std::string protocol_;
  Bytes pending_;  // header + proposal until sent
  bool header_sent_ = false, header_writing_ = false;
  AsyncEvent header_done_;
  std::size_t optimistic_left_ = kLazyOptimisticBytes;
  bool accepted_ = false, answer_reading_ = false;
  std::optional<Error> error_;  // a refusal or a broken negotiation: final
  AsyncEvent answer_ev_;
  Bytes in_;  // the answer as it arrives, then the response bytes read along with it
  std::size_t in_pos_ = 0;
};

}  // namespace

ByteStreamPtr multistream_select_lazy(ByteStreamPtr stream, std::string protocol) {
  return std::make_shared<LazySelectStream>(std::move(stream), std::move(protocol));
}

}  // namespace starling::net
