// The streamed call behind call_streamed / call_forward / call_backward (client.hpp), taking
// its tensors by reference (the caller awaits it; large tensors are not copied).
#pragma once

#include "starling/moe/client.hpp"

namespace starling::moe::detail {

awaitable<result<ExpertAnswer>> stream_call(net::Host& host, const ExpertAddress& to, bool backward,
                                            const std::vector<TensorData>& tensors,
                                            const ExpertCallOptions& opts,
                                            std::optional<std::uint64_t> forward_step);

}  // namespace starling::moe::detail
