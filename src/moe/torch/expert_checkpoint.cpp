// One expert's checkpoint file: the training/checkpoint.hpp container (CRC-checked metadata +
// payload) holding optim/training_state.hpp's state of the module and its optimizer.
#include "moe/torch/server_impl.hpp"
#include "starling/averaging/host_address_sink.hpp"
#include "starling/optim/training_state.hpp"
#include "starling/training/checkpoint.hpp"

namespace starling::moe {

namespace {
constexpr std::size_t kMaxExpertCheckpointBytes = std::size_t{4} << 30;
}

std::filesystem::path ExpertServer::checkpoint_path(const std::filesystem::path& dir,
                                                    const std::string& uid) {
  return dir / (uid + ".stc");
}

result<bool> load_expert_checkpoint(const std::filesystem::path& dir, Backend& b) {
  const auto path = ExpertServer::checkpoint_path(dir, b.schema.uid);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  auto fail = [&](const Error& e) {
    return e.with_context("expert " + b.schema.uid + " checkpoint " + path.string());
  };
  auto bytes = training::read_file(path, kMaxExpertCheckpointBytes);
  if (!bytes) return fail(bytes.error());
  auto decoded = training::decode_checkpoint(bytes.value());
  if (!decoded) return fail(decoded.error());
  const auto& meta = decoded.value().meta;
  if (meta.run_id != b.schema.uid)
    return fail(Error(errc::invalid_argument, "holds expert '" + meta.run_id.substr(0, 64) + "'"));
  if (meta.task != b.schema.expert_type)
    return fail(Error(errc::invalid_argument, "holds an expert of type '" +
                                                  meta.task.substr(0, 64) + "', not '" +
                                                  b.schema.expert_type + "'"));
  auto loaded =
      optim::load_training_state(decoded.value().payload, *b.module.parameters, b.optimizer.get());
  if (!loaded) return fail(loaded.error());
  b.steps = meta.epoch;
  b.saved_steps = meta.epoch;
  b.samples = meta.samples_total;
  return true;
}

result<void> save_expert_checkpoint(const std::filesystem::path& dir, Backend& b) {
  training::CheckpointMeta meta;
  meta.run_id = b.schema.uid;
  meta.task = b.schema.expert_type;
  meta.epoch = b.steps;
  meta.samples_total = b.samples;
  meta.parameter_names = optim::parameter_names(*b.module.parameters);
  auto state = optim::save_training_state(*b.module.parameters, b.optimizer.get());
  if (!state) return state.error().with_context("expert " + b.schema.uid + " checkpoint");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error(errc::io, "expert checkpoint dir " + dir.string() + ": " + ec.message());
  auto file = training::encode_checkpoint(meta, state.value());
  ST_TRY(training::write_file_atomic(ExpertServer::checkpoint_path(dir, b.schema.uid), file));
  b.saved_steps = b.steps;
  return success();
}

}  // namespace starling::moe

namespace starling::moe {

result<Bytes> expert_state(Backend& b) {
  auto s = optim::save_training_state(*b.module.parameters, b.optimizer.get());
  if (!s) return s.error().with_context("expert " + b.schema.uid + " state");
  return std::move(s).value();
}

result<void> load_expert_state(BytesView state, std::uint64_t steps, Backend& b) {
  auto r = optim::load_training_state(state, *b.module.parameters, b.optimizer.get());
  if (!r) return r.error().with_context("expert " + b.schema.uid + " downloaded state");
  b.steps = steps;
  b.saved_steps = 0;
  return success();
}

result<std::shared_ptr<averaging::Averager>> make_state_averager(
    const std::shared_ptr<net::Host>& host, const std::shared_ptr<averaging::Directory>& dir,
    const std::string& uid) {
  averaging::AveragerConfig c;
  c.key = {"moe." + uid, 16, 0};
  for (const auto& a : host->announce_addresses()) c.addrs.push_back(a.to_string());
  if (c.addrs.size() > 16) c.addrs.resize(16);
  c.reduce_threads = 1;
  return averaging::Averager::create(host, dir, averaging::Schema{}, {}, c,
                                     averaging::host_address_sink(host));
}

}  // namespace starling::moe
