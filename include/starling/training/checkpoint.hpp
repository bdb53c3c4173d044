// Checkpoints on disk: atomic file replacement (temporary file + fsync + rename + directory
// fsync, so a crash leaves either the old file or the new one, never half of one), the
// checkpoint container (metadata + opaque payload + CRC-32), and a directory that keeps the
// last few checkpoints and resumes from the newest valid one. The payload (model parameters
// and optimizer state) is produced by training_state.hpp; no torch here.
//
// Threading rule: plain functions; a CheckpointDir is used from one thread. Calls block on
// disk I/O: run them off the network thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "starling/core/bytes.hpp"

namespace starling::training {

struct AtomicWriteOptions {
  // fsync the file before the rename and the directory after it (off only in tests that do
  // not care about power loss).
  bool sync = true;
  std::size_t chunk_bytes = 1 << 20;
  // Test hook: called after each chunk reaches the temporary file with the bytes written so
  // far. A test can kill the process here to simulate a crash mid-write.
  std::function<void(std::size_t)> on_chunk;
};

// Replaces `path` with `data` atomically. The temporary file is `.<name>.tmp-<pid>-<rand>` in
// the same directory (removed on failure). errc::io with the path and OS reason on failure.
result<void> write_file_atomic(const std::filesystem::path& path, BytesView data,
                               const AtomicWriteOptions& options = {});
// Reads a whole file (errc::not_found, errc::too_large over max_bytes, errc::io).
result<Bytes> read_file(const std::filesystem::path& path, std::size_t max_bytes);
// Removes temporaries of interrupted write_file_atomic calls in `dir`; returns how many.
std::size_t remove_stale_temporaries(const std::filesystem::path& dir);

// Collaboration metadata stored next to the state (pb::training::CheckpointMeta).
struct CheckpointMeta {
  std::string run_id;
  std::uint64_t epoch = 0;                // collaboration epoch of the parameters
  std::uint64_t samples_accumulated = 0;  // toward `epoch`'s target when saved
  std::uint64_t samples_total = 0;        // contributed by this peer over the run
  std::uint64_t stream_pass = 0;          // data stream position
  std::uint64_t stream_position = 0;
  std::string task;
  std::vector<std::string> parameter_names;
  std::uint64_t outer_steps = 0;  // DiLoCo

  friend bool operator==(const CheckpointMeta&, const CheckpointMeta&) = default;
};

inline constexpr std::size_t kMaxCheckpointMetaBytes = 1 << 20;

// Container: "STARCKPT", u32 version (1), u32 meta length, meta, u64 payload length, payload,
// u32 CRC-32 of everything before it. All integers big-endian.
Bytes encode_checkpoint(const CheckpointMeta& meta, BytesView payload);
struct DecodedCheckpoint {
  CheckpointMeta meta;
  BytesView payload;  // points into the decoded input
};
// errc::invalid_argument naming the problem: bad magic, unknown version, truncated, lengths
// that do not add up, CRC mismatch, bad metadata.
result<DecodedCheckpoint> decode_checkpoint(BytesView in);

// A directory of checkpoints `ckpt-<epoch, 12 digits>.stc`; keeps the newest `keep`.
class CheckpointDir {
 public:
  // Creates the directory if needed and removes temporaries of interrupted writes.
  static result<CheckpointDir> open(std::filesystem::path dir, std::size_t keep = 2);

  // Writes the checkpoint for meta.epoch atomically, then prunes old ones.
  result<std::filesystem::path> save(const CheckpointMeta& meta, BytesView payload,
                                     const AtomicWriteOptions& options = {});
  // The newest checkpoint that decodes and passes its CRC (older ones are tried when a newer
  // one is damaged; damaged files are logged and skipped). nullopt if there is none.
  struct Loaded {
    CheckpointMeta meta;
    Bytes payload;
    std::filesystem::path path;
  };
  result<std::optional<Loaded>> load_latest(std::size_t max_bytes = std::size_t{16} << 30) const;
  // Checkpoint files present, newest first.
  std::vector<std::filesystem::path> list() const;
  const std::filesystem::path& path() const noexcept { return dir_; }

 private:
  CheckpointDir(std::filesystem::path dir, std::size_t keep) : dir_(std::move(dir)), keep_(keep) {}
  std::filesystem::path dir_;
  std::size_t keep_;
};

}  // namespace starling::training
