// The pieces of running a cpp-httplib server the dashboard and the Prometheus endpoint share.
#pragma once

#include <string>
#include <thread>

#include <httplib.h>

#include "starling/core/result.hpp"

namespace starling::monitor::detail {

// Security headers and limits every server here uses (read-only, GET only, bounded threads,
// timeouts, SO_REUSEADDR without SO_REUSEPORT so a busy port fails clearly).
void configure_server(httplib::Server& server, std::size_t threads);
// Binds host:port (port 0: any free port), runs the accept loop on `thread` and waits (bounded)
// until it runs, so a stop() right after cannot be lost. The port bound.
result<int> bind_and_run(httplib::Server& server, const std::string& host, int port,
                         std::thread& thread);
// http://host:port/ (brackets around an IPv6 host).
std::string http_url(const std::string& host, int port);

}  // namespace starling::monitor::detail
