// sluice/redis/detail/attempt_script.hpp — the Lua script behind
// sluice::redis::RedisAttemptLimiter. Internal.
//
//   EVALSHA <sha1> 1 <key> <op> <token> <started> <initial> <cap> <quiet> <lease> <time>
//
//   op        'b' begin, 's' succeed, 'f' fail (abandon is 'f'), 'i' inspect, 'r' reset
//   token, started   the receipt's fencing pair (completions only; "0" otherwise)
//   initial, cap, quiet, lease   the policy, whole microseconds
//   time      "": read the clock with TIME; else a test-only server time (µs since the epoch)
//
// State: one hash per subject, every field an integer in microseconds since the Unix epoch or a
// count: seen (latest time used: a server clock that steps back is clamped to it), token
// (attempts begun), started (latest begin), active (1/0), lease_end, retry_at and quiet_end (while
// active: what the lease's expiry sets), failures (saturates at 2^32 − 1). The key expires
// (PEXPIRE, relative to the server's clock) within a millisecond after quiet_end — never while
// leased: quiet_end ≥ lease_end then — or, after a success, within the next millisecond, strictly
// after the attempt's begin time, so a recreated key never repeats a (started, token) pair.
// Inspect reads only: it writes nothing, not even `seen`, and leaves the expiry alone. Reset
// rewrites an existing record as a success does (keeping token and started, so receipts issued
// before stay fenced) and writes nothing for an absent key.
//
// Replies (integers): begin {0, token, started, failures} admitted, {1, wait, failures} another
// attempt is active, {2, wait, failures} backoff; inspect as begin's denials, or {0, 0, failures}
// where begin would admit; completions {0} done, {3} stale receipt; reset {0}.
//
// Exactness: Lua numbers are doubles. Times are ~2^51 µs today and the limiter validates every
// duration to ≤ 2^50 µs, so every sum formed here (now + lease + cap or quiet) stays below 2^53;
// doubling stops at the first value ≥ cap (< 2^51); values are written with '%.0f'.
//
// Thread-safety: constants only.
#ifndef SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_
#define SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_

#include <string_view>

namespace sluice::redis::detail {

inline constexpr std::string_view kAttemptScript = R"lua(-- sluice attempt v1 (docs/attempts.md)
local key, op = KEYS[1], ARGV[1]
local initial, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local quiet, lease = tonumber(ARGV[6]), tonumber(ARGV[7])
local now
if ARGV[8] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[8])
end
local v = redis.call('HMGET', key, 'seen', 'token', 'started', 'active', 'lease_end',
                     'retry_at', 'quiet_end', 'failures')
local seen = tonumber(v[1])
if seen and now < seen then now = seen end
local token, started = tonumber(v[2]) or 0, tonumber(v[3]) or -1
local active, lease_end = v[4] == '1', tonumber(v[5]) or 0
local retry_at, quiet_end = tonumber(v[6]) or 0, tonumber(v[7]) or 0
local failures = tonumber(v[8]) or 0
local max_failures = 4294967295

-- What time alone does: an expired lease is a failure, old failures are forgotten.
if active and now >= lease_end then
  active = false
  if failures < max_failures then failures = failures + 1 end
end
if not active and now >= quiet_end then failures, retry_at = 0, 0 end

local function delay(f)
  if f == 0 then return 0 end
  local d, k = initial, f - 1
  while k > 0 and d < cap do d, k = d * 2, k - 1 end
  if d > cap then d = cap end
  return d
end
-- The denial begin answers now, if any.
local function refusal()
  if active then return {1, lease_end - now, failures} end
  if now < retry_at then return {2, retry_at - now, failures} end
  return nil
end
local function save(expire_at)
  local f = string.format
  redis.call('HSET', key, 'seen', f('%.0f', now), 'token', f('%.0f', token),
             'started', f('%.0f', started), 'active', active and '1' or '0',
             'lease_end', f('%.0f', lease_end), 'retry_at', f('%.0f', retry_at),
             'quiet_end', f('%.0f', quiet_end), 'failures', f('%.0f', failures))
  redis.call('PEXPIRE', key, f('%.0f', math.floor((expire_at - now) / 1000) + 1))
end

-- Ends any attempt and forgets the failures (a success or a reset); token and started stay.
local function clear()
  active, failures, retry_at, quiet_end = false, 0, 0, now
  save(now)
end

if op == 'i' then return refusal() or {0, 0, failures} end
if op == 'r' then
  if seen then clear() end
  return {0}
end
if op == 'b' then
  local denied = refusal()
  if denied then return denied end
  local before = failures
  local next_failures = failures
  if next_failures < max_failures then next_failures = next_failures + 1 end
  token, started, active = token + 1, now, true
  lease_end = now + lease
  retry_at = lease_end + delay(next_failures)
  quiet_end = lease_end + quiet
  save(quiet_end)
  return {0, token, started, before}
end
if op ~= 's' and op ~= 'f' then return redis.error_reply('sluice: unknown attempt operation') end
if not active or token ~= tonumber(ARGV[2]) or started ~= tonumber(ARGV[3]) then return {3} end
if op == 's' then
  clear()
else
  active = false
  if failures < max_failures then failures = failures + 1 end
  retry_at, quiet_end = now + delay(failures), now + quiet
  save(quiet_end)
end
return {0}
)lua";

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_
