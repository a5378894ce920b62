SELECT coalesce(array_agg(DISTINCT r.parent_id)
                   FILTER (WHERE r.kind <> '${CONTAINER}' AND r.parent_id IS NOT NULL), '{}'),
             coalesce(bool_or(r.kind <> '${CONTAINER}' AND r.state = '${READY}'), false)
