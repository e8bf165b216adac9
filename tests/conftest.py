import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

import pytest

import simhashdb


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "test.db")


@pytest.fixture
def db(db_path):
    with simhashdb.DB(db_path, distance=3, blocks=5) as database:
        yield database


def key_order(key):
    """Sort keys of mixed types: ints, then str, then bytes (as the DB does)."""
    return (isinstance(key, bytes), isinstance(key, str), key)


def brute_force(docs, fingerprint, distance):
    """The oracle: every (key, fingerprint, distance) within ``distance``, sorted."""
    hits = [(bin(fp ^ fingerprint).count("1"), key, fp) for key, fp in docs.items()]
    return sorted(((k, fp, d) for d, k, fp in hits if d <= distance),
                  key=lambda m: (m[2], key_order(m[0])))
