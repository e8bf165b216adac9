"""Which backend opens a database: by name, by the scheme of a URL, or the
default (``$SIMHASHDB_BACKEND``, else native LMDB where it was built, else
py-lmdb). Backends are imported when first opened, so the core runs without
the optional packages of the others."""

import importlib
import os

from . import Storage
from ..errors import InvalidArgumentError

_backends = {}  # name -> a Storage subclass, or "module:Class" until first opened
_schemes = {}  # URL scheme -> backend name


def register(name, backend, schemes=()):
    """Make ``backend`` (a :class:`Storage` subclass, or ``"module:Class"`` to
    import on first use) openable as ``name``, and for URLs of ``schemes``."""
    _backends[name] = backend
    _schemes.update(dict.fromkeys(schemes, name))


register("lmdb", "simhashdb.storage.lmdb.native:NativeStorage")
register("py-lmdb", "simhashdb.storage.lmdb.pylmdb:PyLmdbStorage")
register("redis", "simhashdb.storage.redis.storage:RedisStorage", schemes=("redis", "rediss"))


def names():
    """The names of the registered backends."""
    return list(_backends)


def backend_class(name):
    """The Storage subclass registered as ``name`` (importing it now).

    :raises ImportError: its module could not be imported (not built, or a
        package it needs is missing).
    """
    backend = _backends[name]
    if isinstance(backend, str):
        module, _, attribute = backend.partition(":")
        backend = _backends[name] = getattr(importlib.import_module(module), attribute)
    return backend


def default_backend():
    """``$SIMHASHDB_BACKEND``, else ``"lmdb"`` where the native backend was
    built, else ``"py-lmdb"``."""
    chosen = os.environ.get("SIMHASHDB_BACKEND")
    if chosen:
        return chosen
    try:
        backend_class("lmdb")
    except ImportError:
        return "py-lmdb"
    return "lmdb"


def scheme_of(path):
    """The backend a URL ``path`` names by its scheme, or None for a plain path."""
    scheme, sep, _ = str(path).partition("://")
    return _schemes.get(scheme) if sep else None


def open_storage(path, readonly=False, create=True, backend=None):
    """The :class:`Storage` of ``path``: ``backend`` itself if it is one; for a
    URL, the backend of its scheme; else the backend named ``backend``
    (default: :func:`default_backend`).

    :raises InvalidArgumentError: an unknown backend, or one that cannot open
        a URL of that scheme.
    """
    if isinstance(backend, Storage):
        return backend
    by_scheme = scheme_of(path)
    if by_scheme and backend not in (None, by_scheme):
        raise InvalidArgumentError("%s is a %s URL, which the %s backend cannot open"
                                   % (path, by_scheme, backend))
    name = by_scheme or backend or default_backend()
    if name not in _backends:
        raise InvalidArgumentError("backend must be a Storage or one of %s, got %r"
                                   % (", ".join(_backends), name))
    return backend_class(name)(path, readonly=readonly, create=create)
