// RoundRunner: the per-stream I/O: one writer per peer (frames from the core's outbox, parts
// encoded on the pool when compressed, keepalives when idle) and one reader per stream
// (frames decoded, payloads read in chunks, decoded on the pool or received in place).
#include <bit>

#include "round_runner.hpp"
#include "starling/core/log.hpp"
#include "starling/core/thread_pool.hpp"

namespace starling::averaging::detail {

static_assert(std::endian::native == std::endian::little,
              "the all-reduce wire format is little-endian float32");

namespace {

BytesView float_bytes(std::span<const float> f) {
  return {reinterpret_cast<const std::uint8_t*>(f.data()), f.size_bytes()};
}

constexpr std::size_t kReadChunk = 256 * 1024;

// Pool tasks as plain function objects (GCC 12 mishandles lambdas nested in coroutines).
// This member's values of a part, for its owner (with error feedback when configured).
struct EncodeTask {
  std::shared_ptr<PoolGate> gate;
  const TensorCodecs* codecs;
  std::uint64_t begin;
  std::span<const float> in;
  std::span<const float> residual;
  std::span<float> residual_out;
  std::atomic<std::int64_t>* ns;
  result<Bytes> operator()() const {
    PoolGate::Pass pass(gate.get());
    if (!pass.ok) return make_error(errc::cancelled, "all-reduce: the round ended");
    Timed t{ns};
    return codecs->encode(begin, in, {}, residual, residual_out);
  }
};
struct DecodeTask {
  const Bytes* in;
  std::size_t max_count;
  FloatBuffer* out;
  std::atomic<std::int64_t>* ns;
  result<void> operator()() const {
    Timed t{ns};
    return TensorCodecs::decode(*in, max_count, *out);
  }
};

}  // namespace

awaitable<void> RoundRunner::writer(std::uint32_t j) {
  auto& P = p_[j];
  TimePoint held_since{};  // when this writer began holding back its next frame
  for (;;) {
    if (P.fenced) co_return;
    if (cfg_.stall) P.queue.clear();  // test-only stalling: nothing after the hello
    if (P.send && !P.queue.empty()) {
      const auto& next = P.queue.front().msg;
      const bool data_frame = !P.queue.front().acct && (std::holds_alternative<PartMsg>(next) ||
                                                        std::holds_alternative<ResultMsg>(next));
      if (data_frame && !ending_ && balance_ahead(j)) {
        const TimePoint now = Clock::now();
        if (held_since == TimePoint{}) held_since = now;
        if (now - held_since < cfg_.round.balance_hold) {
          auto r = co_await with_timeout(balance_.wait(),
                                         cfg_.round.balance_hold - (now - held_since), "balance");
          if (!r && r.error() == errc::cancelled) co_return;
          continue;
        }
      }
      held_since = TimePoint{};
      OutFrame f = std::move(P.queue.front());
      P.queue.pop_front();
      auto s = P.send;
      if (f.acct) {
        const Bytes frame = net::length_prefixed(wire::encode_acct(*f.acct));
        P.writing = true;
        auto w = co_await s->write(frame);
        P.writing = false;
        if (!w) {
          if (!ending_) stream_lost(j, w.error(), false);
          co_return;
        }
        bytes_sent_ += frame.size();
        if (P.queue.empty()) progress_.set();
        continue;
      }
      std::span<const float> data;
      if (auto* pm = std::get_if<PartMsg>(&f.msg)) data = pm->data;
      if (auto* rm = std::get_if<ResultMsg>(&f.msg)) data = rm->data;
      BytesView payload = float_bytes(data);
      std::shared_ptr<const Bytes> encoded;
      if (compressed() && !data.empty()) {
        if (auto* rm = std::get_if<ResultMsg>(&f.msg)) {
          auto it = encoded_results_.find({rm->subround, rm->part});
          if (it != encoded_results_.end()) encoded = it->second;
        }
        if (!encoded && std::holds_alternative<ResultMsg>(f.msg)) {
          // reduce_part() encodes every result before the core releases it.
          logger("averaging")->error("all-reduce: result for member {} was not encoded", j);
          if (!ending_) stream_lost(j, make_error(errc::internal, "unencoded result"), false);
          co_return;
        }
        if (!encoded) {
          // A part holds this member's own values: a subspan of local_.
          const auto begin = static_cast<std::uint64_t>(data.data() - local_.data());
          EncodeTask task{gate_, cfg_.codecs, begin, data, {}, {}, &codec_ns_};
          if (!cfg_.residual.empty() && begin + data.size() <= local_.size()) {
            task.residual = cfg_.residual.subspan(begin, data.size());
            task.residual_out = cfg_.residual_out.subspan(begin, data.size());
          }
          PoolUse use(this);
          auto e = co_await pool_.run(task);
          if (!e) {
            logger("averaging")
                ->warn("all-reduce: cannot encode a part for member {}: {}", j,
                       e.error().message());
            if (!ending_) stream_lost(j, e.error(), false);
            co_return;
          }
          encoded = std::make_shared<const Bytes>(std::move(e).value());
        }
        payload = *encoded;
      }
      // Accountability: the signed receipt of the part or result (test-only different-parts:
      // other values than the committed ones, under a receipt that matches them).
      Bytes receipt;
      if (acct_) {
        if (auto* pm = std::get_if<PartMsg>(&f.msg)) {
          receipt = acct_->part_receipt(pm->subround, pm->part, pm->weight);
          if (const auto* t = acct_->tampered(pm->subround, pm->part)) payload = float_bytes(*t);
        } else if (auto* rm = std::get_if<ResultMsg>(&f.msg)) {
          if (auto rr = acct_->result_receipt(rm->subround, rm->part, rm->counted)) receipt = *rr;
        }
      }
      const Bytes header = net::length_prefixed(wire::encode_round(f.msg, payload.size(), receipt));
      P.busy = data_frame;
      P.writing = true;
      auto w = co_await paced_write(*s, header, payload);
      P.busy = P.writing = false;
      if (!w) {
        if (!ending_) stream_lost(j, w.error(), false);
        co_return;
      }
      bytes_sent_ += header.size() + payload.size();
      if (data_frame) {
        const auto sub = std::visit([](const auto& m) { return m.subround; }, f.msg);
        if (sub == balance_sub_) {
          const auto before = P.flow_sent;
          P.flow_sent += data.size();
          log_flow(j, before);
        }
        balance_.pulse();
      }
      if (P.queue.empty()) progress_.set();
      continue;
    }
    if (ending_) co_return;
    P.wake->reset();
    auto r = co_await with_timeout(P.wake->wait(), cfg_.keepalive_interval, "keepalive");
    if (!r && r.error() == errc::cancelled) co_return;
    if (!r && P.send && P.queue.empty() && !ending_ && !P.fenced && !cfg_.stall) {
      auto ka = net::length_prefixed(wire::encode_keepalive());
      auto s = P.send;
      auto w = co_await s->write(ka);
      if (!w) {
        if (!ending_) stream_lost(j, w.error(), false);
        co_return;
      }
      bytes_sent_ += ka.size();
    }
  }
}

awaitable<result<void>> RoundRunner::paced_write(net::ByteStream& s, BytesView header,
                                                 BytesView payload) {
  if (pacer_.rate <= 0) {
    ST_CO_TRY(co_await s.write(header));
    if (!payload.empty()) ST_CO_TRY(co_await s.write(payload));
    co_return success();
  }
  const std::size_t chunk = std::max<std::size_t>(4096, static_cast<std::size_t>(pacer_.burst));
  std::size_t off = 0;
  bool first = true;
  while (first || off < payload.size()) {
    const std::size_t take = std::min(chunk, payload.size() - off);
    const Duration wait = pacer_.take(take + (first ? header.size() : 0), Clock::now());
    if (wait > Duration::zero()) ST_CO_TRY(co_await sleep_for(wait));
    if (first) ST_CO_TRY(co_await s.write(header));
    if (take > 0) ST_CO_TRY(co_await s.write(payload.subspan(off, take)));
    off += take;
    first = false;
  }
  co_return success();
}

void RoundRunner::InPlace::hold(std::pair<std::uint32_t, std::uint32_t> k) {
  key = k;
  r->receiving_.insert(k);
}

RoundRunner::InPlace::~InPlace() {
  if (key) r->receiving_.erase(*key);
}

awaitable<void> RoundRunner::reader(std::uint32_t j, net::ByteStreamPtr s,
                                    std::shared_ptr<net::BufferedReader> r) {
  auto self = shared_from_this();
  ++readers_;
  struct Done {
    RoundRunner* r;
    ~Done() {
      --r->readers_;
      r->progress_.set();
    }
  } done{this};
  if (!r) r = std::make_shared<net::BufferedReader>(*s);
  for (;;) {
    auto hdr = co_await r->read_length_prefixed(wire::kMaxFrame);
    if (!hdr) {
      if (ending_) co_return;
      if (hdr.error() == errc::closed && r->buffered() == 0)
        stream_ended(j);  // EOF between frames: j has nothing more to say on this stream
      else
        stream_lost(j, hdr.error(), hdr.error() == errc::too_large);
      co_return;
    }
    bytes_received_ += hdr.value().size() + uvarint_size(hdr.value().size());
    p_[j].heard = true;
    core_.on_activity(j, Clock::now());
    auto f = wire::decode_round(hdr.value(), n_);
    if (!f) {
      stream_lost(j, f.error(), true);
      co_return;
    }
    if (std::holds_alternative<wire::Keepalive>(f.value().msg)) continue;
    if (const auto* a = std::get_if<wire::Acct>(&f.value().msg)) {
      auto ok = acct_ ? acct_->on_statement(j, a->statement)
                      : result<void>(make_error(errc::protocol_violation,
                                                "accountability statement in a round without it"));
      acct_event_.set();
      if (!ok) {
        stream_lost(j, ok.error(), true);
        co_return;
      }
      continue;
    }
    if (std::holds_alternative<wire::Hello>(f.value().msg)) {
      stream_lost(j, make_error(errc::protocol_violation, "second hello"), true);
      co_return;
    }
    RoundMessage msg = std::get<RoundMessage>(std::move(f.value().msg));
    if (std::holds_alternative<PartMsg>(msg) && core_.local_pending() && !peer_data_told_ &&
        cfg_.on_peer_data) {
      peer_data_told_ = true;
      cfg_.on_peer_data();
    }
    FloatBuffer buf;
    // An uncompressed result goes straight into the output when the core expects it.
    std::span<float> direct;
    InPlace in_place{this};
    const bool has_data =
        std::holds_alternative<PartMsg>(msg) || std::holds_alternative<ResultMsg>(msg);
    if (has_data) {
      const std::uint64_t len = f.value().payload_len;
      const std::uint64_t max_len = compressed() ? cfg_.codecs->max_payload(cfg_.round.part_elems)
                                                 : cfg_.round.part_elems * sizeof(float);
      if (len > max_len || (!compressed() && len % sizeof(float) != 0)) {
        stream_lost(
            j, make_error(errc::invalid_argument, "payload of " + std::to_string(len) + " bytes"),
            true);
        co_return;
      }
      Bytes raw;
      auto* rm = std::get_if<ResultMsg>(&msg);
      if (rm && !compressed() && !receiving_.contains({rm->subround, rm->part})) {
        direct = core_.result_destination(j, rm->subround, rm->part, len / sizeof(float));
        if (!direct.empty()) in_place.hold({rm->subround, rm->part});
      }
      MutableBytesView dst;
      if (compressed()) {
        raw.resize(len);
        dst = raw;
      } else if (!direct.empty()) {
        dst = MutableBytesView(reinterpret_cast<std::uint8_t*>(direct.data()), len);
      } else {
        buf.resize(len / sizeof(float));
        dst = MutableBytesView(reinterpret_cast<std::uint8_t*>(buf.data()), len);
      }
      for (std::size_t off = 0; off < len; off += kReadChunk) {
        const std::size_t take = std::min<std::size_t>(kReadChunk, len - off);
        auto rd = co_await r->read_exact(dst.subspan(off, take));
        if (!rd) {
          if (!ending_) stream_lost(j, rd.error(), false);
          co_return;
        }
        bytes_received_ += take;
        core_.on_activity(j, Clock::now());
      }
      if (compressed()) {
        DecodeTask task{&raw, cfg_.round.part_elems, &buf, &codec_ns_};
        auto d = co_await pool_.run(task);
        if (!d) {
          stream_lost(j, d.error(), true);
          co_return;
        }
      }
      if (auto* p = std::get_if<PartMsg>(&msg)) p->data = buf;
      if (rm) rm->data = direct.empty() ? std::span<const float>(buf) : direct;
    }
    if (core_.status() != RoundCore::Status::running) continue;
    if (acct_ && has_data) {
      const Bytes& receipt = f.value().receipt;
      auto ok = co_await acct_check(j, msg, receipt);
      if (!ok) {
        stream_lost(j, ok.error(), true);
        co_return;
      }
      if (core_.status() != RoundCore::Status::running) continue;
    }
    auto res = core_.on_message(j, msg, Clock::now(), &buf);
    pump();
    if (!res) co_return;  // the core blamed and fenced j
  }
}

}  // namespace starling::averaging::detail
