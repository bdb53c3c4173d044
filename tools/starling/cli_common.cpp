// Shared by the two executables of the command line: `starling` (no libtorch, starts in
// milliseconds) and `starling-train` (the `train` subcommand, links libtorch).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>

#include <asio/signal_set.hpp>

#include "cli.hpp"
#include "starling/core/allocator.hpp"
#include "starling/core/log.hpp"

namespace starling::cli {

std::string default_identity_path() {
  if (const char* home = std::getenv("STARLING_HOME")) return std::string(home) + "/identity.key";
  const char* h = std::getenv("HOME");
  return std::string(h ? h : ".") + "/.starling/identity.key";
}

crypto::KeyPair load_identity_or_exit(const std::string& path, bool create) {
  bool created = false;
  auto k = create ? crypto::load_or_create_identity(path, &created) : crypto::load_identity(path);
  if (!k) {
    std::cerr << "error: identity " << path << ": " << k.error().message() << "\n";
    std::exit(2);
  }
  if (created) std::cerr << "created new identity at " << path << "\n";
  return std::move(k).value();
}

result<Bytes> read_small_file(const std::string& path, std::size_t max) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(errc::not_found, "cannot read " + path);
  Bytes b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() > max)
    return make_error(errc::too_large, path + ": above " + std::to_string(max) + " bytes");
  return b;
}

int run_main(std::function<awaitable<int>()> main) {
  asio::io_context io;
  int code = 1;
  asio::cancellation_signal cancel;
  bool done = false;
  asio::co_spawn(io, main(),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, int c) {
                   done = true;
                   code = c;
                   if (e) {
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::exception& ex) {
                       std::cerr << "error: " << ex.what() << "\n";
                     }
                     code = 1;
                   }
                   io.stop();
                 }));
  asio::signal_set signals(io, SIGINT, SIGTERM);
  int hits = 0;
  std::function<void(std::error_code, int)> on_signal = [&](std::error_code ec, int) {
    if (ec) return;
    if (++hits > 1) std::_Exit(130);  // second Ctrl-C: leave at once
    std::cerr << "\nstopping (Ctrl-C again to force)...\n";
    cancel.emit(asio::cancellation_type::terminal);
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  io.run();
  return done ? code : 130;
}

int cli_main(int argc, char** argv, const std::function<void(CLI::App&, Runner&)>& add_commands) {
  tune_allocator();
  CLI::App app{"Starling: train neural networks together over the internet", "starling"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log", log_level, "log level: trace, debug, info, warn, error, off")
      ->envname("STARLING_LOG");
  Runner run;
  add_commands(app, run);
  CLI11_PARSE(app, argc, argv);
  if (!log_level.empty()) {
    set_log_level(log_level);
    ::setenv("STARLING_LOG", log_level.c_str(), 1);  // for a program this one executes
  }
  return run ? run() : 1;
}

}  // namespace starling::cli
