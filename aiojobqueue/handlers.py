"""Handlers: what ``@queue.handler(...)`` registers (``HandlerSpec``, read by the worker and
by ``Batch.add``) and returns (``Handler``, the user's object).

A handler's parameters after ``ctx`` are read once, at registration, into ``Params``: enqueue
checks a job's args against them (a mismatch is an ``InvalidJobError`` naming the argument,
and nothing is inserted), and the worker checks them again before each call (args that do
not fit fail the job for good: no re-run can make them fit). Both checks are two set
comparisons, not ``inspect.Signature.bind``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

from .errors import ConfigurationError, PermanentError

P = ParamSpec("P")
R = TypeVar("R")

#: ``async def fn(ctx, **args)``
HandlerFn = Callable[..., Awaitable[Any]]
#: what ``retry_on=`` takes: one exception class or a tuple of them
RetryOn = type[BaseException] | tuple[type[BaseException], ...]

_P = inspect.Parameter
_BY_NAME = (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)


@dataclass(frozen=True, slots=True)
class Params:
    """The args a handler takes by name (its parameters after ``ctx``)."""

    #: names it accepts
    names: frozenset[str]
    #: names without a default
    required: frozenset[str]
    #: it has ``**kwargs``: any other name is accepted too
    any_name: bool
    #: the name ``ctx`` is bound to, which an arg must not take again
    ctx_name: str | None
    #: how the handler reads in messages: ``resize(image, width=100)``
    shown: str

    @classmethod
    def of(cls, fn: HandlerFn, type: str) -> Params | None:
        """Read ``fn``'s signature; None when it has none to read (then nothing is checked).
        Raises ConfigurationError for a handler that cannot take ``ctx`` and its args by
        name."""
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a callable without a signature: nothing to check
            return None
        params = list(sig.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.VAR_POSITIONAL,
        ):
            raise ConfigurationError(
                f"handler for {type!r} must take the JobContext as its first positional "
                f"parameter: {getattr(fn, '__qualname__', fn)}{sig}"
            )
        first = params[0]
        ctx_name = first.name if first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None
        rest = params if first.kind is inspect.Parameter.VAR_POSITIONAL else params[1:]
        names: set[str] = set()
        required: set[str] = set()
        any_name = False
        for p in rest:
            if p.kind in _BY_NAME:
                names.add(p.name)
                if p.default is inspect.Parameter.empty:
                    required.add(p.name)
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                any_name = True
            elif p.kind is _P.POSITIONAL_ONLY and p.default is _P.empty:
                raise ConfigurationError(
                    f"handler for {type!r}: parameter {p.name!r} is positional-only, but a "
                    "job's args are passed by name"
                )
        bare = sig.replace(parameters=rest, return_annotation=_P.empty)
        shown = f"{getattr(fn, '__qualname__', type)}{bare}"
        return cls(frozenset(names), frozenset(required), any_name, ctx_name, shown)

    def mismatch(self, args: Mapping[str, Any]) -> str | None:
        """Why ``args`` cannot be passed to the handler by name, or None when they can."""
        if self.required.issubset(args) and (  # (iterating a dict: its keys)
                self.names.issuperset(args) if not self.any_name
                else self.ctx_name is None or self.ctx_name not in args):
            return None
        keys = args.keys()
        problems = []
        missing = sorted(self.required - keys)
        if missing:
            problems.append(f"missing argument{'s' if len(missing) > 1 else ''} "
                            + ", ".join(map(repr, missing)))
        unexpected = sorted(
            {self.ctx_name} & keys if self.any_name and self.ctx_name is not None
            else keys - self.names, key=str,
        )
        if unexpected:
            problems.append(f"unexpected argument{'s' if len(unexpected) > 1 else ''} "
                            + ", ".join(map(repr, unexpected)))
        return f"{'; '.join(problems)} for {self.shown}"


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler and its per-type defaults, as the worker and enqueue read it."""

    fn: HandlerFn
    timeout: float | None
    max_attempts: int | None
    #: the exceptions worth another attempt (a PermanentError never is)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    #: the args it takes (None: not known, not checked)
    params: Params | None = None
    #: a plain ``def``: it runs in a worker thread (threads.py)
    plain: bool = False

    def retryable(self, exc: BaseException) -> bool:
        """May an attempt that raised ``exc`` be retried (attempts permitting)?"""
        return isinstance(exc, self.retry_on) and not isinstance(exc, PermanentError)


def retry_types(retry_on: RetryOn, job_type: str) -> tuple[type[BaseException], ...]:
    """``retry_on`` as a tuple of exception classes, or ConfigurationError."""
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    for t in types:
        if not (inspect.isclass(t) and issubclass(t, BaseException)):
            raise ConfigurationError(
                f"retry_on of {job_type!r} must be exception classes: {retry_on!r}")
    return types


class Handler(Generic[P, R]):
    """What ``@queue.handler(...)`` returns: still the coroutine function
    (``await fetch(ctx, url=u)``; name, docstring and signature are the function's), plus
    ``await fetch.enqueue({"url": u}, **options)``. A Handler is accepted by ``b.add`` and
    ``queue.enqueue`` wherever a job type is; its args are checked against its signature."""

    def __init__(self, type: str, spec: HandlerSpec,
                 enqueue: Callable[..., Awaitable[int]]) -> None:
        functools.update_wrapper(self, spec.fn)
        self.type = type
        self.spec = spec
        self._enqueue = enqueue

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return self.spec.fn(*args, **kwargs)  # type: ignore[return-value]

    @property
    def fn(self) -> Callable[P, Coroutine[Any, Any, R]]:
        """The decorated coroutine function itself."""
        return self.spec.fn  # type: ignore[return-value]

    async def enqueue(self, args: dict[str, Any] | None = None, **options: Any) -> int:
        """Enqueue a job of this handler's type on the queue it was registered with; takes the
        options of ``JobQueue.enqueue`` and returns the new job's id."""
        return await self._enqueue(self, args, **options)

    def __repr__(self) -> str:
        return f"<Handler {self.type!r} {getattr(self.spec.fn, '__qualname__', '?')}>"


class Register(Protocol):
    """What ``JobQueue.handler(...)`` returns: the decorator of an ``async def`` or a plain
    ``def`` handler."""

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Handler[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Handler[P, R]: ...


def registrar(
    type: str, timeout: float | None, max_attempts: int | None, retry_on: RetryOn,
    handlers: dict[str, HandlerSpec], enqueue: Callable[..., Awaitable[int]],
) -> Register:
    """The decorator ``JobQueue.handler(type, ...)`` returns: the options are checked now,
    the function when it is decorated (an async function taking ``ctx`` and its args by
    name); it is then registered in ``handlers`` and comes back as a ``Handler`` whose
    ``.enqueue`` calls ``enqueue``. A plain ``def`` runs in a worker thread (threads.py).
    Raises ConfigurationError."""
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"timeout must be > 0: {timeout!r}")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be >= 1: {max_attempts!r}")
    retry = retry_types(retry_on, type)

    def register(fn: Callable[P, Any]) -> Handler[P, Any]:
        if isinstance(fn, Handler):  # registered again (another type or queue)
            fn = fn.fn
        if not callable(fn) or inspect.isclass(fn):
            raise ConfigurationError(f"handler for {type!r} must be a function: {fn!r}")
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise ConfigurationError(
                f"handler for {type!r} must be a function, not a generator: {fn!r}")
        plain = not asyncio.iscoroutinefunction(fn)
        spec = HandlerSpec(fn, timeout, max_attempts, retry, Params.of(fn, type), plain)
        handlers[type] = spec
        return Handler(type, spec, enqueue)

    return register
