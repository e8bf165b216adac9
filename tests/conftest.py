import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

import pytest
import redis_cluster

import simhashdb


def native_built():
    try:
        import simhashdb._lmdb  # noqa: F401
    except ImportError:
        return False
    return True


# Every storage test runs on each backend. CI builds the native one, so there
# it is always tested (and fails if it did not build); elsewhere it is tested
# where it was built.
BACKENDS = ["lmdb", "py-lmdb"] if native_built() or os.environ.get("CI") else ["py-lmdb"]
# CI installs redis-server (make test does), so there the Redis backend is always tested.
REDIS = redis_cluster.available() or bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory):
    """The URL of a 3-primary, 3-replica Redis Cluster on loopback, started
    once for the session (in ~6 s) when a test first asks for it."""
    cluster = redis_cluster.LocalCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """The backend a test's databases use: also the default of ``DB()`` and of
    subprocesses (``SIMHASHDB_BACKEND``)."""
    monkeypatch.setenv("SIMHASHDB_BACKEND", request.param)
    return request.param


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "test.db")


@pytest.fixture
def db(db_path, backend):
    with simhashdb.DB(db_path, distance=3, blocks=5, backend=backend) as database:
        assert database.backend == backend
        yield database


def as_tuples(matches):
    """Matches as (key, fingerprint, distance) tuples, as brute_force gives them."""
    return [(m.key, m.fingerprint, m.distance) for m in matches]


def flip(fp, bits):
    """``fp`` with ``bits`` flipped."""
    for b in bits:
        fp ^= 1 << b
    return fp


def key_order(key):
    """Sort keys of mixed types: ints, then str, then bytes (as the DB does)."""
    return (isinstance(key, bytes), isinstance(key, str), key)


def brute_force(docs, fingerprint, distance):
    """The oracle: every (key, fingerprint, distance) within ``distance``, sorted."""
    hits = [(bin(fp ^ fingerprint).count("1"), key, fp) for key, fp in docs.items()]
    return sorted(((k, fp, d) for d, k, fp in hits if d <= distance),
                  key=lambda m: (m[2], key_order(m[0])))
