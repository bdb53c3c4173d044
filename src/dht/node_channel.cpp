// DhtNode: request channels (channel.hpp). Requester side: one Channel per peer (a writer
// task that opens the stream and flushes queued frames, a reader task that hands answers to
// the core, a sweeper that closes idle and stuck channels). Server side: serve_channel answers
// frames in order on the node's thread.
#include "dht_log.hpp"
#include "starling/dht/channel.hpp"
#include "starling/dht/node.hpp"
#include "starling/net/rpc_detail.hpp"

namespace starling::dht {

struct DhtNode::Channel {
  Channel(asio::any_io_executor ex, net::PeerId p, TimePoint now)
      : peer(std::move(p)), wake(std::move(ex)), opened_at(now), last_used(now) {}
  net::PeerId peer;
  net::ByteStreamPtr stream;                         // null until the writer opened it
  Bytes outbox;                                      // frames waiting for the writer
  AsyncEvent wake;                                   // the writer's doorbell
  std::map<std::uint64_t, OutgoingRequest> pending;  // by request id (the core's RequestId)
  std::uint64_t max_id = 0;                          // highest id sent
  TimePoint opened_at, last_used;
  TimePoint writing_since = TimePoint::max();  // a write in progress since
  bool dead = false;
};

namespace {
std::uint64_t rid(RequestId id) {
  return static_cast<std::uint64_t>(id);
}

// Resets a served channel that completed no answer during a whole period.
struct Watchdog : std::enable_shared_from_this<Watchdog> {
  Watchdog(net::ByteStreamPtr s, Duration p)
      : stream(std::move(s)), period(p), timer(stream->get_executor()) {}
  net::ByteStreamPtr stream;
  Duration period;
  Timer timer;
  std::uint64_t answered = 0, seen = 0;
  bool stopped = false;
  void arm() {
    timer.expires_after(period);
    timer.async_wait([self = shared_from_this()](std::error_code ec) {
      if (ec || self->stopped) return;
      if (self->answered == self->seen) {
        dht_log().debug("dht: closing a served channel idle for {} ms",
                        std::chrono::duration_cast<Millis>(self->period).count());
        self->stream->reset();
        return;
      }
      self->seen = self->answered;
      self->arm();
    });
  }
  void stop() {
    stopped = true;
    timer.cancel();
  }
};
}  // namespace

ChannelStats DhtNode::channel_stats() const {
  ChannelStats s = channel_stats_;
  s.open = channels_.size();
  s.inbound = inbound_channels_.size();
  return s;
}

// Queues `out` on the peer's channel (opening one if needed). False: send it as an RPC call.
bool DhtNode::channel_send(OutgoingRequest& out) {
  if (!cfg_.use_channels || channel_legacy_.count(out.to.peer)) return false;
  const TimePoint t = Clock::now();
  auto& slot = channels_[out.to.peer];
  if (slot && !slot->dead && slot->pending.empty() && t - slot->opened_at > cfg_.channel_max_age) {
    auto old = slot;
    channel_failed(old, make_error(errc::closed, "dht channel renewed"), false);  // none pending
  }
  auto& ch = channels_[out.to.peer];  // channel_failed may have erased the slot
  // Full (or its writes stall: the sweeper closes it): this request goes as an RPC call.
  if (ch && (ch->pending.size() >= cfg_.channel_outstanding ||
             ch->outbox.size() > cfg_.dht.limits.max_message_bytes))
    return false;
  if (!ch) {
    // Before the writer starts: it may dial at once.
    std::vector<net::Multiaddr> addrs;
    for (const auto& b : out.to.addrs)
      if (auto a = net::Multiaddr::from_bytes(b)) addrs.push_back(std::move(a).value());
    if (!addrs.empty()) host_->add_addresses(out.to.peer, addrs);
    ch = open_channel(out.to.peer, out);
    if (!ch) {
      channels_.erase(out.to.peer);
      return false;
    }
  }
  const Bytes frame = encode_channel_frame(rid(out.id), encode(out.request));
  ch->outbox.insert(ch->outbox.end(), frame.begin(), frame.end());
  ch->max_id = std::max(ch->max_id, rid(out.id));
  ch->last_used = t;
  ch->pending.emplace(rid(out.id), std::move(out));
  ch->wake.set();
  ++channel_stats_.sent;
  return true;
}

std::shared_ptr<DhtNode::Channel> DhtNode::open_channel(const net::PeerId& peer,
                                                        const OutgoingRequest& first) {
  if (stopping_) return nullptr;
  auto ch = std::make_shared<Channel>(host_->get_executor(), peer, Clock::now());
  const auto left = first.deadline - Clock::now();
  const Duration open_timeout = left > 10ms ? left : Duration(10ms);
  scope_.spawn([self = shared_from_this(), ch, open_timeout]() {
    return self->channel_writer(ch, open_timeout);
  });
  ++channel_stats_.opened;
  return ch;
}

void DhtNode::channel_failed(const std::shared_ptr<Channel>& ch, const Error& e, bool error) {
  if (ch->dead) return;
  ch->dead = true;
  if (error && !stopping_ && e != errc::unsupported) ++channel_stats_.failed;
  if (ch->stream) ch->stream->reset();
  ch->wake.set();  // the writer ends
  if (auto it = channels_.find(ch->peer); it != channels_.end() && it->second == ch)
    channels_.erase(it);
  auto pending = std::move(ch->pending);
  ch->pending.clear();
  if (stopping_) return;
  if (e == errc::unsupported && !channel_legacy_.count(ch->peer)) {
    // The peer does not serve channels (lazy select's "na" on the first read): it gets RPC
    // calls from now on, these requests included. The set is bounded (cleared when full).
    if (channel_legacy_.size() >= 4096) channel_legacy_.clear();
    channel_legacy_.insert(ch->peer);
    ++channel_stats_.fallback;
    dht_log().debug("dht: {} does not serve {}; using {}", ch->peer.short_string(),
                    kDhtChannelProtocol, kDhtProtocol);
  }
  if (pending.empty()) return;
  if (e == errc::unsupported) {
    auto self = shared_from_this();
    for (auto& [id, out] : pending) {
      ++channel_stats_.rpc_sent;
      scope_.spawn(
          [self, o = std::move(out)]() mutable { return self->send_request(std::move(o)); });
    }
    return;
  }
  if (dht_log().should_log(spdlog::level::debug))
    dht_log().debug("dht channel to {} closed with {} requests pending: {}",
                    ch->peer.short_string(), pending.size(), e.message());
  for (auto& [id, out] : pending) core_.on_failure(out.id, e, now());
  pump();
}

awaitable<void> DhtNode::channel_writer(std::shared_ptr<Channel> ch, Duration open_timeout) {
  auto self = shared_from_this();
  auto opened = co_await host_->open_stream(ch->peer, kDhtChannelProtocol, open_timeout);
  if (!opened) {
    channel_failed(ch, opened.error());
    co_return;
  }
  if (ch->dead || stopping_) {
    opened.value()->reset();
    co_return;
  }
  ch->stream = std::move(opened).value();
  bool reading = false;
  while (!ch->dead && !stopping_) {
    if (ch->outbox.empty()) {
      ch->wake.reset();
      if (!co_await ch->wake.wait()) break;  // cancelled: the node stops
      continue;
    }
    Bytes batch = std::move(ch->outbox);
    ch->outbox.clear();
    ch->writing_since = Clock::now();
    auto w = co_await ch->stream->write(batch);
    ch->writing_since = TimePoint::max();
    if (!w) {
      channel_failed(ch, w.error());
      co_return;
    }
    if (!reading) {  // after the first write: lazy select's proposal rides on the first frame
      reading = true;
      scope_.spawn([self, ch]() { return self->channel_reader(ch); });
    }
  }
}

awaitable<void> DhtNode::channel_reader(std::shared_ptr<Channel> ch) {
  auto self = shared_from_this();
  net::BufferedReader r(*ch->stream);
  const std::size_t limit = channel_frame_limit(cfg_.dht.limits.max_message_bytes);
  for (;;) {
    auto len = co_await net::detail::read_frame_length(r);
    if (ch->dead || stopping_) co_return;
    if (!len) co_return channel_failed(ch, len.error());
    if (!len.value()) co_return channel_failed(ch, make_error(errc::closed, "peer closed"));
    const std::uint64_t n = *len.value();
    auto bad = [&](const std::string& why) {
      ++bad_messages_;
      if (core_.warn_allowed(ch->peer, Clock::now()))
        dht_log().warn("dht: bad answer on the channel from {} (stream closed): {}",
                       ch->peer.short_string(), why);
      channel_failed(ch, make_error(errc::protocol_violation, why));
    };
    if (n > limit)
      co_return bad("frame of " + std::to_string(n) + " bytes exceeds limit " +
                    std::to_string(limit));
    auto body = co_await net::detail::read_frame_body(r, static_cast<std::size_t>(n));
    if (ch->dead || stopping_) co_return;
    if (!body) co_return channel_failed(ch, body.error());
    auto f = decode_channel_frame(body.value());
    if (!f) co_return bad(f.error().message());
    auto it = ch->pending.find(f.value().id);
    if (it == ch->pending.end()) {
      if (f.value().id > ch->max_id)
        co_return bad("answer to request " + std::to_string(f.value().id) + ", never sent");
      continue;  // late: its deadline passed and the sweeper dropped it
    }
    OutgoingRequest out = std::move(it->second);
    ch->pending.erase(it);
    ++channel_stats_.answered;
    if (auto ok = accept_response(core_, out.id, f.value().message, now()); !ok)
      co_return bad(std::string(describe(out.request)) + " answer: " + ok.error().message());
    pump();
  }
}

awaitable<void> DhtNode::channel_sweeper() {
  const Duration period = std::clamp<Duration>(cfg_.channel_idle / 4, 50ms, 5s);
  Timer t(host_->get_executor());
  while (!stopping_) {
    t.expires_after(period);
    auto [ec] = co_await t.async_wait(use_nothrow);
    if (ec || stopping_) co_return;
    sweep_channels();
  }
}

// Drops requests past their deadline (the core failed them already; a late answer is then
// ignored), closes channels idle for channel_idle and channels whose write stalled longer
// than a request may live (the requests on them fail).
void DhtNode::sweep_channels() {
  const TimePoint t = Clock::now();
  struct Closing {
    std::shared_ptr<Channel> ch;
    Error e;
    bool error;
  };
  std::vector<Closing> closing;
  for (auto& [peer, ch] : channels_) {
    std::erase_if(ch->pending,
                  [&](const auto& p) { return t > p.second.deadline + cfg_.channel_grace; });
    if (ch->writing_since != TimePoint::max() &&
        t - ch->writing_since > cfg_.dht.request_timeout + cfg_.channel_grace)
      closing.push_back({ch, make_error(errc::timeout, "dht channel write stalled"), true});
    else if (ch->pending.empty() && t - ch->last_used > cfg_.channel_idle)
      closing.push_back({ch, make_error(errc::closed, "dht channel idle"), false});
  }
  for (auto& c : closing) channel_failed(c.ch, c.e, c.error);
}

void DhtNode::close_channels() {
  auto chans = std::move(channels_);
  channels_.clear();
  for (auto& [peer, ch] : chans) channel_failed(ch, make_error(errc::cancelled, "stopping"), false);
  const auto inbound = inbound_channels_;  // a reset may end a serving task meanwhile
  for (const auto& s : inbound) s->reset();
}

awaitable<void> DhtNode::serve_channel(std::weak_ptr<DhtNode> weak, net::ByteStreamPtr s,
                                       net::PeerId from) {
  std::size_t limit = 0;
  Duration idle{};
  {
    auto self = weak.lock();
    if (!self || self->stopping_) {
      s->reset();
      co_return;
    }
    auto& n = self->inbound_per_peer_[from];
    if (n >= self->cfg_.channel_inbound_per_peer) {
      ++self->channel_stats_.refused;
      if (self->core_.warn_allowed(from, Clock::now()))
        dht_log().warn("dht: refused a channel from {}: it holds {} already", from.short_string(),
                       n);
      s->reset();
      co_return;
    }
    ++n;
    self->inbound_channels_.insert(s);
    limit = channel_frame_limit(self->cfg_.dht.limits.max_message_bytes);
    idle = self->cfg_.channel_server_idle;
  }
  // The idle watchdog: a channel that completes no answer in a whole period is reset (this
  // bounds every wait below: a read of the next frame, a frame's body, a write).
  auto watch = std::make_shared<Watchdog>(s, idle);
  watch->arm();
  net::BufferedReader r(*s);
  std::string closed_why;
  for (;;) {
    auto len = co_await net::detail::read_frame_length(r);
    if (!len || !len.value()) break;  // the requester closed or reset it: nothing to log
    const std::uint64_t n = *len.value();
    if (n > limit) {
      closed_why =
          "frame of " + std::to_string(n) + " bytes exceeds limit " + std::to_string(limit);
      break;
    }
    auto body = co_await net::detail::read_frame_body(r, static_cast<std::size_t>(n));
    if (!body) break;
    auto f = decode_channel_frame(body.value());
    if (!f) {
      closed_why = f.error().message();
      break;
    }
    auto self = weak.lock();
    if (!self || self->stopping_) break;
    auto answer = self->serve(from, f.value().message);  // logs a bad request itself
    if (!answer) {
      s->reset();
      break;
    }
    ++self->channel_stats_.served;
    const Bytes frame = encode_channel_frame(f.value().id, answer.value());
    self.reset();
    auto w = co_await s->write(frame);
    if (!w) break;
    ++watch->answered;
  }
  watch->stop();
  s->reset();
  auto self = weak.lock();
  if (!self) co_return;
  if (!closed_why.empty()) {
    ++self->bad_messages_;
    if (self->core_.warn_allowed(from, Clock::now()))
      dht_log().warn("dht: bad frame on the channel from {} (stream closed): {}",
                     from.short_string(), closed_why);
  }
  self->inbound_channels_.erase(s);
  if (auto it = self->inbound_per_peer_.find(from);
      it != self->inbound_per_peer_.end() && --it->second == 0)
    self->inbound_per_peer_.erase(it);
}

}  // namespace starling::dht
