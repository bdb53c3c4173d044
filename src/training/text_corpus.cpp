// WordNet glosses as the language-model task's corpus.
#include "starling/training/text_corpus.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "starling/crypto/keys.hpp"
#include "starling/training/checkpoint.hpp"

namespace starling::training {

namespace {
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
}  // namespace

result<std::vector<std::string>> parse_wordnet_glosses(std::string_view content,
                                                       std::string_view where) {
  std::vector<std::string> out;
  std::size_t line_no = 0;
  while (!content.empty()) {
    ++line_no;
    const auto nl = content.find('\n');
    std::string_view line = content.substr(0, nl);
    content = nl == std::string_view::npos ? std::string_view{} : content.substr(nl + 1);
    if (line.empty() || line.starts_with("  ")) continue;  // license header
    bool offset = line.size() > 9 && line[8] == ' ';
    for (std::size_t i = 0; offset && i < 8; ++i) offset = is_digit(line[i]);
    if (!offset)
      return make_error(errc::invalid_argument,
                        fmt::format("{}:{}: not a WordNet synset line", where, line_no));
    const auto bar = line.find(" | ");
    if (bar == std::string_view::npos) continue;
    std::string_view gloss = line.substr(bar + 3);
    while (!gloss.empty() && (gloss.back() == ' ' || gloss.back() == '\r')) gloss.remove_suffix(1);
    if (!gloss.empty()) out.emplace_back(gloss);
  }
  return out;
}

void split_documents(std::vector<std::string> docs, std::uint32_t heldout_every, TextCorpus& out) {
  Bytes all;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    out.bytes += docs[i].size();
    all.insert(all.end(), docs[i].begin(), docs[i].end());
    all.push_back('\n');
    const bool held = heldout_every > 0 && i % heldout_every == heldout_every - 1;
    (held ? out.heldout : out.train).push_back(std::move(docs[i]));
  }
  const auto h = crypto::sha256(all);
  out.digest = to_hex(BytesView(h.data(), h.size()));
}

result<TextCorpus> load_wordnet_corpus(const std::filesystem::path& dir,
                                       std::uint32_t heldout_every) {
  std::vector<std::string> docs;
  for (const char* name : kWordnetDataFiles) {
    const auto path = dir / name;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      return make_error(errc::not_found,
                        fmt::format("{} not found: the language-model task reads WordNet's "
                                    "glosses; install Debian's wordnet-base "
                                    "(scripts/install-deps.sh) or pass --data-dir",
                                    path.string()));
    ST_TRY(auto bytes, read_file(path, std::size_t{64} << 20));
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    ST_TRY(auto glosses, parse_wordnet_glosses(text, path.string()));
    for (auto& g : glosses) docs.push_back(std::move(g));
  }
  TextCorpus c;
  split_documents(std::move(docs), heldout_every, c);
  if (c.bytes < kWordnetMinBytes)
    return make_error(errc::invalid_argument,
                      fmt::format("{}: only {} bytes of glosses (expected at least {}): not "
                                  "Debian's wordnet-base data files",
                                  dir.string(), c.bytes, kWordnetMinBytes));
  return c;
}

std::filesystem::path default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::filesystem::path(x) / "starling";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::filesystem::path(h) / ".cache" / "starling";
  return ".starling-cache";
}

std::filesystem::path tokenizer_cache_file(const std::filesystem::path& cache_dir,
                                           std::uint32_t vocab_size, std::string_view digest) {
  return cache_dir / fmt::format("bpe-{}-{}.txt", vocab_size, digest.substr(0, 16));
}

result<LmCorpus> load_lm_corpus(const LmCorpusOptions& o) {
  ST_TRY(auto text, load_wordnet_corpus(o.data_dir, o.heldout_every));
  const auto dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  const auto file = tokenizer_cache_file(dir, o.vocab_size, text.digest);
  ST_TRY(auto tok, load_or_train_bpe(file, text.train, o.vocab_size));
  auto train = tok.encode_all(text.train, kLmSeparator);
  auto heldout = tok.encode_all(text.heldout, kLmSeparator);
  return LmCorpus{std::move(tok), std::move(train), std::move(heldout),
                  text.digest,    text.bytes,       file};
}

}  // namespace starling::training
