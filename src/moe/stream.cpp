// Streamed calls: the frame assembler and slicer (see stream.hpp).
#include "starling/moe/stream.hpp"

#include <algorithm>

#include "starling/pb/moe.pb.h"

namespace starling::moe {

namespace {

Error violation(const std::string& what) {
  return Error(errc::protocol_violation, what);
}

}  // namespace

std::uint64_t StreamHeader::total_values() const {
  std::uint64_t n = 0;
  for (const auto& s : shapes) {
    std::uint64_t k = 1;
    for (auto d : s) k *= static_cast<std::uint64_t>(d);
    n += k;
  }
  return n;
}

StreamAssembler::StreamAssembler(WireLimits limits, Check check)
    : limits_(limits), check_(std::move(check)) {}

result<void> StreamAssembler::fail(Error e) {
  failed_ = true;
  tensors_.clear();
  return e;
}

result<void> StreamAssembler::on_header(const pb::MoeStreamHeader& h) {
  StreamHeader out;
  if (h.uid().size() > limits_.max_uid)
    return Error(errc::invalid_argument, "uid longer than limit");
  out.uid = h.uid();
  if (h.tensors_size() > static_cast<int>(limits_.max_tensors))
    return Error(errc::invalid_argument, std::to_string(h.tensors_size()) +
                                             " tensors exceed limit " +
                                             std::to_string(limits_.max_tensors));
  WireLimits shape_limits = limits_;
  shape_limits.max_elements = limits_.max_stream_elements;
  for (const auto& t : h.tensors()) {
    std::vector<std::int64_t> shape(t.shape().begin(), t.shape().end());
    ST_TRY(check_shape(shape, shape_limits));
    out.shapes.push_back(std::move(shape));
  }
  if (!h.response_codec().empty()) {
    auto c = averaging::codec_from_string(h.response_codec());
    if (!c)
      return Error(errc::invalid_argument,
                   "unknown response codec '" + h.response_codec().substr(0, 32) + "'");
    out.response_codec = averaging::CodecSpec{*c};
    out.codec_given = true;
  }
  if (h.has_forward_step()) out.forward_step = h.forward_step();
  out.expert_step = h.expert_step();
  if (check_) ST_TRY(check_(out));
  // Accepted: allocate (bounded by the limits and the check).
  tensors_.resize(out.shapes.size());
  for (std::size_t i = 0; i < out.shapes.size(); ++i) {
    tensors_[i].shape = out.shapes[i];
    tensors_[i].values.resize(tensors_[i].numel());
  }
  header_ = std::move(out);
  tensor_ = 0;
  offset_ = 0;
  while (tensor_ < tensors_.size() && tensors_[tensor_].values.empty()) ++tensor_;
  return success();
}

result<void> StreamAssembler::feed(const pb::MoeStreamFrame& frame) {
  if (failed_) return violation("stream already refused");
  if (frame.has_header()) {
    if (header_) return fail(violation("second stream header"));
    auto r = on_header(frame.header());
    if (!r) return fail(r.error().with_context("stream header"));
    return success();
  }
  if (!frame.has_chunk()) return fail(violation("stream frame with neither header nor chunk"));
  if (!header_) return fail(violation("stream chunk before the header"));
  const auto& c = frame.chunk();
  if (tensor_ >= tensors_.size()) return fail(violation("stream chunk after the last value"));
  if (c.tensor() != tensor_ || c.offset() != offset_)
    return fail(violation("stream chunk of tensor " + std::to_string(c.tensor()) + " at value " +
                          std::to_string(c.offset()) + ", expected tensor " +
                          std::to_string(tensor_) + " at value " + std::to_string(offset_)));
  auto info = averaging::inspect(as_bytes(c.data()));
  if (!info) return fail(info.error().with_context("stream chunk"));
  const std::uint64_t n = info.value().count;
  auto& t = tensors_[tensor_];
  if (n == 0) return fail(violation("empty stream chunk"));
  if (n > limits_.max_chunk_elements)
    return fail(Error(errc::too_large, "stream chunk of " + std::to_string(n) + " values exceeds " +
                                           std::to_string(limits_.max_chunk_elements)));
  if (n > t.values.size() - offset_)
    return fail(violation("stream chunk of " + std::to_string(n) + " values at " +
                          std::to_string(offset_) + " overruns tensor " + std::to_string(tensor_) +
                          " " + describe_shape(t.shape)));
  auto out = std::span<float>(t.values).subspan(offset_, n);
  auto r = averaging::decode(as_bytes(c.data()), out);
  if (!r) return fail(r.error().with_context("stream chunk of tensor " + std::to_string(tensor_)));
  offset_ += n;
  if (offset_ == t.values.size()) {
    offset_ = 0;
    ++tensor_;
    while (tensor_ < tensors_.size() && tensors_[tensor_].values.empty()) ++tensor_;
  }
  return success();
}

result<void> StreamAssembler::feed_bytes(BytesView frame) {
  pb::MoeStreamFrame f;
  if (!f.ParseFromArray(frame.data(), static_cast<int>(frame.size())))
    return fail(Error(errc::invalid_argument, "malformed stream frame"));
  return feed(f);
}

result<void> StreamAssembler::finish() const {
  if (failed_) return violation("stream refused");
  if (!header_) return violation("stream ended before its header");
  if (tensor_ < tensors_.size())
    return violation("stream ended at value " + std::to_string(offset_) + " of tensor " +
                     std::to_string(tensor_) + " " + describe_shape(tensors_[tensor_].shape));
  return success();
}

StreamSlicer::StreamSlicer(const pb::MoeStreamHeader& header,
                           std::vector<std::vector<std::int64_t>> shapes,
                           std::vector<std::span<const float>> tensors, averaging::CodecSpec codec,
                           std::uint64_t chunk_values)
    : header_(std::make_unique<pb::MoeStreamFrame>()),
      shapes_(std::move(shapes)),
      tensors_(std::move(tensors)),
      codec_(codec),
      chunk_values_(std::max<std::uint64_t>(chunk_values, 1)) {
  auto* h = header_->mutable_header();
  *h = header;
  h->clear_tensors();
  for (const auto& s : shapes_) {
    auto* t = h->add_tensors();
    for (auto d : s) t->add_shape(d);
  }
}

StreamSlicer::~StreamSlicer() = default;

result<std::optional<pb::MoeStreamFrame>> StreamSlicer::next() {
  if (header_) {
    if (shapes_.size() != tensors_.size())
      return Error(errc::invalid_argument, "stream of " + std::to_string(tensors_.size()) +
                                               " tensors with " + std::to_string(shapes_.size()) +
                                               " shapes");
    for (std::size_t i = 0; i < shapes_.size(); ++i) {
      std::uint64_t n = 1;
      for (auto d : shapes_[i]) n *= static_cast<std::uint64_t>(d);
      if (n != tensors_[i].size())
        return Error(errc::invalid_argument, "tensor " + describe_shape(shapes_[i]) + " holds " +
                                                 std::to_string(tensors_[i].size()) + " values");
    }
    auto h = std::move(*header_);
    header_.reset();
    ++frames_;
    return std::optional<pb::MoeStreamFrame>(std::move(h));
  }
  while (tensor_ < tensors_.size() && offset_ == tensors_[tensor_].size()) {
    ++tensor_;
    offset_ = 0;
  }
  if (tensor_ >= tensors_.size()) return std::optional<pb::MoeStreamFrame>{};
  const auto n = std::min<std::uint64_t>(chunk_values_, tensors_[tensor_].size() - offset_);
  auto data = averaging::encode(codec_, tensors_[tensor_].subspan(offset_, n));
  if (!data)
    return data.error().with_context("tensor " + describe_shape(shapes_[tensor_]) + " chunk");
  pb::MoeStreamFrame f;
  auto* c = f.mutable_chunk();
  c->set_tensor(static_cast<std::uint32_t>(tensor_));
  c->set_offset(offset_);
  c->set_data(data.value().data(), data.value().size());
  offset_ += n;
  ++frames_;
  return std::optional<pb::MoeStreamFrame>(std::move(f));
}

bool should_stream(std::uint64_t values, const averaging::CodecSpec& codec,
                   std::uint64_t threshold) {
  const std::uint64_t raw = values * sizeof(float);
  const std::uint64_t encoded =
      values > averaging::kMaxElements ? raw : averaging::encoded_size(codec, values);
  return std::min(raw, encoded) > threshold;
}

}  // namespace starling::moe
