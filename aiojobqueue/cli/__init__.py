"""The ``aiojobqueue`` command line (also ``python -m aiojobqueue``).

A thin shell over ``aiojobqueue.admin``: parse, open the queue, call, render. Exit codes:
0 ok, 1 the job or operation failed, 2 usage error (bad option, URL or module),
3 database unreachable or unsupported, 4 schema missing or at another version,
130 interrupted.

One module per job:

- ``app``      the Typer app, the shared ``--url`` / ``--prefix`` / ``--json`` options, ``main``
- ``runtime``  exit codes, consoles, URLs, one-line errors, ``run()`` and ``opened()``
- ``render``   the Rich views (tables, panels, the DAG tree): pure functions of admin data
- ``demo``     ``demo``
- ``worker``   ``worker MODULE:QUEUE``
- ``queries``  ``status``, ``jobs``, ``show``
- ``explain``  ``explain``
- ``actions``  ``retry``, ``cancel``, ``migrate``, ``prune``
- ``policy``   ``policy``, ``policy set``, ``group set``, ``pause``, ``resume``
- ``schedules`` ``schedules``, ``schedule pause|resume|trigger``
- ``dashboard`` ``dashboard`` (the web dashboard, from ``aiojobqueue.web``)
- ``external`` ``complete``, ``fail`` (external steps)

Adding a command (say ``graph``): write ``aiojobqueue/cli/graph.py`` with an
``@app.command()`` function that calls ``run(url, ...)`` on an ``opened(url, prefix)`` queue
and prints a view (put the view in ``render`` or, if it is big, a ``render_graph`` module),
then add the module's name to ``COMMANDS`` below. ``--help`` lists commands in that order.
"""

from __future__ import annotations

import importlib

from .app import app, main

#: The command modules; importing one registers its commands on ``app``.
COMMANDS = ("demo", "worker", "queries", "explain", "actions", "policy", "schedules",
            "dashboard", "external")
for _name in COMMANDS:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["COMMANDS", "app", "main"]
