// Internal: schema version 5 (see schema_sql.hpp for versions 1 to 4): the one-key check that
// costs one UPDATE, and what the other functions change beside it.
#ifndef SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_V5_HPP_
#define SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_V5_HPP_

namespace sluice::postgres::detail {

// Applied once, after version 4, when schema_version lacks version 5. A check of one key against
// a one-window GCRA limit (the common call) was a check_v2 call: the shard's advisory lock, held
// until the commit was flushed (so unrelated keys of one shard waited for each other's disk
// writes), a row read, two plpgsql calls, and an update that also rewrote the (shard, idle_at)
// index entry. check_one_v1 decides an existing key's admission in one UPDATE under the row
// lock alone, and rows are updated in place (HOT) while their idle_hint stays the same.
inline constexpr const char* kSchemaV5 = R"sql(
-- Rows updated in place (HOT): idle_at leaves the index for idle_hint = idle_at >> 30 (whole
-- 2^30 ns, about 1.07 s), which a check of a busy key rarely changes. Lookups of idle rows scan
-- the index by idle_hint and recheck idle_at.
ALTER TABLE sluice.limit_state
  ADD COLUMN idle_hint bigint GENERATED ALWAYS AS (idle_at >> 30) STORED;
CREATE INDEX limit_state_shard_idle_hint ON sluice.limit_state (shard, idle_hint);
DROP INDEX sluice.limit_state_shard_idle_at;

-- The admitted state of one GCRA window (r requests per p ns, burst b) for cost units at now_ns:
-- the scaled distance ahead of now (in 1/r ns) after the request; admitted iff it is at most
-- b * p. Inlined into check_one_v1's statement.
CREATE FUNCTION sluice.gcra_ahead_v1(st bigint[], r bigint, p bigint, cost bigint, now_ns bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE AS $fn$
  SELECT greatest((st[1] - now_ns)::numeric * r + st[2], 0) + cost::numeric * p
$fn$;

-- One check of one key against a one-window GCRA limit for cost >= 1, with check_v2's reply
-- (p_now: NULL for the database clock). A key with a row that admits the request is decided
-- and stored by one UPDATE under the row's lock alone (no shard lock: the row count does not
-- change); a key whose row denies it is answered from a snapshot, storing nothing; a new key
-- (or a row deleted meanwhile) is decided by check_v2.
CREATE FUNCTION sluice.check_one_v1(p_digest bytea, p_r bigint, p_p bigint, p_b bigint,
                                    p_cost bigint, p_now bigint)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  now_ns bigint := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  tol numeric := p_b::numeric * p_p;
  res bigint[];
  st bigint[];
  d bigint[];
BEGIN
  IF p_cost < 1 OR p_r < 1 OR p_p < 1 OR p_b < 1 OR length(p_digest) <> 16 THEN
    RAISE EXCEPTION 'sluice.check_one_v1: malformed arguments' USING ERRCODE = '22023';
  END IF;
  UPDATE sluice.limit_state AS l
    SET state = ARRAY[now_ns + div(sluice.gcra_ahead_v1(l.state, p_r, p_p, p_cost, now_ns), p_r),
                      mod(sluice.gcra_ahead_v1(l.state, p_r, p_p, p_cost, now_ns), p_r)]::bigint[],
        idle_at = now_ns + div(sluice.gcra_ahead_v1(l.state, p_r, p_p, p_cost, now_ns) + p_r - 1,
                               p_r)::bigint
    WHERE l.digest = p_digest AND cardinality(l.state) = 2
      AND sluice.gcra_ahead_v1(l.state, p_r, p_p, p_cost, now_ns) <= tol
    RETURNING ARRAY[now_ns, 0, p_b,
                    div(tol - sluice.gcra_ahead_v1(l.state, p_r, p_p, 0, now_ns), p_p), 0,
                    l.idle_at - now_ns, 0]::bigint[] INTO res;
  IF FOUND THEN
    RETURN res;
  END IF;
  SELECT l.state INTO st FROM sluice.limit_state AS l WHERE l.digest = p_digest;
  IF FOUND AND cardinality(st) = 2 THEN
    d := sluice.gcra_decide_v1(st, ARRAY[p_r], ARRAY[p_p], ARRAY[p_b], p_cost, now_ns);
    IF d[1] = 1 THEN
      RETURN now_ns || d[1:6];
    END IF;
  END IF;
  RETURN sluice.check_v2(1, p_digest, '{1}', ARRAY[p_r], ARRAY[p_p], ARRAY[p_b], ARRAY[p_cost],
                         true, p_now);
END
$fn$;

-- check_v2 (same arguments and reply) beside check_one_v1: a writing call locks each row it reads,
-- and reclaims idle rows through idle_hint, rechecking idle_at on rows updated meanwhile.
CREATE OR REPLACE FUNCTION sluice.check_v2(p_kind integer, p_digests bytea, p_windows integer[],
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
  writes boolean := false;       -- some item has a cost: lock the rows read
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
    writes := writes OR p_costs[i] > 0;
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
      -- A writing call locks each row it reads: check_one_v1 updates rows without the shard lock.
      IF writes THEN
        SELECT l.state INTO st FROM sluice.limit_state AS l WHERE l.digest = digests[i]
          FOR NO KEY UPDATE;
      ELSE
        SELECT l.state INTO st FROM sluice.limit_state AS l WHERE l.digest = digests[i];
      END IF;
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
            WHERE x.shard = s AND x.idle_hint <= now_ns >> 30 AND x.idle_at <= now_ns
              AND x.digest <> ALL (digests)
            ORDER BY x.idle_hint LIMIT 16)
            AND l.idle_at <= now_ns  -- rechecked on a row check_one_v1 updated meanwhile
          RETURNING 1)
        SELECT count(*) INTO freed FROM gone;
        UPDATE sluice.shards SET row_count = row_count - freed WHERE shard = s;
        cnt := cnt - freed;
      END IF;
      IF cnt + pending[s + 1] >= cap THEN
        SELECT min(l.idle_at) INTO earliest FROM sluice.limit_state AS l
          WHERE l.shard = s AND l.idle_hint = (SELECT min(x.idle_hint) FROM sluice.limit_state AS x
                                               WHERE x.shard = s);
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

-- cleanup_v1 through idle_hint, rechecking idle_at on rows check_one_v1 updated meanwhile.
CREATE OR REPLACE FUNCTION sluice.cleanup_v1(p_max_rows integer, p_now bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  now_ns bigint := coalesce(p_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint * 1000);
  budget integer := p_max_rows;
  freed integer;
BEGIN
  FOR s IN 0..255 LOOP
    EXIT WHEN budget <= 0;
    CONTINUE WHEN NOT EXISTS (SELECT 1 FROM sluice.limit_state AS l
                              WHERE l.shard = s AND l.idle_hint <= now_ns >> 30
                                AND l.idle_at <= now_ns);
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936483173, s);
    WITH gone AS (
      DELETE FROM sluice.limit_state AS l WHERE l.digest IN (
        SELECT x.digest FROM sluice.limit_state AS x
        WHERE x.shard = s AND x.idle_hint <= now_ns >> 30 AND x.idle_at <= now_ns
        ORDER BY x.idle_hint LIMIT budget)
        AND l.idle_at <= now_ns
      RETURNING 1)
    SELECT count(*) INTO freed FROM gone;
    UPDATE sluice.shards SET row_count = row_count - freed WHERE shard = s;
    budget := budget - freed;
  END LOOP;
  RETURN greatest(p_max_rows, 0) - greatest(budget, 0);
END
$fn$;
)sql";

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_SCHEMA_SQL_V5_HPP_
