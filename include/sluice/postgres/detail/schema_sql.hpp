// Internal: the SQL of the schema that sluice::postgres::migrate installs, one step per version;
// a step, once released, never changes (deployed databases have applied it). Version 1 creates the
// schema `sluice`: a per-shard row counter, one row per key (digest, shard, idle time, state), and
// the functions a check and a cleanup call; version 2 adds the function a reset calls; version 3
// the check with a cost per item. Every value
// is an exact integer (bigint, or numeric for products that exceed 64 bits); times are ns since the
// Unix epoch from pg_catalog.clock_timestamp(). Shard = the first byte of the key digest (256
// shards); shard locks are transaction-scoped advisory locks (class kLockClass, object = shard)
// taken in ascending shard order.
#ifndef SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_
#define SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_

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

// The steps in order: step i installs version i + 1.
inline constexpr const char* kSchemaSteps[] = {kSchemaV1, kSchemaV2, kSchemaV3};

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_HPP_
