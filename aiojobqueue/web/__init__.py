"""The dashboard: a live web view of the queue, an ASGI app (Starlette) to mount or serve.

``pip install "aiojobqueue[web]"``, then::

    from aiojobqueue.web import dashboard
    app.mount("/queue", dashboard(queue, access=lambda request: "full"))

``aiojobqueue dashboard --url URL`` serves it alone (see ``serve.serve``).
"""

from .app import dashboard

__all__ = ["dashboard"]
