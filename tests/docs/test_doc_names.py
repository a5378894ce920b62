"""Every file, link and name the docs cite exists, so the docs cannot drift from the tree.

README.md, docs/*.md and bench/README.md are read outside their fenced code blocks:
- every relative Markdown link ``[..](path)`` points at a file or folder of the checkout;
- every backticked path (``aiojobqueue/claim.py``, ``fanout.py``, ``postgresql/fair_pick.sql``)
  is a file of the checkout: as given, next to the doc, or as the tail of a tracked path
  (the docs name ``claim.py`` under ``aiojobqueue/``, ``mysql_watch.py`` under ``dialects/``);
- every backticked dotted name (``migrate.upgrade()``, ``fanout.SPLIT``,
  ``aiojobqueue.schema.build_tables``, ``Finalizer.swap_in``, ``queue.batch()``) resolves by
  import and getattr: a module of the package (or an importable one), a class defined in the
  package, a table's column, or one of the variables the docs use for the public objects
  (``queue`` a JobQueue, ``ctx`` a JobContext ...);
- every backticked bare call ``name()`` is defined somewhere in the package.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import aiojobqueue
from aiojobqueue import schema

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
TICK = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*\.(py|sql|md|png|js|css|html|toml|yml)$"
                  r"|^[\w.-]+(/[\w.-]+)*/$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?$")
CALL = re.compile(r"^([a-z_]\w*)\(\)$")

# The variables the docs use for the public objects, as in the README's examples.
VARIABLES = {"queue": "JobQueue", "ctx": "JobContext", "job": "Job", "event": "JobEvent",
             "jobs": "SyncQueue", "b": "Batch", "fetch": "Handler"}
# Files a user writes (the README's app.py, a module of theirs), never files of this tree.
USER_FILES = {"app.py", "myapp/jobs.py", "jobs.db", "app.db", "block.py"}
# Names of other systems the docs cite: SQL functions, SQLAlchemy's, OpenTelemetry's span
# attributes, MySQL's information schema, and the meta table's rows (keys, not columns).
FOREIGN = {"pg_backend_pid()", "statement_timestamp()", "drop_all()", "now()",
           "messaging.batch.message_count", "aiojobqueue.outcome", "aiojobqueue.error.type",
           "information_schema.INNODB_TRX", "meta.gate", "meta.schema_version",
           # Django's own names (docs/django.md), and the example project's module
           "django.tasks", "TaskResult.id", "transaction.atomic()", "atomic()",
           "close_old_connections()", "myapp.tasks.send_invoice"}


def prose(doc: Path) -> str:
    """The doc without its fenced code blocks (code is tested by running it)."""
    return FENCE.sub("", doc.read_text())


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(out.split())


def path_exists(token: str, doc: Path) -> bool:
    if token in USER_FILES:
        return True
    rel = token.rstrip("/")
    if (ROOT / rel).exists() or (doc.parent / rel).exists():
        return True
    return any(f == rel or f.endswith("/" + rel) or f.startswith(rel + "/")
               or ("/" + rel + "/") in ("/" + f) for f in tracked())


@cache
def package_modules() -> dict[str, Any]:
    mods: dict[str, Any] = {"aiojobqueue": aiojobqueue}
    for info in pkgutil.walk_packages(aiojobqueue.__path__, "aiojobqueue."):
        if info.name.endswith("__main__"):  # importing it runs the command line
            continue
        try:
            mods[info.name] = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
    return mods


@cache
def package_classes() -> dict[str, list[Any]]:
    classes: dict[str, list[Any]] = {}
    for mod in package_modules().values():
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__.startswith("aiojobqueue"):
                classes.setdefault(name, []).append(obj)
    return classes


def has(obj: Any, attrs: list[str]) -> bool:
    """``obj.a.b...`` exists: an attribute, or a class's annotated or ``self.x =`` field."""
    for attr in attrs:
        if not hasattr(obj, attr):
            return attr == attrs[-1] and inspect.isclass(obj) and instance_field(obj, attr)
        obj = getattr(obj, attr)
    return True


def instance_field(cls: type, attr: str) -> bool:
    if attr in getattr(cls, "__annotations__", {}):
        return True
    try:
        return re.search(rf"self\.{attr}\b\s*[:=]", inspect.getsource(cls)) is not None
    except (OSError, TypeError):
        return False


def resolves(name: str) -> bool:
    parts = name.removesuffix("()").split(".")
    if parts[0] == "aiojobqueue":
        parts = parts[1:]
    mods = package_modules()
    for cut in range(len(parts), -1, -1):  # the longest module prefix of the package
        mod = mods.get(".".join(["aiojobqueue", *parts[:cut]]))
        if mod is not None and has(mod, parts[cut:]):
            return True
    # a module named by its last part only (`rounds.WIDE_HORIZON` for worker.rounds)
    if any(n.rsplit(".", 1)[-1] == parts[0] and has(m, parts[1:]) for n, m in mods.items()):
        return True
    candidates = list(package_classes().get(parts[0], []))
    if parts[0] in VARIABLES:
        candidates += package_classes().get(VARIABLES[parts[0]], [])
    if any(has(c, parts[1:]) for c in candidates):
        return True
    tables = schema.build_tables("ajq_")
    table = getattr(tables, parts[0], None)
    if len(parts) == 2 and table is not None and parts[1] in table.c:
        return True
    try:  # the standard library or a dependency (asyncio.timeout, logging.getLogger)
        return has(importlib.import_module(parts[0]), parts[1:])
    except ImportError:
        return False


@cache
def package_source() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "aiojobqueue").rglob("*.py"))


def defined(func: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def {re.escape(func)}\(", package_source(), re.M) is not None


def citations(doc: Path) -> list[tuple[str, str]]:
    """(kind, text) of every link, path, dotted name and bare call the doc cites."""
    text = prose(doc)
    found = [("link", m) for m in LINK.findall(text)
             if not re.match(r"[a-z]+:|#", m)]
    for span in TICK.findall(text):
        for token in span.split():
            token = token.strip(",;:()[]").removeprefix("./")
            if PATH.match(token) and ("/" in token or token.endswith((".py", ".sql"))):
                found.append(("path", token))
        span = span.strip()
        if DOTTED.match(span) and not re.search(r"\.(db|py|md|sql|json|txt|sh)$", span):
            found.append(("name", span))
        elif CALL.match(span):
            found.append(("call", span))
    return found


def broken(doc: Path) -> list[str]:
    bad = []
    for kind, text in citations(doc):
        target = text.split("#")[0]
        if text in FOREIGN:
            continue
        if kind == "link":
            ok = not target or (doc.parent / target).exists()
        elif kind == "path":
            ok = path_exists(text, doc)
        elif kind == "name":
            ok = resolves(text)
        else:
            ok = defined(text.removesuffix("()"))
        if not ok:
            bad.append(f"{kind} {text}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_cited_file_and_name_exists(doc: Path) -> None:
    assert broken(doc) == []


def test_the_checker_finds_what_is_gone(tmp_path: Path) -> None:
    """Names that once were in the docs and no longer exist are caught."""
    doc = tmp_path / "stale.md"
    doc.write_text("`migrate.settle_routine()` installs `postgresql/settle.sql`; see\n"
                   "[gone](gone.md), `Claimer.no_such_step`, `nope_at_all()`; fine: "
                   "`migrate.upgrade()`, `fanout.SPLIT`, `aiojobqueue/claim.py`,\n"
                   "`queue.batch()`.\n")
    assert broken(doc) == ["link gone.md", "name migrate.settle_routine()",
                           "path postgresql/settle.sql", "name Claimer.no_such_step",
                           "call nope_at_all()"]


def test_every_doc_is_read() -> None:
    assert ROOT / "README.md" in DOCS and ROOT / "bench" / "README.md" in DOCS
    assert len(DOCS) >= 8
    assert sum(len(citations(d)) for d in DOCS) > 300
