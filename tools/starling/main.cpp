// starling: identity, node, ping, echo, dht, monitor, run-key; `train` runs starling-train (the
// only part that needs libtorch, kept out of this executable so that it starts in milliseconds).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include "cli.hpp"

namespace starling::cli {
namespace {

// `starling train|experts ARGS...` executes `starling-train train|experts ARGS...` from this
// executable's directory; every flag (including --help) is passed through unparsed.
void add_forwarder(CLI::App& app, Runner& run, const std::string& name, const std::string& help) {
  auto* cmd = app.add_subcommand(name, help);
  cmd->prefix_command();
  cmd->set_help_flag();
  cmd->allow_extras();
  cmd->callback([&run, cmd, name] {
    run = [args = cmd->remaining(), name] {
      std::error_code ec;
      auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
      const auto exe = (ec ? std::filesystem::path(".") : self.parent_path()) / "starling-train";
      std::vector<std::string> all{exe.string(), name};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      std::cerr << "error: cannot run " << exe.string() << ": " << std::strerror(errno)
                << " (starling-train is built only with libtorch)\n";
      return 2;
    };
  });
}

}  // namespace
}  // namespace starling::cli

int main(int argc, char** argv) {
  using namespace starling::cli;
  return cli_main(argc, argv, [](CLI::App& app, Runner& run) {
    add_id_command(app, run);
    add_node_command(app, run);
    add_ping_command(app, run);
    add_echo_command(app, run);
    add_dht_command(app, run);
    add_monitor_command(app, run);
    add_run_key_command(app, run);
    add_forwarder(app, run, "train",
                  "join or start a collaboration training the built-in Fashion-MNIST task "
                  "(starling-train)");
    add_forwarder(app, run, "experts", "serve mixture-of-experts experts (starling-train)");
  });
}
