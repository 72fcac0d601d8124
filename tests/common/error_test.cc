#include "common/error.h"

#include <coroutine>
#include <exception>
#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace agentbox {
namespace {

TEST(ErrorTest, ErrnoMapsToWireCodeAndNamesTheOperation) {
  Error e = Error::from_errno(ENOENT, "open(/workspace/a.txt)");
  EXPECT_EQ(e.code, Code::kNotFound);
  EXPECT_EQ(code_name(e.code), "ENOENT");
  EXPECT_EQ(e.sys_errno, ENOENT);
  EXPECT_NE(e.message.find("open(/workspace/a.txt)"), std::string::npos);
  EXPECT_NE(e.message.find("ENOENT"), std::string::npos);
}

TEST(ErrorTest, EscapesAndReadOnlyAreAccessErrors) {
  EXPECT_EQ(code_for_errno(EXDEV), Code::kAccess);   // openat2 refusing to leave the root
  EXPECT_EQ(code_for_errno(EROFS), Code::kAccess);
  EXPECT_EQ(code_for_errno(ELOOP), Code::kAccess);
  EXPECT_EQ(code_for_errno(ENOSPC), Code::kQuota);
  EXPECT_EQ(code_for_errno(ENOTEMPTY), Code::kNotEmpty);
}

}  // namespace
}  // namespace agentbox

namespace agentbox {
namespace {

Result<int> parse_digit(char c) {
  if (c < '0' || c > '9') return fail(Code::kInvalid, std::string("not a digit: ") + c);
  return c - '0';
}

Status check_even(int n) {
  if (n % 2 != 0) return fail(Code::kInvalid, "odd: " + std::to_string(n));
  return {};
}

// Uses both forms: the value form yields the int, the Status form yields nothing.
Result<int> twice_even_digit(char c, int* reached) {
  int d = AB_TRY(parse_digit(c));
  *reached = 1;
  AB_TRY(check_even(d));
  *reached = 2;
  return d * 2;
}

Status all_even(const std::string& s) {
  for (char c : s) {
    int d = AB_TRY(parse_digit(c));
    AB_TRY(check_even(d));
  }
  return {};
}

TEST(TryTest, ValueFormYieldsTheValue) {
  int reached = 0;
  auto r = twice_even_digit('4', &reached);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, 8);
  EXPECT_EQ(reached, 2);
}

TEST(TryTest, ValueFormReturnsTheErrorAndStops) {
  int reached = 0;
  auto r = twice_even_digit('x', &reached);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalid);
  EXPECT_EQ(r.error().message, "not a digit: x");
  EXPECT_EQ(reached, 0);
}

TEST(TryTest, StatusFormReturnsTheErrorAndStops) {
  int reached = 0;
  auto r = twice_even_digit('3', &reached);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "odd: 3");
  EXPECT_EQ(reached, 1);
}

TEST(TryTest, WorksInAStatusFunction) {
  EXPECT_TRUE(all_even("248"));
  auto r = all_even("2x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "not a digit: x");
}

TEST(TryTest, MovesOutOfATemporaryAndCopiesFromANamedResult) {
  auto make = []() -> Result<std::unique_ptr<int>> { return std::make_unique<int>(7); };
  auto use_temp = [&]() -> Result<int> {
    std::unique_ptr<int> p = AB_TRY(make());  // move-only value: moved out
    return *p;
  };
  EXPECT_EQ(*use_temp(), 7);
  Result<std::string> named = std::string("kept");
  auto use_named = [&]() -> Result<std::size_t> {
    std::string s = AB_TRY(named);
    return s.size();
  };
  EXPECT_EQ(*use_named(), 4u);
  EXPECT_EQ(*named, "kept");  // not moved from
}

}  // namespace
}  // namespace agentbox

// AB_CO_TRY in a coroutine: a minimal eager coroutine type whose result is read after it ran.
namespace agentbox {
namespace {

template <typename R>
struct Eager {
  struct promise_type {
    R result;
    Eager get_return_object() { return Eager{this}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_value(R r) { result = std::move(r); }
    void unhandled_exception() { std::terminate(); }
  };
  explicit Eager(promise_type* p) : p_(p) {}
  Eager(const Eager&) = delete;
  ~Eager() { std::coroutine_handle<promise_type>::from_promise(*p_).destroy(); }
  R& result() { return p_->result; }

 private:
  promise_type* p_;
};

Eager<Result<int>> co_twice_even_digit(char c) {
  int d = AB_CO_TRY(parse_digit(c));
  AB_CO_TRY(check_even(d));
  co_return d * 2;
}

Eager<Status> co_all_even(std::string s) {
  for (char c : s) {
    int d = AB_CO_TRY(parse_digit(c));
    AB_CO_TRY(check_even(d));
  }
  co_return Status{};
}

TEST(TryTest, CoroutineFormsYieldOrCoReturnTheError) {
  auto ok = co_twice_even_digit('6');
  ASSERT_TRUE(ok.result());
  EXPECT_EQ(*ok.result(), 12);
  auto bad = co_twice_even_digit('y');
  ASSERT_FALSE(bad.result());
  EXPECT_EQ(bad.result().error().message, "not a digit: y");
  auto odd = co_twice_even_digit('5');
  ASSERT_FALSE(odd.result());
  EXPECT_EQ(odd.result().error().message, "odd: 5");
  EXPECT_TRUE(co_all_even("0").result());
  auto st = co_all_even("21");
  ASSERT_FALSE(st.result());
  EXPECT_EQ(st.result().error().message, "odd: 1");
}

}  // namespace
}  // namespace agentbox
