// starling-train: the `starling train` subcommand in its own executable (it links libtorch;
// `starling train ...` executes `starling-train train ...`).
#include "cli.hpp"

int main(int argc, char** argv) {
  using namespace starling::cli;
  return cli_main(argc, argv, [](CLI::App& app, Runner& run) {
    add_train_command(app, run);
    add_experts_command(app, run);
  });
}
