#include "match_session.hpp"

#include "starling/core/log.hpp"

namespace starling::averaging::detail {
namespace {

bool admitted(PeerGate& gate, const PeerKey& peer) {
  auto id = net::PeerId::from_bytes(peer.bytes());
  return id && gate.admits(id.value());
}

}  // namespace

MatchSession::MatchSession(net::StreamHost& host, Directory& dir, MatchmakingCore core,
                           Averager::AddressSink sink, Duration open_timeout,
                           std::string join_protocol,
                           std::function<void(const std::string&)> on_phase)
    : host_(host),
      dir_(dir),
      core_(std::move(core)),
      sink_(std::move(sink)),
      open_timeout_(open_timeout),
      join_protocol_(std::move(join_protocol)),
      ex_(host.get_executor()),
      scope_(ex_),
      changed_(ex_),
      on_phase_(std::move(on_phase)) {}

MatchSession::~MatchSession() = default;

void MatchSession::tell_addresses(const MemberInfo& m) {
  if (!sink_ || m.addrs.empty()) return;
  auto id = net::PeerId::from_bytes(m.peer.bytes());
  if (id) sink_(id.value(), m.addrs);
}

void MatchSession::predict(std::vector<MatchEntry> view) {
  predicted_ = std::move(view);
}

awaitable<void> MatchSession::publish() {
  published_ = true;
  const auto& e = core_.entry();
  const auto t0 = Clock::now();
  auto r = co_await dir_.put(core_.key().dht_key(), e.info.peer.bytes(), wire::encode_entry(e),
                             e.deadline);
  logger("averaging")
      ->debug("matchmaking: publish took {} ms",
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  if (!r)
    logger("averaging")->info("matchmaking: publishing entry failed: {}", r.error().message());
}

awaitable<void> MatchSession::refresh() {
  const auto t0 = Clock::now();
  auto got = co_await dir_.get(core_.key().dht_key());
  logger("averaging")
      ->debug("matchmaking: refresh took {} ms",
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  std::vector<MatchEntry> entries;
  if (got) {
    for (const auto& v : got.value()) {
      auto e = wire::decode_entry(v);
      if (!e) continue;  // someone's garbage: ignore it
      if (gate_ && !admitted(*gate_, e.value().info.peer)) continue;  // not a member
      entries_[e.value().info.peer] = e.value();
      entries.push_back(std::move(e).value());
    }
  } else {
    logger("averaging")
        ->info("matchmaking: reading the directory failed: {}", got.error().message());
  }
  core_.on_view(entries, WallClock::now());
  pump();
}

awaitable<result<GroupInfo>> MatchSession::run() {
  auto self = shared_from_this();
  using S = MatchmakingCore::State;
  // The entry is encoded when publish() begins: a change while the put is in flight (a
  // follower joined, matchmaking was cancelled) sets the flag again and is published next.
  // Taking the flag after the put instead lost that change: a leader's group size stayed 1
  // in the directory (a peer that needed it to plan waited out the deadline), and a peer that
  // cancelled during its first put left its entry open until the deadline.
  if (!predicted_.empty()) {
    // An intact group: every member plans the same group from the same predicted view and
    // joins its leader at once; the directory is left alone unless that fails.
    direct_ = true;
    for (const auto& e : predicted_) entries_[e.info.peer] = e;
    core_.on_view(predicted_, WallClock::now());
    pump();
  } else {
    (void)core_.take_republish();
    co_await publish();
  }
  for (;;) {
    // Reset before looking at the state: a message handled while refresh() or publish() is
    // suspended sets the event, and the wait below must not miss it (a lost wakeup here
    // held a finished leader back until the 10 s cap).
    changed_.reset();
    const auto st = core_.state();
    if (st == S::done || st == S::failed) break;
    const auto now = WallClock::now();
    if (direct_ && core_.wants_view(now)) {
      // No group within a refresh interval: a member changed. Back to the directory (our
      // entry as it is now, then a fresh view).
      logger("averaging")
          ->debug("matchmaking under {}: no group from the last one's members ({}), using the DHT",
                  core_.key().to_string(), MatchmakingCore::state_name(st));
      direct_ = false;
      (void)core_.take_republish();
      co_await publish();
    }
    if (!direct_ && core_.wants_view(now)) co_await refresh();
    if (!direct_ && core_.take_republish()) co_await publish();
    const auto wake = core_.next_wakeup(WallClock::now());
    const auto wait = std::max<Duration>(wake - WallClock::now(), Duration(1ms));
    (void)co_await with_timeout(changed_.wait(), std::min<Duration>(wait, 10s), "matchmaking");
    core_.tick(WallClock::now());
    pump();
  }
  ending_ = true;
  // Let our last messages (Start, Confirm) leave before closing the join streams.
  const TimePoint until = Clock::now() + 2s;
  for (;;) {
    bool pending = false;
    for (auto& [who, l] : links_) pending = pending || (!l->closed && !l->queue.empty());
    if (!pending || Clock::now() >= until) break;
    changed_.reset();
    (void)co_await with_timeout(changed_.wait(), 50ms, "drain");
  }
  for (auto& [who, l] : links_) {
    l->wake->set();
    if (!l->closed) (void)co_await with_timeout(l->stream->close_write(), 1s, "close");
  }
  if (published_ && core_.take_republish()) co_await publish();
  // Resetting at once could drop our last frames at the peer: wait for it to close too.
  // A cancelled session does not wait: its Leave / Disband is out, and a reset tells the peer
  // the same (it drops this peer as lost).
  const bool cancelled = core_.state() == S::failed && core_.error() == errc::cancelled;
  const TimePoint eof_until = cancelled ? Clock::now() : Clock::now() + 2s;
  while (readers_ > 0 && Clock::now() < eof_until) {
    changed_.reset();
    (void)co_await with_timeout(changed_.wait(), 50ms, "peers' EOF");
  }
  for (auto& [who, l] : links_) l->stream->reset();
  (void)co_await scope_.close(2s);
  if (core_.state() == S::failed) co_return core_.error();
  for (const auto& m : core_.group().members) tell_addresses(m);
  co_return core_.group();
}

std::shared_ptr<MatchSession::Link> MatchSession::add_link(const PeerKey& who,
                                                           net::ByteStreamPtr s) {
  auto link = std::make_shared<Link>();
  link->stream = std::move(s);
  link->wake = std::make_unique<AsyncEvent>(ex_);
  if (auto it = links_.find(who); it != links_.end()) it->second->stream->reset();
  links_[who] = link;
  scope_.spawn(write_link(who, link));
  return link;
}

void MatchSession::drop_link(const PeerKey& who) {
  auto it = links_.find(who);
  if (it == links_.end()) return;
  it->second->closed = true;
  it->second->stream->reset();
  it->second->wake->set();
}

awaitable<void> MatchSession::write_link(PeerKey who, std::shared_ptr<Link> link) {
  auto self = shared_from_this();
  for (;;) {
    if (link->closed) co_return;
    if (!link->queue.empty()) {
      Bytes frame = std::move(link->queue.front());
      link->queue.pop_front();
      auto w = co_await link->stream->write(frame);
      if (!w) {
        link->closed = true;
        if (!ending_) {
          core_.on_peer_failed(who, WallClock::now());
          pump();
        }
        co_return;
      }
      changed_.set();
      continue;
    }
    if (ending_) co_return;
    link->wake->reset();
    auto r = co_await link->wake->wait();
    if (!r) co_return;
  }
}

void MatchSession::cancel(const std::string& why) {
  core_.cancel(WallClock::now(), why);
  pump();
}

void MatchSession::pump() {
  for (auto& out : core_.take_outbox()) {
    if (auto* req = std::get_if<JoinRequest>(&out.msg)) {
      scope_.spawn(follow(out.to, *req));
      continue;
    }
    auto it = links_.find(out.to);
    if (it == links_.end() || it->second->closed) continue;
    wire::MatchFrame f = std::visit([](auto&& m) -> wire::MatchFrame { return m; }, out.msg);
    it->second->queue.push_back(net::length_prefixed(wire::encode_match(f)));
    it->second->wake->set();
  }
  changed_.set();
  if (on_phase_ && core_.state() != last_state_) {
    last_state_ = core_.state();
    on_phase_(std::string("matchmaking:") + MatchmakingCore::state_name(last_state_));
  }
}

awaitable<void> MatchSession::follow(PeerKey leader, JoinRequest req) {
  auto self = shared_from_this();
  if (auto it = entries_.find(leader); it != entries_.end()) tell_addresses(it->second.info);
  auto id = net::PeerId::from_bytes(leader.bytes());
  if (!id) {
    core_.on_peer_failed(leader, WallClock::now());
    pump();
    co_return;
  }
  auto s = co_await host_.open_stream(id.value(), join_protocol_, open_timeout_);
  if (!s) {
    logger("averaging")
        ->debug("matchmaking: join stream to {}: {}", leader.short_hex(), s.error().message());
    core_.on_peer_failed(leader, WallClock::now());
    pump();
    co_return;
  }
  if (ending_ || core_.leader() != leader) {
    s.value()->reset();
    co_return;
  }
  auto link = add_link(leader, s.value());
  link->queue.push_front(net::length_prefixed(wire::encode_match(req)));
  link->wake->set();
  co_await read_frames(leader, s.value(), nullptr);
}

awaitable<void> MatchSession::serve_join(net::PeerId remote, net::ByteStreamPtr stream,
                                         std::shared_ptr<net::BufferedReader> reader,
                                         JoinRequest req) {
  auto self = shared_from_this();
  const PeerKey who(remote.bytes());
  if (req.member.peer != who || ending_) {
    auto f = net::length_prefixed(wire::encode_match(JoinReply{JoinVerdict::begun}));
    (void)co_await stream->write(f);
    stream->reset();
    co_return;
  }
  auto link = add_link(who, stream);
  const JoinReply reply = core_.on_join(req, WallClock::now());
  // The reply goes out before anything the core queued for this follower.
  link->queue.push_front(net::length_prefixed(wire::encode_match(reply)));
  link->wake->set();
  pump();
  if (reply.verdict != JoinVerdict::accepted) co_return;  // the writer sends the refusal
  tell_addresses(req.member);
  co_await read_frames(who, stream, std::move(reader));
}

awaitable<void> MatchSession::read_frames(PeerKey who, net::ByteStreamPtr s,
                                          std::shared_ptr<net::BufferedReader> r) {
  auto self = shared_from_this();
  ++readers_;
  struct Done {
    MatchSession* m;
    ~Done() {
      --m->readers_;
      m->changed_.set();
    }
  } done{this};
  if (!r) r = std::make_shared<net::BufferedReader>(*s);
  for (;;) {
    auto frame = co_await r->read_length_prefixed(wire::kMaxFrame);
    if (!frame) break;
    auto m = wire::decode_match(frame.value());
    if (!m) {
      logger("averaging")
          ->warn("matchmaking: malformed frame from {}: {}", who.short_hex(), m.error().message());
      break;
    }
    const auto now = WallClock::now();
    bool bad = false;
    std::visit(
        [&](auto&& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, JoinReply>)
            core_.on_join_reply(who, x, now);
          else if constexpr (std::is_same_v<T, JoinRequest>)
            bad = true;  // only as the first frame
          else
            core_.on_message(who, MatchMessage{x}, now);
        },
        m.value());
    pump();
    if (bad) break;
  }
  if (!ending_) {
    core_.on_peer_failed(who, WallClock::now());
    drop_link(who);
    pump();
  }
}

}  // namespace starling::averaging::detail
