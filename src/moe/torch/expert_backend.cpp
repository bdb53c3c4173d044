// One expert's forward / backward on a batch and its optimizer step (the runtime thread's
// compute; see expert_server.hpp).
#include "moe/torch/server_impl.hpp"

namespace starling::moe {

namespace {

Error bad_request(const std::string& uid, const std::string& why) {
  return Error(errc::invalid_argument, "expert " + uid + ": " + why);
}

// Checks that `t` is [rows, shape...] for some rows >= 1.
result<void> check_rows(const std::string& uid, const char* what, const TensorData& t,
                        const std::vector<std::int64_t>& shape) {
  bool ok = t.shape.size() == shape.size() + 1 && t.shape[0] >= 1;
  for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = t.shape[i + 1] == shape[i];
  if (!ok)
    return bad_request(uid, std::string(what) + " has shape " + describe_shape(t.shape) +
                                ", the expert takes [N, " + describe_shape(shape).substr(1));
  return success();
}

torch::Tensor view_of(TensorData& t) {
  return torch::from_blob(t.values.data(), t.shape, torch::kFloat32);
}

}  // namespace

void step_expert(ExpertServerStats& stats, Backend& b) {
  b.optimizer->step();
  b.optimizer->zero_grad();
  b.accumulated_rows = 0;
  ++b.steps;
  ++stats.optimizer_steps;
}

void run_batch(const ExpertServerConfig& cfg, ExpertServerStats& stats, Backend& b, bool backward,
               std::vector<Task>& tasks) {
  std::vector<std::size_t> good;
  std::vector<TensorData> inputs(tasks.size()), grads(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    Task& t = tasks[i];
    auto d = t.decoded ? result<DecodedRequest>(std::move(*t.decoded))
                       : decode_request(t.request, cfg.limits);
    result<void> ok = success();
    if (!d) {
      ok = d.error().with_context("expert " + b.schema.uid);
    } else if (d.value().tensors.size() != (backward ? 2u : 1u)) {
      ok = bad_request(b.schema.uid, std::string(backward ? "backward" : "forward") + " takes " +
                                         (backward ? "2 tensors" : "1 tensor") + ", got " +
                                         std::to_string(d.value().tensors.size()));
    } else {
      auto& ts = d.value().tensors;
      ok = check_rows(b.schema.uid, "input", ts[0], b.schema.input_shape);
      if (ok && backward) {
        ok = check_rows(b.schema.uid, "grad_output", ts[1], b.schema.output_shape);
        if (ok && ts[1].shape[0] != ts[0].shape[0])
          ok = bad_request(b.schema.uid, "grad_output rows differ from input rows");
      }
      if (ok && static_cast<std::size_t>(ts[0].shape[0]) != t.rows)
        ok = bad_request(b.schema.uid, "row count changed");
      if (ok && backward && d.value().forward_step &&
          cfg.max_staleness != std::numeric_limits<std::uint64_t>::max()) {
        const std::uint64_t f = *d.value().forward_step;
        if (f > b.steps || b.steps - f > cfg.max_staleness) {
          ++stats.stale_gradients;
          complete(t, Error(errc::unavailable,
                            "expert " + b.schema.uid + ": gradient too stale (forward at step " +
                                std::to_string(f) + ", expert at step " + std::to_string(b.steps) +
                                ", bound " + std::to_string(cfg.max_staleness) + ")"));
          continue;
        }
      }
      if (ok) {
        t.codec = d.value().codec_given ? d.value().response_codec : cfg.codec;
        inputs[i] = std::move(ts[0]);
        if (backward) grads[i] = std::move(ts[1]);
      }
    }
    if (!ok) {
      ++stats.bad_requests;
      complete(t, ok.error());
    } else {
      good.push_back(i);
    }
  }
  if (good.empty()) return;
  std::vector<torch::Tensor> xs, gs;
  std::int64_t rows = 0;
  for (auto i : good) {
    xs.push_back(view_of(inputs[i]));
    if (backward) gs.push_back(view_of(grads[i]));
    rows += inputs[i].shape[0];
  }
  torch::Tensor answer;
  std::uint64_t answered_step = b.steps;
  try {
    // One request: its rows as they are (no copy; a streamed request can be large).
    torch::Tensor x = xs.size() == 1 ? xs[0] : torch::cat(xs, 0);
    if (!backward) {
      torch::NoGradGuard ng;
      answer = b.module.forward(x).contiguous();
      if (answer.is_alias_of(x)) answer = answer.clone();  // x's memory ends with this call
      ++stats.forward_batches;
      stats.forward_rows += static_cast<std::uint64_t>(rows);
    } else {
      torch::AutoGradMode grad_on(true);
      x.requires_grad_(true);
      torch::Tensor out = b.module.forward(x);
      torch::Tensor g = gs.size() == 1 ? gs[0] : torch::cat(gs, 0);
      if (out.sizes() != g.sizes())
        throw std::runtime_error("expert output shape differs from its declared schema");
      out.backward(g);
      answer = x.grad().contiguous();
      // Through view-only paths autograd may hand g (the request's memory) over as x's grad.
      if (answer.is_alias_of(g) || answer.is_alias_of(x)) answer = answer.clone();
      answered_step = b.steps;
      if (b.accumulated_rows == 0) b.accumulating_since = Clock::now();
      b.accumulated_rows += static_cast<std::uint64_t>(rows);
      b.samples += static_cast<std::uint64_t>(rows);
      ++stats.backward_batches;
      stats.backward_rows += static_cast<std::uint64_t>(rows);
      if (cfg.step_samples == 0 || b.accumulated_rows >= cfg.step_samples) step_expert(stats, b);
    }
    if (answer.dim() < 1 || answer.size(0) != rows)
      throw std::runtime_error("expert returned " + std::to_string(answer.size(0)) + " rows for " +
                               std::to_string(rows));
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.size() > 512) what.resize(512);
    for (auto i : good)
      complete(tasks[i], Error(errc::internal, "expert " + b.schema.uid + " failed: " + what));
    return;
  }
  const std::vector<std::int64_t> out_shape(answer.sizes().begin(), answer.sizes().end());
  std::int64_t row = 0;
  const float* base = answer.data_ptr<float>();
  const std::int64_t per_row = rows ? answer.numel() / rows : 0;
  for (auto i : good) {
    const std::int64_t n = inputs[i].shape[0];
    std::vector<std::int64_t> shape = out_shape;
    shape[0] = n;
    const std::span<const float> values(base + row * per_row, n * per_row);
    row += n;
    if (tasks[i].streamed) {  // streamed: the io thread encodes it frame by frame
      auto rows_of = answer.narrow(0, row - n, n);  // a view: no copy
      if (!torch::isfinite(rows_of).all().item<bool>()) {
        complete(tasks[i],
                 Error(errc::invalid_argument, "expert " + b.schema.uid + " output holds inf/nan"));
        continue;
      }
      complete(tasks[i], TaskAnswer{StreamedAnswer{rows_of, shape, answered_step, tasks[i].codec}});
      continue;
    }
    pb::ExpertResponse resp;
    resp.set_expert_step(answered_step);
    auto r = encode_tensor(tasks[i].codec, shape, values, *resp.add_tensors());
    if (!r)
      complete(tasks[i], r.error().with_context("expert " + b.schema.uid + " output"));
    else
      complete(tasks[i], TaskAnswer{std::move(resp)});
  }
}

}  // namespace starling::moe
