// sluice/redis/script.hpp — the Lua script that decides every Redis check (target sluice::redis).
//
// One EVALSHA of `kGcraScript` decides and (when everything admits) reserves the cost for one or
// more (key, windows, cost) items, atomically: Redis runs a script without interleaving. The
// client (sluice/redis/client.hpp) builds the arguments, then recomputes every decision field
// from the reply with 128-bit integers and cross-checks the script's verdict. Users never call
// it directly; it is public so that a deployment can preload it (optional: the client loads it
// on NOSCRIPT by itself) and tests can vary it:
//
//   const std::string_view body = sluice::redis::kGcraScript;
//   redisCommand(context, "SCRIPT LOAD %b", body.data(), body.size());  // == client->script_sha()
//
// Call:  EVALSHA <sha1> <k> key_1 .. key_k <time_s> <time_ns> params_1 .. params_k
//        A booking check (one that records what it took, to settle the cost later) passes 2k
//        keys: key_1 .. key_k, then each key's reset marker (`<key>:reset`, see the booking
//        script), and its reply ends with each marker's count.
//        Independent items: `kIndependentItems` ("each") after params_k. Every item is then
//        decided at its turn exactly as k separate checks in this order at the one `now`
//        would be (a key repeated later sees the earlier consumption), and each key left
//        changed is written once; the reply is an array of k elements, element i being item
//        i's reply as a lone check's (below) or that item's own error (a key of another type;
//        a write the server refuses, OOM or READONLY, as it would refuse each lone check's).
//        Never atomic across items; not for booking checks.
//        `kDistinctIndependentItems` ("distinct") instead of "each" when no two of the keys are
//        equal: the same decisions and replies, each admitted item written at once.
//        Carried keys: `<mask> carry` after params_k (not with "each"), the mask one byte per
//        item, '1' for an item whose key may still have its state under an earlier limit (a rule
//        whose windows a reload changed). If any such key holds no state, the script changes
//        nothing and replies with the status CARRY: the client carries the state over
//        (sluice/redis/detail/carry.hpp) and calls again without the mask.
//
// Units and layout (all numbers are IEEE doubles holding integers below 2^53, packed
// little-endian with Redis's bundled `struct` library, so every value is exact):
//   time_s, time_ns   "" and "": read the clock with TIME. Otherwise a test-only override of the
//                     server time, seconds since the Unix epoch and nanoseconds within it.
//   params_i          per window, shortest period first, 5 doubles:
//                     cost·T as (ns, frac), burst·T as (ns, frac), requests r.
//                     (ns, frac) means ns + frac/r nanoseconds, 0 ≤ frac < r; T = period / r.
//                     A fixed-window item (Limit::fixed_window): the byte 'F', its cost (a
//                     double), then per window its limit and its length in ns (2 doubles); its
//                     length is odd, so never a multiple of 40.
//   state (the value at key_i, 16 + 16·n bytes): w_s, w_ns (the latest time the key was written
//                     at), then per window its debt (ns, frac) = TAT − w. No debt = a fresh window.
//                     A fixed-window key: per window the ns its window has left after w, and
//                     its count; a window with no time left is closed (the next admitted item
//                     opens a new one of the full length). Its TTL is the longest time left.
//   reply             one string: doubles all_admitted (1/0), now_s, now_ns, then per item one
//                     byte '1' followed by the state the decision was computed from, or '0'
//                     when the key held no state; then, for a booking check, per item its
//                     reset count (a double).
//
// Invariants: requests < 2^52 and burst·T ≤ 2^52 ns (`Limit::create` validates both), so every
// debt is ≤ 2^52 ns, a debt plus a cost is < 2^53, and frac + frac < 2r < 2^53: every sum the
// script forms is an exact double. Elapsed time above 2^53 ns may round, but it then exceeds
// every debt, and any debt minus it is clamped to 0 either way.
//
// Thread-safety: a constant.
#ifndef SLUICE_REDIS_SCRIPT_HPP_
#define SLUICE_REDIS_SCRIPT_HPP_

#include <string_view>

namespace sluice::redis {

inline constexpr std::string_view kGcraScript = R"lua(-- sluice GCRA v1 (docs/redis.md)
local now_s, now_ns
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_s, now_ns = tonumber(t[1]), t[2] * 1000
else
  now_s, now_ns = tonumber(ARGV[1]), tonumber(ARGV[2])
end
local sunpack, spack = struct.unpack, struct.pack
local distinct = ARGV[#ARGV] == 'distinct'
local each = distinct or ARGV[#ARGV] == 'each'
local carry = ARGV[#ARGV] == 'carry' and ARGV[#ARGV - 1]
local nkeys = #ARGV - 2
if each then nkeys = nkeys - 1 end
if carry then nkeys = nkeys - 2 end
-- A fixed-window item's windows (p: 'F', its cost, then per window its limit and length in ns)
-- against state s, e ns after s was written. Returns an error message; or nil, the verdict,
-- whether it consumes, the windows' state (per window: ns left, count) and the most ns left.
local function fixed_windows(p, s, n, e)
  local cost = sunpack('<d', p, 2)
  local ok, most, packed = true, 0, ''
  for w = 1, n do
    local limit, length = sunpack('<dd', p, 16 * w - 6)
    local left, c = 0, 0
    if s then
      left, c = sunpack('<dd', s, 16 * w + 1)
      if not (left >= 0 and left <= 4503599627370496 and c >= 0 and c <= limit) then
        return 'sluice: corrupt state'
      end
      left = left - e
      if left <= 0 then left, c = 0, 0 end
    end
    if c + cost > limit then ok = false end
    if left == 0 then left = length end
    packed = packed .. spack('<dd', left, c + cost)
    if left > most then most = left end
  end
  return nil, ok, cost > 0, packed, most
end
-- One item (parameters p) against its key's state s (false: none); cn1 .. r1: p's first
-- window, when the caller has it unpacked. Returns an error message; or nil, the verdict, and
-- for an admitted item that consumes, its new state and its time to live (ms).
local function decide(p, s, cn1, cf1, bn1, bf1, r1)
  local fixed = #p % 40 ~= 0 and p:sub(1, 1) == 'F'
  local n = #p / 40
  if fixed then n = (#p - 9) / 16 end
  if n < 1 or n % 1 ~= 0 then return 'sluice: malformed parameters' end
  -- ts, tns: the time this item is decided at (now, or the key's later write time: a clock
  -- that went back replenishes nothing); e: ns elapsed since the key's write.
  local ts, tns, e = now_s, now_ns, 0
  local d1, f1  -- the state's first window
  if s then
    if #s ~= 16 + 16 * n then return 'sluice: state of unexpected size' end
    local ws, wns
    ws, wns, d1, f1 = sunpack('<dddd', s)
    if not (ws >= 0 and ws <= 1e10 and wns >= 0 and wns < 1e9 and wns % 1 == 0) then
      return 'sluice: corrupt state'
    end
    if now_s < ws or (now_s == ws and now_ns < wns) then
      ts, tns = ws, wns
    else
      e = (now_s - ws) * 1e9 + (now_ns - wns)
    end
  end
  local err, ok, consumes, packed, most, d, f
  if fixed then
    err, ok, consumes, packed, most = fixed_windows(p, s, n, e)
    if err then return err end
  else
    ok, consumes, most, packed = true, false, 0, ''
    for w = 1, n do
      local cn, cf, bn, bf, r = cn1, cf1, bn1, bf1, r1
      if w > 1 or not r1 then cn, cf, bn, bf, r = sunpack('<ddddd', p, 40 * w - 39) end
      d, f = 0, 0
      if s then
        if w == 1 then d, f = d1, f1 else d, f = sunpack('<dd', s, 16 * w + 1) end
        if not (d >= 0 and d <= 4503599627370496 and f >= 0 and f < r) then
          return 'sluice: corrupt state'
        end
        d = d - e
        if d < 0 then d, f = 0, 0 end
      end
      if cn + cf > 0 then consumes = true end
      d, f = d + cn, f + cf
      if f >= r then d, f = d + 1, f - r end
      if d > bn or (d == bn and f > bf) then ok = false end
      if n > 1 then packed = packed .. spack('<dd', d, f) end
      if d > most then most = d end
    end
  end
  if not (ok and consumes) then return nil, ok end
  if not fixed and n == 1 then
    packed = spack('<dddd', ts, tns, d, f)
  else
    packed = spack('<dd', ts, tns) .. packed
  end
  -- Expire when every window is full again: the time to live in ms, rounded up, from the
  -- server's clock.
  local q = ((ts - now_s) * 1e9 + (tns - now_ns) + most) / 1e6
  local ttl = q - q % 1 + 1
  if ttl > 1e10 then ttl = 1e10 end
  return nil, true, packed, ttl
end
if each then
  -- Independent items: each decided at its turn, as separate checks in this order would be (a
  -- repeated key sees the earlier occurrence's consumption); each item's reply or error. Until a
  -- write has succeeded, an admitted item writes at once and a refused write (OOM, READONLY) is
  -- its error, as a lone check's would be. After one has, Redis refuses no later write of this
  -- script: each key changed since is written once, at the end, with its last state and TTL.
  -- MGET's array becomes the reply: item i's reply replaces element i once it has been read.
  -- With distinct keys no item sees another's write: each admitted item writes at once, and no
  -- table of the keys met is kept.
  local keys, argv = KEYS, ARGV
  local replies, known, ttls = redis.call('MGET', unpack(keys)), {}, nil
  local admitted, denied = spack('<ddd', 1, now_s, now_ns), nil
  local wrote = false
  local wrongtype = 'WRONGTYPE Operation against a key holding the wrong kind of value'
  -- The items mostly share their limit: the parameters met last and, for GCRA parameters, their
  -- first window; and the verdict on a key without state under the parameters met last there,
  -- which depends on nothing else (its time to live as text: converted once, not per key).
  local last_p, cn, cf, bn, bf, r
  local fresh_p, fresh_err, fresh_ok, fresh_packed, fresh_ttl
  for i = 1, nkeys do
    local key = keys[i]
    local s, err = nil, nil
    if not distinct then s = known[key] end
    if s == nil then
      s = replies[i]
      -- MGET reads a key of another type as nil: only GET tells it from no key. With distinct
      -- keys, a write asks SET to write only where no key is (NX) instead, below.
      if not (s or distinct) then
        s = redis.pcall('GET', key)
        if type(s) == 'table' then err = s.err end
      end
    end
    local ok, packed, ttl
    if not err then
      local p = argv[i + 2]
      if p ~= last_p then
        last_p, cn, cf, bn, bf, r = p, nil, nil, nil, nil, nil
        if #p >= 40 and #p % 40 == 0 then cn, cf, bn, bf, r = sunpack('<ddddd', p) end
      end
      if s then
        err, ok, packed, ttl = decide(p, s, cn, cf, bn, bf, r)
      else
        if p ~= fresh_p then
          fresh_p = p
          fresh_err, fresh_ok, fresh_packed, fresh_ttl = decide(p, s, cn, cf, bn, bf, r)
          if fresh_ttl then fresh_ttl = tostring(fresh_ttl) end
        end
        err, ok, packed, ttl = fresh_err, fresh_ok, fresh_packed, fresh_ttl
      end
      if distinct and not s and not err then
        -- No state read: the key is absent or of another type, which SET NX (or GET, when
        -- nothing is written) tells apart without touching it.
        local w
        if packed then
          w = redis.pcall('SET', key, packed, 'PX', ttl, 'NX')
          if not w then w = {err = wrongtype} end
        else
          w = redis.pcall('GET', key)
        end
        if type(w) == 'table' then err = w.err end
        if packed and not err then wrote = true end
      elseif packed and (distinct or not wrote) then
        local set = redis.pcall('SET', key, packed, 'PX', ttl)
        if set.err then err = set.err else wrote = true end
      elseif packed then
        ttls = ttls or {}
        ttls[key] = ttl
      end
      if not (err or distinct) then known[key] = packed or s end
    end
    if err then
      replies[i] = redis.error_reply(err)
    else
      local head = admitted
      if not ok then
        denied = denied or spack('<ddd', 0, now_s, now_ns)
        head = denied
      end
      if s then replies[i] = head .. '1' .. s else replies[i] = head .. '0' end
    end
  end
  if ttls then
    for key, ttl in next, ttls do
      redis.call('SET', key, known[key], 'PX', ttl)
    end
  end
  return replies
end
-- A key whose state may still be under an earlier limit, and that holds none here: nothing is
-- decided, so that the caller carries its state over first.
if carry then
  for i = 1, nkeys do
    if string.byte(carry, i) == 49 and redis.call('EXISTS', KEYS[i]) == 0 then
      return redis.status_reply('CARRY')
    end
  end
end
-- A booking check names each item's reset marker after the state keys.
local marked = #KEYS == 2 * nkeys
local pending, ttls, order, seen
if nkeys > 1 then pending, ttls, order, seen = {}, {}, {}, {} end
if marked and not ttls then ttls = {} end
local all, s = 1, nil
for i = 1, nkeys do
  local key = KEYS[i]
  s = pending and pending[key]
  if not s then s = redis.call('GET', key) end
  if seen then seen[i] = s and '1' .. s or '0' end
  local err, ok, packed, ttl = decide(ARGV[i + 2], s)
  if err then return redis.error_reply(err) end
  if not ok then
    all = 0
  elseif packed then
    if ttls then ttls[key] = ttl end
    if nkeys == 1 then
      redis.call('SET', key, packed, 'PX', ttl)
    else
      if not pending[key] then order[#order + 1] = key end
      pending[key] = packed
    end
  end
end
-- Each item's reset count, when asked; an admitted booking keeps a raised count alive for as
-- long as its key's state (so that it can give back, as the booking script's give-back does).
local serials = ''
if marked then
  for i = 1, nkeys do
    local marker = KEYS[nkeys + i]
    local serial = tonumber(redis.call('GET', marker) or '0')
    serials = serials .. spack('<d', serial)
    local ttl = ttls[KEYS[i]]
    if all == 1 and serial > 0 and ttl and redis.call('PTTL', marker) < ttl then
      redis.call('PEXPIRE', marker, ttl)
    end
  end
end
if nkeys == 1 then
  if s then return spack('<ddd', all, now_s, now_ns) .. '1' .. s .. serials end
  return spack('<ddd', all, now_s, now_ns) .. '0' .. serials
end
if all == 1 then
  for j = 1, #order do
    local key = order[j]
    redis.call('SET', key, pending[key], 'PX', ttls[key])
  end
end
return spack('<ddd', all, now_s, now_ns) .. table.concat(seen) .. serials
)lua";

// Gives back a fixed-window key's booked cost (a Cluster batch over several slots that another
// slot denied). Call: EVALSHA <sha1> 1 key <time_s> <time_ns> <cost> end_s_1 end_ns_1 ..
// end_s_n end_ns_n, each end the one the booking left its window at. A window still ending
// then gives the cost back (never below 0); any other window (reopened, or expired) is left as
// it is. The key keeps its expiry. Replies 1 if it changed the key, else 0. Every value below
// 2^53: exact. Thread-safety: a constant.
inline constexpr std::string_view kFixedGiveBackScript = R"lua(-- sluice fixed give-back v1
local s = redis.call('GET', KEYS[1])
if not s then return 0 end
local sunpack, spack = struct.unpack, struct.pack
local n = (#s - 16) / 16
if n < 1 or n % 1 ~= 0 or 2 * n ~= #ARGV - 3 then return 0 end
local cost = tonumber(ARGV[3])
local ws, wns = sunpack('<dd', s)
local out, changed = spack('<dd', ws, wns), 0
for w = 1, n do
  local left, c = sunpack('<dd', s, 16 * w + 1)
  local t = wns + left
  local ns = t % 1e9
  if ws + (t - ns) / 1e9 == tonumber(ARGV[2 * w + 2]) and ns == tonumber(ARGV[2 * w + 3]) then
    c = math.max(c - cost, 0)
    changed = 1
  end
  out = out .. spack('<dd', left, c)
end
local ttl = redis.call('PTTL', KEYS[1])
if changed == 1 and ttl > 0 then redis.call('SET', KEYS[1], out, 'PX', ttl) end
return changed
)lua";

// The tags that, after the parameters, select the independent-items mode (see above): for any
// keys, and for keys of which no two are equal.
inline constexpr std::string_view kIndependentItems = "each";
inline constexpr std::string_view kDistinctIndependentItems = "distinct";

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_SCRIPT_HPP_
