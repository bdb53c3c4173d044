// MatchSession: drives one MatchmakingCore over the directory (DHT) and join streams. It
// publishes this peer's entry under the group key, re-reads the dictionary when the core asks,
// opens a join stream to the leader the core picks (JoinRequest first, then the leader's
// replies, Begin, Start/Disband; our Confirm/Leave go back on it), and, as a leader, serves
// the join streams followers open (serve_join). Messages for one peer are written in order
// on its join stream by one writer.
//
// Threading rule: the host's executor only.
#pragma once

#include <deque>
#include <map>
#include <memory>

#include "starling/averaging/averager.hpp"
#include "starling/averaging/wire.hpp"
#include "starling/net/byte_stream.hpp"

namespace starling::averaging::detail {

class MatchSession : public std::enable_shared_from_this<MatchSession> {
 public:
  MatchSession(net::StreamHost& host, Directory& dir, MatchmakingCore core,
               Averager::AddressSink sink, Duration open_timeout, std::string join_protocol,
               std::function<void(const std::string&)> on_phase = {});
  ~MatchSession();

  // Before run(): match from this predicted view first (the members of the last group), over
  // join streams only; the session publishes and reads the directory only once the core wants
  // a fresh view (after its refresh interval) without having a group.
  void predict(std::vector<MatchEntry> view);
  // Runs until the core has a group or fails; then flushes and closes the join streams.
  awaitable<result<GroupInfo>> run();
  // Whether the group formed from the predicted view, without the directory.
  bool matched_directly() const noexcept { return !predicted_.empty() && !published_; }
  // Leader side: `req` arrived first on `stream` (opened by `remote`); serves the stream until
  // the session ends.
  awaitable<void> serve_join(net::PeerId remote, net::ByteStreamPtr stream,
                             std::shared_ptr<net::BufferedReader> reader, JoinRequest req);

  // Ends matchmaking now (MatchmakingCore::cancel): run() sends the Leave / Disband and
  // returns errc::cancelled.
  void cancel(const std::string& why);

  const MatchmakingCore& core() const { return core_; }
  // A private run: directory entries of peers the gate does not admit are ignored.
  void set_gate(std::shared_ptr<PeerGate> gate) { gate_ = std::move(gate); }

 private:
  struct Link {
    net::ByteStreamPtr stream;
    std::deque<Bytes> queue;
    std::unique_ptr<AsyncEvent> wake;
    bool closed = false;
  };
  awaitable<void> follow(PeerKey leader, JoinRequest req);
  awaitable<void> read_frames(PeerKey who, net::ByteStreamPtr s,
                              std::shared_ptr<net::BufferedReader> r);
  awaitable<void> write_link(PeerKey who, std::shared_ptr<Link> link);
  std::shared_ptr<Link> add_link(const PeerKey& who, net::ByteStreamPtr s);
  void drop_link(const PeerKey& who);
  awaitable<void> publish();
  awaitable<void> refresh();
  void pump();
  void tell_addresses(const MemberInfo& m);

  net::StreamHost& host_;
  Directory& dir_;
  MatchmakingCore core_;
  Averager::AddressSink sink_;
  Duration open_timeout_;
  std::string join_protocol_;
  asio::any_io_executor ex_;
  TaskScope scope_;
  AsyncEvent changed_;
  std::map<PeerKey, std::shared_ptr<Link>> links_;
  std::map<PeerKey, MatchEntry> entries_;
  bool ending_ = false;
  std::vector<MatchEntry> predicted_;
  bool direct_ = false;     // matching from predicted_, the directory untouched
  bool published_ = false;  // our entry is in the directory
  std::size_t readers_ = 0;
  std::function<void(const std::string&)> on_phase_;
  std::shared_ptr<PeerGate> gate_;
  MatchmakingCore::State last_state_ = MatchmakingCore::State::looking;
};

}  // namespace starling::averaging::detail
