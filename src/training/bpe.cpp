// Byte-level BPE: chunking, deterministic training, encoding, the cache file.
#include "starling/training/bpe.hpp"

#include <algorithm>
#include <charconv>
#include <queue>

#include <fmt/format.h>

#include "starling/core/log.hpp"
#include "starling/crypto/keys.hpp"
#include "starling/training/checkpoint.hpp"

namespace starling::training {

namespace {

enum class CharClass { word, punct, space };

CharClass class_of(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80)
    return CharClass::word;
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v')
    return CharClass::space;
  return CharClass::punct;
}

std::uint32_t pair_key(TokenId a, TokenId b) {
  return (std::uint32_t{a} << 16) | b;
}

Error bad_file(std::string_view what) {
  return Error(errc::invalid_argument, fmt::format("tokenizer file: {}", what));
}

}  // namespace

std::vector<std::string_view> bpe_chunks(std::string_view text) {
  std::vector<std::string_view> out;
  const auto cls = [&](std::size_t i) { return class_of(static_cast<unsigned char>(text[i])); };
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    std::size_t j = i;
    if (text[i] == ' ' && i + 1 < n && cls(i + 1) != CharClass::space) {
      const auto c = cls(i + 1);
      j = i + 1;
      while (j < n && cls(j) == c) ++j;
    } else if (cls(i) == CharClass::space) {
      while (j < n && cls(j) == CharClass::space) ++j;
      // A final space before a word goes with the word.
      if (j < n && j - i > 1 && text[j - 1] == ' ') --j;
    } else {
      const auto c = cls(i);
      while (j < n && cls(j) == c) ++j;
    }
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

BpeTokenizer::BpeTokenizer(std::vector<Merge> merges) : merges_(std::move(merges)) {
  bytes_.reserve(256 + merges_.size());
  for (int b = 0; b < 256; ++b) bytes_.emplace_back(1, static_cast<char>(b));
  for (std::size_t i = 0; i < merges_.size(); ++i) {
    rank_.emplace(pair_key(merges_[i].first, merges_[i].second), static_cast<std::uint32_t>(i));
    bytes_.push_back(bytes_[merges_[i].first] + bytes_[merges_[i].second]);
  }
  const auto file = serialize();
  const auto h = crypto::sha256(file);
  hash_ = to_hex(BytesView(h.data(), h.size()));
}

result<BpeTokenizer> BpeTokenizer::from_merges(std::vector<Merge> merges) {
  if (merges.empty() || 256 + merges.size() > kBpeMaxVocab)
    return bad_file(fmt::format("{} merges (1 to {})", merges.size(), kBpeMaxVocab - 256));
  std::unordered_map<std::uint32_t, std::uint32_t> seen;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto [a, b] = merges[i];
    if (a >= 256 + i || b >= 256 + i)
      return bad_file(fmt::format("merge {} uses a token not defined before it", i));
    if (!seen.emplace(pair_key(a, b), 0).second)
      return bad_file(fmt::format("merge {} repeats an earlier pair", i));
  }
  return BpeTokenizer(std::move(merges));
}

result<BpeTokenizer> BpeTokenizer::train(std::span<const std::string> texts,
                                         std::uint32_t vocab_size) {
  if (vocab_size <= 256 || vocab_size > kBpeMaxVocab)
    return make_error(errc::invalid_argument, fmt::format("tokenizer: vocabulary of {} (257 to {})",
                                                          vocab_size, kBpeMaxVocab));
  // Distinct chunks with their counts, in byte order (deterministic).
  std::unordered_map<std::string_view, std::uint64_t> counts;
  for (const auto& t : texts)
    for (auto c : bpe_chunks(t)) ++counts[c];
  std::vector<std::pair<std::string_view, std::uint64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  struct Word {
    std::vector<TokenId> sym;
    std::int64_t count;
  };
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [s, c] : sorted) {
    Word w{{}, static_cast<std::int64_t>(c)};
    for (unsigned char ch : s) w.sym.push_back(ch);
    words.push_back(std::move(w));
  }
  std::unordered_map<std::uint32_t, std::int64_t> pairs;
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>> where;
  for (std::uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].sym;
    for (std::size_t j = 0; j + 1 < s.size(); ++j) {
      const auto k = pair_key(s[j], s[j + 1]);
      pairs[k] += words[w].count;
      auto& list = where[k];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  // Max-heap on (count, smaller pair first); entries go stale when counts change.
  using Entry = std::pair<std::int64_t, std::uint32_t>;
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : pairs) heap.emplace(c, ~k);
  std::vector<Merge> merges;
  std::vector<std::uint64_t> stamp(words.size(), 0);
  std::vector<std::uint32_t> changed;
  std::vector<TokenId> next;
  while (256 + merges.size() < vocab_size && !heap.empty()) {
    const auto [count, nk] = heap.top();
    heap.pop();
    const std::uint32_t key = ~nk;
    if (auto it = pairs.find(key); it == pairs.end() || it->second != count) continue;  // stale
    if (count < 2) break;
    const TokenId a = static_cast<TokenId>(key >> 16), b = static_cast<TokenId>(key & 0xffff);
    const TokenId t = static_cast<TokenId>(256 + merges.size());
    merges.emplace_back(a, b);
    const std::uint64_t iter = merges.size();
    changed.clear();
    auto list = std::move(where[key]);
    where.erase(key);
    for (const auto w : list) {
      if (stamp[w] == iter) continue;
      stamp[w] = iter;
      auto& s = words[w].sym;
      const auto c = words[w].count;
      next.clear();
      bool hit = false;
      for (std::size_t j = 0; j < s.size();) {
        if (j + 1 < s.size() && s[j] == a && s[j + 1] == b) {
          next.push_back(t);
          j += 2;
          hit = true;
        } else {
          next.push_back(s[j++]);
        }
      }
      if (!hit) continue;
      for (std::size_t j = 0; j + 1 < s.size(); ++j) {
        const auto k = pair_key(s[j], s[j + 1]);
        pairs[k] -= c;
        changed.push_back(k);
      }
      s.swap(next);
      for (std::size_t j = 0; j + 1 < s.size(); ++j) {
        const auto k = pair_key(s[j], s[j + 1]);
        pairs[k] += c;
        changed.push_back(k);
        if (s[j] == t || s[j + 1] == t) {
          auto& l = where[k];
          if (l.empty() || l.back() != w) l.push_back(w);
        }
      }
    }
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    for (const auto k : changed) {
      auto it = pairs.find(k);
      if (it == pairs.end()) continue;
      if (it->second <= 0)
        pairs.erase(it);
      else
        heap.emplace(it->second, ~k);
    }
  }
  if (merges.empty())
    return make_error(errc::invalid_argument, "tokenizer: no pair occurs twice in the text");
  return BpeTokenizer(std::move(merges));
}

Bytes BpeTokenizer::serialize() const {
  std::string s = fmt::format("starling-bpe 1\nvocab {}\n", vocab_size());
  for (const auto& [a, b] : merges_) s += fmt::format("{} {}\n", a, b);
  return Bytes(s.begin(), s.end());
}

result<BpeTokenizer> BpeTokenizer::parse(BytesView file) {
  if (file.size() > kBpeMaxFileBytes)
    return make_error(errc::too_large, fmt::format("tokenizer file: {} bytes (limit {})",
                                                   file.size(), kBpeMaxFileBytes));
  std::string_view in(reinterpret_cast<const char*>(file.data()), file.size());
  const auto line = [&]() -> std::optional<std::string_view> {
    const auto nl = in.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;
    auto l = in.substr(0, nl);
    in.remove_prefix(nl + 1);
    return l;
  };
  const auto number = [](std::string_view s) -> std::optional<std::uint32_t> {
    // Canonical decimal only (no sign, no leading zero), so a file has one spelling.
    if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
    return v;
  };
  auto header = line();
  if (!header || *header != "starling-bpe 1") return bad_file("missing 'starling-bpe 1' header");
  auto vl = line();
  if (!vl || !vl->starts_with("vocab ")) return bad_file("missing 'vocab' line");
  const auto vocab = number(vl->substr(6));
  if (!vocab || *vocab <= 256 || *vocab > kBpeMaxVocab) return bad_file("bad vocabulary size");
  std::vector<Merge> merges;
  merges.reserve(*vocab - 256);
  for (std::uint32_t i = 256; i < *vocab; ++i) {
    auto l = line();
    if (!l) return bad_file(fmt::format("truncated at merge {}", i - 256));
    const auto sp = l->find(' ');
    if (sp == std::string_view::npos) return bad_file(fmt::format("merge {}: no space", i - 256));
    const auto a = number(l->substr(0, sp)), b = number(l->substr(sp + 1));
    if (!a || !b || *a >= i || *b >= i)
      return bad_file(fmt::format("merge {}: bad token ids", i - 256));
    merges.emplace_back(static_cast<TokenId>(*a), static_cast<TokenId>(*b));
  }
  if (!in.empty()) return bad_file("trailing bytes after the merges");
  return from_merges(std::move(merges));
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<TokenId>& out) const {
  std::vector<TokenId> s;
  s.reserve(chunk.size());
  for (unsigned char ch : chunk) s.push_back(ch);
  while (s.size() > 1) {
    std::uint32_t best = UINT32_MAX;
    for (std::size_t j = 0; j + 1 < s.size(); ++j)
      if (auto it = rank_.find(pair_key(s[j], s[j + 1])); it != rank_.end())
        best = std::min(best, it->second);
    if (best == UINT32_MAX) break;
    const auto [a, b] = merges_[best];
    const TokenId t = static_cast<TokenId>(256 + best);
    std::size_t w = 0;
    for (std::size_t j = 0; j < s.size();) {
      if (j + 1 < s.size() && s[j] == a && s[j + 1] == b) {
        s[w++] = t;
        j += 2;
      } else {
        s[w++] = s[j++];
      }
    }
    s.resize(w);
  }
  out.insert(out.end(), s.begin(), s.end());
}

void BpeTokenizer::encode(std::string_view text, std::vector<TokenId>& out) const {
  for (auto c : bpe_chunks(text)) encode_chunk(c, out);
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  encode(text, out);
  return out;
}

std::vector<TokenId> BpeTokenizer::encode_all(std::span<const std::string> texts,
                                              std::optional<TokenId> separator) const {
  std::unordered_map<std::string_view, std::vector<TokenId>> cache;
  std::vector<TokenId> out;
  for (const auto& t : texts) {
    for (auto c : bpe_chunks(t)) {
      auto [it, fresh] = cache.try_emplace(c);
      if (fresh) encode_chunk(c, it->second);
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
    if (separator) out.push_back(*separator);
  }
  return out;
}

result<std::string> BpeTokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  for (auto id : ids) {
    if (id >= bytes_.size())
      return make_error(
          errc::invalid_argument,
          fmt::format("tokenizer: id {} outside the vocabulary of {}", id, bytes_.size()));
    out += bytes_[id];
  }
  return out;
}

result<BpeTokenizer> load_or_train_bpe(const std::filesystem::path& path,
                                       std::span<const std::string> texts,
                                       std::uint32_t vocab_size) {
  const auto log = logger("training");
  if (auto bytes = read_file(path, kBpeMaxFileBytes)) {
    auto tok = BpeTokenizer::parse(bytes.value());
    if (tok && tok.value().vocab_size() == vocab_size) return std::move(tok).value();
    log->warn("tokenizer cache {}: {}; training it again", path.string(),
              tok ? fmt::format("vocabulary {} instead of {}", tok.value().vocab_size(), vocab_size)
                  : tok.error().message());
  }
  ST_TRY(auto tok, BpeTokenizer::train(texts, vocab_size));
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (auto w = write_file_atomic(path, tok.serialize()); !w)
    log->warn("tokenizer cache {}: not written: {}", path.string(), w.error().message());
  return tok;
}

}  // namespace starling::training
