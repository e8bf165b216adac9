"""The clusters of a graph of pairs on Spark: its connected components, found
by alternating large-star and small-star rounds (Kiveris et al., 2014) over
DataFrames; a cluster is named by its smallest node."""

from pyspark.sql import Window, functions as F

from ..errors import SimhashDBError
from .tasks import _materialize

MAX_ROUNDS = 64             # large-star / small-star rounds before giving up


def _components(edges):
    """(key, cluster) of every node of an edge (u, v), u > v, but the smallest
    of each component, which is the cluster. Alternates large-star and
    small-star until every component is a star around its smallest node."""
    for _ in range(MAX_ROUNDS):
        if _stars(edges):
            return edges.select(F.col("u").alias("key"), F.col("v").alias("cluster"))
        edges = _materialize(_small_star(_large_star(edges)))
    raise SimhashDBError("connected components did not settle in %d rounds" % MAX_ROUNDS)


def _large_star(edges):
    """Join every node's larger neighbours to its smallest neighbour (or itself)."""
    both = edges.unionByName(edges.select(F.col("v").alias("u"), F.col("u").alias("v")))
    smallest = F.least(F.min("v").over(Window.partitionBy("u")), F.col("u"))
    return both.withColumn("m", smallest).where(F.col("v") > F.col("u")) \
        .select(F.col("v").alias("u"), F.col("m").alias("v"))


def _small_star(edges):
    """Join every node and its smaller neighbours to the smallest of them."""
    linked = edges.withColumn("m", F.min("v").over(Window.partitionBy("u")))
    return linked.select(F.explode(F.array("u", "v")).alias("u"), F.col("m").alias("v")) \
        .where(F.col("u") != F.col("v")).distinct()


def _stars(edges):
    """True when every node has at most one smaller neighbour and no node has
    both a smaller and a larger one: each component a star around its minimum."""
    roles = edges.select(F.col("u").alias("node"), F.lit(1).alias("up"), F.lit(0).alias("down")) \
        .unionByName(edges.select(F.col("v").alias("node"), F.lit(0).alias("up"),
                                  F.lit(1).alias("down")))
    counts = roles.groupBy("node").agg(F.sum("up").alias("up"), F.max("down").alias("down"))
    return counts.where((F.col("up") > 1) | ((F.col("up") > 0) & (F.col("down") > 0))).isEmpty()
