"""The policy commands end to end on every database: ``policy`` (show, ``--json``),
``policy set``, ``group set``, ``pause`` and ``resume`` in fresh processes, what they
store (read back through JobQueue), output within 80 columns, and bad input as one line,
exit 2, nothing changed."""

from __future__ import annotations

import json
from collections.abc import Callable

from clikit import acli, one_line_error

from aiojobqueue import JobQueue, RateLimit
from aiojobqueue.stored_policy import Policy


def fits(text: str, width: int = 80) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, wide


async def test_policy_commands_store_what_they_say(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str) -> None:
    q = make_queue()
    async with q:
        at = ("--url", db_url, "--prefix", prefix)
        narrow = {"COLUMNS": "80"}
        p = await acli("policy", *at, env=narrow)
        assert p.returncode == 0, p.stderr
        assert "no fleet-wide cap" in p.stdout and "no rate" in p.stdout
        fits(p.stdout)

        p = await acli("policy", "set", "--concurrency", "8", "--rate", "100/1m", *at)
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines() == ["concurrency: - -> 8", "rate: - -> 100/60s"]
        p = await acli("group", "set", "*", "--cap", "2", "--rate", "10/60", *at)
        assert p.stdout.splitlines() == ['group "*" cap: - -> 2', 'group "*" rate: - -> 10/60s']
        p = await acli("group", "set", "tenant-a", "--weight", "3", "--cap", "5", *at)
        assert p.returncode == 0, p.stderr
        for args in (("--group", "tenant-a"), ("--type", "fetch"), ()):
            p = await acli("pause", *args, *at)
            assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "queue: paused"

        got = await q.policy()
        assert got.concurrency == 8 and got.rate is not None
        assert (got.rate.n, got.rate.per) == (100, 60.0)
        a, other = got.group("tenant-a"), got.group("anyone")
        assert (a.weight, a.cap, a.paused) == (3, 5, True)
        assert other.cap == 2 and other.rate is not None and other.rate.n == 10
        assert got.paused == {("group", "tenant-a"), ("type", "fetch"), ("queue", "")}

        p = await acli("policy", *at, env=narrow)
        fits(p.stdout)
        assert "PAUSED" in p.stdout and "paused types fetch" in p.stdout
        assert "tenant-a" in p.stdout and "10/60s" in p.stdout
        data = json.loads((await acli("policy", "--json", *at)).stdout)
        assert data == {
            "concurrency": 8, "rate": {"n": 100, "per": 60.0}, "paused": True,
            "default": {"cap": 2, "rate": {"n": 10, "per": 60.0}},
            "groups": {"tenant-a": {"weight": 3, "cap": 5, "rate": None, "paused": True}},
            "paused_groups": ["tenant-a"], "paused_types": ["fetch"]}

        # none clears; resume undoes; what was not named stays
        p = await acli("policy", "set", "--concurrency", "none", *at)
        assert p.stdout.strip() == "concurrency: 8 -> -"
        for args in (("--group", "tenant-a"), ("--type", "fetch"), ()):
            assert (await acli("resume", *args, *at)).returncode == 0
        p = await acli("resume", *at)
        assert p.stdout.strip() == "no change: already so"
        got = await q.policy()
        assert got.concurrency is None and got.rate is not None and got.paused == frozenset()
        assert got.group("tenant-a").cap == 5


BAD = [
    (("policy", "set"), "nothing to set"),
    (("policy", "set", "--concurrency", "0"), "--concurrency must be a whole number >= 1"),
    (("policy", "set", "--concurrency", "lots"), "--concurrency must be a whole number"),
    (("policy", "set", "--rate", "10"), "rate must be N/SECONDS"),
    (("policy", "set", "--rate", "0/60"), "rate must be N/SECONDS"),
    (("policy", "set", "--rate", "10/0"), "rate must be N/SECONDS"),
    (("group", "set", "g"), "nothing to set"),
    (("group", "set", "g", "--cap", "-1"), "--cap must be a whole number >= 0"),
    (("group", "set", "g", "--weight", "0"), "--weight must be a whole number >= 1"),
    (("group", "set", "*", "--weight", "2"), 'the "*" row has no weight'),
    (("group", "set", "x" * 201, "--cap", "1"), "group must be a name of 1-200"),
    (("pause", "--group", "g", "--type", "t"), "give --group or --type, not both"),
    (("pause", "--group", "*"), "the '*' row holds defaults"),
    (("resume", "--group", "g", "--type", "t"), "give --group or --type, not both"),
]


async def test_bad_input_is_one_line_exit_2_and_changes_nothing(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str) -> None:
    q = make_queue()
    async with q:
        await q.set_policy(concurrency=3, rate=RateLimit(5, per=1.0))
        await q.set_group("g", cap=1)
        before = await q.policy()
        for args, starts in BAD:
            p = await acli(*args, "--url", db_url, "--prefix", prefix)
            one_line_error(p, 2, starts)
        after = await q.policy()
        assert (after.concurrency, after.groups.keys(), after.paused) == (
            before.concurrency, before.groups.keys(), before.paused)
        assert after.group("g").cap == 1 and after != Policy()
