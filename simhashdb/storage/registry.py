"""Which backend opens a database: by name, by the scheme of a URL, or the
default (``$SIMHASHDB_BACKEND``, else native LMDB where it was built, else
py-lmdb, with a warning). Backends are imported when first opened, so the core
runs without the optional packages of the others."""

import importlib
import os
import warnings

from . import Storage
from ..errors import InvalidArgumentError

_backends = {}  # name -> a Storage subclass, or "module:Class" until first opened
_schemes = {}  # URL scheme -> backend name
_warned_fallback = False  # the py-lmdb fallback is announced once a process


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
    built, else ``"py-lmdb"``: the first time that happens in a process, a
    RuntimeWarning says why and how to get the native backend (choosing
    py-lmdb by name or by ``$SIMHASHDB_BACKEND`` warns of nothing)."""
    chosen = os.environ.get("SIMHASHDB_BACKEND")
    if chosen:
        return chosen
    try:
        backend_class("lmdb")
    except ImportError as exc:
        _warn_fallback(exc)
        return "py-lmdb"
    return "lmdb"


def _warn_fallback(reason):
    global _warned_fallback
    if _warned_fallback:
        return
    _warned_fallback = True
    warnings.warn(
        "simhashdb: the native LMDB backend is missing (%s), so databases open on the py-lmdb "
        "fallback, about 19x slower in batches. To get it, install the LMDB C library and "
        "pkg-config (Debian/Ubuntu: apt-get install liblmdb-dev pkg-config; Homebrew: lmdb) and "
        "run pip install . again in simhashdb's source directory, or install a wheel made by "
        "`make wheel`, which carries the library. backend=\"py-lmdb\" or "
        "SIMHASHDB_BACKEND=py-lmdb chooses the fallback without this warning." % reason,
        RuntimeWarning, stacklevel=5)  # the caller of DB(...), through open_storage


def scheme_of(path):
    """The backend a URL ``path`` names by its scheme, or None for a plain path.

    :raises InvalidArgumentError: a path that begins with a backend's scheme
        but is not a URL of it (``redis:/host/x``, ``Redis://``): it would
        otherwise be taken for a directory.
    """
    scheme, sep, _ = str(path).partition("://")
    if sep and scheme in _schemes:
        return _schemes[scheme]
    named, colon, _ = str(path).partition(":")
    if colon and named.lower() in _schemes:  # (a directory named redis is a directory)
        named = named.lower()
        raise InvalidArgumentError("%s is not a %s URL as simhashdb reads them: write it as "
                                   "%s://host:port/name, in lower case (or ./%s for a "
                                   "directory of that name)"
                                   % (path, _schemes[named], named, path))
    return None


def makes_files(path):
    """Whether creating a database at ``path`` makes its files: a path that
    names no backend by its URL and is missing or an empty directory."""
    return scheme_of(path) is None and (
        not os.path.exists(path) or os.path.isdir(path) and not os.listdir(path))


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
    return backend_class(name).open(path, readonly=readonly, create=create)
