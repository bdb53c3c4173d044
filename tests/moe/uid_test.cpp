// Expert uid parsing, pattern expansion and declaration prefixes.
#include <gtest/gtest.h>

#include "starling/moe/uid.hpp"

namespace starling::moe {
namespace {

TEST(MoeUid, ParsesAndPrints) {
  auto u = parse_uid("ffn.3.17");
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u.value().grid, "ffn");
  EXPECT_EQ(u.value().coords, (std::vector<std::uint32_t>{3, 17}));
  EXPECT_EQ(u.value().to_string(), "ffn.3.17");
  EXPECT_EQ(u.value().prefix(0), "ffn.");
  EXPECT_EQ(u.value().prefix(1), "ffn.3.");
  EXPECT_EQ(u.value().prefix(2), "ffn.3.17.");
}

TEST(MoeUid, RejectsBadUids) {
  for (const char* bad :
       {"", "ffn", "ffn.", ".3", "ffn..3", "ffn.3.", "ffn.-1", "ffn.x", "f n.1", "ffn.1048576",
        "ffn.99999999999", "ffn.1.2.3.4.5.6.7.8.9", "ffn.+1", "ffn. 1"}) {
    auto u = parse_uid(bad);
    EXPECT_FALSE(u) << "accepted '" << bad << "'";
    if (!u) {
      EXPECT_EQ(u.error(), Error(errc::invalid_argument)) << bad;
    }
  }
  EXPECT_TRUE(parse_uid("ffn.1048575"));
  EXPECT_TRUE(parse_uid("a_b-C9.0.1.2.3.4.5.6.7"));
  EXPECT_FALSE(parse_uid(std::string(65, 'g') + ".1"));
}

TEST(MoeUid, ExpandsPatternsRowMajor) {
  auto r = expand_pattern("ffn.[0:4].[0:4]");
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r.value().size(), 16u);
  EXPECT_EQ(r.value().front().to_string(), "ffn.0.0");
  EXPECT_EQ(r.value()[1].to_string(), "ffn.0.1");
  EXPECT_EQ(r.value()[4].to_string(), "ffn.1.0");
  EXPECT_EQ(r.value().back().to_string(), "ffn.3.3");

  auto m = expand_pattern("ffn.[1:3].7");
  ASSERT_TRUE(m);
  ASSERT_EQ(m.value().size(), 2u);
  EXPECT_EQ(m.value()[0].to_string(), "ffn.1.7");
  EXPECT_EQ(m.value()[1].to_string(), "ffn.2.7");

  auto one = expand_pattern("ffn.1.2");
  ASSERT_TRUE(one);
  ASSERT_EQ(one.value().size(), 1u);
  EXPECT_EQ(one.value()[0].to_string(), "ffn.1.2");

  auto d1 = expand_pattern("x.[5:8]");
  ASSERT_TRUE(d1);
  ASSERT_EQ(d1.value().size(), 3u);
  EXPECT_EQ(d1.value()[2].to_string(), "x.7");
}

TEST(MoeUid, RejectsBadPatterns) {
  for (const char* bad :
       {"", "ffn", "ffn.[0:4", "ffn.0:4]", "ffn.[04]", "ffn.[4:4]", "ffn.[5:2]", "ffn.[a:3]",
        "ffn.[0:]", "ffn.[:3]", "ffn.[]", "ffn.[", "ffn.]", "ffn.[0:1048577]", "ffn.[0:4].",
        "ffn.[0:300].[0:300]", "ffn.[0:2].[0:2].[0:2].[0:2].[0:2].[0:2].[0:2].[0:2].[0:2]",
        "ffn.[0:4:1]", "ffn.[-1:2]"}) {
    auto r = expand_pattern(bad);
    EXPECT_FALSE(r) << "accepted '" << bad << "'";
  }
  EXPECT_TRUE(expand_pattern("ffn.[0:256].[0:256]"));  // exactly 65536
}

TEST(MoeUid, DeclarationPrefixes) {
  auto u = parse_uid("ffn.3.17").value();
  auto p = declaration_prefixes(u);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].prefix, "ffn.");
  EXPECT_EQ(p[0].coordinate, 3u);
  EXPECT_FALSE(p[0].leaf);
  EXPECT_EQ(p[1].prefix, "ffn.3.");
  EXPECT_EQ(p[1].coordinate, 17u);
  EXPECT_TRUE(p[1].leaf);
}

}  // namespace
}  // namespace starling::moe
