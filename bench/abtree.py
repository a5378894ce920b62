"""Running one measurement of an A/B bench under another tree's ``aiojobqueue``.

bench/cap_ab.py and bench/rate_ab.py run each measurement as ``python SCRIPT --child ...``
in a fresh process with ``PYTHONPATH`` set to the tree being measured; the child prints one
JSON object as its last line, with ``tree``: the ``aiojobqueue`` it really imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_in_tree(script: str, tree: str, child_args: list[str], what: str,
                timeout: float = 900) -> dict[str, Any]:
    """The child's JSON result; exits naming ``what`` when the child failed or imported
    another tree's package than ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree}
    args = [sys.executable, script, "--child", *child_args]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"{tree} {what}: {out.stderr[-2000:]}{out.stdout[-500:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["tree"].startswith(str(Path(tree).resolve())):
        raise SystemExit(f"{tree}: imported {res['tree']} instead")
    return res
