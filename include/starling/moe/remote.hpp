// Remote experts in libtorch autograd.
//
// RemoteExpert: one expert on another peer as a function of a [N, in...] tensor whose forward
// and backward are RPCs (/starling/moe/1.0.0): forward() returns [N, out...] with a gradient
// node whose backward sends (input, grad_output) to the server and returns grad_input (the
// server steps its optimizer). The input schema is checked against the server's (info call,
// cached) before the first call. Failures throw std::runtime_error naming the expert.
//
// RemoteMixtureOfExperts: a torch::nn::Module. A gating projection scores the grid's every
// dimension; beam search over the DHT (ExpertDirectory) finds each sample's k best alive
// experts; one request per chosen expert carries all rows routed to it; calls run in
// parallel; after k_min answers per sample it waits at most timeout_after_k_min for the rest;
// failed or late experts get gate -inf (masked out of the softmax); the output is the
// softmax-weighted sum over the experts that answered. Backward goes only to the experts that
// answered forward; gradients flow into the gating projection (through the gates) and into
// the layers before (through the experts' input gradients). A sample none of whose experts
// answered gets zeros (and no gradient) and is counted in stats().empty_rows; if no expert
// answered at all, forward throws.
//
// Replicas (several servers declaring one uid): each expert's request goes to the replica
// expected to finish it first, from the throughput and latency measured on this layer's
// earlier calls and the calls already planned for this forward (replica_choice.hpp), avoiding
// for `avoid_failed` a server whose call failed or came late (replica_choice.hpp). A call that
// fails (an error, not a late answer) is sent once more, within the same deadline, to another
// replica of its expert that has not failed it, if one is declared.
//
// Staleness: every forward answer carries the expert's step count, which the backward sends
// back (the server refuses a gradient past its staleness bound: a backward failure here).
//
// Threading rule: call forward/backward from a training thread, never from the host's io
// thread (the calls block on it). The host must be running (an IoThread).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/nn.h>

#include "starling/moe/client.hpp"
#include "starling/moe/expert_directory.hpp"
#include "starling/moe/replica_choice.hpp"

namespace starling::moe {

class RemoteExpert {
 public:
  RemoteExpert(std::shared_ptr<net::Host> host, ExpertAddress address, ExpertCallOptions opts = {});
  // The server's schema (cached after the first successful call).
  result<ExpertSchema> info();
  // [N, in...] -> [N, out...]; throws on failure or schema mismatch.
  torch::Tensor forward(const torch::Tensor& x);
  const ExpertAddress& address() const { return address_; }

 private:
  std::shared_ptr<net::Host> host_;
  ExpertAddress address_;
  ExpertCallOptions opts_;
  std::optional<ExpertSchema> schema_;
};

struct MoeOptions {
  std::string grid = "ffn";
  std::vector<std::int64_t> grid_size = {4, 4};
  std::int64_t in_features = 64;   // the experts' input width
  std::int64_t out_features = 64;  // the experts' output width
  std::size_t k = 4;               // experts per sample
  std::size_t k_min = 1;           // answers per sample before timeout_after_k_min runs
  Duration forward_timeout = 10s;  // beam search + forward calls
  Duration timeout_after_k_min = 1s;
  Duration backward_timeout = 10s;
  averaging::CodecSpec codec;  // codec of activations and gradients sent
  std::string response_codec;  // codec asked of the servers ("": their default)
  // A call whose tensors exceed this many bytes is streamed (ExpertCallOptions).
  std::uint64_t stream_threshold = 4u << 20;
  // Replicas: a server whose call for an expert failed is not chosen for that expert again
  // for this long while another replica of it is declared (about one declaration refresh).
  Duration avoid_failed = 10s;
  // Replicas: a server's measured speed is forgotten after this long without a call.
  Duration replica_forget_after = 60s;
};

struct MoeStats {
  std::uint64_t forward_calls = 0, forward_failures = 0, forward_late = 0;
  std::uint64_t forward_retries = 0;  // failed calls sent again to another replica
  std::uint64_t backward_calls = 0, backward_failures = 0;
  std::uint64_t empty_rows = 0;
  std::map<std::string, std::uint64_t> rows_per_expert;  // utilisation
};

class RemoteMixtureOfExpertsImpl : public torch::nn::Module {
 public:
  RemoteMixtureOfExpertsImpl(MoeOptions options, std::shared_ptr<net::Host> host,
                             std::shared_ptr<ExpertDirectory> directory);
  // x: [B, in_features] -> [B, out_features].
  torch::Tensor forward(const torch::Tensor& x);
  MoeStats stats() const;
  const MoeOptions& options() const { return options_; }

  torch::nn::Linear proj{nullptr};
  // The last forward's routing (for the Switch layer): grid coordinates [B, k, dims] (int64)
  // of each sample's slots and which slots answered [B, k] (bool). Undefined before a forward.
  torch::Tensor last_coords, last_answered;

 private:
  MoeOptions options_;
  std::shared_ptr<net::Host> host_;
  std::shared_ptr<ExpertDirectory> directory_;
  std::shared_ptr<std::mutex> stats_mu_;
  std::shared_ptr<MoeStats> stats_;
  // Replica choice and failed replicas (the training thread's forward only).
  ReplicaChooser replicas_;
};
TORCH_MODULE(RemoteMixtureOfExperts);

}  // namespace starling::moe
