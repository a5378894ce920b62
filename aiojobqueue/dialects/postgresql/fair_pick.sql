WITH RECURSIVE
-- the loose index scan of ix_ready (see census.scan_cte): first the names after the cursor
sa(g, n) AS (
  SELECT (SELECT j.group_key FROM ${jobs} j
           WHERE j.state = 'ready' AND (j.state, j.group_key) > ('ready', ${after})
           ORDER BY j.group_key LIMIT 1), 1
  UNION ALL
  SELECT (SELECT j.group_key FROM ${jobs} j
           WHERE j.state = 'ready' AND (j.state, j.group_key) > ('ready', sa.g)
           ORDER BY j.group_key LIMIT 1), sa.n + 1
    FROM sa WHERE sa.g IS NOT NULL AND sa.n < (:lim)::int
),
-- ... then from the start, up to the first name past the cursor
sb(g, n) AS (
  SELECT (SELECT j.group_key FROM ${jobs} j WHERE j.state = 'ready'
           ORDER BY j.group_key LIMIT 1), 1
  UNION ALL
  SELECT (SELECT j.group_key FROM ${jobs} j
           WHERE j.state = 'ready' AND (j.state, j.group_key) > ('ready', sb.g)
           ORDER BY j.group_key LIMIT 1), sb.n + 1
    FROM sb WHERE sb.g IS NOT NULL AND ${sb_more} AND sb.n < (:lim)::int
),
a_done AS (SELECT ${a_done} AS v),
-- the groups read, in rotation order; the names before the cursor only where those after
-- it were all read (else groups not read would come before them)
seen AS (
  SELECT g FROM ${first} WHERE g IS NOT NULL
  ${wrap}
),
-- every group with ready jobs was read
done AS (
  SELECT (SELECT v FROM a_done) AND EXISTS (SELECT 1 FROM sb WHERE ${b_end}) AS complete,
         (SELECT count(*) FROM seen)::int AS nseen
),
run AS (
  SELECT r.group_key AS g, count(*)::int AS c FROM ${jobs} r
   WHERE r.state = 'running' GROUP BY r.group_key
),
-- any ready job heavier than the default at all (one probe of ix_ready_weight): else
-- every weight is 1 and no group is probed for its own
heavy AS (
  SELECT (SELECT complete FROM done) AND EXISTS (
    SELECT 1 FROM ${jobs} j WHERE j.state = 'ready' AND j.weight > 1) AS v
),
cand AS (
  SELECT s.g, coalesce(run.c, 0) AS running,
         CASE WHEN (SELECT v FROM heavy) THEN coalesce((
           SELECT j.weight FROM ${jobs} j
            WHERE j.state = 'ready' AND j.group_key = s.g
              AND (j.state, j.group_key) >= ('ready', s.g)
              AND (j.state, j.group_key) <= ('ready', s.g) AND j.weight > 1
            ORDER BY j.weight DESC LIMIT 1), 1) ELSE 1 END AS w
    FROM seen s LEFT JOIN run ON run.g = s.g
),
tot AS (SELECT coalesce(sum(running), 0) AS r, coalesce(sum(w), 1) AS w FROM cand),
-- fair_share's grants, one row a slot: the k-th slot of g has the key (running + k - 1) / w.
-- No grant has a key above (R + free) / W (R, W: the sums over the groups read), so k stays
-- below that bound, + 2 for rounding. Where not every group was read, only the groups that
-- run nothing (key 0) are served: any group not read has key 0 too and comes later in
-- rotation order, so it could take no slot before them.
-- (A row_number() bound, not LIMIT :free: the estimates then do not depend on the binds,
-- so the prepared statement gets a generic plan instead of being planned at every call.)
slots AS (
  SELECT c.g, c.running, row_number() OVER (
           ORDER BY (c.running + k - 1)::float8 / c.w, ${tie} c.g) AS slot
    FROM cand c CROSS JOIN tot CROSS JOIN done
    CROSS JOIN LATERAL generate_series(1, CASE
      WHEN done.complete THEN least((:free)::int, floor((tot.r + (:free)::int)::float8 * c.w
                                                        / tot.w)::int - c.running + 2)
      WHEN c.running = 0 THEN 1 ELSE 0 END) k
),
plan AS (SELECT g, count(*)::int AS n, min(running) AS running FROM slots
          WHERE slot <= (:free)::int GROUP BY g)
SELECT p.id, plan.running, done.complete, done.nseen
  FROM plan CROSS JOIN done CROSS JOIN LATERAL (
    SELECT j.id FROM ${jobs} j
     WHERE j.state = 'ready' AND j.group_key = plan.g AND j.type IN :types
     ORDER BY j.priority DESC, j.id LIMIT plan.n FOR UPDATE SKIP LOCKED) p
