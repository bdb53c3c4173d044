// StateDownload: the newcomer's side of state transfer (state_transfer.hpp). Asks several
// donors for their manifest in parallel, picks the snapshot with the highest epoch held by
// the most donors, and fetches its parts from every donor holding it at once; each part is
// hashed on the worker pool and checked against the manifest; a donor that fails, stalls or
// lies is dropped and its unfinished parts go back to the queue for the others.
//
// Threading rule: the host's executor only (hashing runs on the ThreadPool). Member
// coroutines instead of nested lambdas (GCC 12 miscompiles lambdas nested in coroutines).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "starling/averaging/state_transfer.hpp"
#include "starling/core/async.hpp"
#include "starling/net/byte_stream.hpp"
#include "starling/net/stream_host.hpp"

namespace starling {
class ThreadPool;
}

namespace starling::averaging::detail {

struct StateDonor {
  PeerKey peer;
  net::ByteStreamPtr stream;
  std::shared_ptr<net::BufferedReader> reader;
  StateManifest manifest;
  bool served = false;
};

class StateDownload : public std::enable_shared_from_this<StateDownload> {
 public:
  // After the first manifest, how long the other donors get at least to answer theirs.
  static constexpr Duration kManifestGrace = std::chrono::milliseconds(300);
  using AddressSink =
      std::function<void(const net::PeerId&, const std::vector<std::string>& addrs)>;
  // What to download: the kind (schema hash or blob_kind()), the exact size if known, the
  // largest size accepted, and the donors' state protocol id.
  struct Target {
    Bytes kind;
    std::optional<std::uint64_t> size;
    std::uint64_t max_bytes = 0;
    std::string protocol;
  };
  StateDownload(net::StreamHost& host, ThreadPool& pool, AddressSink sink, Target target,
                LoadStateOptions opts, TimePoint deadline);

  // Runs the whole download; on success `data()` holds the state.
  awaitable<result<StateInfo>> run(std::vector<StateAnnouncement> candidates);
  Bytes& data() { return buf_; }
  const StateManifest& manifest() const { return manifest_; }
  // Donors holding the chosen snapshot (after run()).
  std::vector<PeerKey> chosen_donors() const;

 private:
  awaitable<void> ask_manifest(StateAnnouncement a);
  awaitable<result<std::shared_ptr<StateDonor>>> open_donor(net::PeerId id, PeerKey peer,
                                                            Duration left);
  awaitable<void> worker(std::shared_ptr<StateDonor> d);
  awaitable<result<void>> fetch(StateDonor& d, const std::vector<std::uint32_t>& batch,
                                std::size_t& done_in_batch);
  result<void> choose_snapshot();

  net::StreamHost& host_;
  ThreadPool& pool_;
  AddressSink sink_;
  Target target_;
  LoadStateOptions opts_;
  TimePoint deadline_;
  std::vector<std::shared_ptr<StateDonor>> donors_;  // answered with a manifest
  std::vector<std::shared_ptr<StateDonor>> use_;     // holding the chosen snapshot
  StateManifest manifest_;
  Bytes buf_;
  bool too_large_ = false;
  std::deque<std::uint32_t> queue_;
  std::vector<bool> have_;
  std::size_t have_count_ = 0, in_flight_ = 0, retried_ = 0, pending_ = 0, workers_ = 0;
  std::uint64_t bytes_ = 0;
  AsyncEvent changed_;
};

using VerifyFn = std::function<result<void>(const StateManifest&, BytesView)>;

struct Verified {
  result<void> check = success();  // the check's verdict
  Bytes data;                      // the data, handed back
};
// Runs the caller's check `fn` of a downloaded state on `pool` (state_verify.cpp). Waits at
// most until `deadline` (errc::timeout) or cancellation (errc::cancelled); the check, which
// cannot be interrupted, then finishes on its own and its verdict is dropped, so `fn` must own
// what it captures.
awaitable<result<Verified>> verify_on_pool(ThreadPool& pool, VerifyFn fn, StateManifest m,
                                           Bytes data, TimePoint deadline);

}  // namespace starling::averaging::detail
