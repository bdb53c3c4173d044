// The `starling` command line: one file per subcommand, each registering itself on the app.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>

#include "starling/core/async.hpp"
#include "starling/crypto/keys.hpp"

namespace starling::cli {

// A flag's seconds (fractional) as a Duration.
inline Duration seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

// Each subcommand adds itself to `app` and sets `run` to what executes when it is chosen.
using Runner = std::function<int()>;
void add_id_command(CLI::App& app, Runner& run);
void add_node_command(CLI::App& app, Runner& run);
void add_ping_command(CLI::App& app, Runner& run);
void add_echo_command(CLI::App& app, Runner& run);
void add_dht_command(CLI::App& app, Runner& run);
void add_monitor_command(CLI::App& app, Runner& run);
void add_run_key_command(CLI::App& app, Runner& run);  // private runs
// In starling-train only (built with libtorch).
void add_train_command(CLI::App& app, Runner& run);
void add_experts_command(CLI::App& app, Runner& run);  // starling experts serve

// Default identity path: $STARLING_HOME/identity.key or ~/.starling/identity.key.
std::string default_identity_path();
// Loads (or creates, with a note on stderr) the identity at `path`; prints errors and exits 2.
crypto::KeyPair load_identity_or_exit(const std::string& path, bool create);

// A small file's bytes (errc::not_found if unreadable, errc::too_large above `max`).
result<Bytes> read_small_file(const std::string& path, std::size_t max = 1 << 20);

// Runs `main` on a fresh io_context until it finishes or SIGINT/SIGTERM arrives; on a signal
// the coroutine is cancelled (it should then clean up, bounded). Returns main's exit code.
int run_main(std::function<awaitable<int>()> main);

// The whole program: an app named "starling" with --log (or $STARLING_LOG), the commands that
// `add_commands` registers, parsing, then the chosen command's runner.
int cli_main(int argc, char** argv, const std::function<void(CLI::App&, Runner&)>& add_commands);

}  // namespace starling::cli
