// `starling run-key`: the organiser's side of a private run (docs/security.md, "Private runs").
//   new     create the run authority key (an identity file, 0600; keep it offline)
//   sign    sign a membership certificate for a peer id, valid for some days
//   revoke  sign a revocation list (the previous list's entries plus the new ones)
//   show    print a certificate or revocation list and check it against a run key
#include <fstream>
#include <iostream>

#include "cli.hpp"
#include "starling/auth/certificate.hpp"

namespace starling::cli {
namespace {

result<void> write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f ||
      !f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size())))
    return make_error(errc::io, "cannot write " + path);
  return success();
}

int fail(const Error& e) {
  std::cerr << "error: " << e.message() << "\n";
  return 2;
}

std::string when(std::uint64_t unix) {
  return std::to_string(unix) + " (" +
         std::to_string(static_cast<std::int64_t>(unix) -
                        static_cast<std::int64_t>(auth::unix_seconds(WallClock::now()))) +
         " s from now)";
}

struct Args {
  std::string key, out, list, run_key;
  std::vector<std::string> peers;
  double days = 30;
  std::string file;
};

int cmd_new(const Args& a) {
  if (std::ifstream(a.out)) return fail(make_error(errc::already_exists, a.out + " exists"));
  const auto k = crypto::KeyPair::generate();
  if (auto r = crypto::save_identity(a.out, k); !r) return fail(r.error());
  std::cerr << "run authority key written to " << a.out << " (keep it offline)\n";
  std::cout << auth::format_run_key(auth::key32(k.public_key()).value()) << "\n";
  return 0;
}

int cmd_sign(const Args& a) {
  auto key = load_identity_or_exit(a.key, false);
  if (!(a.days > 0 && a.days <= 36500)) return fail(make_error(errc::invalid_argument, "--days"));
  auto peer = net::PeerId::from_string(a.peers.front());
  if (!peer) return fail(peer.error().with_context("--peer"));
  auto member = auth::member_key(peer.value());
  if (!member) return fail(member.error());
  const auto now = auth::unix_seconds(WallClock::now());
  auto c = auth::sign_certificate(key, member.value(), now,
                                  now + static_cast<std::uint64_t>(a.days * 86400));
  if (!c) return fail(c.error());
  if (auto w = write_file(a.out, auth::encode(c.value())); !w) return fail(w.error());
  std::cerr << "certificate for " << peer.value().to_string() << " expires "
            << when(c.value().expires_at) << ", written to " << a.out << "\n";
  return 0;
}

int cmd_revoke(const Args& a) {
  auto key = load_identity_or_exit(a.key, false);
  const auto run = auth::key32(key.public_key()).value();
  std::vector<auth::Revocation> entries;
  std::uint64_t seq = 1;
  if (!a.list.empty()) {
    auto b = read_small_file(a.list);
    if (!b) return fail(b.error());
    auto l = auth::decode_revocations(b.value());
    if (!l) return fail(l.error().with_context(a.list));
    if (l.value().run_key != run || !auth::signature_valid(l.value()))
      return fail(make_error(errc::invalid_argument, a.list + ": not signed by this run key"));
    entries = l.value().entries;
    seq = l.value().sequence + 1;
  }
  const auto now = auth::unix_seconds(WallClock::now());
  for (const auto& p : a.peers) {
    auto peer = net::PeerId::from_string(p);
    if (!peer) return fail(peer.error().with_context("--peer " + p));
    auto member = auth::member_key(peer.value());
    if (!member) return fail(member.error());
    entries.push_back({member.value(), now});
  }
  auto l = auth::sign_revocations(key, seq, now, std::move(entries));
  if (!l) return fail(l.error());
  if (auto w = write_file(a.out, auth::encode(l.value())); !w) return fail(w.error());
  std::cerr << "revocation list " << seq << " (" << l.value().entries.size()
            << " revoked) written to " << a.out
            << "; give it to a member (starling train --revocations) to publish it\n";
  return 0;
}

int cmd_show(const Args& a) {
  auto b = read_small_file(a.file);
  if (!b) return fail(b.error());
  std::optional<auth::Key32> run;
  if (!a.run_key.empty()) {
    auto k = auth::parse_run_key(a.run_key);
    if (!k) return fail(k.error());
    run = k.value();
  }
  const auto now = auth::unix_seconds(WallClock::now());
  if (auto c = auth::decode_certificate(b.value())) {
    const auto& x = c.value();
    const auto r = auth::check_certificate(x, run.value_or(x.run_key), x.member, now, nullptr);
    std::cout << "membership certificate\n  run key: " << auth::format_run_key(x.run_key)
              << "\n  member:  "
              << net::PeerId::from_public_key(auth::public_key(x.member)).to_string()
              << "\n  issued:  " << when(x.issued_at) << "\n  expires: " << when(x.expires_at)
              << "\n  check:   " << auth::refusal_name(r) << "\n";
    return r == auth::Refusal::none ? 0 : 1;
  }
  auto l = auth::decode_revocations(b.value());
  if (!l)
    return fail(make_error(errc::invalid_argument,
                           a.file + ": neither a certificate nor a revocation list"));
  const auto& x = l.value();
  const bool ok = auth::signature_valid(x) && (!run || *run == x.run_key);
  std::cout << "revocation list " << x.sequence
            << "\n  run key: " << auth::format_run_key(x.run_key)
            << "\n  issued:  " << when(x.issued_at) << "\n  check:   " << (ok ? "valid" : "INVALID")
            << "\n";
  for (const auto& e : x.entries)
    std::cout << "  revoked: "
              << net::PeerId::from_public_key(auth::public_key(e.member)).to_string()
              << " (certificates issued up to " << e.revoked_at << ")\n";
  return ok ? 0 : 1;
}

}  // namespace

void add_run_key_command(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("run-key",
                                 "private runs: the run authority key, membership "
                                 "certificates and revocations (docs/security.md)");
  cmd->require_subcommand(1);
  auto a = std::make_shared<Args>();
  auto* n = cmd->add_subcommand("new", "create a run authority key file; prints the run key");
  n->add_option("--out,-o", a->out, "key file to create")->required();
  n->callback([&run, a] { run = [a] { return cmd_new(*a); }; });

  auto* s = cmd->add_subcommand("sign", "sign a membership certificate for a peer id");
  s->add_option("--key,-k", a->key, "run authority key file")->required();
  s->add_option("--peer,-p", a->peers, "the member's peer id (starling id)")
      ->required()
      ->expected(1);
  s->add_option("--days", a->days, "validity in days")->capture_default_str();
  s->add_option("--out,-o", a->out, "certificate file to write")->required();
  s->callback([&run, a] { run = [a] { return cmd_sign(*a); }; });

  auto* r = cmd->add_subcommand("revoke", "sign a revocation list revoking peer ids");
  r->add_option("--key,-k", a->key, "run authority key file")->required();
  r->add_option("--peer,-p", a->peers, "peer ids to revoke")->required();
  r->add_option("--list", a->list, "the previous list (its entries are kept, sequence + 1)");
  r->add_option("--out,-o", a->out, "revocation list file to write")->required();
  r->callback([&run, a] { run = [a] { return cmd_revoke(*a); }; });

  auto* w = cmd->add_subcommand("show", "print a certificate or revocation list");
  w->add_option("file", a->file, "certificate or revocation list")->required();
  w->add_option("--run-key", a->run_key, "check against this run key");
  w->callback([&run, a] { run = [a] { return cmd_show(*a); }; });
}

}  // namespace starling::cli
