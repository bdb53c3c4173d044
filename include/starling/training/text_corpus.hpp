// English text for the built-in language-model task: the glosses (definitions and example
// sentences) of Debian's wordnet-base package, ~9.2 MB of plain text read straight from
// /usr/share/wordnet/data.{noun,verb,adj,adv}, split deterministically into a training part
// and a held-out part. No torch here.
//
// Threading rule: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "starling/core/result.hpp"
#include "starling/training/bpe.hpp"

namespace starling::training {

// Where Debian's wordnet-base package puts the database files.
inline constexpr const char* kWordnetDefaultDir = "/usr/share/wordnet";
// The four data files read, in this order.
inline constexpr const char* kWordnetDataFiles[] = {"data.noun", "data.verb", "data.adj",
                                                    "data.adv"};
// Below this many bytes of text the files are not the package's (truncated, a stub).
inline constexpr std::size_t kWordnetMinBytes = 5'000'000;

// The glosses of one WordNet data file, in file order: the text after "| " on every synset
// line, trailing spaces removed. License lines (starting with two spaces) are skipped. A
// synset line without a gloss is skipped; a line that is not a synset line (it does not start
// with an 8-digit offset) is an error naming `where` and the line number.
result<std::vector<std::string>> parse_wordnet_glosses(std::string_view content,
                                                       std::string_view where);

struct TextCorpus {
  std::vector<std::string> train;
  std::vector<std::string> heldout;
  std::size_t bytes = 0;  // of all documents
  std::string digest;     // hex SHA-256 of every document (in order, each followed by '\n')
};

// Every `heldout_every`-th document (index % heldout_every == heldout_every - 1) goes to the
// held-out part, the others to the training part. Deterministic: every peer splits the same
// files the same way.
void split_documents(std::vector<std::string> docs, std::uint32_t heldout_every, TextCorpus& out);

// Loads and splits the glosses of `dir`'s four data files. Errors (errc::not_found) name the
// missing file and the package to install (wordnet-base, scripts/install-deps.sh); fewer than
// kWordnetMinBytes of text is errc::invalid_argument.
result<TextCorpus> load_wordnet_corpus(const std::filesystem::path& dir,
                                       std::uint32_t heldout_every = 50);

// The language-model task's data: the corpus, its tokenizer (trained on the training part
// once, then read from the cache file) and both parts as token streams, every document
// followed by the separator token '\n'.
struct LmCorpusOptions {
  std::filesystem::path data_dir = kWordnetDefaultDir;
  std::filesystem::path cache_dir;  // empty: default_cache_dir()
  std::uint32_t vocab_size = 2048;
  std::uint32_t heldout_every = 50;
};
struct LmCorpus {
  BpeTokenizer tokenizer;
  std::vector<TokenId> train;
  std::vector<TokenId> heldout;
  std::string corpus_digest;  // TextCorpus::digest
  std::size_t text_bytes = 0;
  std::filesystem::path tokenizer_file;
};
inline constexpr TokenId kLmSeparator = '\n';
// $XDG_CACHE_HOME/starling, else $HOME/.cache/starling, else ./.starling-cache.
std::filesystem::path default_cache_dir();
// The tokenizer cache file: <cache_dir>/bpe-<vocab>-<first 16 hex digits of the digest>.txt.
std::filesystem::path tokenizer_cache_file(const std::filesystem::path& cache_dir,
                                           std::uint32_t vocab_size, std::string_view digest);
result<LmCorpus> load_lm_corpus(const LmCorpusOptions& options);

}  // namespace starling::training
