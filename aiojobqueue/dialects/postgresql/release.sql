
#variable_conflict use_column
DECLARE
  v_id bigint[]; v_kind text[]; v_state text[]; v_parent bigint[]; v_ready boolean;
BEGIN
  WITH r AS (${release_p_ids})
  SELECT array_agg(r.id), array_agg(r.kind::text), array_agg(r.state::text),
         array_agg(r.parent_id),
         coalesce(bool_or(r.kind <> '${CONTAINER}' AND r.state = '${READY}'), false)
    INTO v_id, v_kind, v_state, v_parent, v_ready FROM r;
  IF v_ready THEN
    PERFORM pg_notify('${channel}', '');
  END IF;
  RETURN QUERY SELECT * FROM unnest(v_id, v_kind, v_state, v_parent);
END
