// The /starling/moe/1.0.0 wire (proto/moe.proto): protocol ids, limits, and the checked
// conversions between protobuf messages and plain float tensors. Torch-free: the torch side
// (src/moe/torch) wraps these; the fuzz target (fuzz/fuzz_moe_wire.cpp) drives the decoders.
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "starling/averaging/compression.hpp"
#include "starling/core/bytes.hpp"
#include "starling/core/result.hpp"
#include "starling/net/multiaddr.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::pb {
class MoeTensor;
class ExpertRequest;
class ExpertResponse;
class ExpertInfo;
class ExpertDeclaration;
}  // namespace starling::pb

namespace starling::moe {

inline constexpr const char* kInfoProtocol = "/starling/moe/1.0.0/info";
inline constexpr const char* kForwardProtocol = "/starling/moe/1.0.0/forward";
inline constexpr const char* kBackwardProtocol = "/starling/moe/1.0.0/backward";

// Limits a decoder applies to anything from a peer.
struct WireLimits {
  std::size_t max_dims = 8;                // tensor rank
  std::uint64_t max_elements = 16u << 20;  // values in one tensor (64 MiB as float32)
  std::size_t max_tensors = 4;             // tensors in one request/response
  std::size_t max_uid = 256;               // uid length
  // Streamed calls (stream.hpp): values in one streamed tensor (1 GiB as float32), and in one
  // chunk (one frame; 16 MiB as float32).
  std::uint64_t max_stream_elements = 256u << 20;
  std::uint64_t max_chunk_elements = 4u << 20;
};

// A decoded tensor: row-major float32 values and their shape.
struct TensorData {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::uint64_t numel() const;
};

// Encodes `values` (prod(shape) floats) with `codec`. errc::invalid_argument for a shape that
// does not match, or non-finite values (which the float codecs would carry: the wire never
// carries inf/nan, a server that produced them answers an error instead).
result<void> encode_tensor(const averaging::CodecSpec& codec, std::span<const std::int64_t> shape,
                           std::span<const float> values, pb::MoeTensor& out);
// Decodes and checks a tensor from a peer: rank, element count and the codec buffer
// (inf/nan are refused). errc::invalid_argument / too_large naming the problem.
result<TensorData> decode_tensor(const pb::MoeTensor& msg, const WireLimits& limits = {});

// A request as the server sees it after the checks.
struct DecodedRequest {
  std::string uid;
  std::vector<TensorData> tensors;
  averaging::CodecSpec response_codec;
  bool codec_given = false;
  std::optional<std::uint64_t> forward_step;  // backward: the step of the forward answer
};
// Parses a serialized ExpertRequest and decodes its tensors (used by the fuzz target; the
// server gets the parsed message from the RPC framework and calls decode_request below).
result<DecodedRequest> parse_request(BytesView bytes, const WireLimits& limits = {});
result<DecodedRequest> decode_request(const pb::ExpertRequest& msg, const WireLimits& limits = {});
result<std::vector<TensorData>> decode_response(const pb::ExpertResponse& msg,
                                                const WireLimits& limits = {});
result<std::vector<TensorData>> parse_response(BytesView bytes, const WireLimits& limits = {});

// Expert schema (shapes exclude the batch dimension).
struct ExpertSchema {
  std::string uid;
  std::vector<std::int64_t> input_shape;
  std::vector<std::int64_t> output_shape;
  std::string dtype = "float32";
  averaging::CodecSpec codec;  // what the server answers with by default
  std::uint32_t max_batch = 0;
  std::string expert_type;
  friend bool operator==(const ExpertSchema&, const ExpertSchema&) = default;
};
void to_proto(const ExpertSchema& s, pb::ExpertInfo& out);
result<ExpertSchema> from_proto(const pb::ExpertInfo& msg, const WireLimits& limits = {});
result<ExpertSchema> parse_info(BytesView bytes, const WireLimits& limits = {});

// A declaration value (who serves what follows a prefix).
struct Declaration {
  std::uint32_t coordinate = 0;
  net::PeerId peer;
  std::vector<net::Multiaddr> addrs;
  bool leaf = false;
};
Bytes encode_declaration(const Declaration& d);
// errc::invalid_argument for garbage (bad peer id, coordinate out of range); unparsable
// addresses are dropped; at most 16 addresses are kept.
result<Declaration> decode_declaration(BytesView bytes);

// Checks a shape from a peer (rank <= limits.max_dims, no negative dimension, at most
// limits.max_elements values) and returns its value count; errc::invalid_argument / too_large.
result<std::uint64_t> check_shape(std::span<const std::int64_t> shape, const WireLimits& limits);

// "shape [2, 3]" for messages.
std::string describe_shape(std::span<const std::int64_t> shape);

}  // namespace starling::moe
