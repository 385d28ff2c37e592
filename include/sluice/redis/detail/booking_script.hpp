// sluice/redis/detail/booking_script.hpp — the Lua script behind reserve, cancel, settle and
// reset over Redis (RedisGcraLimiter). Internal.
//
// It works on the same state as the check script (sluice/redis/script.hpp: write time, then per
// window the debt TAT − write time as exact (ns, frac) doubles) and keeps its invariants: a debt
// never exceeds 2^52 ns, every sum is an exact double.
//
// Call:  EVALSHA <sha1> 2 <state key> <reset marker key> <op> <time_s> <time_ns> <params> <extra>
//   op        'r' reserve, 'e' estimated check, 'g' give back (cancel, refund), 'c' charge,
//             'k' charge a key only if it holds state, 'x' reset.
//   time_*    "" "": the server's TIME; otherwise a test-only time, as for the check script.
//   params    per window 5 doubles, as the check script's: an amount·T as (ns, frac), burst·T as
//             (ns, frac), requests r. The amount is the reservation's cost ('r'), the estimate
//             ('e'), the surplus to give back ('g') or the extra to charge ('c', 'k').
//   extra     'r': the longest wait allowed, ns (a decimal string).
//             'g': 3 doubles, the reset count the booking saw and the instant after which it
//             may no longer be given back (s, ns); then per window the TAT it booked (s, ns,
//             frac).
// Every operation decides at t = max(server time, the key's write time) (a clock that went back
// gives nothing back), and answers an array of integers:
//   'r'  {0, t_s, t_ns, wait, reset count, per window: booked debt (ns, frac), added (ns,
//        frac)}; the debts are relative to t, the reservation's instant is t + wait.
//        {1, wait}: the wait exceeds the longest allowed, nothing booked.
//        {2}: a window's debt would pass 2^52 ns, nothing booked.
//   'e'  {0 admitted (booked) or 5 denied (nothing written), t_s, t_ns, reset count, per
//        window: debt before (ns, frac)}.
//   'g', 'c', 'k'  {0, t_s, t_ns, per window: debt after (ns, frac)}; {3}: the instant has
//        passed; {4, t_s, t_ns, debts}: the key was reset after the booking (nothing given back);
//        {6}: 'k' on a key without state (nothing written: a check carries it from its earlier
//        keys).
//   'x'  {0}. The state is deleted; if it or the marker still lives, the marker's count is
//        raised and kept for as long as the longer of the two: past the TAT of every booking
//        that saw the previous count, since a give-back that shortens the state's life first
//        extends the marker to it. A booking gives back only while the count is the one it saw,
//        and none can once its TAT passed.
#ifndef SLUICE_REDIS_DETAIL_BOOKING_SCRIPT_HPP_
#define SLUICE_REDIS_DETAIL_BOOKING_SCRIPT_HPP_

#include <string_view>

namespace sluice::redis::detail {

inline constexpr std::string_view kBookingScript = R"lua(-- sluice GCRA bookings v1
local now_s, now_ns
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now_s, now_ns = tonumber(t[1]), t[2] * 1000
else
  now_s, now_ns = tonumber(ARGV[2]), tonumber(ARGV[3])
end
local sunpack, spack = struct.unpack, struct.pack
local key, marker, op = KEYS[1], KEYS[2], ARGV[1]
local MAXD = 4503599627370496
if op == 'x' then
  -- Bookings may give back for as long as the state lives, or the marker, which a give-back
  -- that shortened the state's life extended to the life it had (see the write below).
  local ttl = redis.call('PTTL', key)
  local held = redis.call('PTTL', marker)
  if held > ttl then ttl = held end
  if ttl > 0 then
    redis.call('INCR', marker)
    redis.call('PEXPIRE', marker, ttl)
  end
  redis.call('DEL', key)
  return {0}
end
-- The key's reset count while bookings made before a reset may still give back (0: none).
local serial = tonumber(redis.call('GET', marker) or '0')
local p = ARGV[4]
local n = #p / 40
if n < 1 or n % 1 ~= 0 then return redis.error_reply('sluice: malformed parameters') end
local s = redis.call('GET', key)
if op == 'k' and not s then return {6} end
local ts, tns, e = now_s, now_ns, 0
if s then
  if #s ~= 16 + 16 * n then return redis.error_reply('sluice: state of unexpected size') end
  local ws, wns = sunpack('<dd', s)
  if not (ws >= 0 and ws <= 1e10 and wns >= 0 and wns < 1e9 and wns % 1 == 0) then
    return redis.error_reply('sluice: corrupt state')
  end
  if now_s < ws or (now_s == ws and now_ns < wns) then
    ts, tns = ws, wns
  else
    e = (now_s - ws) * 1e9 + (now_ns - wns)
  end
end
-- Each window's debt at t, and the amount, burst and requests of the call.
local dn, df, an, af, bn, bf, rq = {}, {}, {}, {}, {}, {}, {}
for w = 1, n do
  an[w], af[w], bn[w], bf[w], rq[w] = sunpack('<ddddd', p, 40 * w - 39)
  local d, f = 0, 0
  if s then
    d, f = sunpack('<dd', s, 16 * w + 1)
    if not (d >= 0 and d <= MAXD and f >= 0 and f < rq[w]) then
      return redis.error_reply('sluice: corrupt state')
    end
    d = d - e
    if d < 0 then d, f = 0, 0 end
  end
  dn[w], df[w] = d, f
end
local out = {0, ts, tns}
if op == 'r' then
  local wait = 0
  for w = 1, n do
    -- The cost fits once the debt has drained to burst·T − cost·T: wait debt + cost − burst.
    local x, y = dn[w] + an[w] - bn[w], df[w] + af[w] - bf[w]
    if y >= rq[w] then x, y = x + 1, y - rq[w] elseif y < 0 then x, y = x - 1, y + rq[w] end
    if y > 0 then x = x + 1 end
    if x > wait then wait = x end
  end
  if wait > tonumber(ARGV[5]) then return {1, wait} end
  out[4], out[5] = wait, serial
  for w = 1, n do
    local d, f = dn[w], df[w]
    if d < wait or (d == wait and f == 0) then d, f = wait, 0 end
    d, f = d + an[w], f + af[w]
    if f >= rq[w] then d, f = d + 1, f - rq[w] end
    if d > MAXD then return {2} end
    local x, y = d - dn[w], f - df[w]
    if y < 0 then x, y = x - 1, y + rq[w] end
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = d, f, x, y
    dn[w], df[w] = d, f
  end
elseif op == 'g' then
  local x = ARGV[5]
  local booked_serial, is, ins = sunpack('<ddd', x)
  if ts > is or (ts == is and tns > ins) then return {3} end
  if serial ~= booked_serial then
    out[1] = 4
    for w = 1, n do out[#out + 1], out[#out + 2] = dn[w], df[w] end
    return out
  end
  for w = 1, n do
    local ks, kns, kf = sunpack('<ddd', x, 25 + 24 * (w - 1))
    -- What the booking still has ahead of t; give back at most that, and at most the amount.
    local hn, hf = (ks - ts) * 1e9 + (kns - tns), kf
    local d, f = dn[w], df[w]
    if (d > 0 or f > 0) and (hn > 0 or (hn == 0 and hf > 0)) then
      local gn, gf = an[w], af[w]
      if hn < gn or (hn == gn and hf < gf) then gn, gf = hn, hf end
      d, f = d - gn, f - gf
      if f < 0 then d, f = d - 1, f + rq[w] end
      if d < 0 then d, f = 0, 0 end
    end
    dn[w], df[w] = d, f
    out[#out + 1], out[#out + 2] = d, f
  end
elseif op == 'e' then
  -- A check that books `amount` if it fits now (the estimate of a settled cost).
  local ok = true
  out[4] = serial
  for w = 1, n do
    out[#out + 1], out[#out + 2] = dn[w], df[w]
    local d, f = dn[w] + an[w], df[w] + af[w]
    if f >= rq[w] then d, f = d + 1, f - rq[w] end
    if d > bn[w] or (d == bn[w] and f > bf[w]) then ok = false end
    dn[w], df[w] = d, f
  end
  if not ok then
    out[1] = 5
    return out
  end
elseif op == 'c' or op == 'k' then
  for w = 1, n do
    local d, f = dn[w] + an[w], df[w] + af[w]
    if f >= rq[w] then d, f = d + 1, f - rq[w] end
    if d > MAXD then d, f = MAXD, 0 end
    dn[w], df[w] = d, f
    out[#out + 1], out[#out + 2] = d, f
  end
else
  return redis.error_reply('sluice: unknown booking operation')
end
-- Write the state at t; expire it when every window is full again; no debt: no state. A write
-- that brings the state's expiry closer (a give-back shrinks the debt, not the TATs earlier
-- bookings hold) first extends the marker to the life the state had (count 0 if none yet), so
-- that a later reset's marker outlives every booking made before it.
local packed, most, any = spack('<dd', ts, tns), 0, false
for w = 1, n do
  packed = packed .. spack('<dd', dn[w], df[w])
  if dn[w] > most then most = dn[w] end
  if dn[w] > 0 or df[w] > 0 then any = true end
end
local q = ((ts - now_s) * 1e9 + (tns - now_ns) + most) / 1e6
local ttl = q - q % 1 + 1
if ttl > 1e10 then ttl = 1e10 end
if not any then ttl = 0 end
if s then
  local kept = redis.call('PTTL', key)
  if kept > ttl and redis.call('PTTL', marker) < kept then
    if serial > 0 then
      redis.call('PEXPIRE', marker, kept)
    else
      redis.call('SET', marker, '0', 'PX', kept)
    end
  end
end
if any then
  redis.call('SET', key, packed, 'PX', ttl)
  -- A booking that saw a reset count keeps it alive for as long as the booking can give back.
  if serial > 0 and redis.call('PTTL', marker) < ttl then redis.call('PEXPIRE', marker, ttl) end
elseif s then
  redis.call('DEL', key)
end
return out
)lua";

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_BOOKING_SCRIPT_HPP_
