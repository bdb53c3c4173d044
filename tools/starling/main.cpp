// starling: identity, node, ping, echo, dht; `train` runs starling-train (the only part that
// needs libtorch, kept out of this executable so that it starts in milliseconds).
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

// `starling train ARGS...` executes `starling-train train ARGS...` from this executable's
// directory; every flag (including --help) is passed through unparsed.
void add_train_forwarder(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "train",
      "join or start a collaboration training the built-in Fashion-MNIST task (starling-train)");
  cmd->prefix_command();
  cmd->set_help_flag();
  cmd->allow_extras();
  cmd->callback([&run, cmd] {
    run = [args = cmd->remaining()] {
      std::error_code ec;
      auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
      const auto exe = (ec ? std::filesystem::path(".") : self.parent_path()) / "starling-train";
      std::vector<std::string> all{exe.string(), "train"};
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
    add_train_forwarder(app, run);
  });
}
