// The /starling/moe/1.0.0 messages: round trips and malformed input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "starling/crypto/keys.hpp"
#include "starling/moe/wire.hpp"
#include "starling/pb/moe.pb.h"

namespace starling::moe {
namespace {

using averaging::CodecId;
using averaging::CodecSpec;

Bytes serialize(const google::protobuf::MessageLite& m) {
  Bytes out(m.ByteSizeLong());
  m.SerializeToArray(out.data(), static_cast<int>(out.size()));
  return out;
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i)) * 3.0f;
  return v;
}

TEST(MoeWire, TensorRoundTripsPerCodec) {
  const std::vector<std::int64_t> shape{3, 5};
  auto vals = ramp(15);
  for (auto [codec, tol] :
       {std::pair{CodecId::none, 0.0f}, std::pair{CodecId::float16, 3e-3f},
        std::pair{CodecId::bfloat16, 3e-2f}, std::pair{CodecId::uniform8, 0.05f}}) {
    pb::MoeTensor t;
    ASSERT_TRUE(encode_tensor(CodecSpec{codec}, shape, vals, t));
    auto d = decode_tensor(t);
    ASSERT_TRUE(d) << d.error().message();
    EXPECT_EQ(d.value().shape, shape);
    ASSERT_EQ(d.value().values.size(), vals.size());
    for (std::size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(d.value().values[i], vals[i], tol);
  }
}

TEST(MoeWire, EncodeRefusesMismatchAndNonFinite) {
  pb::MoeTensor t;
  std::vector<std::int64_t> shape{2, 2};
  auto three = ramp(3);
  EXPECT_FALSE(encode_tensor(CodecSpec{}, shape, three, t));
  std::vector<float> bad{1, std::numeric_limits<float>::quiet_NaN(), 0, 0};
  EXPECT_FALSE(encode_tensor(CodecSpec{}, shape, bad, t));
  bad[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(encode_tensor(CodecSpec{}, shape, bad, t));
  std::vector<std::int64_t> neg{-1, 2};
  EXPECT_FALSE(encode_tensor(CodecSpec{}, neg, three, t));
}

TEST(MoeWire, DecodeRejectsBadTensors) {
  pb::MoeTensor good;
  std::vector<std::int64_t> shape{2, 3};
  auto vals = ramp(6);
  ASSERT_TRUE(encode_tensor(CodecSpec{}, shape, vals, good));

  auto mismatch = good;  // shape says 8 values, data holds 6
  mismatch.set_shape(1, 4);
  EXPECT_FALSE(decode_tensor(mismatch));

  auto negative = good;
  negative.set_shape(0, -2);
  negative.set_shape(1, -3);
  EXPECT_FALSE(decode_tensor(negative));

  auto huge = good;  // overflowing element count
  huge.set_shape(0, std::int64_t{1} << 40);
  huge.set_shape(1, std::int64_t{1} << 40);
  auto h = decode_tensor(huge);
  ASSERT_FALSE(h);
  EXPECT_EQ(h.error(), Error(errc::too_large));

  auto rank = good;
  for (int i = 0; i < 10; ++i) rank.add_shape(1);
  EXPECT_FALSE(decode_tensor(rank));

  auto garbage = good;
  garbage.set_data("\x01\x02\x03");
  EXPECT_FALSE(decode_tensor(garbage));

  auto truncated = good;
  truncated.mutable_data()->resize(good.data().size() - 1);
  EXPECT_FALSE(decode_tensor(truncated));

  // A float32 buffer carrying a NaN is refused.
  pb::MoeTensor nan_t;
  std::vector<std::int64_t> s1{1};
  std::vector<float> one{1.0f};
  ASSERT_TRUE(encode_tensor(CodecSpec{}, s1, one, nan_t));
  std::string data = nan_t.data();
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(data.data() + data.size() - 4, &qnan, 4);
  nan_t.set_data(data);
  EXPECT_FALSE(decode_tensor(nan_t));

  WireLimits small;
  small.max_elements = 5;
  EXPECT_FALSE(decode_tensor(good, small));
}

TEST(MoeWire, RequestAndResponseRoundTrip) {
  pb::ExpertRequest req;
  req.set_uid("ffn.1.2");
  std::vector<std::int64_t> shape{4, 8};
  auto vals = ramp(32);
  ASSERT_TRUE(encode_tensor(CodecSpec{}, shape, vals, *req.add_tensors()));
  ASSERT_TRUE(encode_tensor(CodecSpec{CodecId::float16}, shape, vals, *req.add_tensors()));
  req.set_response_codec("float16");
  auto d = parse_request(serialize(req));
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d.value().uid, "ffn.1.2");
  ASSERT_EQ(d.value().tensors.size(), 2u);
  EXPECT_EQ(d.value().tensors[0].values, vals);
  EXPECT_TRUE(d.value().codec_given);
  EXPECT_EQ(d.value().response_codec.codec, CodecId::float16);

  pb::ExpertResponse resp;
  ASSERT_TRUE(encode_tensor(CodecSpec{}, shape, vals, *resp.add_tensors()));
  auto r = parse_response(serialize(resp));
  ASSERT_TRUE(r);
  ASSERT_EQ(r.value().size(), 1u);
  EXPECT_EQ(r.value()[0].shape, shape);
  EXPECT_EQ(r.value()[0].values, vals);
}

TEST(MoeWire, RequestRejectsMalformed) {
  const char junk[] = "\xff\xff\xff\xff\x0f garbage";
  EXPECT_FALSE(parse_request(as_bytes(std::string_view(junk, sizeof junk - 1))));
  EXPECT_FALSE(parse_response(as_bytes(std::string_view(junk, sizeof junk - 1))));
  EXPECT_FALSE(parse_info(as_bytes(std::string_view(junk, sizeof junk - 1))));

  pb::ExpertRequest req;
  req.set_uid(std::string(300, 'a'));
  EXPECT_FALSE(parse_request(serialize(req)));

  pb::ExpertRequest many;
  many.set_uid("ffn.0");
  std::vector<std::int64_t> s{1};
  std::vector<float> v{1};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(encode_tensor(CodecSpec{}, s, v, *many.add_tensors()));
  EXPECT_FALSE(parse_request(serialize(many)));

  pb::ExpertRequest codec;
  codec.set_uid("ffn.0");
  codec.set_response_codec("zip");
  EXPECT_FALSE(parse_request(serialize(codec)));
}

TEST(MoeWire, SchemaRoundTripAndChecks) {
  ExpertSchema s;
  s.uid = "ffn.3.1";
  s.input_shape = {16};
  s.output_shape = {16};
  s.codec = CodecSpec{CodecId::float16};
  s.max_batch = 256;
  s.expert_type = "ffn";
  pb::ExpertInfo m;
  to_proto(s, m);
  auto back = parse_info(serialize(m));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value(), s);

  auto bad_dtype = m;
  bad_dtype.set_dtype("int8");
  EXPECT_FALSE(from_proto(bad_dtype));
  auto bad_codec = m;
  bad_codec.set_codec("lzma");
  EXPECT_FALSE(from_proto(bad_codec));
  auto bad_shape = m;
  bad_shape.set_input_shape(0, -5);
  EXPECT_FALSE(from_proto(bad_shape));
}

TEST(MoeWire, DeclarationRoundTripAndChecks) {
  auto key = crypto::KeyPair::generate();
  Declaration d;
  d.coordinate = 17;
  d.peer = net::PeerId::from_public_key(key.public_key());
  d.addrs.push_back(net::Multiaddr::parse("/ip4/127.0.0.1/tcp/4001").value());
  d.leaf = true;
  auto back = decode_declaration(encode_declaration(d));
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().coordinate, 17u);
  EXPECT_EQ(back.value().peer, d.peer);
  ASSERT_EQ(back.value().addrs.size(), 1u);
  EXPECT_EQ(back.value().addrs[0].to_string(), "/ip4/127.0.0.1/tcp/4001");
  EXPECT_TRUE(back.value().leaf);

  pb::ExpertDeclaration m;
  m.set_coordinate(1u << 20);
  m.set_peer_id(d.peer.to_string());
  EXPECT_FALSE(decode_declaration(serialize(m)));
  m.set_coordinate(1);
  m.set_peer_id("not-a-peer");
  EXPECT_FALSE(decode_declaration(serialize(m)));
  m.set_peer_id(d.peer.to_string());
  m.add_addrs("garbage address");
  for (int i = 0; i < 20; ++i) m.add_addrs("/ip4/127.0.0.1/tcp/" + std::to_string(1000 + i));
  auto kept = decode_declaration(serialize(m));
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept.value().addrs.size(), 16u);
}

}  // namespace
}  // namespace starling::moe
