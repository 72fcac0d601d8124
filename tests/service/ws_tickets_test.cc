// WsTickets (service/ws_tickets.h): the dashboard's WebSocket tickets are single-use, expire,
// answer the caller they were issued to, and are bounded in number.

#include "service/ws_tickets.h"

#include <gtest/gtest.h>

#include <set>

namespace agentbox::service {
namespace {

using std::chrono::seconds;

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  WsTickets::Clock fn() {
    return [this] { return now; };
  }
};

TEST(WsTickets, ATicketAnswersItsCallerOnceOnly) {
  FakeClock clock;
  WsTickets book(seconds(30), clock.fn());
  auto a = book.issue(session::Caller("a", false, 0));
  auto b = book.issue(session::Caller("b", true, 0));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 64u) << "256 random bits, hex";
  EXPECT_NE(*a, *b);
  auto who = book.redeem(*b);
  ASSERT_TRUE(who);
  EXPECT_EQ(who->tenant, "b");
  EXPECT_TRUE(who->admin);
  EXPECT_FALSE(book.redeem(*b)) << "a ticket is single-use";
  who = book.redeem(*a);
  ASSERT_TRUE(who);
  EXPECT_EQ(who->tenant, "a");
  EXPECT_FALSE(who->admin);
  EXPECT_FALSE(book.redeem("")) << "no ticket";
  EXPECT_FALSE(book.redeem(std::string(64, '0'))) << "a guessed ticket";
  EXPECT_EQ(book.size(), 0u);
}

TEST(WsTickets, ATicketExpiresAfterItsTtl) {
  FakeClock clock;
  WsTickets book(seconds(30), clock.fn());
  auto t = book.issue(session::Caller("a", false, 0));
  auto u = book.issue(session::Caller("a", false, 0));
  ASSERT_TRUE(t && u);
  clock.now += seconds(29);
  EXPECT_TRUE(book.redeem(*t)) << "still live just before its ttl";
  clock.now += seconds(1);
  EXPECT_FALSE(book.redeem(*u)) << "expired at its ttl";
  // Expired tickets are dropped as new ones are issued: the book does not grow.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(book.issue(session::Caller("a", false, 0)));
  clock.now += seconds(31);
  ASSERT_TRUE(book.issue(session::Caller("a", false, 0)));
  EXPECT_EQ(book.size(), 1u);
}

TEST(WsTickets, TheBookIsBoundedAndDropsTheOldestFirst) {
  FakeClock clock;
  WsTickets book(seconds(30), clock.fn());
  auto first = book.issue(session::Caller("a", false, 0));
  ASSERT_TRUE(first);
  std::string last;
  for (std::size_t i = 0; i < WsTickets::kMaxTickets + 10; ++i) {
    clock.now += std::chrono::microseconds(1);
    auto t = book.issue(session::Caller("a", false, 0));
    ASSERT_TRUE(t);
    last = *t;
  }
  EXPECT_LE(book.size(), WsTickets::kMaxTickets);
  EXPECT_FALSE(book.redeem(*first)) << "the oldest went first";
  EXPECT_TRUE(book.redeem(last));
}

}  // namespace
}  // namespace agentbox::service
