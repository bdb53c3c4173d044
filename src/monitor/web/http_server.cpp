// Shared cpp-httplib server setup (http_server.hpp).
#include "http_server.hpp"

#include <chrono>

#include <fmt/format.h>

namespace starling::monitor::detail {

void configure_server(httplib::Server& server, std::size_t threads) {
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server
  // share (and split) the port instead of failing clearly.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_payload_max_length(64 * 1024);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
}

result<int> bind_and_run(httplib::Server& server, const std::string& host, int port,
                         std::thread& thread) {
  int bound = 0;
  if (port == 0) {
    bound = std::max(0, server.bind_to_any_port(host));
  } else if (server.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound == 0)
    return make_error(errc::unavailable, fmt::format("cannot listen on {}:{}", host, port));
  thread = std::thread([&server] { server.listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs: wait for it (bounded).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server.is_running())
    return make_error(
        errc::timeout,
        fmt::format("the HTTP server on {}:{} did not start within 10 s", host, port));
  return bound;
}

std::string http_url(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}/", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

}  // namespace starling::monitor::detail
