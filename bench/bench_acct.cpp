// The accountability work of one member in one all-reduce round (accountability.hpp), timed
// beside the work the round already does in the same run: the owner's reduction of its part
// (weighted mean and CenteredClip over the group's values) and a copy of the vector.
//   bench_acct [floats=4194304] [members=7] [repeats=5]
// Per member and round: hash its parts, sign its commitment and a receipt per part; as an
// owner, verify the receipts and hash the parts it gets, hash and sign its result, recompute
// every member's projection; as a member, verify and hash every result, project its values
// on z for every part, sign its reports, verify everyone's reports and check every part.
// Also prints the bytes of the statements beside the bytes of parts and results it sends.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "starling/averaging/accountability.hpp"
#include "starling/averaging/robust.hpp"

using namespace starling;
using namespace starling::averaging;
using namespace starling::averaging::acct;
using Clk = std::chrono::steady_clock;

namespace {

double ms_since(Clk::time_point t) {
  return std::chrono::duration<double, std::milli>(Clk::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t N = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4194304;
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 7;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  const std::size_t per = N / n;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<std::vector<float>> g(n, std::vector<float>(N));
  for (auto& v : g)
    for (auto& x : v) x = nd(rng);
  std::vector<crypto::KeyPair> keys;
  RoundInfo info;
  info.context = to_bytes("bench");
  for (std::size_t i = 0; i < n; ++i) {
    keys.push_back(crypto::KeyPair::generate());
    info.members.push_back(key_of(keys.back()));
  }
  const Hash32 rid = round_id(info);
  auto part = [&](std::size_t i, std::size_t p) {
    return std::span<const float>(g[i].data() + p * per, per);
  };
  std::vector<float> result(per), copy(N);
  std::vector<std::span<const float>> inputs;
  for (std::size_t i = 0; i < n; ++i) inputs.push_back(part(i, 0));
  const std::vector<double> w(n, 1.0);
  AggregationConfig clip;
  clip.kind = Aggregation::centered_clip;

  std::vector<double> t_mean, t_clip, t_copy, t_acct;
  std::size_t stmt_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t = Clk::now();
    std::memcpy(copy.data(), g[0].data(), N * 4);
    t_copy.push_back(ms_since(t));

    t = Clk::now();
    for (std::size_t j = 0; j < per; ++j) {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += inputs[i][j];
      result[j] = static_cast<float>(s / static_cast<double>(n));
    }
    t_mean.push_back(ms_since(t));

    t = Clk::now();
    centered_clip(result, inputs, w, clip);
    t_clip.push_back(ms_since(t));

    // Member 0's accountability work (as sender, owner of part 0 and member).
    t = Clk::now();
    stmt_bytes = 0;
    Commitment c;
    c.round = rid;
    for (std::size_t p = 0; p < n; ++p) c.parts.push_back(hash_floats(part(0, p)));
    sign(c, keys[0]);
    stmt_bytes += encode(c).size() * (n - 1);
    for (std::size_t p = 1; p < n; ++p) {
      DataReceipt pr;
      pr.round = rid;
      pr.part = static_cast<std::uint32_t>(p);
      pr.data_hash = c.parts[p];
      sign(pr, keys[0]);
      stmt_bytes += encode(pr).size();
    }
    // Owner of part 0: receipts from the others (signed here, verified as they would be).
    for (std::size_t s = 1; s < n; ++s) {
      DataReceipt pr;
      pr.round = rid;
      pr.signer = static_cast<std::uint32_t>(s);
      pr.data_hash = hash_floats(part(s, 0));
      sign(pr, keys[s]);
      if (!check_part(pr, rid, 0, 0, static_cast<std::uint32_t>(s), info.members[s], part(s, 0)))
        return 1;
    }
    DataReceipt rr;
    rr.kind = DataKind::result;
    rr.round = rid;
    rr.data_hash = hash_floats(result);
    sign(rr, keys[0]);
    stmt_bytes += encode(rr).size() * (n - 1);
    Hash32 seed{};
    std::vector<ProjectionReport> reports;
    for (std::size_t p = 0; p < n; ++p) {  // results of the other owners: verify, hash
      if (p > 0 && (!verify_sig(rr) || hash_floats(result) != rr.data_hash)) return 1;
      ProjectionReport rp;
      rp.round = rid;
      rp.part = static_cast<std::uint32_t>(p);
      const auto pj = project(seed, 0, static_cast<std::uint32_t>(p), part(0, p), result);
      rp.proj = pj.proj;
      rp.dist = pj.dist;
      sign(rp, keys[0]);
      stmt_bytes += encode(rp).size() * (n - 1);
      reports.push_back(rp);
    }
    for (std::size_t s = 1; s < n; ++s)  // as owner: everyone's projection on part 0
      (void)project(seed, 0, 0, part(s, 0), result);
    for (std::size_t k = 0; k < n * n; ++k)  // everyone's reports
      if (!verify_sig(reports[k % n])) return 1;
    for (std::size_t p = 0; p < n; ++p)
      (void)check_fixed_point(reports, true, 1.0, 1.0, CheckConfig{});
    t_acct.push_back(ms_since(t));
  }
  const double parts_bytes =
      2.0 * static_cast<double>(N) * 4.0 * static_cast<double>(n - 1) / static_cast<double>(n);
  std::printf("floats %zu members %zu repeats %d (medians)\n", N, n, repeats);
  std::printf("anchor copy of the vector        %8.2f ms\n", median(t_copy));
  std::printf("anchor owner's mean of its part  %8.2f ms\n", median(t_mean));
  std::printf("anchor owner's CenteredClip      %8.2f ms\n", median(t_clip));
  std::printf("accountability work per member   %8.2f ms  (x%.2f CenteredClip, x%.2f mean)\n",
              median(t_acct), median(t_acct) / median(t_clip), median(t_acct) / median(t_mean));
  std::printf("statement bytes sent per member  %8zu B   (%.5f%% of the %.0f B of parts+results)\n",
              stmt_bytes, 100.0 * static_cast<double>(stmt_bytes) / parts_bytes, parts_bytes);
  return 0;
}
