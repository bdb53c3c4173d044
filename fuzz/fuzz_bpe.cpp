// Fuzzes the tokenizer cache file parser (BpeTokenizer::parse: a file on disk a peer reads at
// start, which another process or a user may have damaged): it either rejects the bytes or
// yields a tokenizer that re-serialises to the same bytes and round-trips any text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "starling/training/bpe.hpp"

using namespace starling;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto t = training::BpeTokenizer::parse(BytesView(data, size));
  if (!t) return 0;
  const auto& tok = t.value();
  check(tok.vocab_size() > 256 && tok.vocab_size() <= training::kBpeMaxVocab);
  check(tok.serialize() == Bytes(data, data + size));
  const std::string text(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, 256));
  auto ids = tok.encode(text);
  for (auto id : ids) check(id < tok.vocab_size());
  auto back = tok.decode(ids);
  check(back && back.value() == text);
  return 0;
}
