
DECLARE
  v_ids bigint[]; v_rel bigint[]; v_parents bigint[]; v_next bigint[];
  v_busy bigint[] := '{}'; v_act bigint[] := '{}'; v_kids bigint[]; v_b bigint[];
  v_ready boolean := false; v_r boolean; v_nested boolean; v_p bigint; v_pp bigint;
  v_deps bigint[]; v_boxes boolean; v_split integer; v_n integer; v_cond boolean;
BEGIN
  WITH u AS (${finish_p_ids})
  SELECT coalesce(array_agg(u.id), '{}'),
         coalesce(array_agg(u.id) FILTER (WHERE u.has_dependents), '{}'),
         coalesce(array_agg(DISTINCT u.parent_id) FILTER (WHERE u.parent_id IS NOT NULL), '{}')
    INTO v_ids, v_rel, v_parents FROM u;
${split_block}
  -- settle() in rounds: release what waits on v_rel, activate the containers that releases,
  -- roll up the parents no live child job held here keeps open; the rolled-up containers
  -- are the next round's v_rel, their parents its candidates
  LOOP
    IF cardinality(v_rel) > 0 THEN
      WITH r AS (${release_v_rel})
      SELECT coalesce(array_agg(DISTINCT r.parent_id)
                        FILTER (WHERE r.kind <> '${CONTAINER}' AND r.parent_id IS NOT NULL), '{}'),
             coalesce(array_agg(r.id) FILTER (WHERE r.kind = '${CONTAINER}'
                                                AND r.state <> '${WAITING}'), '{}'),
             coalesce(bool_or(r.kind <> '${CONTAINER}' AND r.state = '${READY}'), false),
             coalesce(bool_or(r.kind = '${ONFAIL}'), false)
        INTO v_b, v_act, v_r, v_cond FROM r;
      -- a when="failed" job released: whether its condition holds is the long path's
      IF v_cond THEN
        RAISE EXCEPTION USING ERRCODE = 'AJQ01';
      END IF;
      v_busy := v_busy || v_b;
      v_ready := v_ready OR v_r;
    END IF;
    IF cardinality(v_act) > 0 THEN
      WITH k AS (${activate_v_act})
      SELECT coalesce(bool_or(k.kind = '${CONTAINER}' AND k.state <> '${WAITING}'), false),
             coalesce(array_agg(DISTINCT k.parent_id) FILTER (WHERE k.kind <> '${CONTAINER}'),
                      '{}'),
             coalesce(bool_or(k.kind <> '${CONTAINER}' AND k.state = '${READY}'), false),
             coalesce(bool_or(k.kind = '${ONFAIL}'), false)
        INTO v_nested, v_kids, v_r, v_cond FROM k;
      IF v_cond THEN
        RAISE EXCEPTION USING ERRCODE = 'AJQ01';
      END IF;
      -- a container activated in turn, or one that may be empty (to roll up at once): the
      -- long path's
      IF v_nested OR EXISTS (SELECT unnest(v_act) EXCEPT SELECT unnest(v_kids)) THEN
        RAISE EXCEPTION USING ERRCODE = 'AJQ01';
      END IF;
      v_busy := v_busy || v_kids;
      v_ready := v_ready OR v_r;
      v_act := '{}';
    END IF;
    -- a parent with a live child job this call holds locked cannot finish before it commits
    v_parents := ARRAY(SELECT unnest(v_parents) EXCEPT SELECT unnest(v_busy) ORDER BY 1);
    v_rel := '{}';
    v_next := '{}';
    IF cardinality(v_parents) > 0 THEN
      PERFORM 1 FROM ${jobs} WHERE id = ANY(v_parents) ORDER BY id FOR UPDATE;
      FOREACH v_p IN ARRAY v_parents LOOP
        PERFORM 1 FROM ${jobs} WHERE id = v_p AND state IN (${live});
        CONTINUE WHEN NOT FOUND;  -- ended already (cancelled, say)
        PERFORM 1 FROM ${jobs} WHERE parent_id = v_p AND state IN (${live}) LIMIT 1;
        CONTINUE WHEN FOUND;
        -- a failed or cancelled child fails the container and cancels what waits on it
        PERFORM 1 FROM ${jobs} WHERE parent_id = v_p AND state IN ('${FAILED}', '${CANCELLED}')
          LIMIT 1;
        IF FOUND THEN
          RAISE EXCEPTION USING ERRCODE = 'AJQ01';
        END IF;
        UPDATE ${jobs} SET state = '${DONE}', error = NULL, finished_at = statement_timestamp(),
                          live_key = NULL
          WHERE id = v_p RETURNING parent_id INTO v_pp;
        v_rel := v_rel || v_p;
        IF v_pp IS NOT NULL THEN
          v_next := v_next || v_pp;
        END IF;
      END LOOP;
    END IF;
    EXIT WHEN cardinality(v_rel) = 0;
    v_parents := v_next;
  END LOOP;
  -- p_n < 0: a counted cap's hand-over, no more leased than this call finished
  v_n := CASE WHEN p_n < 0 THEN least(-p_n, cardinality(v_ids)) ELSE p_n END;
  IF v_n > 0 THEN
    WITH l AS (${lease})
    SELECT coalesce(jsonb_agg(jsonb_build_array(${row})), '[]') INTO o_leased FROM l;
  END IF;
  IF v_ready THEN
    PERFORM pg_notify('${channel}', '');
  END IF;
  o_done := v_ids;
  RETURN;
EXCEPTION WHEN SQLSTATE 'AJQ01' THEN
  o_done := NULL;
  o_leased := NULL;
  o_rest := NULL;
  RETURN;
END
