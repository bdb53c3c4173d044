// The /starling/moe/1.0.0 messages: checked conversions (see wire.hpp).
#include "starling/moe/wire.hpp"

#include <cmath>

#include "starling/pb/moe.pb.h"

namespace starling::moe {

namespace {

Error invalid(const std::string& what) {
  return Error(errc::invalid_argument, what);
}

result<std::vector<std::int64_t>> read_shape(const google::protobuf::RepeatedField<std::int64_t>& f,
                                             const WireLimits& limits) {
  std::vector<std::int64_t> shape(f.begin(), f.end());
  ST_TRY(check_shape(shape, limits));
  return shape;
}

}  // namespace

result<std::uint64_t> check_shape(std::span<const std::int64_t> shape, const WireLimits& limits) {
  if (shape.size() > limits.max_dims)
    return invalid("tensor of rank " + std::to_string(shape.size()) + " exceeds " +
                   std::to_string(limits.max_dims));
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return invalid("negative dimension in " + describe_shape(shape));
    if (d > 0 && n > limits.max_elements / static_cast<std::uint64_t>(d))
      return Error(errc::too_large, "tensor " + describe_shape(shape) + " exceeds " +
                                        std::to_string(limits.max_elements) + " values");
    n *= static_cast<std::uint64_t>(d);
  }
  if (n > limits.max_elements)
    return Error(errc::too_large, "tensor " + describe_shape(shape) + " exceeds " +
                                      std::to_string(limits.max_elements) + " values");
  return n;
}

std::uint64_t TensorData::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string describe_shape(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

result<void> encode_tensor(const averaging::CodecSpec& codec, std::span<const std::int64_t> shape,
                           std::span<const float> values, pb::MoeTensor& out) {
  WireLimits unlimited;
  unlimited.max_elements = averaging::kMaxElements;
  unlimited.max_dims = 64;
  ST_TRY(auto n, check_shape(shape, unlimited));
  if (n != values.size())
    return invalid("tensor " + describe_shape(shape) + " holds " + std::to_string(values.size()) +
                   " values");
  for (float v : values)
    if (!std::isfinite(v)) return invalid("tensor " + describe_shape(shape) + " holds inf/nan");
  ST_TRY(auto data, averaging::encode(codec, values));
  out.Clear();
  for (auto d : shape) out.add_shape(d);
  out.set_data(data.data(), data.size());
  return success();
}

result<TensorData> decode_tensor(const pb::MoeTensor& msg, const WireLimits& limits) {
  TensorData t;
  ST_TRY(t.shape, read_shape(msg.shape(), limits));
  const std::uint64_t n = t.numel();
  ST_TRY(auto info, averaging::inspect(as_bytes(msg.data())));
  if (info.count != n)
    return invalid("tensor " + describe_shape(t.shape) + " carries " + std::to_string(info.count) +
                   " values");
  t.values.resize(n);
  auto r = averaging::decode(as_bytes(msg.data()), t.values);
  if (!r) return r.error().with_context("tensor " + describe_shape(t.shape));
  return t;
}

result<DecodedRequest> decode_request(const pb::ExpertRequest& msg, const WireLimits& limits) {
  DecodedRequest d;
  if (msg.uid().size() > limits.max_uid) return invalid("expert uid longer than limit");
  d.uid = msg.uid();
  if (msg.tensors_size() > static_cast<int>(limits.max_tensors))
    return invalid(std::to_string(msg.tensors_size()) + " tensors exceed limit " +
                   std::to_string(limits.max_tensors));
  for (const auto& t : msg.tensors()) {
    ST_TRY(auto dt, decode_tensor(t, limits));
    d.tensors.push_back(std::move(dt));
  }
  if (!msg.response_codec().empty()) {
    auto c = averaging::codec_from_string(msg.response_codec());
    if (!c) return invalid("unknown response codec '" + msg.response_codec().substr(0, 32) + "'");
    d.response_codec = averaging::CodecSpec{*c};
    d.codec_given = true;
  }
  if (msg.has_forward_step()) d.forward_step = msg.forward_step();
  return d;
}

result<DecodedRequest> parse_request(BytesView bytes, const WireLimits& limits) {
  pb::ExpertRequest msg;
  if (!msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return invalid("malformed ExpertRequest");
  return decode_request(msg, limits);
}

result<std::vector<TensorData>> decode_response(const pb::ExpertResponse& msg,
                                                const WireLimits& limits) {
  if (msg.tensors_size() > static_cast<int>(limits.max_tensors))
    return invalid("response with too many tensors");
  std::vector<TensorData> out;
  for (const auto& t : msg.tensors()) {
    ST_TRY(auto dt, decode_tensor(t, limits));
    out.push_back(std::move(dt));
  }
  return out;
}

result<std::vector<TensorData>> parse_response(BytesView bytes, const WireLimits& limits) {
  pb::ExpertResponse msg;
  if (!msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return invalid("malformed ExpertResponse");
  return decode_response(msg, limits);
}

void to_proto(const ExpertSchema& s, pb::ExpertInfo& out) {
  out.set_uid(s.uid);
  for (auto d : s.input_shape) out.add_input_shape(d);
  for (auto d : s.output_shape) out.add_output_shape(d);
  out.set_dtype(s.dtype);
  out.set_codec(std::string(averaging::to_string(s.codec.codec)));
  out.set_max_batch(s.max_batch);
  out.set_expert_type(s.expert_type);
}

result<ExpertSchema> from_proto(const pb::ExpertInfo& msg, const WireLimits& limits) {
  ExpertSchema s;
  if (msg.uid().size() > limits.max_uid) return invalid("expert uid longer than limit");
  s.uid = msg.uid();
  ST_TRY(s.input_shape, read_shape(msg.input_shape(), limits));
  ST_TRY(s.output_shape, read_shape(msg.output_shape(), limits));
  if (msg.dtype() != "float32")
    return invalid("unsupported dtype '" + msg.dtype().substr(0, 32) + "'");
  s.dtype = msg.dtype();
  auto c = averaging::codec_from_string(msg.codec());
  if (!c) return invalid("unknown codec '" + msg.codec().substr(0, 32) + "'");
  s.codec = averaging::CodecSpec{*c};
  s.max_batch = msg.max_batch();
  if (msg.expert_type().size() > 64) return invalid("expert type longer than 64");
  s.expert_type = msg.expert_type();
  return s;
}

result<ExpertSchema> parse_info(BytesView bytes, const WireLimits& limits) {
  pb::ExpertInfo msg;
  if (!msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return invalid("malformed ExpertInfo");
  return from_proto(msg, limits);
}

Bytes encode_declaration(const Declaration& d) {
  pb::ExpertDeclaration m;
  m.set_coordinate(d.coordinate);
  m.set_peer_id(d.peer.to_string());
  for (const auto& a : d.addrs) m.add_addrs(a.to_string());
  m.set_leaf(d.leaf);
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

result<Declaration> decode_declaration(BytesView bytes) {
  pb::ExpertDeclaration m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return invalid("malformed expert declaration");
  Declaration d;
  if (m.coordinate() >= (1u << 20)) return invalid("declaration coordinate out of range");
  d.coordinate = m.coordinate();
  d.leaf = m.leaf();
  auto peer = net::PeerId::from_string(m.peer_id());
  if (!peer) return peer.error().with_context("expert declaration peer id");
  d.peer = peer.value();
  for (const auto& a : m.addrs()) {
    if (d.addrs.size() >= 16) break;
    auto ma = net::Multiaddr::parse(a);
    if (ma) d.addrs.push_back(ma.value());
  }
  return d;
}

}  // namespace starling::moe
