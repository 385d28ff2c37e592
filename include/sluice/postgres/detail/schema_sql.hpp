// Internal: the SQL of the schema that sluice::postgres::migrate installs, one step per version;
// a step, once released, never changes (deployed databases have applied it). Version 1 creates the
// schema `sluice`: a per-shard row counter, one row per key (digest, shard, idle time, state), and
// the functions a check and a cleanup call; version 2 adds the function a reset calls; version 3
// the check with a cost per item; version 4 the check that carries a key's state from earlier
// limits; version 5 (schema_sql_v5.hpp) the one-key check of one UPDATE; version 6 drops the
// digest's CHECK constraint, which each write parsed again. Every value is an exact
// integer (bigint, or numeric for products that exceed 64 bits); times are ns since the
// Unix epoch from pg_catalog.clock_timestamp(). Shard = the first byte of the key digest (256
// shards); shard locks are transaction-scoped advisory locks (class kLockClass, object = shard)
// taken in ascending shard order.
#ifndef SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_
#define SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_

#include "sluice/postgres/detail/schema_sql_v5.hpp"

namespace sluice::postgres::detail {

// The advisory lock class of sluice's shard locks (object -1: the migration).
inline constexpr int kLockClass = 1936483173;

// Applied once, inside the migration's transaction, when schema_version lacks version 1.
inline constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE sluice.shards (
  shard integer PRIMARY KEY CHECK (shard BETWEEN 0 AND 255),
  row_count integer NOT NULL DEFAULT 0 CHECK (row_count >= 0),
  capacity integer NOT NULL CHECK (capacity >= 1));
INSERT INTO sluice.shards (shard, capacity)
  SELECT s, 4096 FROM pg_catalog.generate_series(0, 255) AS s;
CREATE TABLE sluice.limit_state (
  digest bytea PRIMARY KEY CHECK (pg_catalog.length(digest) = 16),
  shard integer NOT NULL,
  idle_at bigint NOT NULL,
  state bigint[] NOT NULL) WITH (fillfactor = 80);
CREATE INDEX limit_state_shard_idle_at ON sluice.limit_state (shard, idle_at);

-- The two decide functions use only built-in operators and are called from check_v1, whose
-- search_path is fixed (a SET clause here would cost more than the function body).
-- GCRA for one key at now_ns: st holds (TAT whole ns, TAT fraction in 1/requests ns) per window.
-- Returns reason (0 allowed, 1 quota), limit, remaining, retry_after, reset_after, binding
-- (0-based), idle_at, then the state to store if allowed.
CREATE FUNCTION sluice.gcra_decide_v1(st bigint[], req bigint[], period bigint[], burst bigint[],
                                      cost bigint, now_ns bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  wc integer := cardinality(req);
  nx bigint[] := st;
  aheads numeric[] := '{}';
  r numeric; p numeric; tol numeric; ahead numeric; held numeric; least numeric; rem numeric;
  wait numeric := 0;
  tw bigint; tf bigint; idle bigint := now_ns;
  fd integer; bind integer;
BEGIN
  FOR w IN 1..wc LOOP
    r := req[w]; p := period[w]; tol := burst[w] * p;
    tw := st[2 * w - 1]; tf := st[2 * w];
    IF tw < now_ns OR (tw = now_ns AND tf = 0) THEN tw := now_ns; tf := 0; END IF;
    tw := tw + div(cost * p, r)::bigint;
    tf := tf + mod(cost * p, r)::bigint;
    IF tf >= r THEN tf := tf - r::bigint; tw := tw + 1; END IF;
    nx[2 * w - 1] := tw; nx[2 * w] := tf;
    idle := greatest(idle, tw + CASE WHEN tf > 0 THEN 1 ELSE 0 END);
    ahead := (tw - now_ns)::numeric * r + tf;
    aheads := aheads || ahead;
    IF ahead > tol AND fd IS NULL THEN fd := w; END IF;
  END LOOP;
  IF fd IS NULL THEN
    FOR w IN 1..wc LOOP
      rem := div(burst[w]::numeric * period[w] - aheads[w], period[w]);
      IF least IS NULL OR rem < least THEN least := rem; bind := w; END IF;
    END LOOP;
    RETURN ARRAY[0, burst[bind], least, 0, div(aheads[bind] + req[bind] - 1, req[bind]), bind - 1,
                 idle] || nx;
  END IF;
  FOR w IN fd..wc LOOP
    tol := burst[w]::numeric * period[w];
    IF aheads[w] > tol THEN wait := greatest(wait, div(aheads[w] - tol + req[w] - 1, req[w])); END IF;
  END LOOP;
  r := req[fd]; p := period[fd]; tol := burst[fd] * p;
  held := CASE WHEN st[2 * fd - 1] >= now_ns
               THEN (st[2 * fd - 1] - now_ns)::numeric * r + st[2 * fd] ELSE 0 END;
  RETURN ARRAY[1, burst[fd], greatest(div(tol - held, p), 0), wait, div(held + r - 1, r), fd - 1,
               0] || st;
END
$fn$;

-- Fixed windows for one key at now_ns: st holds (window end ns, units counted) per window.
-- Returns what gcra_decide_v1 returns.
CREATE FUNCTION sluice.fixed_window_decide_v1(st bigint[], lim bigint[], win bigint[],
                                              cost bigint, now_ns bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  wc integer := cardinality(lim);
  cur bigint[] := st;
  fd integer; bind integer; least bigint; wait bigint := 0; idle bigint := now_ns;
BEGIN
  FOR w IN 1..wc LOOP
    IF cur[2 * w - 1] <= now_ns THEN cur[2 * w - 1] := now_ns + win[w]; cur[2 * w] := 0; END IF;
    IF cost > lim[w] - cur[2 * w] AND fd IS NULL THEN fd := w; END IF;
  END LOOP;
  IF fd IS NULL THEN
    FOR w IN 1..wc LOOP
      cur[2 * w] := cur[2 * w] + cost;
      idle := greatest(idle, cur[2 * w - 1]);
      IF least IS NULL OR lim[w] - cur[2 * w] < least THEN least := lim[w] - cur[2 * w]; bind := w; END IF;
    END LOOP;
    RETURN ARRAY[0, lim[bind], least, 0,
                 CASE WHEN cur[2 * bind] = 0 THEN 0 ELSE cur[2 * bind - 1] - now_ns END, bind - 1,
                 idle] || cur;
  END IF;
  FOR w IN fd..wc LOOP
    IF cost > lim[w] - cur[2 * w] THEN wait := greatest(wait, cur[2 * w - 1] - now_ns); END IF;
  END LOOP;
  RETURN ARRAY[1, lim[fd], lim[fd] - cur[2 * fd], wait,
               CASE WHEN cur[2 * fd] = 0 THEN 0 ELSE cur[2 * fd - 1] - now_ns END, fd - 1, 0] || st;
END
$fn$;

-- Decides n items (one limit each, all of kind p_kind: 1 GCRA, 2 fixed window) in one
-- transaction. p_digests: n 16-byte key digests; p_windows: windows per item; p_a, p_b, p_c: per
-- window, GCRA (requests, period ns, burst) or fixed window (limit, window ns, 0). All-or-nothing:
-- nothing is stored unless every item is admitted. p_now: NULL for the database clock.
-- Returns now_ns, then per item reason (2: store full), limit, remaining, retry_after,
-- reset_after, binding window.
CREATE FUNCTION sluice.check_v1(p_kind integer, p_digests bytea, p_windows integer[],
                                p_a bigint[], p_b bigint[], p_c bigint[], p_cost bigint,
                                p_all_or_nothing boolean, p_now bigint)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n integer := length(p_digests) / 16;
  now_ns bigint;
  digests bytea[] := '{}';
  shards integer[] := '{}';
  offs integer[] := '{}';        -- 0-based offset of each item's first window in p_a, p_b, p_c
  states bigint[] := '{}';       -- per item, 8 slots: the key's state after the item
  stored boolean[] := '{}';      -- per item: the key has a row, or an earlier item creates one
  existed boolean[] := '{}';     -- per item: the key had a row before this call
  touched integer[];             -- the shards of the call, ascending
  idles bigint[] := '{}';        -- per item: when the key's state after it is idle
  pending integer[] := array_fill(0, ARRAY[256]);  -- rows this call adds, per shard
  result bigint[];
  d bigint[];
  st bigint[];
  admitted boolean := true;
  o integer := 0; wc integer; prev integer; s integer; freed integer; cap integer; cnt integer;
  earliest bigint;
BEGIN
  IF n < 1 OR length(p_digests) <> 16 * n OR cardinality(p_windows) <> n OR p_cost < 0
     OR p_kind NOT IN (1, 2) THEN
    RAISE EXCEPTION 'sluice.check_v1: malformed arguments' USING ERRCODE = '22023';
  END IF;
  FOR i IN 1..n LOOP
    IF p_windows[i] IS NULL OR p_windows[i] NOT BETWEEN 1 AND 4 THEN
      RAISE EXCEPTION 'sluice.check_v1: 1 to 4 windows per item' USING ERRCODE = '22023';
    END IF;
    digests := digests || substring(p_digests FROM 16 * i - 15 FOR 16);
    shards := shards || get_byte(digests[i], 0);
    offs := offs || o;
    o := o + p_windows[i];
  END LOOP;
  IF cardinality(p_a) <> o OR cardinality(p_b) <> o OR cardinality(p_c) <> o THEN
    RAISE EXCEPTION 'sluice.check_v1: malformed windows' USING ERRCODE = '22023';
  END IF;
  -- Every shard the call touches, locked in ascending order: concurrent calls cannot deadlock.
  IF n = 1 THEN
    touched := shards;
  ELSE
    SELECT array_agg(DISTINCT u ORDER BY u) INTO touched FROM unnest(shards) AS u;
  END IF;
  FOREACH s IN ARRAY touched LOOP
    PERFORM pg_advisory_xact_lock(1936483173, s);
  END LOOP;
  -- Read after the locks: a call that waited decides no earlier than the call it waited for.
  now_ns := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  result := ARRAY[now_ns];

  FOR i IN 1..n LOOP
    wc := p_windows[i]; o := offs[i]; s := shards[i];
    prev := NULL;
    FOR j IN REVERSE i - 1..1 LOOP
      IF digests[j] = digests[i] THEN prev := j; EXIT; END IF;
    END LOOP;
    IF prev IS NOT NULL THEN
      st := states[8 * prev - 7 : 8 * prev - 8 + 2 * wc];
      stored := stored || stored[prev];
      existed := existed || existed[prev];
    ELSE
      SELECT l.state INTO st FROM sluice.limit_state AS l WHERE l.digest = digests[i];
      stored := stored || FOUND;
      existed := existed || FOUND;
      IF FOUND AND cardinality(st) <> 2 * wc THEN
        RAISE EXCEPTION 'sluice.check_v1: stored state of the wrong shape' USING ERRCODE = 'XX000';
      END IF;
    END IF;
    IF NOT stored[i] THEN
      st := '{}';
      FOR w IN 1..wc LOOP st := st || ARRAY[now_ns, 0]::bigint[]; END LOOP;
    END IF;
    IF p_kind = 1 THEN
      d := sluice.gcra_decide_v1(st, p_a[o + 1 : o + wc], p_b[o + 1 : o + wc], p_c[o + 1 : o + wc],
                                 p_cost, now_ns);
    ELSE
      d := sluice.fixed_window_decide_v1(st, p_a[o + 1 : o + wc], p_b[o + 1 : o + wc], p_cost, now_ns);
    END IF;
    IF d[1] = 0 AND p_cost > 0 AND NOT stored[i] THEN
      -- A new key: it needs a slot in its shard. Idle rows (never another batch member's) are
      -- reclaimed first, a few at a time; a full shard denies the key (capacity denial).
      SELECT h.row_count, h.capacity INTO cnt, cap FROM sluice.shards AS h WHERE h.shard = s;
      IF cnt + pending[s + 1] >= cap THEN
        WITH gone AS (
          DELETE FROM sluice.limit_state AS l WHERE l.digest IN (
            SELECT x.digest FROM sluice.limit_state AS x
            WHERE x.shard = s AND x.idle_at <= now_ns AND x.digest <> ALL (digests)
            ORDER BY x.idle_at LIMIT 16)
          RETURNING 1)
        SELECT count(*) INTO freed FROM gone;
        UPDATE sluice.shards SET row_count = row_count - freed WHERE shard = s;
        cnt := cnt - freed;
      END IF;
      IF cnt + pending[s + 1] >= cap THEN
        SELECT min(l.idle_at) INTO earliest FROM sluice.limit_state AS l WHERE l.shard = s;
        d := ARRAY[2, p_c[o + 1], 0, greatest(coalesce(earliest, now_ns) - now_ns, 0), 0, 0, 0]
             || st;
        IF p_kind = 2 THEN d[2] := p_a[o + 1]; END IF;
      ELSE
        pending[s + 1] := pending[s + 1] + 1;
        stored[i] := true;
      END IF;
    END IF;
    result := result || d[1:6];
    IF d[1] <> 0 THEN admitted := false; END IF;
    IF d[1] = 0 AND p_cost > 0 THEN st := d[8:7 + 2 * wc]; END IF;
    states := states || st || array_fill(0::bigint, ARRAY[8 - 2 * wc]);
    idles := idles || CASE WHEN d[1] = 0 AND p_cost > 0 THEN d[7] END;
  END LOOP;

  IF p_cost = 0 OR (p_all_or_nothing AND NOT admitted) THEN
    RETURN result;
  END IF;
  -- Write each admitted key once, with the state after its last admitted item.
  FOR i IN REVERSE n..1 LOOP
    CONTINUE WHEN idles[i] IS NULL;
    CONTINUE WHEN n > 1 AND EXISTS (SELECT 1 FROM generate_subscripts(digests, 1) AS k
                                    WHERE k > i AND digests[k] = digests[i]
                                      AND idles[k] IS NOT NULL);
    IF existed[i] THEN
      UPDATE sluice.limit_state
        SET idle_at = idles[i], state = states[8 * i - 7 : 8 * i - 8 + 2 * p_windows[i]]
        WHERE digest = digests[i];
    ELSE
      INSERT INTO sluice.limit_state (digest, shard, idle_at, state)
        VALUES (digests[i], shards[i], idles[i], states[8 * i - 7 : 8 * i - 8 + 2 * p_windows[i]]);
    END IF;
  END LOOP;
  FOREACH s IN ARRAY touched LOOP
    CONTINUE WHEN pending[s + 1] = 0;
    UPDATE sluice.shards SET row_count = row_count + pending[s + 1] WHERE shard = s;
  END LOOP;
  RETURN result;
END
$fn$;

-- Deletes at most p_max_rows idle rows (shards ascending, skipping shards a check holds).
-- Returns the number deleted.
CREATE FUNCTION sluice.cleanup_v1(p_max_rows integer, p_now bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  now_ns bigint := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  budget integer := p_max_rows;
  freed integer;
BEGIN
  FOR s IN 0..255 LOOP
    EXIT WHEN budget <= 0;
    CONTINUE WHEN NOT EXISTS (SELECT 1 FROM sluice.limit_state AS l
                              WHERE l.shard = s AND l.idle_at <= now_ns);
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936483173, s);
    WITH gone AS (
      DELETE FROM sluice.limit_state AS l WHERE l.digest IN (
        SELECT x.digest FROM sluice.limit_state AS x
        WHERE x.shard = s AND x.idle_at <= now_ns ORDER BY x.idle_at LIMIT budget)
      RETURNING 1)
    SELECT count(*) INTO freed FROM gone;
    UPDATE sluice.shards SET row_count = row_count - freed WHERE shard = s;
    budget := budget - freed;
  END LOOP;
  RETURN greatest(p_max_rows, 0) - greatest(budget, 0);
END
$fn$;
)sql";

// Applied once, after version 1, when schema_version lacks version 2.
inline constexpr const char* kSchemaV2 = R"sql(
-- Forgets one key: deletes its row, if any, and frees its slot in its shard. Takes the shard's
-- lock first, as a check does, so a reset falls wholly before or after each check of the shard
-- (and, taken before any row lock, it cannot deadlock with them). Returns whether a row existed.
CREATE FUNCTION sluice.reset_v1(p_digest bytea)
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  s integer;
BEGIN
  IF p_digest IS NULL OR length(p_digest) <> 16 THEN
    RAISE EXCEPTION 'sluice.reset_v1: malformed arguments' USING ERRCODE = '22023';
  END IF;
  s := get_byte(p_digest, 0);
  PERFORM pg_advisory_xact_lock(1936483173, s);
  -- A statement after the lock: its snapshot includes every check that held the lock before.
  DELETE FROM sluice.limit_state WHERE digest = p_digest;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  UPDATE sluice.shards SET row_count = row_count - 1 WHERE shard = s;
  RETURN true;
END
$fn$;
)sql";

// Applied once, after version 2, when schema_version lacks version 3: check_v2, with one cost per
// item (a policy's rules may cost differently), and check_v1 as a call of it, so that both decide
// with one body (replicas not yet upgraded keep calling check_v1 during a rolling deploy).
inline constexpr const char* kSchemaV3 = R"sql(
-- Decides n items, as check_v1, with a cost per item: p_costs[i] (0: a peek of item i). An
-- item of cost 0 stores nothing; an all-or-nothing call stores nothing unless every item is
-- admitted.
CREATE FUNCTION sluice.check_v2(p_kind integer, p_digests bytea, p_windows integer[],
                                p_a bigint[], p_b bigint[], p_c bigint[], p_costs bigint[],
                                p_all_or_nothing boolean, p_now bigint)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n integer := length(p_digests) / 16;
  now_ns bigint;
  digests bytea[] := '{}';
  shards integer[] := '{}';
  offs integer[] := '{}';        -- 0-based offset of each item's first window in p_a, p_b, p_c
  states bigint[] := '{}';       -- per item, 8 slots: the key's state after the item
  stored boolean[] := '{}';      -- per item: the key has a row, or an earlier item creates one
  existed boolean[] := '{}';     -- per item: the key had a row before this call
  touched integer[];             -- the shards of the call, ascending
  idles bigint[] := '{}';        -- per item: when the key's state after it is idle
  pending integer[] := array_fill(0, ARRAY[256]);  -- rows this call adds, per shard
  result bigint[];
  d bigint[];
  st bigint[];
  admitted boolean := true;
  o integer := 0; wc integer; prev integer; s integer; freed integer; cap integer; cnt integer;
  earliest bigint; c bigint;
BEGIN
  IF n < 1 OR length(p_digests) <> 16 * n OR cardinality(p_windows) <> n
     OR cardinality(p_costs) <> n OR p_kind NOT IN (1, 2) THEN
    RAISE EXCEPTION 'sluice.check_v2: malformed arguments' USING ERRCODE = '22023';
  END IF;
  FOR i IN 1..n LOOP
    IF p_windows[i] IS NULL OR p_windows[i] NOT BETWEEN 1 AND 4 THEN
      RAISE EXCEPTION 'sluice.check_v2: 1 to 4 windows per item' USING ERRCODE = '22023';
    END IF;
    IF p_costs[i] IS NULL OR p_costs[i] < 0 THEN
      RAISE EXCEPTION 'sluice.check_v2: costs must be >= 0' USING ERRCODE = '22023';
    END IF;
    digests := digests || substring(p_digests FROM 16 * i - 15 FOR 16);
    shards := shards || get_byte(digests[i], 0);
    offs := offs || o;
    o := o + p_windows[i];
  END LOOP;
  IF cardinality(p_a) <> o OR cardinality(p_b) <> o OR cardinality(p_c) <> o THEN
    RAISE EXCEPTION 'sluice.check_v2: malformed windows' USING ERRCODE = '22023';
  END IF;
  -- Every shard the call touches, locked in ascending order: concurrent calls cannot deadlock.
  IF n = 1 THEN
    touched := shards;
  ELSE
    SELECT array_agg(DISTINCT u ORDER BY u) INTO touched FROM unnest(shards) AS u;
  END IF;
  FOREACH s IN ARRAY touched LOOP
    PERFORM pg_advisory_xact_lock(1936483173, s);
  END LOOP;
  -- Read after the locks: a call that waited decides no earlier than the call it waited for.
  now_ns := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  result := ARRAY[now_ns];

  FOR i IN 1..n LOOP
    wc := p_windows[i]; o := offs[i]; s := shards[i]; c := p_costs[i];
    prev := NULL;
    FOR j IN REVERSE i - 1..1 LOOP
      IF digests[j] = digests[i] THEN prev := j; EXIT; END IF;
    END LOOP;
    IF prev IS NOT NULL THEN
      st := states[8 * prev - 7 : 8 * prev - 8 + 2 * wc];
      stored := stored || stored[prev];
      existed := existed || existed[prev];
    ELSE
      SELECT l.state INTO st FROM sluice.limit_state AS l WHERE l.digest = digests[i];
      stored := stored || FOUND;
      existed := existed || FOUND;
      IF FOUND AND cardinality(st) <> 2 * wc THEN
        RAISE EXCEPTION 'sluice.check_v2: stored state of the wrong shape' USING ERRCODE = 'XX000';
      END IF;
    END IF;
    IF NOT stored[i] THEN
      st := '{}';
      FOR w IN 1..wc LOOP st := st || ARRAY[now_ns, 0]::bigint[]; END LOOP;
    END IF;
    IF p_kind = 1 THEN
      d := sluice.gcra_decide_v1(st, p_a[o + 1 : o + wc], p_b[o + 1 : o + wc], p_c[o + 1 : o + wc],
                                 c, now_ns);
    ELSE
      d := sluice.fixed_window_decide_v1(st, p_a[o + 1 : o + wc], p_b[o + 1 : o + wc], c, now_ns);
    END IF;
    IF d[1] = 0 AND c > 0 AND NOT stored[i] THEN
      -- A new key: it needs a slot in its shard. Idle rows (never another batch member's) are
      -- reclaimed first, a few at a time; a full shard denies the key (capacity denial).
      SELECT h.row_count, h.capacity INTO cnt, cap FROM sluice.shards AS h WHERE h.shard = s;
      IF cnt + pending[s + 1] >= cap THEN
        WITH gone AS (
          DELETE FROM sluice.limit_state AS l WHERE l.digest IN (
            SELECT x.digest FROM sluice.limit_state AS x
            WHERE x.shard = s AND x.idle_at <= now_ns AND x.digest <> ALL (digests)
            ORDER BY x.idle_at LIMIT 16)
          RETURNING 1)
        SELECT count(*) INTO freed FROM gone;
        UPDATE sluice.shards SET row_count = row_count - freed WHERE shard = s;
        cnt := cnt - freed;
      END IF;
      IF cnt + pending[s + 1] >= cap THEN
        SELECT min(l.idle_at) INTO earliest FROM sluice.limit_state AS l WHERE l.shard = s;
        d := ARRAY[2, p_c[o + 1], 0, greatest(coalesce(earliest, now_ns) - now_ns, 0), 0, 0, 0]
             || st;
        IF p_kind = 2 THEN d[2] := p_a[o + 1]; END IF;
      ELSE
        pending[s + 1] := pending[s + 1] + 1;
        stored[i] := true;
      END IF;
    END IF;
    result := result || d[1:6];
    IF d[1] <> 0 THEN admitted := false; END IF;
    IF d[1] = 0 AND c > 0 THEN st := d[8:7 + 2 * wc]; END IF;
    states := states || st || array_fill(0::bigint, ARRAY[8 - 2 * wc]);
    idles := idles || CASE WHEN d[1] = 0 AND c > 0 THEN d[7] END;
  END LOOP;

  IF p_all_or_nothing AND NOT admitted THEN
    RETURN result;
  END IF;
  -- Write each admitted key (an item of cost 0 writes nothing) once, with the state after its last admitted item.
  FOR i IN REVERSE n..1 LOOP
    CONTINUE WHEN idles[i] IS NULL;
    CONTINUE WHEN n > 1 AND EXISTS (SELECT 1 FROM generate_subscripts(digests, 1) AS k
                                    WHERE k > i AND digests[k] = digests[i]
                                      AND idles[k] IS NOT NULL);
    IF existed[i] THEN
      UPDATE sluice.limit_state
        SET idle_at = idles[i], state = states[8 * i - 7 : 8 * i - 8 + 2 * p_windows[i]]
        WHERE digest = digests[i];
    ELSE
      INSERT INTO sluice.limit_state (digest, shard, idle_at, state)
        VALUES (digests[i], shards[i], idles[i], states[8 * i - 7 : 8 * i - 8 + 2 * p_windows[i]]);
    END IF;
  END LOOP;
  FOREACH s IN ARRAY touched LOOP
    CONTINUE WHEN pending[s + 1] = 0;
    UPDATE sluice.shards SET row_count = row_count + pending[s + 1] WHERE shard = s;
  END LOOP;
  RETURN result;
END
$fn$;

CREATE OR REPLACE FUNCTION sluice.check_v1(p_kind integer, p_digests bytea, p_windows integer[],
                                           p_a bigint[], p_b bigint[], p_c bigint[], p_cost bigint,
                                           p_all_or_nothing boolean, p_now bigint)
RETURNS bigint[] LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT sluice.check_v2(p_kind, p_digests, p_windows, p_a, p_b, p_c,
                         array_fill(p_cost, ARRAY[greatest(length(p_digests) / 16, 0)]),
                         p_all_or_nothing AND p_cost > 0, p_now)
$fn$;
)sql";

// Applied once, after version 3, when schema_version lacks version 4: check_carried_v1, a
// check_v2 whose items may carry their state from rows of earlier limits (a rule whose windows a
// reload changed), and the GCRA carry of one window it uses.
inline constexpr const char* kSchemaV4 = R"sql(
-- The scaled distance ahead of now (in 1/r_t ns) that a window (r_t, p_t, b_t) holds for a key
-- whose window (r_f, p_f, b_f) holds `ahead` > 0 (in 1/r_f ns): the same spent share of the
-- bucket, rounded up to the nanosecond (toward less room) and never past a full bucket; a spent
-- bucket stays spent and a debt beyond it is kept in nanoseconds (at most 2^61).
CREATE FUNCTION sluice.gcra_carry_v1(ahead numeric, r_f numeric, p_f numeric, b_f numeric,
                                     r_t numeric, p_t numeric, b_t numeric)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  full_f numeric := b_f * p_f;
  full_t numeric := b_t * p_t;
  ahead_ns numeric; full_f_ns numeric; carried numeric;
BEGIN
  IF ahead >= full_f THEN
    carried := full_t + least(div(ahead - full_f + r_f - 1, r_f), 2305843009213693952) * r_t;
  ELSE
    ahead_ns := div(ahead + r_f - 1, r_f);
    full_f_ns := div(full_f, r_f);
    IF ahead_ns >= full_f_ns THEN
      carried := full_t;
    ELSE
      carried := least(div(ahead_ns * div(full_t + r_t - 1, r_t) + full_f_ns - 1, full_f_ns) * r_t,
                       full_t);
    END IF;
  END IF;
  RETURN least(carried, 2305843009213693952 * r_t);
END
$fn$;

-- check_v2 (same arguments and reply), after carrying: for each source s, item p_from_items[s]
-- (1-based; GCRA only) may hold its state at p_from_digests' s-th digest under the windows
-- p_from_windows[s] (p_from_a, p_from_b, p_from_c as p_a, p_b, p_c). An item whose key has no
-- row, and whose sources leave some window spent, gets a row first: per window the most spent
-- carried share (gcra_carry_v1) of the source window with the same period (or of the only one
-- when both have one window); a window without a source starts full. Under the same shard locks
-- as the check, so of two replicas carrying one key, the first row stands. A carried row counts
-- in its shard even beyond the shard's capacity (the key held a row before).
CREATE FUNCTION sluice.check_carried_v1(p_kind integer, p_digests bytea, p_windows integer[],
                                        p_a bigint[], p_b bigint[], p_c bigint[],
                                        p_costs bigint[], p_all_or_nothing boolean, p_now bigint,
                                        p_from_items integer[], p_from_digests bytea,
                                        p_from_windows integer[], p_from_a bigint[],
                                        p_from_b bigint[], p_from_c bigint[])
RETURNS bigint[] LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n integer := length(p_digests) / 16;
  m integer := cardinality(p_from_items);
  now_ns bigint;
  offs integer[] := '{}';
  from_offs integer[] := '{}';
  best numeric[];
  st bigint[];
  nx bigint[];
  dg bytea;
  o integer := 0; fo integer; wc integer; fwc integer; src integer; s integer; idle bigint;
  ahead numeric; r numeric;
BEGIN
  IF p_kind <> 1 OR n < 1 OR length(p_digests) <> 16 * n OR cardinality(p_windows) <> n
     OR m IS NULL OR length(p_from_digests) <> 16 * m OR cardinality(p_from_windows) <> m THEN
    RAISE EXCEPTION 'sluice.check_carried_v1: malformed arguments' USING ERRCODE = '22023';
  END IF;
  FOR i IN 1..n LOOP
    offs := offs || o;
    o := o + p_windows[i];
  END LOOP;
  o := 0;
  FOR k IN 1..m LOOP
    IF p_from_items[k] NOT BETWEEN 1 AND n OR p_from_windows[k] NOT BETWEEN 1 AND 4 THEN
      RAISE EXCEPTION 'sluice.check_carried_v1: malformed sources' USING ERRCODE = '22023';
    END IF;
    from_offs := from_offs || o;
    o := o + p_from_windows[k];
  END LOOP;
  -- The check's shards, ascending, before any row is read (check_v2 takes them again).
  FOREACH s IN ARRAY (SELECT array_agg(DISTINCT u ORDER BY u)
                      FROM (SELECT get_byte(substring(p_digests FROM 16 * i - 15 FOR 16), 0) AS u
                            FROM generate_series(1, n) AS i) AS x) LOOP
    PERFORM pg_advisory_xact_lock(1936483173, s);
  END LOOP;
  now_ns := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  FOR i IN 1..n LOOP
    CONTINUE WHEN NOT (i = ANY (p_from_items));
    dg := substring(p_digests FROM 16 * i - 15 FOR 16);
    CONTINUE WHEN EXISTS (SELECT 1 FROM sluice.limit_state AS l WHERE l.digest = dg);
    wc := p_windows[i]; o := offs[i];
    best := array_fill(0::numeric, ARRAY[wc]);
    FOR k IN 1..m LOOP
      CONTINUE WHEN p_from_items[k] <> i;
      fwc := p_from_windows[k]; fo := from_offs[k];
      SELECT l.state INTO st FROM sluice.limit_state AS l
        WHERE l.digest = substring(p_from_digests FROM 16 * k - 15 FOR 16);
      CONTINUE WHEN NOT FOUND;
      IF cardinality(st) <> 2 * fwc THEN
        RAISE EXCEPTION 'sluice.check_carried_v1: stored state of the wrong shape'
          USING ERRCODE = 'XX000';
      END IF;
      FOR w IN 1..wc LOOP
        src := NULL;
        IF wc = 1 AND fwc = 1 THEN src := 1; END IF;
        FOR j IN 1..fwc LOOP
          IF p_from_b[fo + j] = p_b[o + w] THEN src := j; END IF;
        END LOOP;
        CONTINUE WHEN src IS NULL;
        r := p_from_a[fo + src];
        ahead := (st[2 * src - 1] - now_ns)::numeric * r + st[2 * src];
        CONTINUE WHEN ahead <= 0;
        best[w] := greatest(best[w], sluice.gcra_carry_v1(ahead, r, p_from_b[fo + src],
                                                          p_from_c[fo + src], p_a[o + w],
                                                          p_b[o + w], p_c[o + w]));
      END LOOP;
    END LOOP;
    CONTINUE WHEN NOT EXISTS (SELECT 1 FROM unnest(best) AS x WHERE x > 0);
    nx := '{}'; idle := now_ns;
    FOR w IN 1..wc LOOP
      r := p_a[o + w];
      nx := nx || ARRAY[div(now_ns * r + best[w], r)::bigint, mod(now_ns * r + best[w], r)::bigint];
      idle := greatest(idle, nx[2 * w - 1] + CASE WHEN nx[2 * w] > 0 THEN 1 ELSE 0 END);
    END LOOP;
    s := get_byte(dg, 0);
    INSERT INTO sluice.limit_state (digest, shard, idle_at, state) VALUES (dg, s, idle, nx);
    UPDATE sluice.shards SET row_count = row_count + 1 WHERE shard = s;
  END LOOP;
  RETURN sluice.check_v2(p_kind, p_digests, p_windows, p_a, p_b, p_c, p_costs, p_all_or_nothing,
                         p_now);
END
$fn$;
)sql";

// Applied once, after version 5, when schema_version lacks version 6. PostgreSQL parses and plans
// a table's CHECK constraints again in every statement that writes one of its rows: the digest's
// length check took about 19k of the 267k server instructions of a one-key check
// (scripts/postgres_instructions). Every function that writes a row checks the length of its
// digests itself, so the constraint goes. Metadata only: the table is not rewritten.
inline constexpr const char* kSchemaV6 = R"sql(
ALTER TABLE sluice.limit_state DROP CONSTRAINT IF EXISTS limit_state_digest_check;
)sql";

// The steps in order: step i installs version i + 1.
inline constexpr const char* kSchemaSteps[] = {kSchemaV1, kSchemaV2, kSchemaV3,
                                               kSchemaV4, kSchemaV5, kSchemaV6};

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_
