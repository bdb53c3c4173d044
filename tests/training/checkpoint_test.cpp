// Atomic files, the checkpoint container, and the checkpoint directory (including a process
// killed in the middle of writing a checkpoint).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <random>

#include "starling/training/checkpoint.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::training;
namespace fs = std::filesystem;

namespace {

Bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

CheckpointMeta meta(std::uint64_t epoch) {
  CheckpointMeta m;
  m.run_id = "test-run";
  m.epoch = epoch;
  m.samples_accumulated = 17;
  m.samples_total = 1000 * epoch;
  m.stream_pass = 2;
  m.stream_position = 345;
  m.task = "fashion-mnist/mlp";
  m.parameter_names = {"0.weight", "0.bias"};
  m.outer_steps = 3;
  return m;
}

std::size_t temporaries(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST(Checkpoint, ContainerRoundTrip) {
  Bytes payload = random_bytes(5000, 1);
  Bytes file = encode_checkpoint(meta(7), payload);
  auto d = decode_checkpoint(file);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d.value().meta, meta(7));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), d.value().payload.begin(),
                         d.value().payload.end()));
}

TEST(Checkpoint, ContainerRejectsDamage) {
  Bytes file = encode_checkpoint(meta(1), random_bytes(300, 2));
  // Every truncation is rejected.
  for (std::size_t n = 0; n < file.size(); ++n)
    EXPECT_FALSE(decode_checkpoint(BytesView(file).first(n))) << n;
  // Every single-bit flip is rejected (CRC-32 detects all of them).
  for (std::size_t i = 0; i < file.size(); ++i) {
    Bytes f = file;
    f[i] ^= static_cast<std::uint8_t>(1u << (i % 8));
    EXPECT_FALSE(decode_checkpoint(f)) << i;
  }
  Bytes longer = file;
  longer.push_back(0);
  EXPECT_FALSE(decode_checkpoint(longer));
  auto e = decode_checkpoint(random_bytes(100, 3));
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message().find("bad magic"), std::string::npos);
}

TEST(AtomicFile, WritesAndReplaces) {
  test::TempDir dir("ckpt");
  auto p = dir.path / "f.bin";
  ASSERT_TRUE(write_file_atomic(p, random_bytes(100, 1)));
  ASSERT_TRUE(write_file_atomic(p, random_bytes(3000000, 2)));
  auto r = read_file(p, 1 << 30);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value(), random_bytes(3000000, 2));
  EXPECT_EQ(temporaries(dir.path), 0u);
  EXPECT_EQ(read_file(dir.path / "nope", 100).error(), errc::not_found);
  EXPECT_EQ(read_file(p, 100).error(), errc::too_large);
  auto bad = write_file_atomic(dir.path / "no-such-dir" / "f", random_bytes(10, 1));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), errc::io);
}

// A real crash: a child process starts replacing the checkpoint and is killed with SIGKILL
// after writing part of it. The previous checkpoint stays valid and loads; the leftover
// temporary file is removed when the directory is opened again.
TEST(CheckpointDir, SurvivesAProcessKilledMidWrite) {
  test::TempDir dir("ckpt");
  auto cd = CheckpointDir::open(dir.path, 2);
  ASSERT_TRUE(cd);
  const Bytes old_payload = random_bytes(200000, 10);
  ASSERT_TRUE(cd.value().save(meta(5), old_payload));
  // The next checkpoint reuses the same name (same epoch) so a torn write would hit the
  // very file we rely on, and a new epoch's file would also be a candidate.
  const Bytes new_payload = random_bytes(4000000, 11);
  for (std::uint64_t epoch : {5u, 6u}) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      AtomicWriteOptions opts;
      opts.chunk_bytes = 64 << 10;
      opts.on_chunk = [](std::size_t written) {
        if (written >= (1 << 20)) ::raise(SIGKILL);
      };
      (void)cd.value().save(meta(epoch), new_payload, opts);
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_EQ(temporaries(dir.path), 1u);

    auto latest = cd.value().load_latest();
    ASSERT_TRUE(latest) << latest.error().message();
    ASSERT_TRUE(latest.value().has_value());
    EXPECT_EQ(latest.value()->meta, meta(5));
    EXPECT_EQ(latest.value()->payload, old_payload);

    auto reopened = CheckpointDir::open(dir.path, 2);
    ASSERT_TRUE(reopened);
    EXPECT_EQ(temporaries(dir.path), 0u);
  }
}

TEST(CheckpointDir, KeepsNewestAndSkipsDamaged) {
  test::TempDir dir("ckpt");
  auto cd = CheckpointDir::open(dir.path / "nested" / "ckpts", 2);
  ASSERT_TRUE(cd);
  auto empty = cd.value().load_latest();
  ASSERT_TRUE(empty);
  EXPECT_FALSE(empty.value().has_value());
  for (std::uint64_t e = 1; e <= 4; ++e)
    ASSERT_TRUE(cd.value().save(meta(e), random_bytes(1000, static_cast<std::uint32_t>(e))));
  auto files = cd.value().list();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename(), "ckpt-000000000004.stc");
  EXPECT_EQ(files[1].filename(), "ckpt-000000000003.stc");
  // Damage the newest: the previous one is used.
  {
    auto raw = read_file(files[0], 1 << 20).value();
    raw[raw.size() / 2] ^= 0xff;
    ASSERT_TRUE(write_file_atomic(files[0], raw));
  }
  auto l = cd.value().load_latest();
  ASSERT_TRUE(l);
  ASSERT_TRUE(l.value().has_value());
  EXPECT_EQ(l.value()->meta.epoch, 3u);
  EXPECT_EQ(l.value()->payload, random_bytes(1000, 3));
  // A file that is not a directory.
  ASSERT_TRUE(write_file_atomic(dir.path / "plain", random_bytes(1, 1)));
  EXPECT_FALSE(CheckpointDir::open(dir.path / "plain"));
}
