#include "starling/core/async.hpp"

#include <map>

#include <asio/error.hpp>
#include <asio/io_context.hpp>

#include "starling/core/log.hpp"

namespace starling {

Error from_asio(const std::error_code& ec, std::string context) {
  if (ec == asio::error::operation_aborted) return Error(errc::cancelled, std::move(context));
  if (ec == asio::error::eof) return Error(errc::closed, std::move(context));
  if (ec == asio::error::connection_reset || ec == asio::error::broken_pipe)
    return Error(errc::reset, context.empty() ? ec.message() : context + ": " + ec.message());
  if (ec == asio::error::timed_out) return Error(errc::timeout, std::move(context));
  return Error(ec, std::move(context));
}

awaitable<result<void>> sleep_for(Duration d) {
  Timer t(co_await asio::this_coro::executor, d);
  auto [ec] = co_await t.async_wait(use_nothrow);
  if (ec) co_return make_error(errc::cancelled, "sleep");
  co_return success();
}

AsyncEvent::AsyncEvent(asio::any_io_executor ex) : timer_(std::move(ex), TimePoint::max()) {}

awaitable<result<void>> AsyncEvent::wait() {
  if (set_) co_return success();
  auto [ec] = co_await timer_.async_wait(use_nothrow);
  // The timer never expires on its own: completion means set()/pulse() (which cancel it)
  // or cancellation of this waiter. Distinguish by the flag / a fresh check.
  if (set_) co_return success();
  if (ec == asio::error::operation_aborted) {
    auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) co_return make_error(errc::cancelled);
    co_return success();  // pulse()
  }
  co_return success();
}

void AsyncEvent::set() {
  set_ = true;
  timer_.cancel();
}
void AsyncEvent::reset() {
  set_ = false;
}
void AsyncEvent::pulse() {
  timer_.cancel();
}

struct TaskScope::State {
  explicit State(asio::any_io_executor e) : ex(e), drained(e) {}
  asio::any_io_executor ex;
  std::map<std::uint64_t, std::shared_ptr<asio::cancellation_signal>> tasks;
  std::uint64_t next_id = 0;
  bool closed = false;
  AsyncEvent drained;

  void cancel_all() {
    auto copy = tasks;  // emitting does not complete synchronously, but be safe
    for (auto& [id, sig] : copy) sig->emit(asio::cancellation_type::terminal);
  }
};

TaskScope::TaskScope(asio::any_io_executor ex) : state_(std::make_shared<State>(ex)) {}

TaskScope::~TaskScope() {
  state_->closed = true;
  // A stopped io_context runs no handler again: its pending tasks end when it is destroyed.
  // Emitting there would reach into timer services that may already be torn down (an object
  // destroyed by the context's own destruction, e.g. from a coroutine frame it held).
  if (const auto* io = state_->ex.target<asio::io_context::executor_type>();
      io && io->context().stopped())
    return;
  state_->cancel_all();
}

std::size_t TaskScope::active() const noexcept {
  return state_->tasks.size();
}
bool TaskScope::closed() const noexcept {
  return state_->closed;
}

void TaskScope::spawn(awaitable<void> task) {
  auto& st = *state_;
  if (st.closed) return;
  auto id = st.next_id++;
  auto sig = std::make_shared<asio::cancellation_signal>();
  st.tasks.emplace(id, sig);
  asio::co_spawn(
      st.ex, std::move(task),
      asio::bind_cancellation_slot(sig->slot(), [state = state_, id, sig](std::exception_ptr e) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::system_error& se) {
            if (se.code() != asio::error::operation_aborted)
              logger("core")->warn("background task ended with error: {}", se.what());
          } catch (const std::exception& ex) {
            logger("core")->error("background task threw: {}", ex.what());
          }
        }
        state->tasks.erase(id);
        if (state->tasks.empty()) state->drained.set();
      }));
}

awaitable<result<void>> TaskScope::close(Duration timeout) {
  // Shutdown must complete even when the calling coroutine was itself cancelled.
  co_await asio::this_coro::reset_cancellation_state();
  auto st = state_;
  st->closed = true;
  if (st->tasks.empty()) co_return success();
  st->drained.reset();
  st->cancel_all();
  if (st->tasks.empty()) co_return success();
  auto r = co_await with_timeout(st->drained.wait(), timeout, "waiting for background tasks");
  if (!r) {
    logger("core")->warn("{} background task(s) did not stop within the shutdown deadline",
                         st->tasks.size());
    co_return r;
  }
  co_return success();
}

awaitable<result<void>> TaskScope::join(Duration timeout) {
  auto st = state_;
  if (st->tasks.empty()) co_return success();
  st->drained.reset();
  co_return co_await with_timeout(st->drained.wait(), timeout, "joining background tasks");
}

}  // namespace starling
