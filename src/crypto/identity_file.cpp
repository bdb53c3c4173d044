// Identity files: a libp2p PrivateKey protobuf on disk, mode 0600, written atomically.
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "starling/crypto/keys.hpp"

namespace starling::crypto {
namespace {

// Generous bound: an Ed25519 PrivateKey protobuf is 68 bytes (100 in the legacy layout).
constexpr std::size_t kMaxIdentityFileSize = 4096;

std::string quoted(const std::filesystem::path& p) {
  return "'" + p.string() + "'";
}

Error os_error(const std::filesystem::path& path, const std::string& op, int err) {
  return make_error(errc::io, op + " " + quoted(path) + ": " + std::strerror(err));
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Wipes a buffer holding secret bytes on scope exit.
struct Wipe {
  Bytes& b;
  ~Wipe() { sodium_memzero(b.data(), b.size()); }
};

result<void> write_all(int fd, BytesView data, const std::filesystem::path& path) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error(path, "write", errno);
    }
    off += static_cast<std::size_t>(n);
  }
  return success();
}

// fsyncs the directory holding `path` so a completed rename/link survives a crash.
void sync_parent_dir(const std::filesystem::path& path) {
  auto dir = path.parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the file itself is already durable
  ::fsync(fd);
  ::close(fd);
}

// Writes `data` to a fresh 0600 temp file next to `path` and fsyncs it. Returns the temp path.
result<std::filesystem::path> write_temp(const std::filesystem::path& path, BytesView data) {
  ensure_sodium();
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%08x", static_cast<long>(::getpid()),
                randombytes_random());
  std::filesystem::path tmp = path;
  tmp += suffix;
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f.fd < 0) return os_error(tmp, "create identity file", errno);
  auto fail = [&](Error e) -> result<std::filesystem::path> {
    ::unlink(tmp.c_str());
    return e;
  };
  // The umask can only remove bits, but make the mode explicit anyway.
  if (::fchmod(f.fd, 0600) != 0) return fail(os_error(tmp, "chmod", errno));
  if (auto w = write_all(f.fd, data, tmp); !w) return fail(w.error());
  if (::fsync(f.fd) != 0) return fail(os_error(tmp, "fsync", errno));
  int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) return fail(os_error(tmp, "close", errno));
  return tmp;
}

// Publishes the temp file at `path`. With `overwrite` false it never replaces an existing
// file (hard link, then unlink the temp name); returns errc::already_exists in that case.
result<void> publish(const std::filesystem::path& tmp, const std::filesystem::path& path,
                     bool overwrite) {
  if (overwrite) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      return os_error(path, "rename identity file to", err);
    }
  } else {
    int rc = ::link(tmp.c_str(), path.c_str());
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc != 0) {
      if (err == EEXIST) return make_error(errc::already_exists, quoted(path) + " already exists");
      return os_error(path, "link identity file to", err);
    }
  }
  sync_parent_dir(path);
  return success();
}

// Creates the missing directories above `path` with mode 0700 (the key's directory holds a
// secret; existing directories are left as they are).
result<void> ensure_parent_dir(const std::filesystem::path& path) {
  auto dir = path.parent_path();
  if (dir.empty()) return success();
  std::filesystem::path at;
  for (const auto& part : dir) {
    at /= part;
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST) {
      return os_error(at, "create identity directory", errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return os_error(dir, "stat identity directory", errno);
  if (!S_ISDIR(st.st_mode)) {
    return make_error(errc::io, "identity directory " + quoted(dir) + " is not a directory");
  }
  return success();
}

result<void> write_identity(const std::filesystem::path& path, const KeyPair& key, bool overwrite) {
  ST_TRY(ensure_parent_dir(path));
  Bytes pb = key.to_private_protobuf();
  Wipe wipe{pb};
  ST_TRY(auto tmp, write_temp(path, pb));
  return publish(tmp, path, overwrite);
}

}  // namespace

result<void> save_identity(const std::filesystem::path& path, const KeyPair& key) {
  return write_identity(path, key, /*overwrite=*/true);
}

result<KeyPair> load_identity(const std::filesystem::path& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (f.fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return make_error(errc::not_found, "identity file " + quoted(path) + " does not exist");
    }
    return os_error(path, "open identity file", err);
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return os_error(path, "stat identity file", errno);
  if (!S_ISREG(st.st_mode)) {
    return make_error(errc::io, "identity file " + quoted(path) + " is not a regular file");
  }
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return make_error(errc::permission, "identity file " + quoted(path) + " has mode " + mode +
                                            " and is accessible by group/others; run: chmod 600 " +
                                            quoted(path));
  }
  Bytes data;
  Wipe wipe{data};
  data.resize(kMaxIdentityFileSize + 1);  // one extra byte detects oversize files
  std::size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(f.fd, data.data() + got, data.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error(path, "read identity file", errno);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxIdentityFileSize) {
    return make_error(errc::invalid_argument, "identity file " + quoted(path) + " is larger than " +
                                                  std::to_string(kMaxIdentityFileSize) +
                                                  " bytes; not a libp2p private key");
  }
  auto kp = KeyPair::from_private_protobuf(BytesView(data).first(got));
  if (!kp) {
    Error e = kp.error();
    // A protobuf that is well-formed but holds another key type stays errc::unsupported.
    return e.with_context("identity file " + quoted(path));
  }
  return std::move(kp).value();
}

result<KeyPair> load_or_create_identity(const std::filesystem::path& path, bool* created) {
  if (created) *created = false;
  auto loaded = load_identity(path);
  if (loaded || loaded.error() != errc::not_found) return loaded;
  KeyPair kp = KeyPair::generate();
  auto w = write_identity(path, kp, /*overwrite=*/false);
  if (!w) {
    // Someone else created it between our load and our link: use theirs.
    if (w.error() == errc::already_exists) return load_identity(path);
    return w.error();
  }
  if (created) *created = true;
  return kp;
}

}  // namespace starling::crypto
