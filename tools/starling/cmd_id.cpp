// `starling id`: create or show an identity (Ed25519 key, 0600 file) and its peer id.
#include <iostream>

#include "cli.hpp"
#include "starling/net/peer_id.hpp"

namespace starling::cli {

void add_id_command(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("id", "create or show an identity and its peer id");
  auto path = std::make_shared<std::string>(default_identity_path());
  auto no_create = std::make_shared<bool>(false);
  cmd->add_option("--identity,-i", *path, "identity file")->capture_default_str();
  cmd->add_flag("--no-create", *no_create, "fail instead of creating a missing identity");
  cmd->callback([&run, path, no_create] {
    run = [path, no_create] {
      auto key = load_identity_or_exit(*path, !*no_create);
      std::cout << net::PeerId::from_public_key(key.public_key()).to_string() << "\n";
      return 0;
    };
  });
}

}  // namespace starling::cli
