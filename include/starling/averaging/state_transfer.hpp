// State transfer: a newcomer downloads the current tensors plus a small metadata blob (e.g. the
// optimizer epoch), or an arbitrary byte blob (a model and its optimizer state), from peers that
// announce a state snapshot in the directory. The newcomer asks several donors for their manifest
// (snapshot id, epoch, metadata, BLAKE2b-256 of every part), picks the snapshot with the highest
// epoch held by the most donors, and downloads its parts in parallel from every donor holding it,
// verifying each part against the manifest; a donor that leaves, stalls or sends a wrong part is
// dropped and its parts go back to the queue for the others (no restart from scratch, unlike
// one-donor-at-a-time downloads).
//
// Threading rule: types only; the Averager runs the protocol on its host's executor.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "starling/averaging/matchmaking_core.hpp"

namespace starling::averaging {

// Published under BLAKE2b("starling/averaging/state/" + prefix), sub-key = donor peer id.
struct StateAnnouncement {
  MemberInfo donor;
  std::uint64_t epoch = 0;
  Bytes schema_hash;
  WallTime expires;
};

// The kind of a blob snapshot (in place of a schema hash): BLAKE2b("starling/averaging/blob").
const Bytes& blob_kind();

struct StateManifest {
  Bytes snapshot;  // BLAKE2b-256 over epoch, metadata, kind, size, part size, part hashes
  std::uint64_t epoch = 0;
  Bytes metadata;
  Bytes schema_hash;            // the tensors' schema hash, or blob_kind()
  std::uint64_t size = 0;       // bytes (float32 tensors: 4 per element)
  std::uint32_t part_size = 0;  // bytes per part (the last may be shorter); <= 64 MiB
  std::vector<Bytes> part_hashes;
};

struct StateRequest {
  bool manifest = false;
  Bytes snapshot;
  std::vector<std::uint32_t> parts;
};

// A donor's reply frame: a manifest, or one part (payload_len raw bytes follow), or an error.
struct StateFrame {
  std::optional<StateManifest> manifest;
  std::optional<std::uint32_t> part;
  std::uint64_t payload_len = 0;
  std::string error;
};

struct LoadStateOptions {
  Duration timeout = 300s;
  std::size_t max_donors = 4;  // download from at most this many donors at once
  std::size_t parts_per_request = 4;
  Duration stall_timeout = 20s;  // a donor silent this long while owing parts is dropped
  std::uint64_t max_bytes = std::uint64_t{1} << 30;  // blobs larger than this are refused
  // If not empty: a snapshot whose metadata equals this is taken (then the highest epoch, then
  // the most donors) before any other; without one, the usual rule. (Training: the digest of
  // the parameters most peers hold, when repairing a fork.)
  Bytes prefer_metadata;
  // A donor claiming an epoch more than this far ahead of the median of the donors' epochs
  // (the lower median, over announcements and again over manifests) is refused: one poisoned
  // donor cannot pull a newcomer to an epoch nobody else holds.
  std::uint64_t max_epoch_lead = 100;
  // If set: the caller's check of a downloaded state before anything changes (e.g. a digest
  // of `data` against the manifest's metadata). A failed check refuses that snapshot and its
  // donors, and the download starts over with the others (at most max_verify_attempts times).
  // It runs on the averager's worker pool, never on the I/O thread, and the load waits for it
  // at most until its deadline (errc::timeout) or its cancellation; a check still running then
  // finishes on its own, so it must own what it captures (by value or shared_ptr).
  std::function<result<void>(const StateManifest& m, BytesView data)> verify;
  std::size_t max_verify_attempts = 3;
};

struct StateInfo {
  std::uint64_t epoch = 0;
  Bytes metadata;
  std::size_t donors = 0;  // donors that served at least one part
  std::size_t parts = 0;
  std::size_t parts_retried = 0;  // parts fetched again after a donor failed or lied
  std::uint64_t bytes = 0;
  Duration time{};
};

// Snapshot id of a manifest's contents (what donors with identical state share).
Bytes snapshot_id(const StateManifest& m);
// Checks a manifest's internal consistency (sizes, part count, id).
result<void> validate_manifest(const StateManifest& m);
// The lower median of `epochs` (0 if empty).
std::uint64_t lower_median(std::vector<std::uint64_t> epochs);

}  // namespace starling::averaging
