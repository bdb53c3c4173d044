// Atomic files, the checkpoint container and the checkpoint directory.
#include "starling/training/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "starling/core/log.hpp"
#include "starling/pb/training.pb.h"

namespace starling::training {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'S', 'T', 'A', 'R', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kVersion = 1;
constexpr const char* kTmpMarker = ".tmp-";

Error os_error(const std::string& what, const fs::path& p, int err = errno) {
  return Error(errc::io, fmt::format("{} {}: {}", what, p.string(), std::strerror(err)));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::uint32_t crc32_of(BytesView b) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t off = 0;
  while (off < b.size()) {
    auto n = static_cast<uInt>(std::min<std::size_t>(b.size() - off, 1u << 30));
    crc = crc32(crc, b.data() + off, n);
    off += n;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string checkpoint_name(std::uint64_t epoch) {
  return fmt::format("ckpt-{:012}.stc", epoch);
}

bool is_checkpoint_name(const std::string& n) {
  if (n.size() != 21 || n.rfind("ckpt-", 0) != 0 || n.substr(17) != ".stc") return false;
  return std::all_of(n.begin() + 5, n.begin() + 17, [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

result<void> write_file_atomic(const fs::path& path, BytesView data,
                               const AtomicWriteOptions& options) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::random_device rd;
  const fs::path tmp =
      dir / fmt::format(".{}{}{}-{:08x}", path.filename().string(), kTmpMarker, ::getpid(), rd());
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) return os_error("create", tmp);
  auto fail = [&](Error e) -> result<void> {
    ::close(f.fd);
    f.fd = -1;
    ::unlink(tmp.c_str());
    return e;
  };
  const std::size_t chunk = std::max<std::size_t>(options.chunk_bytes, 1);
  std::size_t written = 0;
  while (written < data.size()) {
    std::size_t want = std::min(chunk, data.size() - written);
    ssize_t n = ::write(f.fd, data.data() + written, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(os_error("write", tmp));
    }
    written += static_cast<std::size_t>(n);
    if (options.on_chunk) options.on_chunk(written);
  }
  if (options.sync && ::fsync(f.fd) != 0) return fail(os_error("fsync", tmp));
  if (::close(f.fd) != 0) {
    f.fd = -1;
    ::unlink(tmp.c_str());
    return os_error("close", tmp);
  }
  f.fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto e = os_error("rename to", path);
    ::unlink(tmp.c_str());
    return e;
  }
  if (options.sync) {
    Fd d;
    d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd < 0) return os_error("open directory", dir);
    if (::fsync(d.fd) != 0) return os_error("fsync directory", dir);
  }
  return success();
}

result<Bytes> read_file(const fs::path& path, std::size_t max_bytes) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    if (errno == ENOENT)
      return make_error(errc::not_found, fmt::format("{}: no such file", path.string()));
    return os_error("open", path);
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return os_error("stat", path);
  auto size = static_cast<std::size_t>(st.st_size);
  if (size > max_bytes)
    return make_error(errc::too_large,
                      fmt::format("{}: {} bytes (limit {})", path.string(), size, max_bytes));
  Bytes out(size);
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(f.fd, out.data() + got, size - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("read", path);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

std::size_t remove_stale_temporaries(const fs::path& dir) {
  std::size_t removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(kTmpMarker) != std::string::npos) {
      if (fs::remove(e.path(), ec)) ++removed;
    }
  }
  return removed;
}

Bytes encode_checkpoint(const CheckpointMeta& meta, BytesView payload) {
  pb::training::CheckpointMeta m;
  m.set_format_version(kVersion);
  m.set_run_id(meta.run_id);
  m.set_epoch(meta.epoch);
  m.set_samples_accumulated(meta.samples_accumulated);
  m.set_samples_total(meta.samples_total);
  m.set_stream_pass(meta.stream_pass);
  m.set_stream_position(meta.stream_position);
  m.set_task(meta.task);
  for (const auto& n : meta.parameter_names) m.add_parameter_names(n);
  m.set_outer_steps(meta.outer_steps);
  std::string meta_bytes = m.SerializeAsString();

  Bytes out;
  out.reserve(8 + 4 + 4 + meta_bytes.size() + 8 + payload.size() + 4);
  out.insert(out.end(), std::begin(kMagic), std::end(kMagic));
  append_be32(out, kVersion);
  append_be32(out, static_cast<std::uint32_t>(meta_bytes.size()));
  out.insert(out.end(), meta_bytes.begin(), meta_bytes.end());
  append_be64(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  append_be32(out, crc32_of(out));
  return out;
}

result<DecodedCheckpoint> decode_checkpoint(BytesView in) {
  auto bad = [](std::string why) {
    return make_error(errc::invalid_argument, "checkpoint: " + why);
  };
  if (in.size() < 8 + 4 + 4 + 8 + 4) return bad(fmt::format("truncated ({} bytes)", in.size()));
  if (!std::equal(std::begin(kMagic), std::end(kMagic), in.begin())) return bad("bad magic");
  const std::uint32_t version = load_be32(in.data() + 8);
  if (version != kVersion) return bad(fmt::format("unknown format version {}", version));
  const std::size_t meta_len = load_be32(in.data() + 12);
  if (meta_len > kMaxCheckpointMetaBytes) return bad(fmt::format("metadata of {} bytes", meta_len));
  std::size_t off = 16;
  if (in.size() - off < meta_len + 8 + 4) return bad("truncated metadata");
  BytesView meta_bytes = in.subspan(off, meta_len);
  off += meta_len;
  const std::uint64_t payload_len = load_be64(in.data() + off);
  off += 8;
  if (payload_len > in.size() - off - 4 || payload_len != in.size() - off - 4)
    return bad(fmt::format("payload length {} does not match the file ({} bytes left)", payload_len,
                           in.size() - off - 4));
  const std::uint32_t want_crc = load_be32(in.data() + in.size() - 4);
  const std::uint32_t got_crc = crc32_of(in.first(in.size() - 4));
  if (want_crc != got_crc)
    return bad(fmt::format("CRC mismatch ({:08x} != {:08x})", got_crc, want_crc));

  pb::training::CheckpointMeta m;
  if (!m.ParseFromArray(meta_bytes.data(), static_cast<int>(meta_bytes.size())))
    return bad("metadata is not a CheckpointMeta message");
  DecodedCheckpoint d;
  d.meta.run_id = m.run_id();
  d.meta.epoch = m.epoch();
  d.meta.samples_accumulated = m.samples_accumulated();
  d.meta.samples_total = m.samples_total();
  d.meta.stream_pass = m.stream_pass();
  d.meta.stream_position = m.stream_position();
  d.meta.task = m.task();
  d.meta.parameter_names.assign(m.parameter_names().begin(), m.parameter_names().end());
  d.meta.outer_steps = m.outer_steps();
  d.payload = in.subspan(off, static_cast<std::size_t>(payload_len));
  return d;
}

result<CheckpointDir> CheckpointDir::open(fs::path dir, std::size_t keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::io, fmt::format("create {}: {}", dir.string(), ec.message()));
  if (!fs::is_directory(dir, ec))
    return make_error(errc::invalid_argument, fmt::format("{} is not a directory", dir.string()));
  if (auto n = remove_stale_temporaries(dir))
    logger("optim")->info("removed {} temporary file(s) of interrupted checkpoint writes in {}", n,
                          dir.string());
  return CheckpointDir(std::move(dir), std::max<std::size_t>(keep, 1));
}

std::vector<fs::path> CheckpointDir::list() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.is_regular_file(ec) && is_checkpoint_name(e.path().filename().string()))
      out.push_back(e.path());
  // Zero-padded epochs: names sort like epochs.
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() > b.filename().string();
  });
  return out;
}

result<fs::path> CheckpointDir::save(const CheckpointMeta& meta, BytesView payload,
                                     const AtomicWriteOptions& options) {
  const fs::path p = dir_ / checkpoint_name(meta.epoch);
  const Bytes file = encode_checkpoint(meta, payload);
  ST_TRY(write_file_atomic(p, file, options));
  auto all = list();
  std::error_code ec;
  for (std::size_t i = keep_; i < all.size(); ++i) fs::remove(all[i], ec);
  return p;
}

result<std::optional<CheckpointDir::Loaded>> CheckpointDir::load_latest(
    std::size_t max_bytes) const {
  for (const auto& p : list()) {
    auto raw = read_file(p, max_bytes);
    if (!raw) {
      logger("optim")->warn("skipping checkpoint {}: {}", p.string(), raw.error().message());
      continue;
    }
    auto d = decode_checkpoint(raw.value());
    if (!d) {
      logger("optim")->warn("skipping damaged checkpoint {}: {}", p.string(), d.error().message());
      continue;
    }
    Loaded l;
    l.meta = std::move(d.value().meta);
    l.payload.assign(d.value().payload.begin(), d.value().payload.end());
    l.path = p;
    return std::optional<Loaded>(std::move(l));
  }
  return std::optional<Loaded>();
}

}  // namespace starling::training
