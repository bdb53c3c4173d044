// The built-in transformer-block expert: served remotely on sequences, its forward, input
// gradients and optimizer step match the same block run locally.
#include <gtest/gtest.h>

#include "moe/moe_env.hpp"

namespace starling::moe {
namespace {

using namespace test;

constexpr std::int64_t kSeq = 5, kModel = 16, kFfn = 32, kHeads = 2;

TEST(MoeTransformerExpert, RemoteMatchesLocalOnSequences) {
  Env env;
  const std::string uid = "block.0";
  auto server = ExpertServer::create(env.cluster->host_ptr(1), nullptr, server_config());
  ASSERT_TRUE(server->add_expert(uid, make_transformer_expert(kModel, kFfn, kSeq, kHeads, 7),
                                 sgd_factory(kLr)));
  ASSERT_TRUE(block_on(
      env.io.executor(), [server] { return server->start(); }, 30s));
  auto local = make_transformer_expert(kModel, kFfn, kSeq, kHeads, 7);
  EXPECT_EQ(local.type, "transformer");
  RemoteExpert remote(env.cluster->host_ptr(2), env.address(1, uid));
  auto schema = remote.info();
  ASSERT_TRUE(schema) << schema.error().message();
  EXPECT_EQ(schema.value().input_shape, (std::vector<std::int64_t>{kSeq, kModel}));
  EXPECT_EQ(schema.value().expert_type, "transformer");

  torch::manual_seed(9);
  auto x = torch::randn({3, kSeq, kModel});
  // Attention mixes positions: position 0 of a sequence depends on the others.
  {
    torch::NoGradGuard ng;
    auto x2 = x.clone();
    x2.index_put_({0, kSeq - 1}, torch::randn({kModel}));
    EXPECT_FALSE(torch::allclose(local.forward(x2).index({0, 0}), local.forward(x).index({0, 0})));
  }
  expect_remote_matches_local(remote, local, x, torch::randn({3, kSeq, kModel}));
  torch::optim::SGD opt(local.parameters->parameters(), torch::optim::SGDOptions(kLr));
  opt.step();
  EXPECT_EQ(server->stats().optimizer_steps.load(), 1u);
  expect_params_close(*server->module_of(uid), *local.parameters, "after one step");

  // A sequence of the wrong length is refused with the schema in the message.
  EXPECT_THROW(remote.forward(torch::randn({1, kSeq + 1, kModel})), std::runtime_error);
  env.stop(server);
}

TEST(MoeTransformerExpert, BuiltinByNameChecksItsArguments) {
  auto m = make_builtin_expert("transformer", 16, 32, 1, 4, 0);
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ(m.value().input_shape, (std::vector<std::int64_t>{4, 16}));
  EXPECT_EQ(m.value().forward(torch::randn({2, 4, 16})).sizes(), (torch::IntArrayRef{2, 4, 16}));
  auto bad_heads = make_builtin_expert("transformer", 16, 32, 1, 4, 3);
  ASSERT_FALSE(bad_heads);
  EXPECT_NE(bad_heads.error().message().find("heads"), std::string::npos);
  EXPECT_FALSE(make_builtin_expert("transformer", 16, 32, 1, 0, 0));
  auto unknown = make_builtin_expert("lstm", 16, 32, 1);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.error().message().find("transformer"), std::string::npos);
}

}  // namespace
}  // namespace starling::moe
