"""See weighted fair share happen: a mixed load on SQLite, plotted as each group's running slots.

    python examples/fairshare_plot.py [--out docs/fairshare.png] [--url URL]

Three tenants share ``concurrency=10``: ``big`` (weight 3) and ``small`` (weight 1) start with
deep backlogs; ``late`` (weight 1) arrives at 3 s; ``small`` runs dry at about 8 s. Every
0.1 s the script counts, in the database, what each group runs and which groups have work
waiting, and draws each group's share of the running slots against its weight-proportional
target (weight / sum of the weights of the groups that have work). Needs matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from aiojobqueue import JobContext, JobQueue, admin

GROUPS = {"big": 3, "small": 1, "late": 1}
COLORS = {"big": "#3b6fb6", "small": "#e1812c", "late": "#3a923a"}
CAP = 10


async def load(queue: JobQueue) -> None:
    async with queue.batch() as b:
        for _ in range(600):
            b.add("work", {"ms": random.randint(100, 300)}, group="big", weight=3)
        for _ in range(80):
            b.add("work", {"ms": random.randint(100, 300)}, group="small", weight=1)
    await asyncio.sleep(3.0)
    async with queue.batch() as b:
        for _ in range(300):
            b.add("work", {"ms": random.randint(100, 300)}, group="late", weight=1)


async def sample(queue: JobQueue, t0: float, seconds: float) -> list[dict[str, Any]]:
    out = []
    while time.monotonic() - t0 < seconds:
        st = await admin.status(queue)  # what `aiojobqueue status` shows, read from the database
        out.append({
            "t": time.monotonic() - t0,
            "running": {g.group: g.count("running") for g in st.groups if g.count("running")},
            "waiting": {g.group for g in st.groups if g.count("ready")},
        })
        await asyncio.sleep(0.1)
    return out


def plot(samples: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [s["t"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.3]})
    stacks = [[s["running"].get(g, 0) for s in samples] for g in GROUPS]
    top.stackplot(ts, stacks, labels=[f"{g} (weight {w})" for g, w in GROUPS.items()],
                  colors=[COLORS[g] for g in GROUPS], step="post", alpha=0.85)
    top.axhline(CAP, color="black", lw=1, ls=":")
    top.text(ts[-1], CAP + 0.15, "concurrency = 10 ", ha="right", va="bottom", fontsize=8)
    top.set_ylim(0, CAP + 1.5)
    top.set_ylabel("running slots")
    top.legend(loc="upper left", fontsize=8, ncol=3, frameon=False)
    top.set_title("Weighted fair share on SQLite: each group's slots vs its weight", fontsize=10)
    for g, w in GROUPS.items():
        share, target = [], []
        for s in samples:
            total = sum(s["running"].values())
            active = {h for h in GROUPS if h in s["waiting"] or s["running"].get(h)}
            share.append(s["running"].get(g, 0) / total if total and g in active else None)
            wsum = sum(GROUPS[h] for h in active)
            target.append(w / wsum if g in active and wsum else None)
        bottom.step(ts, share, where="post", color=COLORS[g], lw=1.4, label=f"{g}: share")
        bottom.plot(ts, target, color=COLORS[g], lw=2.2, ls="--", alpha=0.7,
                    label=f"{g}: weight target")
    bottom.set_ylim(0, 1)
    bottom.set_ylabel("share of running slots")
    bottom.set_xlabel("seconds (late arrives at 3 s; small runs dry later)")
    bottom.legend(loc="upper right", fontsize=7, ncol=3, frameon=False)
    for ax in (top, bottom):
        ax.grid(alpha=0.25)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="docs/fairshare.png")
    p.add_argument("--url", default=None, help="default: a temporary SQLite file")
    p.add_argument("--seconds", type=float, default=12.0)
    a = p.parse_args()
    random.seed(1)
    url = a.url or f"sqlite+aiosqlite:///{Path(tempfile.mkdtemp()) / 'fair.db'}"
    queue = JobQueue(url, concurrency=CAP, capacity=CAP, poll_interval=0.1)

    @queue.handler("work")
    async def work(ctx: JobContext, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    async with queue:
        t0 = time.monotonic()
        serving = asyncio.create_task(queue.serve())
        loading = asyncio.create_task(load(queue))
        samples = await sample(queue, t0, a.seconds)
        serving.cancel()
        loading.cancel()
        await asyncio.gather(serving, loading, return_exceptions=True)
    plot(samples, Path(a.out))


if __name__ == "__main__":
    asyncio.run(main())
