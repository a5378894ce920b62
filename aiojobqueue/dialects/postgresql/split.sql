
  -- a wide fan-out: release its first jobs here, record the rest in parts (see above)
  IF cardinality(v_rel) = 1 THEN
    v_split := greatest(4 * p_n, ${split});
    IF (SELECT count(*) FROM (SELECT 1 FROM ${deps} d WHERE d.depends_on_id = v_rel[1]
                              LIMIT v_split + 1) s) > v_split THEN
      SELECT array_agg(j.id ORDER BY j.priority DESC, j.id)
               FILTER (WHERE j.kind <> '${CONTAINER}' AND j.state = '${WAITING}'),
             coalesce(bool_or(j.kind IN ('${CONTAINER}', '${ONFAIL}')), false)
        INTO v_deps, v_boxes
        FROM ${jobs} j
       WHERE j.id = ANY(ARRAY(SELECT d.job_id FROM ${deps} d WHERE d.depends_on_id = v_rel[1]));
      IF NOT v_boxes AND cardinality(v_deps) > v_split THEN
        INSERT INTO ${rels} (job_id, ids, created_at)
          SELECT v_rel[1], to_jsonb(v_deps[s + 1 : s + ${part}]), statement_timestamp()
            FROM generate_series(v_split, cardinality(v_deps) - 1, ${part}) s ORDER BY s;
        o_rest := v_rel[1];
        v_deps := v_deps[1:v_split];
        WITH r AS (${one})
        ${agg}
          INTO v_b, v_r FROM r;
        v_busy := v_busy || v_b;
        v_ready := v_ready OR v_r;
        v_rel := '{}';
      END IF;
    END IF;
  END IF;
