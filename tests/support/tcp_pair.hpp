// Test support: a connected pair of TcpStreams on 127.0.0.1 (port 0), and a helper to run a
// coroutine to completion on an io_context with a hard deadline.
#pragma once

#include <stdexcept>
#include <utility>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>

#include "starling/net/tcp.hpp"

namespace starling::test {

// Both ends on `io`'s executor. Throws on failure (tests only).
inline std::pair<std::shared_ptr<net::TcpStream>, std::shared_ptr<net::TcpStream>> tcp_pair(
    asio::io_context& io) {
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket a(io), b(io);
  a.connect(acc.local_endpoint());
  acc.accept(b);
  net::tune_socket(a);
  net::tune_socket(b);
  return {std::make_shared<net::TcpStream>(std::move(a)),
          std::make_shared<net::TcpStream>(std::move(b))};
}

// Runs `task` on `io` until it and everything else on `io` finishes, or throws after
// `deadline` (stopping the io_context) so a hung test fails instead of hanging.
template <class Task>
void run_with_deadline(asio::io_context& io, Task&& task, Duration deadline = 30s) {
  bool done = false;
  std::exception_ptr err;
  asio::co_spawn(io, std::forward<Task>(task), [&](std::exception_ptr e) {
    done = true;
    err = e;
  });
  io.run_for(deadline);
  if (err) std::rethrow_exception(err);
  if (!done) throw std::runtime_error("test coroutine did not finish before its deadline");
}

}  // namespace starling::test

// gtest's ASSERT_* use `return`, which coroutines cannot: use these inside coroutines.
#define CO_ASSERT_TRUE(cond)                             \
  if (!(cond)) {                                         \
    ADD_FAILURE() << "CO_ASSERT_TRUE(" #cond ") failed"; \
    co_return;                                           \
  }
#define CO_ASSERT_FALSE(cond) CO_ASSERT_TRUE(!(cond))
// For results: fails with the error message.
#define CO_ASSERT_OK(res)                                         \
  if (!(res)) {                                                   \
    ADD_FAILURE() << #res " failed: " << (res).error().message(); \
    co_return;                                                    \
  }
