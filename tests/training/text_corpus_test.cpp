// The language-model corpus: WordNet gloss parsing, the deterministic split, errors, and (when
// wordnet-base is installed) the real files and their tokenization.
#include <gtest/gtest.h>

#include "starling/training/checkpoint.hpp"
#include "starling/training/text_corpus.hpp"
#include "support/temp_dir.hpp"

using namespace starling;
using namespace starling::training;

TEST(TextCorpus, ParsesGlosses) {
  const std::string data =
      "  1 This software and database is being provided\n"
      "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived  \n"
      "00001930 03 n 01 physical_entity 0 007 @ 00001740 n 0000\n"
      "00002137 03 n 02 abstraction 0 | a general concept; \"an example\"  \n";
  auto g = parse_wordnet_glosses(data, "data.noun");
  ASSERT_TRUE(g) << g.error().message();
  ASSERT_EQ(g.value().size(), 2u);
  EXPECT_EQ(g.value()[0], "that which is perceived");
  EXPECT_EQ(g.value()[1], "a general concept; \"an example\"");
  auto bad = parse_wordnet_glosses("00001740 ok | x\nnot a synset | y\n", "f");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("f:2"), std::string::npos);
}

TEST(TextCorpus, SplitIsDeterministic) {
  std::vector<std::string> docs;
  for (int i = 0; i < 100; ++i) docs.push_back("doc " + std::to_string(i));
  TextCorpus a, b;
  split_documents(docs, 10, a);
  split_documents(docs, 10, b);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.heldout, b.heldout);
  EXPECT_EQ(a.digest, b.digest);
  ASSERT_EQ(a.heldout.size(), 10u);
  EXPECT_EQ(a.train.size(), 90u);
  EXPECT_EQ(a.heldout[0], "doc 9");
  docs[3] = "changed";
  TextCorpus c;
  split_documents(docs, 10, c);
  EXPECT_NE(c.digest, a.digest);
}

TEST(TextCorpus, MissingFilesNameThePackage) {
  test::TempDir dir("corpus");
  auto c = load_wordnet_corpus(dir.path);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code(), make_error_code(errc::not_found));
  EXPECT_NE(c.error().message().find("wordnet-base"), std::string::npos);
  // Present but far too small: not the package's files.
  for (const char* f : kWordnetDataFiles)
    ASSERT_TRUE(write_file_atomic(dir.path / f, as_bytes(std::string("00000001 x | a b c\n"))));
  auto small = load_wordnet_corpus(dir.path);
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().message().find("at least"), std::string::npos);
}

TEST(TextCorpus, RealWordnetTokenizes) {
  if (!std::filesystem::exists(std::filesystem::path(kWordnetDefaultDir) / "data.noun"))
    GTEST_SKIP() << "wordnet-base not installed (scripts/install-deps.sh)";
  test::TempDir dir("lmcorpus");
  LmCorpusOptions o;
  o.cache_dir = dir.path;
  o.vocab_size = 512;  // quick
  auto c = load_lm_corpus(o);
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_GE(c.value().text_bytes, kWordnetMinBytes);
  EXPECT_GT(c.value().train.size(), 40 * c.value().heldout.size());
  EXPECT_GT(c.value().heldout.size(), 10'000u);
  EXPECT_TRUE(std::filesystem::exists(c.value().tokenizer_file));
  // The held-out text decodes back to its glosses.
  auto text = c.value().tokenizer.decode(std::span(c.value().heldout).subspan(0, 200)).value();
  EXPECT_NE(text.find('\n'), std::string::npos);
  // A second load reads the cache and gives the same tokens.
  auto again = load_lm_corpus(o);
  ASSERT_TRUE(again);
  EXPECT_EQ(again.value().tokenizer.hash(), c.value().tokenizer.hash());
  EXPECT_EQ(again.value().heldout, c.value().heldout);
}
