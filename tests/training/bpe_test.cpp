// Byte-level BPE: chunking, round trips, determinism (in another process too), the cache file
// format and its parser's refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>

#include "starling/training/bpe.hpp"
#include "starling/training/checkpoint.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::training;

namespace {

std::vector<std::string> sample_texts() {
  return {"the quick brown fox jumps over the lazy dog",
          "a quick movement of the enemy will jeopardize six gunboats",
          "the five boxing wizards jump quickly; \"the\" dog barks",
          "an act that has disastrous consequences",
          "the destruction of an enemy plane or ship or tank or missile",
          "in an unjust or unfair manner; \"the employee claimed that she was dismissed\"",
          "caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 r\xc3\xa9sum\xc3\xa9  two  spaces\tand\ttabs\n"};
}

BpeTokenizer trained(std::uint32_t vocab = 300) {
  auto t = BpeTokenizer::train(sample_texts(), vocab);
  EXPECT_TRUE(t) << t.error().message();
  return std::move(t).value();
}

}  // namespace

TEST(Bpe, ChunksConcatenateToTheText) {
  const std::string text = " hello,  world!\n\n  x1 -- y\xc3\xa9 ";
  std::string joined;
  auto chunks = bpe_chunks(text);
  for (auto c : chunks) joined += c;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(chunks[0], " hello");
  EXPECT_EQ(chunks[1], ",");
  EXPECT_EQ(chunks[2], " ");
  EXPECT_EQ(chunks[3], " world");
}

TEST(Bpe, RoundTripsAnyBytes) {
  auto tok = trained();
  EXPECT_GT(tok.vocab_size(), 256u);
  std::mt19937 rng(7);
  for (const auto& t : sample_texts()) {
    auto ids = tok.encode(t);
    EXPECT_LT(ids.size(), t.size());  // merges shorten known text
    EXPECT_EQ(tok.decode(ids).value(), t);
  }
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    EXPECT_EQ(tok.decode(tok.encode(s)).value(), s);
  }
  std::vector<TokenId> bad{static_cast<TokenId>(tok.vocab_size())};
  EXPECT_FALSE(tok.decode(bad));
}

TEST(Bpe, EncodeAllMatchesEncode) {
  auto tok = trained();
  auto texts = sample_texts();
  std::vector<TokenId> expected;
  for (const auto& t : texts) {
    tok.encode(t, expected);
    expected.push_back('\n');
  }
  EXPECT_EQ(tok.encode_all(texts, TokenId{'\n'}), expected);
}

TEST(Bpe, TrainingIsDeterministicAcrossProcesses) {
  auto a = trained();
  EXPECT_EQ(a.hash(), trained().hash());
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    auto t = BpeTokenizer::train(sample_texts(), 300);
    const std::string h = t ? t.value().hash() : "error";
    (void)!write(fds[1], h.data(), h.size());
    _exit(0);
  }
  close(fds[1]);
  std::string got(64, '\0');
  std::size_t n = 0;
  while (n < got.size()) {
    auto r = read(fds[0], got.data() + n, got.size() - n);
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(got.substr(0, n), a.hash());
  // A different vocabulary has a different hash.
  EXPECT_NE(trained(290).hash(), a.hash());
}

TEST(Bpe, MostFrequentPairMergesFirst) {
  std::vector<std::string> texts{"ab ab ab ab cd cd"};
  auto tok = BpeTokenizer::train(texts, 258).value();
  ASSERT_EQ(tok.merges().size(), 2u);
  // " a"/"ab"/"b " pairs: 'a','b' occurs 4 times, ' ','a' 3 times.
  EXPECT_EQ(tok.merges()[0], (BpeTokenizer::Merge{'a', 'b'}));
}

TEST(Bpe, FileRoundTripAndRefusals) {
  auto tok = trained();
  auto file = tok.serialize();
  auto back = BpeTokenizer::parse(file);
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().hash(), tok.hash());
  EXPECT_EQ(back.value().merges(), tok.merges());

  auto text = std::string(file.begin(), file.end());
  auto parse = [](const std::string& s) { return BpeTokenizer::parse(as_bytes(s)); };
  EXPECT_FALSE(parse(""));
  EXPECT_FALSE(parse("starling-bpe 2\nvocab 257\n97 98\n"));
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 256\n"));
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 258\n97 98\n"));         // truncated
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 257\n97 256\n"));        // undefined token
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 258\n97 98\n97 98\n"));  // repeated pair
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 257\n97 98\nextra"));    // trailing bytes
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 257\n-1 98\n"));         // sign
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 257\n097 98\n"));        // not canonical
  EXPECT_FALSE(parse("starling-bpe 1\nvocab 99999999\n"));           // too large
  EXPECT_TRUE(parse("starling-bpe 1\nvocab 258\n97 98\n256 99\n"));
  EXPECT_FALSE(parse(text.substr(0, text.size() - 1)));  // no final newline
}

TEST(Bpe, CacheIsWrittenOnceAndReplacedWhenDamaged) {
  test::TempDir dir("bpe");
  const auto path = dir.path / "sub" / "bpe.txt";
  auto texts = sample_texts();
  auto a = load_or_train_bpe(path, texts, 300);
  ASSERT_TRUE(a) << a.error().message();
  ASSERT_TRUE(std::filesystem::exists(path));
  // Read back from the file (different texts would train another vocabulary).
  std::vector<std::string> other{"zzzz zzzz zzzz"};
  auto b = load_or_train_bpe(path, other, 300);
  ASSERT_TRUE(b);
  EXPECT_EQ(b.value().hash(), a.value().hash());
  // Damaged: trained again and rewritten.
  ASSERT_TRUE(write_file_atomic(path, as_bytes(std::string("garbage"))));
  auto c = load_or_train_bpe(path, texts, 300);
  ASSERT_TRUE(c);
  EXPECT_EQ(c.value().hash(), a.value().hash());
  EXPECT_TRUE(BpeTokenizer::parse(read_file(path, 1 << 20).value()));
}
