"""The Redis backend on a local 3-primary, 3-replica cluster."""

import pytest
import redis
from conftest import REDIS

pytestmark = pytest.mark.skipif(not REDIS, reason="redis-server is not installed (CI installs it)")


def test_the_local_cluster_serves_every_slot_with_a_replica(redis_cluster):
    nodes = redis.Redis.from_url(redis_cluster.url).execute_command("CLUSTER NODES").values()
    primaries = {n["node_id"]: n for n in nodes if "master" in n["flags"]}
    assert sum(int(end) - int(start) + 1 for n in primaries.values()
               for start, end in n["slots"]) == 16384
    replicas = [n["master_id"] for n in nodes if "slave" in n["flags"] and n["connected"]]
    assert len(primaries) == 3 and sorted(replicas) == sorted(primaries)
