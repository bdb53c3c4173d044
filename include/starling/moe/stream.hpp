// Streamed calls of /starling/moe/1.0.0 (proto/moe.proto, MoeStreamFrame): large tensors cut
// into chunks sent as successive frames of a bidirectional RPC, and put back together on the
// other side with every frame checked. Torch-free: the client (stream_client.cpp) and the
// expert server (torch/stream_server.cpp) use these; fuzz/fuzz_moe_stream.cpp drives the
// assembler.
//
// A stream is one header frame (the full shape of every tensor, and the uid / codec / steps
// of the call), then the tensors' values as chunks in order: tensor 0 from value 0 to its end,
// then tensor 1, ...; each chunk an averaging codec buffer of its own. The receiver allocates
// a tensor only after the header passed its checks (limits, and the caller's check: the
// server's schema, its memory budget), so memory is bounded by what it accepted, and decodes
// every chunk into place as it comes (the whole encoded request never exists at once).
//
// Threading: plain objects, one thread at a time.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "starling/moe/wire.hpp"

namespace starling::pb {
class MoeStreamFrame;
class MoeStreamHeader;
}  // namespace starling::pb

namespace starling::moe {

inline constexpr const char* kForwardStreamProtocol = "/starling/moe/1.0.0/forward-stream";
inline constexpr const char* kBackwardStreamProtocol = "/starling/moe/1.0.0/backward-stream";

// A stream's header as the receiver sees it after the checks.
struct StreamHeader {
  std::string uid;
  std::vector<std::vector<std::int64_t>> shapes;
  averaging::CodecSpec response_codec;
  bool codec_given = false;
  std::optional<std::uint64_t> forward_step;
  std::uint64_t expert_step = 0;
  // Values in all tensors together.
  std::uint64_t total_values() const;
};

// Receives one stream. Errors name the problem: errc::protocol_violation (frames out of
// order, a chunk at the wrong offset or past its tensor's end, a second header, the stream
// ending early), errc::invalid_argument (bad shapes, codec buffers, non-finite values),
// errc::too_large (a tensor over limits.max_stream_elements, a chunk over
// limits.max_chunk_elements), or whatever `check` returned. After an error the assembler
// refuses everything.
class StreamAssembler {
 public:
  // Called with the header before anything is allocated; an error refuses the stream.
  using Check = std::function<result<void>(const StreamHeader&)>;
  explicit StreamAssembler(WireLimits limits, Check check = {});

  result<void> feed(const pb::MoeStreamFrame& frame);
  // Parses and feeds one serialized frame (the fuzz target's entry).
  result<void> feed_bytes(BytesView frame);
  // The header came and every value of every tensor too.
  bool complete() const noexcept { return header_ && tensor_ == tensors_.size() && !failed_; }
  // At the end of the stream: errc::protocol_violation naming what is missing, if incomplete.
  result<void> finish() const;
  const StreamHeader& header() const { return *header_; }
  // The tensors (after complete()).
  std::vector<TensorData> take() { return std::move(tensors_); }

 private:
  result<void> on_header(const pb::MoeStreamHeader& h);
  result<void> fail(Error e);

  WireLimits limits_;
  Check check_;
  std::optional<StreamHeader> header_;
  std::vector<TensorData> tensors_;
  std::size_t tensor_ = 0;    // the tensor the next chunk belongs to
  std::uint64_t offset_ = 0;  // its next value
  bool failed_ = false;
};

// Produces the frames of one stream: the header, then the chunks of `tensors` (each at most
// `chunk_values` values, encoded with `codec`). The tensors must outlive the slicer. Frames
// are made one at a time (next()), so a sender holds one encoded frame at once.
class StreamSlicer {
 public:
  // `header`'s tensors (shapes) are filled in from `shapes`.
  StreamSlicer(const pb::MoeStreamHeader& header, std::vector<std::vector<std::int64_t>> shapes,
               std::vector<std::span<const float>> tensors, averaging::CodecSpec codec,
               std::uint64_t chunk_values);
  ~StreamSlicer();
  // The next frame; std::nullopt after the last. errc::invalid_argument for non-finite values
  // or a tensor whose size does not match its shape.
  result<std::optional<pb::MoeStreamFrame>> next();
  std::size_t frames_made() const noexcept { return frames_; }

 private:
  std::unique_ptr<pb::MoeStreamFrame> header_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::span<const float>> tensors_;
  averaging::CodecSpec codec_;
  std::uint64_t chunk_values_;
  std::size_t tensor_ = 0;
  std::uint64_t offset_ = 0;
  std::size_t frames_ = 0;
};

// Whether tensors of `values` values in all are sent as a stream under `threshold` bytes
// (their float32 size, or their encoded size if smaller).
bool should_stream(std::uint64_t values, const averaging::CodecSpec& codec,
                   std::uint64_t threshold);

}  // namespace starling::moe
