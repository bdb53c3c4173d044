// Identity files: round trip, mode 0600, atomic create, and every load failure mode.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "starling/crypto/keys.hpp"

using namespace starling;
using namespace starling::crypto;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
class IdentityFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() /
           ("starling-identity-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  void write_raw(const fs::path& p, const Bytes& data, fs::perms mode) {
    {
      std::ofstream f(p, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
    }
    fs::permissions(p, mode);
  }
  static unsigned mode_of(const fs::path& p) {
    struct stat st;
    EXPECT_EQ(::stat(p.c_str(), &st), 0);
    return st.st_mode & 07777;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(IdentityFileTest, SaveLoadRoundTripWithMode0600) {
  auto path = dir_ / "identity.key";
  auto kp = KeyPair::generate();
  auto saved = save_identity(path, kp);
  ASSERT_TRUE(saved) << saved.error().message();
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_EQ(fs::file_size(path), 68u);  // 4-byte protobuf header + 64-byte secret
  auto loaded = load_identity(path);
  ASSERT_TRUE(loaded) << loaded.error().message();
  EXPECT_EQ(loaded.value().public_key(), kp.public_key());
  EXPECT_EQ(to_hex(loaded.value().seed()), to_hex(kp.seed()));
  // No temp files are left behind.
  std::size_t entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1u);

  // Overwrite with another key: the new one wins.
  auto kp2 = KeyPair::generate();
  ASSERT_TRUE(save_identity(path, kp2));
  EXPECT_EQ(load_identity(path).value().public_key(), kp2.public_key());
}

TEST_F(IdentityFileTest, LoadsSpecVectorFile) {
  auto path = dir_ / "spec.key";
  write_raw(path,
            from_hex("080112407e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d1ed1e"
                     "8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e")
                .value(),
            fs::perms::owner_read | fs::perms::owner_write);
  auto kp = load_identity(path);
  ASSERT_TRUE(kp) << kp.error().message();
  EXPECT_EQ(to_hex(kp.value().public_key().data()),
            "1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e");
}

TEST_F(IdentityFileTest, MissingFileIsNotFound) {
  auto path = dir_ / "nope.key";
  auto r = load_identity(path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::not_found);
  EXPECT_NE(r.error().context().find(path.string()), std::string::npos);
}

TEST_F(IdentityFileTest, GroupOrWorldAccessIsPermissionError) {
  auto path = dir_ / "open.key";
  auto kp = KeyPair::generate();
  ASSERT_TRUE(save_identity(path, kp));
  for (auto extra : {fs::perms::group_read, fs::perms::others_read, fs::perms::group_write,
                     fs::perms::others_exec}) {
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | extra);
    auto r = load_identity(path);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error(), errc::permission);
    EXPECT_NE(r.error().context().find("chmod 600"), std::string::npos) << r.error().message();
    EXPECT_NE(r.error().context().find(path.string()), std::string::npos);
  }
  fs::permissions(path, fs::perms::owner_read);  // 0400 is fine
  EXPECT_TRUE(load_identity(path));
}

TEST_F(IdentityFileTest, MalformedFileIsInvalidArgument) {
  auto path = dir_ / "bad.key";
  auto owner_rw = fs::perms::owner_read | fs::perms::owner_write;
  auto good = KeyPair::generate().to_private_protobuf();
  std::vector<Bytes> bad_contents = {
      {},                                   // empty
      to_bytes("not a key at all"),         // text
      Bytes(good.begin(), good.end() - 1),  // truncated
      [&] {
        auto b = good;
        b.push_back(0);
        return b;
      }(),  // trailing byte
      [&] {
        auto b = good;
        b.back() ^= 0x55;
        return b;
      }(),                // public half mismatch
      Bytes(5000, 0x08),  // oversized
  };
  for (std::size_t i = 0; i < bad_contents.size(); ++i) {
    write_raw(path, bad_contents[i], owner_rw);
    auto r = load_identity(path);
    ASSERT_FALSE(r) << i;
    EXPECT_EQ(r.error(), errc::invalid_argument) << i << ": " << r.error().message();
    EXPECT_NE(r.error().context().find(path.string()), std::string::npos) << i;
  }
}

TEST_F(IdentityFileTest, UnreadableIsIo) {
  // A directory where the file should be cannot be read as a key.
  auto path = dir_ / "a-directory.key";
  fs::create_directory(path);
  fs::permissions(path, fs::perms::owner_all);
  auto r = load_identity(path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error(), errc::io);
  EXPECT_NE(r.error().context().find(path.string()), std::string::npos);

  if (::geteuid() != 0) {  // root ignores file modes
    auto locked = dir_ / "locked.key";
    ASSERT_TRUE(save_identity(locked, KeyPair::generate()));
    fs::permissions(locked, fs::perms::none);
    auto r2 = load_identity(locked);
    ASSERT_FALSE(r2);
    EXPECT_EQ(r2.error(), errc::io) << r2.error().message();
  }
}

TEST_F(IdentityFileTest, SaveIntoMissingDirectoryCreatesIt) {
  auto path = dir_ / "missing-dir" / "id.key";
  auto kp = KeyPair::generate();
  auto r = save_identity(path, kp);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(mode_of(dir_ / "missing-dir"), 0700u);
  EXPECT_EQ(mode_of(path), 0600u);
  auto back = load_identity(path);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().public_key(), kp.public_key());
}

TEST_F(IdentityFileTest, LoadOrCreate) {
  auto path = dir_ / "node.key";
  bool created = false;
  auto first = load_or_create_identity(path, &created);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_TRUE(created);
  EXPECT_EQ(mode_of(path), 0600u);
  auto second = load_or_create_identity(path, &created);
  ASSERT_TRUE(second);
  EXPECT_FALSE(created);
  EXPECT_EQ(second.value().public_key(), first.value().public_key());
  // A bad existing file is reported, never silently replaced.
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto third = load_or_create_identity(path, &created);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error(), errc::permission);
  EXPECT_FALSE(created);
}

TEST_F(IdentityFileTest, CreatingAnIdentityCreatesItsMissingDirectoriesWithMode0700) {
  auto path = dir_ / "home" / ".starling" / "identity.key";
  bool created = false;
  auto kp = load_or_create_identity(path, &created);
  ASSERT_TRUE(kp) << kp.error().message();
  EXPECT_TRUE(created);
  EXPECT_EQ(mode_of(dir_ / "home"), 0700u);
  EXPECT_EQ(mode_of(dir_ / "home" / ".starling"), 0700u);
  EXPECT_EQ(mode_of(path), 0600u);
  auto again = load_or_create_identity(path, &created);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_FALSE(created);
  EXPECT_EQ(again.value().public_key(), kp.value().public_key());
}

TEST_F(IdentityFileTest, AParentThatIsAFileIsAClearError) {
  write_raw(dir_ / "plain", Bytes{1, 2, 3}, fs::perms::owner_read | fs::perms::owner_write);
  auto kp = load_or_create_identity(dir_ / "plain" / "identity.key", nullptr);
  ASSERT_FALSE(kp);
  EXPECT_NE(kp.error().message().find("plain"), std::string::npos) << kp.error().message();
}
