// The request channel's frame codec (channel.hpp).
#include "starling/dht/channel.hpp"

namespace starling::dht {

Bytes encode_channel_frame(std::uint64_t id, BytesView message) {
  const std::size_t body = uvarint_size(id) + message.size();
  Bytes out;
  out.reserve(uvarint_size(body) + body);
  append_uvarint(out, body);
  append_uvarint(out, id);
  out.insert(out.end(), message.begin(), message.end());
  return out;
}

result<ChannelFrame> decode_channel_frame(BytesView body) {
  auto id = decode_uvarint(body);
  if (!id || !id.value())
    return make_error(errc::invalid_argument, "dht channel frame: malformed request id");
  ChannelFrame f;
  f.id = id.value()->value;
  f.message = body.subspan(id.value()->length);
  if (f.message.empty())
    return make_error(errc::invalid_argument, "dht channel frame: no message after the id");
  return f;
}

}  // namespace starling::dht
