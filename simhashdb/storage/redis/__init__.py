"""The Redis backend: one database on a Redis Cluster (or a single Redis),
shared by many clients on many machines. Modules: :mod:`.storage` (the
Storage), :mod:`.view` and :mod:`.batch` (its reads and transactions),
:mod:`.protocol` (the batch protocol), :mod:`.keys` (the names of the keys),
:mod:`.cluster` (URLs, connections, rounds), :mod:`.scripts` (the Lua).

``redis://[user:password@]host:port[,host:port...]/name[?options]``
(``rediss://`` for TLS) names database ``name`` on the cluster (detected) or
server at host:port, or at the first of several seed nodes that answers;
several databases share a cluster. Options: ``replicas`` (how many replicas
of each node a batch must reach before it is acknowledged, default 1 where
the primaries have replicas, else 0; a primary that a failover left without
any replica writes alone until one is back), ``retry`` (seconds to retry
through a failover before DatabaseError, default 20), ``lease`` (seconds a
dead writer's lock lives, default 10), ``timeout`` (seconds a node that
still owns its slots may take to answer, default 10: a late reply's node
is left once another node names its replica primary, and a new
connection waits at most 1 s to connect and for each answer of its
handshake), ``ca`` (a PEM file of the CA certificates that signed a
rediss:// server's, default the system's). With ``SIMHASHDB_BACKEND=redis``,
a plain name is a database on the server of ``$SIMHASHDB_REDIS_URL``.

Keys of database N (a table's bucket holds the fingerprints whose permuted
value starts with the bucket's B bits, B a multiple of 8 chosen from the
layout, as one string of the remaining bytes, sorted):

- ``{N}:params``, ``{N}:layout``, ``{N}:count``, ``{N}:distinct``, ``{N}:lock``,
  ``{N}:pending``, ``{N}:epoch``, ``{N}:hold``, ``{N}:queued``: one slot;
- ``N:<table><bucket>``: a table's bucket (3 + B/4 hex digits);
- ``N:b<band><bucket>``: a band's bucket (2 + B/4 hex digits), cut as a
  table's: band b holds, for each band key k of a stored text document,
  the entry ``k << 32 | its fingerprint's top 32 bits`` (the bucket is the
  entry's first B bits, the string holds the rest of each entry, sorted); an
  entry stays while a stored document has it;
- ``N:d:<shard>``: a hash of documents (encoded key -> encoded value), sharded
  by a CRC of the key;
- ``N:f:<shard>``: a hash of fingerprints (8 bytes -> their keys, each after
  its 2-byte length), sharded by the fingerprint's first B - 3 bits;
- ``N:fence{<tag>}``: the epoch of the last batch that wrote in the slot of
  ``<tag>``, one per slot written.

Writers take turns under one lock with a lease (``{N}:lock``; a waiting
writer queues for the next turn, ``{N}:queued``). A batch is planned under
it, stored as ``{N}:pending`` (which makes ``{N}:epoch`` odd) and
acknowledged by a replica, applied with idempotent commands (buckets are
merged by a server-side script, one call per node), acknowledged by a
replica on every node, and cleared (the epoch is even again, the counts
set). A plan lists the documents it changes, the fingerprints the index and
the tables gain and lose, and the band entries that no document keeps
(decided under the lock: a document that shares a removed entry has the
entry's fingerprint prefix, so it is looked for among those); the entries
the bands gain are those of the changed documents, read again from the plan
when it is applied. Every write raises the fence of its slot to the batch's
epoch in the same script, and is refused if a later batch raised it
further: a writer that stalled past its lease cannot land a round it had
already sent over a later batch (the lock alone cannot stop it). A writer
that finds a pending batch (its writer died) applies it first, so a batch
never lands half; a reader retries while the epoch is odd or changed under
it, so it sees whole batches (after three tries it holds new batches back
until it is done, ``{N}:hold``, so that a steady writer cannot starve it).

A query costs one round trip per node for the tables (the script scans the
buckets' ranges on the server), one more for the keys of what matched, and
two reads of the epoch. A band search (any number of texts, 32 band keys
each) costs the same: one round for the bands' buckets (the same script),
one for the fingerprints of the prefixes found (a script reads each hash of
the index that holds one and returns the fingerprints that start with them,
with their keys), and two reads of the epoch.
"""
