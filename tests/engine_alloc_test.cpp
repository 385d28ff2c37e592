// The engine's steady state allocates nothing: every global operator new of this executable is
// counted, and evaluating the documented example after a warm-up must not call it. The bytes are
// counted too: the credential cache holds as many per entry whatever a client sends.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "engine_fixture.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/credential_resolver.hpp"
#include "sluice/detail/coalescer.hpp"
#include "sluice/engine.hpp"

namespace {

std::atomic<std::size_t> allocations{0};
std::atomic<std::size_t> allocated_bytes{0};

void* counted(std::size_t size, std::size_t alignment) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes.fetch_add(size, std::memory_order_relaxed);
  if (size == 0) size = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(size)
                : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// Out of line: where g++ inlines a replaced operator delete into its caller it sees free() given
// a pointer from operator new and warns (-Wmismatched-new-delete), although this operator new
// allocates with malloc.
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }

}  // namespace

// Every replaceable allocation function of the executable, counted.
void* operator new(std::size_t size) { return counted(size, 0); }
void* operator new[](std::size_t size) { return counted(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) {
  return counted(size, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return counted(size, static_cast<std::size_t>(a));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }

namespace {

using namespace std::chrono_literals;
using Engine = sluice::testing::TestEngine;
using sluice::testing::documented_example;
using sluice::testing::on_route;

Engine make(sluice::ManualClock clock) {
  return sluice::testing::make_engine(documented_example(), std::move(clock));
}

std::vector<std::string> client_ips(int n) {
  std::vector<std::string> ips;
  for (int i = 0; i < n; ++i) ips.push_back("10.0.0." + std::to_string(i));
  return ips;
}

// Request i of a run: 8 clients, each sending bursts that the per-ip rule (10/s, burst 20)
// partly denies, so admissions and denials (5 and 6 fields) alternate.
sluice::RequestContext request(const std::vector<std::string>& ips, int i) {
  return on_route(ips[static_cast<std::size_t>(i) % ips.size()], "public");
}

}  // namespace

TEST_CASE("the replaced operator new counts allocations") {
  const std::size_t before = allocations.load();
  auto* p = new std::string(100, 'x');
  delete p;
  CHECK(allocations.load() - before == 2);  // the string object and its buffer
}

TEST_CASE("evaluating the documented example into a reused evaluation allocates nothing") {
  sluice::ManualClock clock;
  const Engine engine = make(clock);
  const std::vector<std::string> ips = client_ips(8);
  sluice::Evaluation e;
  // Warm-up: every client's keys are stored, and the evaluation has held both long field values.
  for (int i = 0; i < 400; ++i) {
    engine.evaluate(request(ips, i), e);
    clock.advance(1ms);
  }
  int denied = 0;
  const std::size_t before = allocations.load();
  for (int i = 0; i < 4000; ++i) {
    engine.evaluate(request(ips, i), e);
    denied += e.allowed ? 0 : 1;
    clock.advance(1ms);
  }
  const std::size_t allocated = allocations.load() - before;
  CHECK(allocated == 0);
  CHECK(denied > 0);     // both outcomes were exercised
  CHECK(denied < 4000);  // 8 clients × 10/s over 4 s admit about 320
}

TEST_CASE("evaluating into a reused evaluation decides and writes what a fresh evaluation does") {
  sluice::ManualClock clock_a, clock_b;
  const Engine reused = make(clock_a);
  const Engine fresh = make(clock_b);
  const std::vector<std::string> ips = client_ips(3);
  sluice::Evaluation e;
  for (int i = 0; i < 300; ++i) {
    sluice::RequestContext r = request(ips, i);
    if (i % 7 == 0) r.route = std::nullopt;  // some unrouted requests: no rule, no fields
    if (i % 11 == 0) r.path = "/healthz";    // some exempt ones
    reused.evaluate(r, e);
    const sluice::Evaluation expected = fresh.evaluate(r);
    REQUIRE(e.exempt == expected.exempt);
    REQUIRE(e.allowed == expected.allowed);
    REQUIRE(e.live_rules == expected.live_rules);
    REQUIRE(e.binding == expected.binding);
    REQUIRE(e.retry_after == expected.retry_after);
    REQUIRE(e.fields == expected.fields);
    REQUIRE(e.dry_denied == expected.dry_denied);
    REQUIRE(e.backend_error == expected.backend_error);
    clock_a.advance(5ms);
    clock_b.advance(5ms);
  }
}

TEST_CASE("an evaluation that asks for no fields allocates nothing and writes them on demand") {
  sluice::ManualClock clock_a, clock_b;
  const Engine engine = make(clock_a);
  const Engine fresh = make(clock_b);
  const std::vector<std::string> ips = client_ips(8);
  const sluice::WallTime wall{std::chrono::seconds(1'700'000'000)};
  sluice::Evaluation e;
  for (int i = 0; i < 400; ++i) {  // warm-up: every client's keys are stored
    sluice::RequestContext r = request(ips, i);
    r.write_fields = false;
    engine.evaluate(r, e);
    fresh.evaluate(request(ips, i));
    clock_a.advance(1ms);
    clock_b.advance(1ms);
  }
  const std::size_t before = allocations.load();
  for (int i = 0; i < 4000; ++i) {
    sluice::RequestContext r = request(ips, i);
    r.write_fields = false;
    engine.evaluate(r, e);
    REQUIRE(e.fields.empty());
    clock_a.advance(1ms);
  }
  CHECK(allocations.load() - before == 0);

  // Written later from the decision, the fields are the ones the evaluation would have written.
  sluice::ManualClock clock_c, clock_d;
  const Engine deferring = make(clock_c);
  const Engine writing = make(clock_d);
  for (int i = 0; i < 300; ++i) {
    sluice::RequestContext r = request(ips, i);
    r.wall_time = wall;
    sluice::RequestContext deferred = r;
    deferred.write_fields = false;
    clock_c.advance(3ms);
    clock_d.advance(3ms);
    const sluice::Evaluation expected = writing.evaluate(r);
    deferring.evaluate(deferred, e);
    REQUIRE(e.allowed == expected.allowed);
    engine.write_fields(e, wall);
    REQUIRE(e.fields == expected.fields);
  }
}

TEST_CASE("a request admitted on an estimate and settled, into reused objects, allocates nothing") {
  sluice::ManualClock clock;
  const Engine engine = make(clock);
  const std::vector<std::string> ips = client_ips(8);
  sluice::Evaluation e;
  Engine::Settlement settlement;
  // Each request estimates 2 units and settles at 3 (a charge) or 1 (a refund).
  const auto run = [&](int i) {
    sluice::RequestContext r = request(ips, i);
    r.cost = 2;
    engine.evaluate(r, e, settlement);
    const bool open = settlement.open();
    if (open) REQUIRE(engine.settle(settlement, i % 2 == 0 ? 3 : 1).ok());
    clock.advance(1ms);
    return open;
  };
  for (int i = 0; i < 400; ++i) run(i);  // warm-up: every client's keys are stored
  int settled = 0;
  const std::size_t before = allocations.load();
  for (int i = 0; i < 4000; ++i) settled += run(i) ? 1 : 0;
  CHECK(allocations.load() - before == 0);
  CHECK(settled > 0);     // admitted requests opened settlements
  CHECK(settled < 4000);  // and denied ones did not
}

TEST_CASE("a cached credential takes as much memory whatever its length", "[attack]") {
  // Bytes allocated to cache 256 made-up keys of `size` bytes (each distinct, none owned).
  const auto bytes_to_cache = [](std::size_t size) {
    auto resolver = sluice::CredentialResolver<sluice::ManualClock>::create(
        [](std::string_view) -> absl::StatusOr<std::optional<std::string>> {
          return std::optional<std::string>();
        },
        {.max_entries = 256}, sluice::ManualClock());
    REQUIRE(resolver.ok());
    std::vector<std::string> keys;
    for (int i = 0; i < 256; ++i) {
      keys.push_back(std::to_string(i));
      keys.back().resize(size, 'k');
    }
    const std::size_t before = allocated_bytes.load();
    for (const std::string& key : keys) REQUIRE(resolver->resolve(key).ok());
    return allocated_bytes.load() - before;
  };
  // A client that sends the longest keys a lookup takes holds no more of the process's memory
  // than one that sends short ones (up to how the cache's tables happened to grow).
  const std::size_t short_keys = bytes_to_cache(8);
  const std::size_t longest_keys = bytes_to_cache(sluice::kMaxCredentialBytes);
  CAPTURE(short_keys, longest_keys);
  CHECK(longest_keys <= 2 * short_keys);
}

TEST_CASE("a coalesced check that finds a call slot free allocates nothing around its call") {
  sluice::detail::Coalescer<int, int> coalescer(64, 2);
  const auto deadline = std::chrono::steady_clock::now() + 1h;
  std::vector<int> sent;
  sent.reserve(100);
  const auto send = [&](std::span<const int> items, int /*group*/,
                        sluice::detail::CoalescerDeadline /*by*/,
                        std::span<absl::StatusOr<sluice::Decision>> results) {
    sent.insert(sent.end(), items.begin(), items.end());
    for (absl::StatusOr<sluice::Decision>& r : results) r = sluice::Decision{.remaining = 7};
  };
  REQUIRE(coalescer.check(-1, 0, deadline, send).ok());  // warm-up: made its shared status once
  sent.clear();
  const std::size_t before = allocations.load();
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<sluice::Decision> d = coalescer.check(i, 0, deadline, send);
    if (!d.ok() || d->remaining != 7) FAIL("check " << i << ": " << d.status());
  }
  const std::size_t allocated = allocations.load() - before;
  CHECK(allocated == 0);
  CHECK(sent.size() == 100);  // each sent alone, in its own call
  CHECK(coalescer.calls() == 101);
  CHECK(coalescer.coalesced_checks() == 0);
}
