"""The dashboard: a live web view of the queue, an ASGI app (Starlette) to mount or serve.

``pip install "aiojobqueue[web]"``, then::

    from aiojobqueue.web import dashboard
    app.mount("/queue", dashboard(queue, access=lambda request: "full"))

``aiojobqueue dashboard --url URL`` serves it alone (see ``serve.serve``).
"""

try:
    from .app import dashboard
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        f'the dashboard needs the web extra ({exc.name} is missing): '
        'pip install "aiojobqueue[web]"') from exc

__all__ = ["dashboard"]
