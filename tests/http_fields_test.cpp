#include "sluice/http_fields.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "catch.hpp"

using namespace std::chrono_literals;

namespace {

// 1700000000.5 s after the Unix epoch.
constexpr sluice::WallTime kNow{1'700'000'000'500'000'000ns};

sluice::Decision denied(std::uint64_t limit, std::chrono::nanoseconds retry_after,
                        std::chrono::nanoseconds reset_after) {
  return sluice::Decision{.reason = sluice::Reason::kQuotaExceeded,
                          .limit = limit,
                          .remaining = 0,
                          .retry_after = retry_after,
                          .reset_after = reset_after,
                          .binding_window = 0};
}

}  // namespace

TEST_CASE("Retry-After is retry_after rounded up to whole seconds and at least one") {
  struct Case {
    std::chrono::nanoseconds retry_after;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {0ns, "1"},
      {1ns, "1"},
      {200ms, "1"},
      {999'999'999ns, "1"},
      {1s, "1"},
      {1'000'000'001ns, "2"},
      {1500ms, "2"},
      {59s, "59"},
      {59'500ms, "60"},
      {-5ns, "1"},
      {std::chrono::nanoseconds::max(), "9223372037"},
  };
  for (const Case& c : cases) {
    INFO("retry_after = " << c.retry_after.count() << " ns");
    CHECK(sluice::retry_after_field(c.retry_after) == sluice::HttpField{"Retry-After", c.expected});
  }
}

TEST_CASE("X-RateLimit-Reset is the epoch second of full replenishment rounded up") {
  struct Case {
    sluice::WallTime now;
    std::chrono::nanoseconds reset_after;
    std::int64_t expected;
  };
  const std::vector<Case> cases = {
      {kNow, 200ms, 1'700'000'001},
      {kNow, 500ms, 1'700'000'001},
      {kNow, 500ms + 1ns, 1'700'000'002},
      {kNow, 0ns, 1'700'000'001},
      {sluice::WallTime{1'700'000'000s}, 0ns, 1'700'000'000},
      {sluice::WallTime{1'700'000'000s}, 1ns, 1'700'000'001},
      {sluice::WallTime{1'700'000'000s}, 60s, 1'700'000'060},
      {sluice::WallTime{1'700'000'000'999'999'999ns}, 1ns, 1'700'000'001},
      {sluice::WallTime{1'700'000'000s}, -3s, 1'700'000'000},
      {sluice::WallTime{-1500ms}, 1s, 0},
      {sluice::WallTime{-1500ms}, 2s, 1},
      {sluice::WallTime{std::chrono::nanoseconds::max()}, std::chrono::nanoseconds::max(),
       18'446'744'074},
  };
  for (const Case& c : cases) {
    INFO("now = " << c.now.time_since_epoch().count()
                  << " ns, reset_after = " << c.reset_after.count() << " ns");
    CHECK(sluice::reset_epoch_seconds(c.now, c.reset_after) == c.expected);
  }
}

// Whether reset_epoch_seconds(now, reset_after) is a constant expression: it is not when its
// evaluation has undefined behaviour (a signed overflow, say), which the compiler then reports.
template <std::int64_t Now, std::int64_t ResetAfter>
concept ConstantReset = requires {
  typename std::integral_constant<std::int64_t, sluice::reset_epoch_seconds(
                                                    sluice::WallTime{std::chrono::nanoseconds{Now}},
                                                    std::chrono::nanoseconds{ResetAfter})>;
};

TEST_CASE("X-RateLimit-Reset is exact and free of overflow for instants before 1677", "[attack]") {
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  // The earliest WallTime lies 0.854775808 s into its second: its whole second, in ns, is below
  // the int64 range.
  constexpr std::int64_t kLastSecond = -9'223'372'036'000'000'001;
  CHECK(ConstantReset<kMin, 0>);
  CHECK(ConstantReset<kMin, kMax>);
  CHECK(ConstantReset<kLastSecond, kMax>);
  CHECK(ConstantReset<kMax, kMax>);
  using std::chrono::nanoseconds;
  CHECK(sluice::reset_epoch_seconds(sluice::WallTime{nanoseconds{kMin}}, nanoseconds{0}) == 0);
  CHECK(sluice::reset_epoch_seconds(sluice::WallTime{nanoseconds{kMin}}, nanoseconds{kMax}) == 0);
  CHECK(sluice::reset_epoch_seconds(sluice::WallTime{nanoseconds{kLastSecond}},
                                    nanoseconds{kMax}) == 1);  // 0.854775806 s after the epoch
  CHECK(sluice::reset_epoch_seconds(sluice::WallTime{nanoseconds{kMin}}, nanoseconds{kMin}) == 0);
}

TEST_CASE("a system_clock time point is accepted as now") {
  std::chrono::system_clock::time_point now{
      std::chrono::duration_cast<std::chrono::system_clock::duration>(1'700'000'000s)};
  CHECK(sluice::reset_epoch_seconds(now, 1500ms) == 1'700'000'002);
}

TEST_CASE("a denial carries Retry-After then the binding window's X-RateLimit fields") {
  sluice::Decision d = denied(20, 100ms, 2050ms);
  CHECK(sluice::response_fields(d, kNow) == sluice::HttpFields{
                                                {"Retry-After", "1"},
                                                {"X-RateLimit-Limit", "20"},
                                                {"X-RateLimit-Remaining", "0"},
                                                {"X-RateLimit-Reset", "1700000003"},
                                            });
}

TEST_CASE("a store-full denial without a known wait still says Retry-After 1") {
  sluice::Decision d{.reason = sluice::Reason::kStoreFull, .limit = 5};
  CHECK(sluice::response_fields(d, kNow).front() == sluice::HttpField{"Retry-After", "1"});
}

TEST_CASE("an admission carries X-RateLimit fields and no Retry-After") {
  sluice::Decision d{.reason = sluice::Reason::kAllowed,
                     .limit = 600,
                     .remaining = 599,
                     .retry_after = 0ns,
                     .reset_after = 100ms,
                     .binding_window = 1};
  CHECK(sluice::response_fields(d, kNow) == sluice::HttpFields{
                                                {"X-RateLimit-Limit", "600"},
                                                {"X-RateLimit-Remaining", "599"},
                                                {"X-RateLimit-Reset", "1700000001"},
                                            });
}

TEST_CASE("X-RateLimit values print the full unsigned range") {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  sluice::Decision d{.reason = sluice::Reason::kAllowed, .limit = kMax, .remaining = kMax};
  sluice::HttpFields out;
  sluice::append_x_ratelimit_fields(out, d, sluice::WallTime{1'700'000'000s});
  CHECK(out == sluice::HttpFields{{"X-RateLimit-Limit", "18446744073709551615"},
                                  {"X-RateLimit-Remaining", "18446744073709551615"},
                                  {"X-RateLimit-Reset", "1700000000"}});
}

TEST_CASE("RateLimit-Policy lists every window as a draft-11 Item joined by comma and space") {
  const std::array<sluice::QuotaPolicy, 3> policies{{
      {"public-api-limits/per-ip/s", 10, 1s},
      {"public-api-limits/per-ip/minute", 600, 1min},
      {"public-api-limits/per-route-flood/minute", 2000, 1min},
  }};
  CHECK(sluice::ratelimit_policy_field(policies) ==
        sluice::HttpField{"RateLimit-Policy",
                          "\"public-api-limits/per-ip/s\";q=10;w=1, "
                          "\"public-api-limits/per-ip/minute\";q=600;w=60, "
                          "\"public-api-limits/per-route-flood/minute\";q=2000;w=60"});
}

TEST_CASE("RateLimit-Policy of one policy is a single Item") {
  CHECK(sluice::ratelimit_policy_field(sluice::QuotaPolicy{"default", 100, 10s}) ==
        sluice::HttpField{"RateLimit-Policy", "\"default\";q=100;w=10"});
}

TEST_CASE("RateLimit-Policy windows round up to whole seconds and are never zero") {
  struct Case {
    std::chrono::nanoseconds window;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {0ns, "\"p\";q=1;w=1"},          {1ns, "\"p\";q=1;w=1"},    {500ms, "\"p\";q=1;w=1"},
      {1s, "\"p\";q=1;w=1"},           {1500ms, "\"p\";q=1;w=2"}, {1h, "\"p\";q=1;w=3600"},
      {8760h, "\"p\";q=1;w=31536000"},
  };
  for (const Case& c : cases) {
    INFO("window = " << c.window.count() << " ns");
    CHECK(sluice::ratelimit_policy_field(sluice::QuotaPolicy{"p", 1, c.window}).value ==
          c.expected);
  }
}

TEST_CASE("policy names escape double quote and backslash") {
  struct Case {
    std::string name;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"", "\"\";q=1;w=1"},
      {"a\"b", "\"a\\\"b\";q=1;w=1"},
      {"a\\b", "\"a\\\\b\";q=1;w=1"},
      {"\"\\\"", "\"\\\"\\\\\\\"\";q=1;w=1"},
      {"with space ~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
       "\"with space ~!#$%&'()*+,-./:;<=>?@[]^_`{|}\";q=1;w=1"},
  };
  for (const Case& c : cases) {
    INFO("name = " << c.name);
    CHECK(sluice::ratelimit_policy_value(std::vector<sluice::QuotaPolicy>{{c.name, 1, 1s}}) ==
          c.expected);
  }
}

TEST_CASE("bytes outside printable ASCII in a name are replaced by a question mark") {
  std::string name = "caf\xc3\xa9\t\n";
  name.push_back('\0');
  name.push_back('\x7f');
  CHECK(sluice::ratelimit_value(std::vector<sluice::ServiceLimit>{{name, 1, 1s}}) ==
        "\"caf??????\";r=1;t=1");
}

TEST_CASE("integers beyond fifteen digits are clamped to 999999999999999") {
  struct Case {
    std::uint64_t value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {0, "0"},
      {999'999'999'999'999, "999999999999999"},
      {1'000'000'000'000'000, "999999999999999"},
      {std::numeric_limits<std::uint64_t>::max(), "999999999999999"},
  };
  for (const Case& c : cases) {
    INFO("value = " << c.value);
    CHECK(sluice::ratelimit_policy_value(std::vector<sluice::QuotaPolicy>{{"p", c.value, 1s}}) ==
          "\"p\";q=" + c.expected + ";w=1");
    CHECK(sluice::ratelimit_value(std::vector<sluice::ServiceLimit>{{"p", c.value, 0ns}}) ==
          "\"p\";r=" + c.expected + ";t=0");
  }
  // A window of more than 999999999999999 seconds is clamped as well.
  CHECK(sluice::ratelimit_policy_value(std::vector<sluice::QuotaPolicy>{
            {"p", 1, std::chrono::nanoseconds::max()}}) == "\"p\";q=1;w=9223372037");
}

TEST_CASE("RateLimit reports an admission with t until the binding window is full again") {
  sluice::Decision d{.reason = sluice::Reason::kAllowed,
                     .limit = 20,
                     .remaining = 7,
                     .retry_after = 0ns,
                     .reset_after = 1200ms,
                     .binding_window = 0};
  CHECK(sluice::ratelimit_field(sluice::service_limit("public-api-limits/per-ip/s", d)) ==
        sluice::HttpField{"RateLimit", "\"public-api-limits/per-ip/s\";r=7;t=2"});
}

TEST_CASE("RateLimit reports a denial with r=0 and t equal to Retry-After") {
  sluice::Decision d = denied(20, 200ms, 2s);
  CHECK(sluice::ratelimit_field(sluice::service_limit("per-ip", d)).value == "\"per-ip\";r=0;t=1");
  CHECK(sluice::retry_after_field(d.retry_after).value == "1");

  sluice::Decision zero_wait{.reason = sluice::Reason::kStoreFull};
  CHECK(sluice::ratelimit_field(sluice::service_limit("per-ip", zero_wait)).value ==
        "\"per-ip\";r=0;t=1");
}

TEST_CASE("a denial's RateLimit t equals Retry-After up to the longest wait", "[attack]") {
  // 2^63 - 1 ns rounds up to 9223372037 s, which as nanoseconds no longer fits an int64.
  constexpr auto kLongest = std::chrono::nanoseconds::max();
  const sluice::Decision d = denied(20, kLongest, kLongest);
  CHECK(sluice::retry_after_field(d.retry_after).value == "9223372037");
  CHECK(sluice::ceil_seconds(sluice::service_limit("p", d).effective_window) == 9'223'372'037);
  CHECK(sluice::ratelimit_field(sluice::service_limit("p", d)).value == "\"p\";r=0;t=9223372037");
  sluice::HttpFields out;
  sluice::write_decision_fields(out, d, kNow, "\"p\";q=20;w=1", "\"p\";r=");
  REQUIRE(out.size() == 6);
  CHECK(out[0] == sluice::HttpField{"Retry-After", "9223372037"});
  CHECK(out[5] == sluice::HttpField{"RateLimit", "\"p\";r=0;t=9223372037"});
}

TEST_CASE("RateLimit lists several service limits joined by comma and space") {
  const std::array<sluice::ServiceLimit, 2> limits{{
      {"per-ip/s", 19, 100ms},
      {"per-ip/minute", 599, 6s},
  }};
  CHECK(sluice::ratelimit_field(limits) ==
        sluice::HttpField{"RateLimit", "\"per-ip/s\";r=19;t=1, \"per-ip/minute\";r=599;t=6"});
}

TEST_CASE("an empty policy list gives an empty value") {
  CHECK(sluice::ratelimit_policy_value({}).empty());
  CHECK(sluice::ratelimit_value({}).empty());
}

TEST_CASE("a field prints as name colon value") {
  std::ostringstream out;
  out << sluice::HttpField{"Retry-After", "3"};
  CHECK(out.str() == "Retry-After: 3");
}

TEST_CASE("a denial by another limiter replaces every rate-limit field the first one wrote") {
  std::multimap<std::string, std::string> response = {{"Content-Type", "application/json"}};
  const sluice::Decision admitted{
      .limit = 10, .remaining = 8, .retry_after = 0ns, .reset_after = 2s};
  for (const auto& [name, value] : sluice::response_fields(admitted, kNow)) {
    response.emplace(std::string(name), value);
  }
  response.emplace("RateLimit", R"("per-ip/minute";r=8;t=2)");
  const sluice::HttpFields denial = {sluice::retry_after_field(4s)};  // e.g. attempt_fields

  sluice::replace_rate_limit_fields(
      denial, [&](std::string_view name) { response.erase(std::string(name)); },
      [&](std::string_view name, const std::string& value) {
        response.emplace(std::string(name), value);
      });

  CHECK(response == std::multimap<std::string, std::string>{{"Content-Type", "application/json"},
                                                            {"Retry-After", "4"}});
}

TEST_CASE("decision fields are exact at every digit count, rewritten into the same strings") {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> values{0, kMax};
  for (std::uint64_t power = 1; power <= kMax / 10; power *= 10) {
    values.push_back(power * 10 - 1);  // 9, 99, ...
    values.push_back(power * 10);      // 10, 100, ...
  }
  values.push_back(kMax / 10 * 10 - 1);
  sluice::HttpFields out;  // reused: each value rewrites the strings of the one before
  for (bool longest_first : {false, true}) {
    if (longest_first) std::reverse(values.begin(), values.end());
    for (std::uint64_t v : values) {
      const sluice::Decision d{.reason = sluice::Reason::kAllowed,
                               .limit = v,
                               .remaining = v,
                               .reset_after = std::chrono::seconds(v % 1000)};
      sluice::write_decision_fields(out, d, kNow, "\"p\";q=1;w=1", "\"p\";r=");
      const std::string r = std::to_string(std::min<std::uint64_t>(v, 999'999'999'999'999));
      CHECK(out == sluice::HttpFields{
                       {"X-RateLimit-Limit", std::to_string(v)},
                       {"X-RateLimit-Remaining", std::to_string(v)},
                       {"X-RateLimit-Reset", std::to_string(1'700'000'001 + v % 1000)},
                       {"RateLimit-Policy", "\"p\";q=1;w=1"},
                       {"RateLimit", "\"p\";r=" + r + ";t=" + std::to_string(v % 1000)},
                   });
    }
  }
}
