// net/policy: canonical names, IP literal spellings, allowlist matching, refused address ranges.
#include "net/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace agentbox::net {
namespace {

namespace ip = boost::asio::ip;

Policy policy(std::vector<std::string> allow) {
  auto p = Policy::parse(allow);
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return p ? *p : Policy{};
}

// The verdict for `host` as a box would spell it: "ok", or the refusal message.
std::string verdict(const Policy& p, std::string_view host, uint16_t port = 443) {
  auto c = canonical_host(host);
  if (!c) return "invalid: " + c.error().message;
  auto ok = p.check(*c, port);
  return ok ? "ok" : ok.error().message;
}

TEST(CanonicalHostTest, CaseTrailingDotAndIdna) {
  EXPECT_EQ(canonical_host("EXAMPLE.test.")->name, "example.test");
  EXPECT_EQ(canonical_host("Example.Test")->name, "example.test");
  EXPECT_EQ(canonical_host("bücher.example")->name, "xn--bcher-kva.example");
  EXPECT_EQ(canonical_host("BÜCHER.example")->name, "xn--bcher-kva.example");
  // Fullwidth dot (U+FF0E) is a label separator after UTS #46 mapping.
  EXPECT_EQ(canonical_host("example\xEF\xBC\x8Etest")->name, "example.test");
  EXPECT_FALSE(canonical_host(""));
  EXPECT_FALSE(canonical_host("a..b"));
  EXPECT_FALSE(canonical_host("."));
  EXPECT_FALSE(canonical_host("exa mple.test"));
  EXPECT_FALSE(canonical_host("example.test%00"));
  EXPECT_FALSE(canonical_host("ex*ample.test"));
  EXPECT_FALSE(canonical_host(std::string(64, 'a') + ".test"));
  EXPECT_FALSE(canonical_host("1.2.3.09")) << "numeric last label";
}

TEST(CanonicalHostTest, IpLiteralsInEverySpellingAreIps) {
  for (const char* s : {"127.0.0.1", "127.1", "0x7f.0.0.1", "0x7F.1", "2130706433", "0177.0.0.1",
                        "0x7f000001", "127.0.0.1.", "017700000001", "127.0.1"}) {
    auto c = canonical_host(s);
    ASSERT_TRUE(c) << s;
    ASSERT_TRUE(c->ip) << s;
    EXPECT_EQ(c->name, "127.0.0.1") << s;
  }
  auto m = canonical_host("[::ffff:127.0.0.1]");
  ASSERT_TRUE(m && m->ip);
  EXPECT_EQ(m->name, "127.0.0.1");
  auto v6 = canonical_host("[::1]");
  ASSERT_TRUE(v6 && v6->ip);
  EXPECT_EQ(v6->name, "::1");
  auto meta = canonical_host("0xa9.0xfe.0xa9.0xfe");
  ASSERT_TRUE(meta && meta->ip);
  EXPECT_EQ(meta->name, "169.254.169.254");
  // Fullwidth digits map to an IP literal too.
  auto fw = canonical_host("\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x97.0.0.1");
  ASSERT_TRUE(fw && fw->ip);
  EXPECT_EQ(fw->name, "127.0.0.1");
  EXPECT_FALSE(canonical_host("[fe80::1%eth0]"));
  EXPECT_FALSE(canonical_host("cafe.test")->ip);
}

TEST(AllowEntryTest, MalformedEntriesAreErrorsNamingThem) {
  for (const char* bad : {"", "*", "*.", "a.*.test", "example.test:", "example.test:0",
                          "example.test:65536", "example.test:http", "exa mple.test", "::1",
                          "*.127.0.0.1", "[::1", "a..test", "https://example.test"}) {
    auto p = Policy::parse({"ok.test", bad});
    ASSERT_FALSE(p) << bad;
    EXPECT_EQ(p.error().code, Code::kInvalid);
    EXPECT_NE(p.error().message.find("\"" + std::string(bad) + "\""), std::string::npos)
        << p.error().message;
  }
  auto e = parse_allow_entry("*.Example.ORG:8443");
  ASSERT_TRUE(e);
  EXPECT_TRUE(e->wildcard);
  EXPECT_EQ(e->name, "example.org");
  EXPECT_EQ(e->port, 8443);
}

TEST(PolicyTest, ExactNamesWildcardsAndLookalikes) {
  Policy p = policy({"example.test", "*.pkg.test"});
  EXPECT_EQ(verdict(p, "example.test"), "ok");
  EXPECT_EQ(verdict(p, "EXAMPLE.test."), "ok");
  EXPECT_EQ(verdict(p, "files.pkg.test"), "ok");
  EXPECT_EQ(verdict(p, "a.b.pkg.test"), "ok");
  EXPECT_EQ(verdict(p, "pkg.test"), "pkg.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "evil-pkg.test"), "evil-pkg.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "evil-example.test"), "evil-example.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "example.test.evil.test"), "example.test.evil.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "pkg.test.evil.test"), "pkg.test.evil.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "sub.example.test"), "sub.example.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "xpkg.test"), "xpkg.test is not in the allowlist");
}

TEST(PolicyTest, IpLiteralsAreRefusedUnlessListed) {
  Policy p = policy({"example.test"});
  for (const char* s :
       {"127.0.0.1", "127.1", "0x7f.0.0.1", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]"}) {
    EXPECT_EQ(verdict(p, s), "IP address 127.0.0.1 is not in the allowlist") << s;
  }
  EXPECT_EQ(verdict(p, "[::1]"), "IP address [::1] is not in the allowlist");
  Policy listed = policy({"203.0.113.7", "[2001:db8::7]:8443"});
  EXPECT_EQ(verdict(listed, "203.0.113.7"), "ok");
  EXPECT_EQ(verdict(listed, "0xcb.0.0x71.7"), "ok");
  EXPECT_EQ(verdict(listed, "[::ffff:203.0.113.7]"), "ok");
  EXPECT_EQ(verdict(listed, "[2001:db8:0::7]", 8443), "ok");
  EXPECT_EQ(verdict(listed, "203.0.113.8"), "IP address 203.0.113.8 is not in the allowlist");
}

TEST(PolicyTest, DefaultPortsAndHostPortEntriesWidenThem) {
  Policy p = policy({"example.test", "mirror.test:8443"});
  EXPECT_EQ(verdict(p, "example.test", 80), "ok");
  EXPECT_EQ(verdict(p, "example.test", 443), "ok");
  EXPECT_EQ(verdict(p, "example.test", 22), "port 22 of example.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "example.test", 8443), "port 8443 of example.test is not in the allowlist");
  EXPECT_EQ(verdict(p, "mirror.test", 8443), "ok");
  EXPECT_EQ(verdict(p, "mirror.test", 443), "ok");
  EXPECT_EQ(verdict(p, "mirror.test", 8080), "port 8080 of mirror.test is not in the allowlist");
}

TEST(PolicyTest, EmptyAllowlistRefusesEverything) {
  Policy p = policy({});
  EXPECT_EQ(verdict(p, "example.test"), "example.test is not in the allowlist");
}

TEST(SplitHostPortTest, Authorities) {
  EXPECT_EQ(split_host_port("example.test:443", std::nullopt)->port, 443);
  EXPECT_EQ(split_host_port("example.test", 80)->port, 80);
  EXPECT_EQ(split_host_port("[::1]:8443", std::nullopt)->host, "[::1]");
  EXPECT_EQ(split_host_port("[::1]:8443", std::nullopt)->port, 8443);
  EXPECT_FALSE(split_host_port("::1:443", std::nullopt));
  EXPECT_FALSE(split_host_port(":443", std::nullopt));
  EXPECT_FALSE(split_host_port("example.test:99999", std::nullopt));
  EXPECT_FALSE(split_host_port("example.test:+443", std::nullopt));
}

std::string refused(const char* a, bool allow_private = false) {
  return refused_address(ip::make_address(a), allow_private).value_or("public");
}

TEST(RefusedAddressTest, LoopbackLinkLocalAndReservedAlways) {
  EXPECT_EQ(refused("127.0.0.1"), "loopback (127.0.0.0/8)");
  EXPECT_EQ(refused("127.255.1.2", true), "loopback (127.0.0.0/8)");
  EXPECT_EQ(refused("169.254.169.254", true), "link-local/metadata (169.254.0.0/16)");
  EXPECT_EQ(refused("0.0.0.0"), "this-network (0.0.0.0/8)");
  EXPECT_EQ(refused("224.0.0.251"), "multicast (224.0.0.0/4)");
  EXPECT_EQ(refused("255.255.255.255"), "reserved/broadcast (240.0.0.0/4)");
  EXPECT_EQ(refused("::1"), "loopback (::1)");
  EXPECT_EQ(refused("::"), "unspecified (::)");
  EXPECT_EQ(refused("fe80::1", true), "link-local (fe80::/10)");
  EXPECT_EQ(refused("ff02::1"), "multicast (ff00::/8)");
  EXPECT_EQ(refused("::ffff:127.0.0.1"), "loopback (127.0.0.0/8)");
  EXPECT_EQ(refused("::ffff:169.254.169.254"), "link-local/metadata (169.254.0.0/16)");
  EXPECT_EQ(refused("64:ff9b::a9fe:a9fe"), "NAT64 of link-local/metadata (169.254.0.0/16)");
  EXPECT_EQ(refused("2002:7f00:1::"), "6to4 of loopback (127.0.0.0/8)");
  EXPECT_EQ(refused("::127.0.0.1"), "IPv4-compatible (::/96)");
}

TEST(RefusedAddressTest, PrivateRangesUnlessAllowed) {
  for (const char* a : {"10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "100.64.0.1",
                        "fd00::1", "fc00::1"}) {
    EXPECT_NE(refused(a), "public") << a;
    EXPECT_EQ(refused(a, true), "public") << a;
  }
  EXPECT_EQ(refused("10.0.0.1"), "private (10.0.0.0/8)");
  EXPECT_EQ(refused("fd00::1"), "private (fc00::/7)");
  for (const char* a :
       {"93.184.216.34", "172.32.0.1", "100.128.0.1", "2606:2800:220:1::1", "8.8.8.8"}) {
    EXPECT_EQ(refused(a), "public") << a;
  }
}

TEST(ParseHostsTest, NamesCanonicalAddressesChecked) {
  auto h = parse_hosts({{"Pkgs.Example.TEST.", "127.0.0.1"}, {"v6.test", "::1"}});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->at("pkgs.example.test").to_string(), "127.0.0.1");
  auto bad = parse_hosts({{"pkgs.test", "localhost"}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("pkgs.test"), std::string::npos);
  EXPECT_FALSE(parse_hosts({{"127.0.0.1", "127.0.0.1"}}));
}

// The open mode's box filter is built from refused_v4_cidrs: the same ranges, both ways.
TEST(RefusedV4CidrsTest, SameRangesAsRefusedAddress) {
  for (bool allow_private : {false, true}) {
    const auto cidrs = refused_v4_cidrs(allow_private);
    for (const std::string& c : cidrs) {
      const auto net = ip::make_address_v4(c.substr(0, c.find('/')));
      const int prefix = std::stoi(c.substr(c.find('/') + 1));
      const uint32_t last = net.to_uint() | (prefix == 32 ? 0 : ~uint32_t(0) >> prefix);
      EXPECT_TRUE(refused_address(IpAddress(net), allow_private)) << c;
      EXPECT_TRUE(refused_address(IpAddress(ip::address_v4(last)), allow_private)) << c;
    }
    const bool has_ten = std::find(cidrs.begin(), cidrs.end(), "10.0.0.0/8") != cidrs.end();
    EXPECT_EQ(has_ten, !allow_private);
  }
  EXPECT_THAT(refused_v4_cidrs(true),
              ::testing::IsSupersetOf({"127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8"}));
}

TEST(ParseOpenSubnetTest, PrefixAndHostBitsChecked) {
  auto ok = parse_open_subnet("10.201.0.0/16");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->first, 0x0AC90000u);
  EXPECT_EQ(ok->second, 16);
  for (const char* bad : {"10.201.0.1/16", "10.201.0.0", "10.201.0.0/30", "10.201.0.0/4",
                          "fd00::/64", "x/16", "10.201.0.0/16x", "10.201.0.0/"}) {
    auto r = parse_open_subnet(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find(std::string("\"") + bad + "\""), std::string::npos)
        << r.error().message;
  }
}

}  // namespace
}  // namespace agentbox::net
