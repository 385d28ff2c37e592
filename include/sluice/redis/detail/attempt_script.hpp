// sluice/redis/detail/attempt_script.hpp — the Lua script behind
// sluice::redis::RedisAttemptLimiter. Internal.
//
//   EVALSHA <sha1> 3 <record> <index> <legacy> <op> <token> <started> <initial> <cap> <quiet>
//           <lease> <time> <max_records> <sweep>
//
//   record    the subject's hash; index: the sorted set of every record under the key prefix;
//   legacy    where version 1 of this script kept the subject's record (with a TTL)
//   op        'b' begin, 's' succeed, 'f' fail (abandon is 'f'), 'i' inspect, 'r' reset
//   token, started   the receipt's fencing pair (completions only; "0" otherwise)
//   initial, cap, quiet, lease   the policy, whole microseconds
//   time      "": read the clock with TIME; else a test-only server time (µs since the epoch)
//   max_records   records the index may hold; a new subject beyond it is refused
//   sweep     idle records each writing operation removes at most
//
// State: one hash per subject, every field an integer in microseconds since the Unix epoch or a
// count: seen (latest time used: a server clock that steps back is clamped to it), token
// (attempts begun), started (latest begin), active (1/0), lease_end, retry_at and quiet_end (while
// active: what the lease's expiry sets), failures (saturates at 2^32 − 1).
//
// Records carry no Redis TTL, so no volatile-* eviction policy can pick them; the script expires
// them itself. The index scores each record's key with the time it goes idle — max(quiet_end,
// started + 1): never while leased (quiet_end ≥ lease_end then), and strictly after the
// attempt's begin, so a recreated record never repeats a (started, token) pair. Every writing
// operation first deletes up to `sweep` records whose time has come (oldest first), so the
// count of records never exceeds max_records: a new record is added only below the bound, and a
// full index holding an idle record loses one to the sweep first. A record that is idle once
// written (after a success or a reset) is deleted at once. Inspect reads only: it writes
// nothing, not even `seen`, and sweeps nothing. Reset rewrites an existing record as a success
// does (keeping token and started, so receipts issued before stay fenced) and writes nothing
// for an absent key. A subject with no record but a version 1 record at `legacy` (same fields,
// kept with a TTL) is decided from that record, which the first write moves to `record` (and
// indexes, and counts). Once a quiet period has passed since the last version 1 writer stopped,
// no legacy record is left.
//
// Replies (integers): begin {0, token, started, failures} admitted, {1, wait, failures} another
// attempt is active, {2, wait, failures} backoff, {3, wait, 0} a new subject and the index is
// full (wait: until its earliest record goes idle, ≥ 1); inspect as begin's first two denials,
// or {0, 0, failures} where begin would admit; completions {0} done, {3} stale receipt; reset {0}.
//
// Exactness: Lua numbers are doubles. Times are ~2^51 µs today and the limiter validates every
// duration to ≤ 2^50 µs, so every sum formed here (now + lease + cap or quiet) stays below 2^53;
// doubling stops at the first value ≥ cap (< 2^51); values are written with '%.0f'. Index
// scores are doubles holding the same integers exactly.
//
// Keys: the caller names the record and the index with one hash tag, so these touch one
// Cluster slot (the swept records are named by the index, under the same tag); only the legacy
// key, read once per subject without a record, lies in another slot.
//
// Thread-safety: constants only.
#ifndef SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_
#define SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_

#include <string_view>

namespace sluice::redis::detail {

// Idle records one writing operation deletes at most: bounded work per call, and more than the
// one record a call can add, so idle records never pile up while calls keep coming.
inline constexpr int kAttemptSweep = 16;

inline constexpr std::string_view kAttemptScript = R"lua(-- sluice attempt v2 (docs/attempts.md)
local key, index, legacy, op = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local initial, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local quiet, lease = tonumber(ARGV[6]), tonumber(ARGV[7])
local max_records, sweep = tonumber(ARGV[9]), tonumber(ARGV[10])
local now
if ARGV[8] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[8])
end
local fields = {'seen', 'token', 'started', 'active', 'lease_end', 'retry_at', 'quiet_end',
                'failures'}
local v = redis.call('HMGET', key, unpack(fields))
-- A subject without a record here may still have one that an earlier version wrote: adopt it.
local adopted = false
if not v[1] then
  local old = redis.call('HMGET', legacy, unpack(fields))
  if old[1] then v, adopted = old, true end
end
local seen = tonumber(v[1])
if seen and now < seen then now = seen end
local token, started = tonumber(v[2]) or 0, tonumber(v[3]) or -1
local active, lease_end = v[4] == '1', tonumber(v[5]) or 0
local retry_at, quiet_end = tonumber(v[6]) or 0, tonumber(v[7]) or 0
local failures = tonumber(v[8]) or 0
local max_failures = 4294967295
local f = string.format

-- What time alone does: an expired lease is a failure, old failures are forgotten.
if active and now >= lease_end then
  active = false
  if failures < max_failures then failures = failures + 1 end
end
if not active and now >= quiet_end then failures, retry_at = 0, 0 end

local function delay(n)
  if n == 0 then return 0 end
  local d, k = initial, n - 1
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
-- Writes the record, indexed by when it goes idle; an idle record is deleted instead.
local function save()
  local idle_at = math.max(quiet_end, started + 1)
  if idle_at <= now then
    redis.call('DEL', key)
    redis.call('ZREM', index, key)
  else
    redis.call('HSET', key, 'seen', f('%.0f', now), 'token', f('%.0f', token),
               'started', f('%.0f', started), 'active', active and '1' or '0',
               'lease_end', f('%.0f', lease_end), 'retry_at', f('%.0f', retry_at),
               'quiet_end', f('%.0f', quiet_end), 'failures', f('%.0f', failures))
    redis.call('ZADD', index, f('%.0f', idle_at), key)
  end
  if adopted then redis.call('DEL', legacy) end
end

-- Ends any attempt and forgets the failures (a success or a reset); token and started stay.
local function clear()
  active, failures, retry_at, quiet_end = false, 0, 0, now
  save()
end

if op == 'i' then return refusal() or {0, 0, failures} end
-- Every writing operation first removes up to `sweep` records that have gone idle.
local idle = redis.call('ZRANGEBYSCORE', index, '-inf', f('%.0f', now), 'LIMIT', 0, sweep)
if #idle > 0 then
  redis.call('DEL', unpack(idle))
  redis.call('ZREM', index, unpack(idle))
end
if op == 'r' then
  if seen then clear() end
  return {0}
end
if op == 'b' then
  local denied = refusal()
  if denied then return denied end
  if not redis.call('ZSCORE', index, key) and redis.call('ZCARD', index) >= max_records then
    local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    return {3, math.max(tonumber(first[2]) - now, 1), 0}
  end
  local before = failures
  local next_failures = failures
  if next_failures < max_failures then next_failures = next_failures + 1 end
  token, started, active = token + 1, now, true
  lease_end = now + lease
  retry_at = lease_end + delay(next_failures)
  quiet_end = lease_end + quiet
  save()
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
  save()
end
return {0}
)lua";

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_ATTEMPT_SCRIPT_HPP_
