
DECLARE
  v_deps bigint[]; v_b bigint[]; v_r boolean; v_ready boolean := false; v_n integer := 0;
BEGIN
  FOR v_deps IN
    DELETE FROM ${rels} WHERE id IN (
      SELECT id FROM ${rels} ORDER BY id LIMIT p_n FOR UPDATE SKIP LOCKED)
    RETURNING ARRAY(SELECT jsonb_array_elements_text(ids)::bigint)
  LOOP
    WITH r AS (${one})
    ${agg}
      INTO v_b, v_r FROM r;
    v_ready := v_ready OR v_r;
    v_n := v_n + 1;
  END LOOP;
  IF v_ready THEN
    PERFORM pg_notify('${channel}', '');
  END IF;
  RETURN v_n;
END
