// RemoteExpert: one remote expert as an autograd function (remote.hpp).
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "moe/torch/tensor_data.hpp"
#include "starling/core/blocking.hpp"
#include "starling/moe/remote.hpp"

namespace starling::moe {

namespace {

using torch::autograd::variable_list;

struct SingleState {
  std::shared_ptr<net::Host> host;
  ExpertAddress to;
  ExpertCallOptions opts;
  TensorData input;
  std::uint64_t forward_step = 0;  // the expert's step in the forward answer
};

// Runs one call from the training thread; throws naming the expert and `what` on failure.
ExpertAnswer run_one_call(const std::shared_ptr<net::Host>& host, CallFn fn, Duration timeout,
                          const std::string& uid, const char* what) {
  std::vector<CallFn> calls;
  calls.push_back(std::move(fn));
  auto r = run_calls(host->get_executor(), std::move(calls), Clock::now() + timeout + 1s);
  if (!r[0]) throw std::runtime_error("expert " + uid + " " + what + ": no answer in time");
  if (!r[0]->has_value())
    throw std::runtime_error("expert " + uid + " " + what + ": " + r[0]->error().message());
  return std::move(r[0]->value());
}

struct RemoteExpertBackward : torch::autograd::Node {
  std::shared_ptr<SingleState> st;
  std::string name() const override { return "RemoteExpertBackward"; }
  variable_list apply(variable_list&& grads) override {
    // Moved into the call (made once): the gradient is not copied again.
    auto g = std::make_shared<TensorData>(to_data(grads[0]));
    auto a = run_one_call(
        st->host,
        [st = st, g]() {
          return call_backward(*st->host, st->to, st->input, std::move(*g), st->opts,
                               st->forward_step);
        },
        st->opts.timeout, st->to.uid, "backward");
    return {to_tensor(std::move(a.tensor))};
  }
};

}  // namespace

RemoteExpert::RemoteExpert(std::shared_ptr<net::Host> host, ExpertAddress address,
                           ExpertCallOptions opts)
    : host_(std::move(host)), address_(std::move(address)), opts_(std::move(opts)) {}

result<ExpertSchema> RemoteExpert::info() {
  if (schema_) return *schema_;
  auto host = host_;
  auto to = address_;
  auto opts = opts_;
  auto r = block_on(
      host_->get_executor(), [host, to, opts] { return call_info(*host, to, opts); },
      opts_.timeout + 1s);
  if (r) schema_ = r.value();
  return r;
}

torch::Tensor RemoteExpert::forward(const torch::Tensor& x) {
  auto schema = info();
  if (!schema) throw std::runtime_error(schema.error().message());
  const auto& in = schema.value().input_shape;
  bool ok = x.dim() == static_cast<std::int64_t>(in.size()) + 1;
  for (std::size_t i = 0; ok && i < in.size(); ++i) ok = x.size(i + 1) == in[i];
  if (!ok)
    throw std::runtime_error("expert " + address_.uid + " schema mismatch: it takes [N, " +
                             describe_shape(in).substr(1) + ", got " + shape_of(x));
  auto st = std::make_shared<SingleState>();
  st->host = host_;
  st->to = address_;
  st->opts = opts_;
  st->opts.answer_row = schema.value().output_shape;
  st->input = to_data(x);
  auto a = run_one_call(
      host_, [st]() { return call_forward(*st->host, st->to, st->input, st->opts); }, opts_.timeout,
      address_.uid, "forward");
  st->forward_step = a.expert_step;
  torch::Tensor out = to_tensor(std::move(a.tensor));
  if (torch::GradMode::is_enabled()) {
    auto node = std::shared_ptr<RemoteExpertBackward>(new RemoteExpertBackward(),
                                                      torch::autograd::deleteNode);
    node->st = st;
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out, node);
  }
  return out;
}

}  // namespace starling::moe
