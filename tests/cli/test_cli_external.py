"""``complete`` / ``fail`` end to end: fresh processes on real databases."""

from __future__ import annotations

import json
from typing import Any

import pytest
from clikit import acli, one_line_error

from aiojobqueue import JobQueue, JobState


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_complete_and_fail_from_the_command_line(
    db_url: str, prefix: str, make_queue: Any,
) -> None:
    q: JobQueue = make_queue()
    async with q:
        yes = await q.enqueue_external("approval")
        no = await q.enqueue_external("approval")
        after = await q.enqueue("next", depends_on=[no])
    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    p = await acli("complete", str(yes), "--result", '{"by": "ops"}', "--json", env=env)
    assert p.returncode == 0 and json.loads(p.stdout) == {"job_id": yes, "state": "done"}
    # a second complete changes nothing and says so
    one_line_error(await acli("complete", str(yes), env=env), 1,
                   f"external step {yes} is already done")
    p = await acli("complete", str(yes), "--result", "{nope", env=env)
    assert p.returncode == 2 and "not JSON" in p.stderr and "Traceback" not in p.stderr
    p = await acli("fail", str(no), "--message", "rejected", env=env)
    assert p.returncode == 0 and "failed" in p.stdout
    one_line_error(await acli("fail", str(after), env=env), 1,
                   f"job {after} is not an external step")
    async with q:
        assert (await q.get(yes)).result == {"by": "ops"}
        job = await q.get(no)
        assert job.state == JobState.FAILED and job.error is not None
        assert job.error["message"] == "rejected"
        assert (await q.get(after)).state == JobState.CANCELLED
