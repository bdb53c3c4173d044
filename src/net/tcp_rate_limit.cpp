// Host-wide bandwidth limits: a token bucket per direction and a ByteStream wrapper that makes
// a connection's raw bytes (below Noise, so every protocol and the handshakes count) take from
// them.
#include <algorithm>
#include <cmath>

#include "starling/net/tcp.hpp"

namespace starling::net {

TokenBucket::TokenBucket(std::uint64_t rate, std::uint64_t burst, TimePoint now)
    : rate_(std::max<std::uint64_t>(rate, 1)),
      burst_(burst ? burst : std::max<std::uint64_t>(16 * 1024, rate_ / 10)),
      tokens_(static_cast<double>(burst_)),
      last_(now) {}

Duration TokenBucket::reserve(std::size_t n, TimePoint now) {
  if (now > last_) {
    const double dt = std::chrono::duration<double>(now - last_).count();
    tokens_ = std::min(static_cast<double>(burst_), tokens_ + dt * static_cast<double>(rate_));
    last_ = now;
  }
  tokens_ -= static_cast<double>(n);
  if (tokens_ >= 0) return Duration::zero();
  const double wait_s = -tokens_ / static_cast<double>(rate_);
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(wait_s));
}

awaitable<result<void>> TokenBucket::take(std::size_t n) {
  const Duration wait = reserve(n, Clock::now());
  if (wait > Duration::zero()) {
    ST_CO_TRY(co_await sleep_for(wait));
  }
  co_return success();
}

namespace {

class RateLimitedStream final : public ByteStream {
 public:
  RateLimitedStream(ByteStreamPtr inner, std::shared_ptr<TokenBucket> up,
                    std::shared_ptr<TokenBucket> down)
      : inner_(std::move(inner)), up_(std::move(up)), down_(std::move(down)) {}

  awaitable<result<std::size_t>> read_some(MutableBytesView buf) override {
    if (!down_) co_return co_await inner_->read_some(buf);
    const std::size_t most = std::min<std::size_t>(buf.size(), down_->burst());
    ST_CO_TRY(auto n, co_await inner_->read_some(buf.first(most)));
    // The bytes are read: they are returned even if the wait is cancelled (not lost).
    (void)co_await down_->take(n);
    co_return n;
  }

  awaitable<result<void>> write(BytesView data) override {
    if (!up_) co_return co_await inner_->write(data);
    while (!data.empty()) {
      const std::size_t n = std::min<std::size_t>(data.size(), up_->burst());
      ST_CO_TRY(co_await up_->take(n));
      ST_CO_TRY(co_await inner_->write(data.first(n)));
      data = data.subspan(n);
    }
    co_return success();
  }

  awaitable<result<void>> close_write() override { return inner_->close_write(); }
  void reset() override { inner_->reset(); }
  asio::any_io_executor get_executor() override { return inner_->get_executor(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  ByteStreamPtr inner_;
  std::shared_ptr<TokenBucket> up_, down_;
};

}  // namespace

ByteStreamPtr rate_limited(ByteStreamPtr inner, std::shared_ptr<TokenBucket> up,
                           std::shared_ptr<TokenBucket> down) {
  if (!up && !down) return inner;
  return std::make_shared<RateLimitedStream>(std::move(inner), std::move(up), std::move(down));
}

}  // namespace starling::net
