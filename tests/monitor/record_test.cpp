// Metrics records: encode/decode round trip, every field's validation, size limit, names,
// keys and sub-keys, and the DHT validators' refusal of forged records.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>

#include "starling/dht/signing.hpp"
#include "starling/dht/validator.hpp"
#include "starling/monitor/metrics_record.hpp"
#include "starling/pb/monitor.pb.h"

using namespace starling;
using namespace starling::monitor;

namespace {

MetricsRecord sample() {
  MetricsRecord r;
  r.name = "alice's laptop";
  r.version = software_version();
  r.epoch = 42;
  r.loss = 0.6931;
  r.samples_per_second = 812.5;
  r.samples_total = 1'234'567;
  r.uptime_s = 3600.5;
  r.bytes_sent = 987'654'321;
  r.bytes_received = 123'456'789;
  r.reachability = Reachability::client;
  r.rounds_ok = 40;
  r.rounds_failed = 2;
  r.state_downloads = 1;
  r.averaging_s = 120.25;
  r.target_batch_size = 4096;
  r.samples_accumulated = 1024;
  r.seq = 17;
  r.ttl_ms = 60'000;
  r.window_s = 10;
  r.eval = MetricsRecord::Eval{0.8612, 0.3901, 40};
  r.task = "fashion mlp s0 adam";
  return r;
}

struct Owner {
  crypto::KeyPair key = crypto::KeyPair::generate();
  net::PeerId peer = net::PeerId::from_public_key(key.public_key());
};

}  // namespace

TEST(MonitorRecord, RoundTripsAndStaysSmall) {
  const auto r = sample();
  auto bytes = encode_metrics(r);
  ASSERT_TRUE(bytes) << bytes.error().message();
  EXPECT_LE(bytes.value().size(), 512u);
  auto back = decode_metrics(bytes.value());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value(), r);
  // The largest record (longest name and version, every counter at its limit) still fits.
  MetricsRecord big = r;
  big.name = std::string(32, 'n');
  big.version = std::string(32, 'v');
  big.task = std::string(128, 't');
  big.eval->perplexity = MetricsLimits{}.max_perplexity;
  big.epoch = big.samples_total = big.bytes_sent = big.bytes_received = big.rounds_ok =
      big.rounds_failed = big.state_downloads = big.target_batch_size = big.samples_accumulated =
          big.seq = MetricsLimits{}.max_count;
  auto big_bytes = encode_metrics(big);
  ASSERT_TRUE(big_bytes) << big_bytes.error().message();
  EXPECT_LE(big_bytes.value().size(), 512u);
  std::cout << "metrics record: " << bytes.value().size() << " bytes typical, "
            << big_bytes.value().size() << " bytes at every limit\n";
  // No loss (an auxiliary peer) round-trips as no loss.
  MetricsRecord no_loss = r;
  no_loss.loss.reset();
  no_loss.eval.reset();
  EXPECT_EQ(decode_metrics(encode_metrics(no_loss).value()).value(), no_loss);
}

TEST(MonitorRecord, ValidatesEveryField) {
  auto bad = [](auto change) {
    MetricsRecord r = sample();
    change(r);
    return !validate_metrics(r) && !encode_metrics(r);
  };
  EXPECT_TRUE(bad([](auto& r) { r.name = std::string(33, 'x'); }));
  EXPECT_TRUE(bad([](auto& r) { r.name = "tab\there"; }));
  EXPECT_TRUE(bad([](auto& r) { r.name = "nul" + std::string(1, '\0'); }));
  EXPECT_TRUE(bad([](auto& r) { r.name = "\xff\xfe"; }));
  EXPECT_TRUE(bad([](auto& r) { r.name = "\xc0\xaf"; }));  // overlong '/'
  EXPECT_TRUE(bad([](auto& r) {
    r.name =
        "\xe2\x80\xae"
        "evil";
  }));  // right-to-left override
  EXPECT_TRUE(bad([](auto& r) { r.version = std::string(40, 'v'); }));
  EXPECT_TRUE(bad([](auto& r) { r.loss = std::nan(""); }));
  EXPECT_TRUE(bad([](auto& r) { r.loss = INFINITY; }));
  EXPECT_TRUE(bad([](auto& r) { r.loss = 1e12; }));
  EXPECT_TRUE(bad([](auto& r) { r.samples_per_second = -1; }));
  EXPECT_TRUE(bad([](auto& r) { r.samples_per_second = 1e10; }));
  EXPECT_TRUE(bad([](auto& r) { r.uptime_s = std::nan(""); }));
  EXPECT_TRUE(bad([](auto& r) { r.averaging_s = -0.5; }));
  EXPECT_TRUE(bad([](auto& r) { r.window_s = 1e11; }));
  EXPECT_TRUE(bad([](auto& r) { r.samples_total = ~std::uint64_t{0}; }));
  EXPECT_TRUE(bad([](auto& r) { r.bytes_sent = ~std::uint64_t{0}; }));
  EXPECT_TRUE(bad([](auto& r) { r.ttl_ms = 48ull * 3600 * 1000; }));
  EXPECT_TRUE(bad([](auto& r) { r.reachability = static_cast<Reachability>(7); }));
  EXPECT_TRUE(bad([](auto& r) { r.eval->accuracy = 1.5; }));
  EXPECT_TRUE(bad([](auto& r) { r.eval->loss = std::nan(""); }));
  // Markup is allowed in a name (it is text): the page shows it as text.
  EXPECT_FALSE(bad([](auto& r) { r.name = "<script>alert(1)</script>"; }));
  EXPECT_FALSE(bad([](auto& r) { r.name = "Zoë 🚀"; }));
}

TEST(MonitorRecord, DecoderRejectsHostileBytes) {
  EXPECT_EQ(decode_metrics(Bytes(513, 0)).error(), errc::too_large);
  EXPECT_FALSE(decode_metrics(to_bytes("\xff\xff\xff")));
  // Wrong format number, unknown reachability, a loss without has_loss, a NaN.
  auto with = [](auto change) {
    pb::monitor::Metrics m;
    m.set_format(kMetricsFormat);
    change(m);
    Bytes b(m.ByteSizeLong());
    m.SerializeToArray(b.data(), static_cast<int>(b.size()));
    return b;
  };
  EXPECT_TRUE(decode_metrics(with([](auto&) {})));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_format(2); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_reachability(9); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_loss(1.5); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_eval_accuracy(0.5); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_samples_per_second(std::nan("")); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_name(std::string(100, 'a')); })));
  EXPECT_FALSE(decode_metrics(with([](auto& m) { m.set_name("bell\a"); })));
  // Oversized by padding with an unknown field: refused before parsing.
  Bytes padded = with([](auto&) {});
  for (std::uint8_t b : {0x9a, 0x06, 0xd8, 0x04}) padded.push_back(b);  // field 99, 600 bytes
  padded.resize(padded.size() + 600, 'x');
  EXPECT_EQ(decode_metrics(padded).error(), errc::too_large);
}

TEST(MonitorRecord, SanitizesNames) {
  EXPECT_EQ(sanitize_name("alice\n\t"), "alice");
  EXPECT_EQ(sanitize_name(std::string(50, 'a')), std::string(32, 'a'));
  EXPECT_EQ(sanitize_name("a\xff"
                          "b"),
            "a?b");
  // Cut on a character boundary: 11 x "é" (2 bytes) = 22 bytes; limit 5 keeps two.
  std::string e;
  for (int i = 0; i < 11; ++i) e += "\xc3\xa9";
  EXPECT_EQ(sanitize_name(e, 5), "\xc3\xa9\xc3\xa9");
  EXPECT_TRUE(validate_metrics([&] {
    auto r = sample();
    r.name = sanitize_name("x\x01y\xe2\x80\xaez" + std::string(60, 'q'));
    return r;
  }()));
}

TEST(MonitorRecord, KeysAndOwnedSubKeys) {
  Owner a, b;
  EXPECT_EQ(metrics_key("run").raw(), metrics_key("run").raw());
  EXPECT_NE(metrics_key("run").raw(), metrics_key("run2").raw());
  auto owner = metrics_owner(metrics_subkey(a.peer));
  ASSERT_TRUE(owner);
  EXPECT_EQ(owner.value(), a.peer);
  EXPECT_FALSE(metrics_owner(dht::SubKey::from_string("metrics")));
  EXPECT_FALSE(metrics_owner(dht::SubKey::from_string("progress" + dht::owner_marker(a.peer))));
  EXPECT_FALSE(metrics_owner(
      dht::SubKey::from_string("metrics" + dht::owner_marker(a.peer) + dht::owner_marker(b.peer))));
}

TEST(MonitorRecord, TheDhtRefusesForgedRecords) {
  Owner a, b;
  const auto key = metrics_key("run");
  const auto wall = dht::WallTime(std::chrono::seconds(1'700'000'000));
  const dht::ValidationContext ctx{wall, std::chrono::minutes(10)};
  const auto version = static_cast<std::uint64_t>(dht::wall_micros(wall));
  const auto value = encode_metrics(sample()).value();
  auto chain = dht::ValidatorChain::standard();
  // The owner's own record passes, with its ttl.
  auto good = dht::make_signed_record(a.key, key, metrics_subkey(a.peer), value,
                                      dht::Millis(60'000), version);
  EXPECT_TRUE(chain.validate(key, good, ctx));
  // B writing A's sub-key: signed with B's key, or unsigned, or A's signature moved to
  // another value: all refused.
  auto forged = dht::make_signed_record(b.key, key, metrics_subkey(a.peer), value,
                                        dht::Millis(60'000), version);
  EXPECT_FALSE(chain.validate(key, forged, ctx));
  auto unsigned_rec = good;
  unsigned_rec.body.signature.clear();
  EXPECT_FALSE(chain.validate(key, unsigned_rec, ctx));
  auto moved = good;
  moved.body.value = encode_metrics([] {
                       auto r = sample();
                       r.samples_total = 999'999'999;
                       return r;
                     }())
                         .value();
  EXPECT_FALSE(chain.validate(key, moved, ctx));
  // Expired (signed far in the past) records are refused too.
  auto old = dht::make_signed_record(a.key, key, metrics_subkey(a.peer), value, dht::Millis(60'000),
                                     version - std::uint64_t{3600} * 1'000'000);
  EXPECT_FALSE(chain.validate(key, old, ctx));
}

TEST(MonitorRecord, CarriesTheTaskAndHeldOutPerplexity) {
  auto r = sample();
  r.task = "lm tiny s0 wn:d6214f1f bpe:67d9e5a27714b147 lamb wd0.01 clip1 wu5 dc60";
  r.eval->perplexity = 206.6;
  auto back = decode_metrics(encode_metrics(r).value());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back.value().task, r.task);
  ASSERT_TRUE(back.value().eval->perplexity);
  EXPECT_DOUBLE_EQ(*back.value().eval->perplexity, 206.6);
  // Refused: an overlong or control-character task, a negative or infinite perplexity.
  auto bad = r;
  bad.task = std::string(129, 't');
  EXPECT_FALSE(encode_metrics(bad));
  bad.task = "lm\x01";
  EXPECT_FALSE(encode_metrics(bad));
  bad = r;
  bad.eval->perplexity = -1;
  EXPECT_FALSE(encode_metrics(bad));
  bad.eval->perplexity = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(encode_metrics(bad));
}
