"""Every pair of a stored database's documents near each other, and their
clusters, from one snapshot (:meth:`simhashdb.DB.find_all`,
:meth:`simhashdb.DB.clusters`): in a database of fingerprints by their
distance, in one of a recipe by the text rule (:mod:`simhashdb.rule`)."""

from __future__ import annotations

import collections
import itertools
from array import array

from . import _ext
from .layout import Layout
from .matching import components, pair_chunks, text_pairs
from .records import decode_key, signature as stored_signature, value_fingerprint
from .results import Pair, TextPair, key_order, ordered, sorted_keys


def built_for(layout, d, n):
    """The tables' ``layout`` where they are built for distance ``d``, else one
    that is, for a scan of ``n`` fingerprints in memory."""
    return layout if d <= layout.distance else Layout(Layout.choose_blocks(d, max(2, n)), d)


def find_all(storage, layout, recipe, d, least):
    """The generator of :meth:`simhashdb.DB.find_all`."""
    with storage.read() as view:
        if recipe is not None:
            keys, fps, signatures = _texts(view)
            layout = built_for(layout, d, len(fps))
            for i, j, score in text_pairs(fps, signatures, layout, least, d):
                key_a, key_b = ordered(keys[i], keys[j])
                between = _ext.num_differing_bits(fps[i], fps[j])
                yield Pair(key_a, key_b, between) if score is None \
                    else TextPair(key_a, key_b, between, score)
            return
        values = array("Q")
        for fp, keys in view.fingerprint_groups():
            values.append(fp)
            for key_a, key_b in itertools.combinations(sorted_keys(view, keys), 2):
                yield Pair(key_a, key_b, 0)
        for pairs in pair_chunks(values, built_for(layout, d, len(values)), d):
            for start in range(0, len(pairs), 20000):  # the keys of 10,000 pairs a read
                chunk = pairs[start:start + 20000]
                yield from _keyed_pairs(view, values, chunk)

def _keyed_pairs(view, values, chunk):
    """The Pairs of the fingerprint pairs ``chunk`` (positions in
    ``values``), their keys read at once."""
    keys = view.keys_of_many({values[i] for i in chunk})
    for p in range(0, len(chunk), 2):
        a, b = values[chunk[p]], values[chunk[p + 1]]
        between = _ext.num_differing_bits(a, b)
        for key_a in sorted_keys(view, keys[a]):
            for key_b in sorted_keys(view, keys[b]):
                yield Pair(*ordered(key_a, key_b), between)

def clusters(storage, layout, recipe, d, least):
    """The generator of :meth:`simhashdb.DB.clusters`."""
    with storage.read() as view:
        if recipe is not None:
            keys, fps, signatures = _texts(view)
            pairs = array("Q")
            for i, j, _ in text_pairs(fps, signatures, built_for(layout, d, len(fps)), least, d):
                pairs.extend((i, j))
            labels = components(len(keys), [pairs])
            members = collections.defaultdict(list)
            for i, label in enumerate(labels):
                members[label].append(i)
            groups = sorted((min(fps[i] for i in group),
                             sorted((keys[i] for i in group), key=key_order))
                            for group in members.values() if len(group) > 1)
            yield from (group for _, group in groups)
            return
        values, multiple = array("Q"), set()
        for fp, keys in view.fingerprint_groups():
            if len(keys) > 1:
                multiple.add(len(values))
            values.append(fp)
        labels = components(len(values), pair_chunks(values, built_for(layout, d, len(values)), d))
        members = collections.defaultdict(list)
        for i, label in enumerate(labels):
            if label != i or i in multiple:
                members[label].append(i)
        labels = sorted(members)
        for start in range(0, len(labels), 1000):  # the keys of 1000 clusters a read
            groups = [members[label] for label in labels[start:start + 1000]]
            for label, group in zip(labels[start:start + 1000], groups):
                if group[0] != label:
                    group.insert(0, label)
            keys = view.keys_of_many({values[i] for group in groups for i in group})
            for group in groups:
                yield sorted_keys(view, [k for i in group for k in keys[values[i]]])

def _texts(view):
    """The (keys, fingerprints, signatures or None) of every document."""
    keys, fps, signatures = [], array("Q"), []
    for key, value in view.documents():
        keys.append(decode_key(key, value))
        fps.append(value_fingerprint(value))
        signatures.append(stored_signature(value))
    return keys, fps, signatures
