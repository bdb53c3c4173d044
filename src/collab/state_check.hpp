// The check a joiner runs on a training state downloaded from peers, before anything changes
// (averaging::LoadStateOptions::verify): the bytes must be a valid training state
// (training::state_format) whose parameters hash (training::StateDigest) to the digest the donors
// announce in the snapshot's metadata, the digest peers compare in their progress records.
// A donor serving other parameters under the collaboration's digest is refused, and the
// download goes on with the others.
//
// Threading rule: a plain function object; runs on the state averager's worker pool.
#pragma once

#include <cstdint>

#include "starling/averaging/state_transfer.hpp"
#include "starling/core/bytes.hpp"

namespace starling::collab::detail {

// A state's digest travels as the blob snapshot's metadata: 8 bytes, big-endian (0: none).
Bytes digest_bytes(std::uint64_t d);
std::uint64_t digest_of(const Bytes& metadata);

// errc::invalid_argument unless `state` decodes as a training state holding parameters with
// the digest `digest`: the first k model tensors for some k (parameters precede buffers), or
// the anchor_<i> extra tensors (DiLoCo, where the collaboration's state is the anchors).
result<void> check_training_state(BytesView state, std::uint64_t digest);

struct StateCheck {
  result<void> operator()(const averaging::StateManifest& m, BytesView data) const;
};

}  // namespace starling::collab::detail
