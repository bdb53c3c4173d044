// A byte-level BPE tokenizer (Sennrich et al.'s byte-pair encoding over UTF-8 bytes): the 256
// byte values are the first tokens, every merge of two tokens adds one. Any byte string
// round-trips exactly. Text is first cut into chunks (a run of letters/digits or of
// punctuation, with at most one leading space; or a run of whitespace) and merges never cross
// a chunk. Training is deterministic (ties broken by the smaller pair), so every peer that
// trains on the same text gets the same merges, and the cache file's SHA-256 names the
// vocabulary. No torch here.
//
// Cache file (text, parsed with bounds; fuzz/fuzz_bpe.cpp):
//   starling-bpe 1\n
//   vocab <V>\n                          (256 < V <= 65536)
//   <a> <b>\n  x (V - 256)               (merge i makes token 256 + i from tokens a, b < 256 + i)
//
// Threading rule: a BpeTokenizer is immutable after construction; const methods may be
// called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"

namespace starling::training {

using TokenId = std::uint16_t;

inline constexpr std::uint32_t kBpeMaxVocab = 65536;
inline constexpr std::size_t kBpeMaxFileBytes = 1 << 20;

// Splits text into the chunks merges stay within; concatenated they give back `text`.
std::vector<std::string_view> bpe_chunks(std::string_view text);

class BpeTokenizer {
 public:
  using Merge = std::pair<TokenId, TokenId>;

  // Learns merges from `texts` until the vocabulary has `vocab_size` tokens (or no pair occurs
  // twice). errc::invalid_argument if vocab_size is not in (256, 65536].
  static result<BpeTokenizer> train(std::span<const std::string> texts, std::uint32_t vocab_size);
  // From merges (checked as the parser checks them).
  static result<BpeTokenizer> from_merges(std::vector<Merge> merges);
  // Parses the cache file format; never throws, bounded by kBpeMaxFileBytes.
  static result<BpeTokenizer> parse(BytesView file);
  Bytes serialize() const;
  // Hex SHA-256 of serialize(): the vocabulary's identity.
  const std::string& hash() const noexcept { return hash_; }

  std::uint32_t vocab_size() const noexcept {
    return 256 + static_cast<std::uint32_t>(merges_.size());
  }
  const std::vector<Merge>& merges() const noexcept { return merges_; }

  void encode(std::string_view text, std::vector<TokenId>& out) const;
  std::vector<TokenId> encode(std::string_view text) const;
  // Bytes of the tokens (errc::invalid_argument for an id outside the vocabulary).
  result<std::string> decode(std::span<const TokenId> ids) const;

  // Encodes many texts with a chunk cache (fast for a corpus), each followed by `separator`
  // (if set).
  std::vector<TokenId> encode_all(std::span<const std::string> texts,
                                  std::optional<TokenId> separator) const;

 private:
  explicit BpeTokenizer(std::vector<Merge> merges);
  void encode_chunk(std::string_view chunk, std::vector<TokenId>& out) const;

  std::vector<Merge> merges_;
  std::unordered_map<std::uint32_t, std::uint32_t> rank_;  // (a << 16 | b) -> merge index
  std::vector<std::string> bytes_;                         // of each token
  std::string hash_;
};

// Loads `path` if it holds a valid tokenizer of `vocab_size` tokens; otherwise trains one on
// `texts` and writes it there atomically (temporary file, fsync, rename), so concurrent
// peers on one machine never read a half-written file. A damaged cache file is replaced.
result<BpeTokenizer> load_or_train_bpe(const std::filesystem::path& path,
                                       std::span<const std::string> texts,
                                       std::uint32_t vocab_size);

}  // namespace starling::training
