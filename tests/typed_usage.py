"""A user's script as ``mypy --strict`` checks it (tests/test_typing.py): the
public API's types, used the way the README shows."""

import tempfile
from array import array

import simhashdb
from simhashdb import DB, Decision, Match, Pair, Record, TextMatch
from simhashdb.aio import AsyncDB
from simhashdb.chunking import ngrams, select_ngrams
from simhashdb.halohash import BitAverageHaloHash


def main() -> None:
    text = "the quick brown fox jumps over the lazy dog " * 20
    fp: int = simhashdb.fingerprint(text)
    prints: list[int] = simhashdb.fingerprint_many([text, text.upper()], html=False)
    fp2, signature = simhashdb.fingerprint_with_signature(text, html=True)
    alike: float = simhashdb.resemblance(signature, signature)
    bits: int = simhashdb.num_differing_bits(fp, fp2)
    pairs: list[tuple[int, int]] = simhashdb.find_all(prints, blocks=4, distance=3)
    clusters: list[list[int]] = simhashdb.find_clusters(prints, 4, 3)
    with DB(tempfile.mkdtemp() + "/typed.db", recipe=simhashdb.RECIPE) as db:
        db.insert("a", fp, {"source": "example"})
        count: int = db.insert_many([("b", fp2), ("c", fp ^ 1, None)])
        matches: list[Match] = db.query(fp)
        distances = [m.distance + 0 for m in matches]
        found: Decision = db.insert_if_new("d", fp ^ 3)
        replaced: Record | None = found.replaced
        status: str = found.status
        text_found: Decision = db.insert_text_if_new("e", text + " and more", refresh=True)
        decisions: list[Decision] = db.insert_text_if_new_many([("f", ""), ("g", text)],
                                                               invalid="report")
        reasons = [d.reason for d in decisions if d.status == "invalid"]
        for match in db.query_text(text):
            if isinstance(match, TextMatch) and match.resemblance is not None:
                alike = max(alike, match.resemblance)
        record = db.get("a")
        stored_at: int | None = record.stored_at if record else None
        every: list[Pair] = list(db.find_all())
        groups = [sorted(map(str, group)) for group in db.clusters()]
        gone: int = db.expire(0)
        stats: dict[str, object] = db.stats()
    with DB(tempfile.mkdtemp() + "/ids.db") as ids:
        count += ids.insert_many(keys=array("Q", [1, 2]), fingerprints=array("Q", [fp, fp2]))
        probes, keys, within = ids.query_many(array("Q", [fp]), arrays=True)
        first_key: int = keys[0] + probes[0] + within[0]
    halo = BitAverageHaloHash([b"a", b"b"], size_in_bits=64)
    grams = list(select_ngrams(ngrams("abcdef", 3)))
    print(first_key, prints, alike, bits, pairs, clusters, count, distances, replaced, text_found,
          stored_at, every, groups, gone, stats, halo.distance(halo), grams)


async def crawl(path: str, pages: list[tuple[str, str]]) -> list[str]:
    """AsyncDB as a crawler's tasks use it."""
    async with AsyncDB(path, recipe=simhashdb.RECIPE) as db:
        statuses = [(await db.insert_text_if_new(url, body, html="main")).status
                    for url, body in pages]
        near: list[TextMatch] = await db.query_text(pages[0][1], html=True)
        gone: bool = await db.delete(pages[0][0])
        found: Decision = await db.insert_if_new("fp", 12345)
        return statuses + [m.key for m in near if isinstance(m.key, str)] + [str(gone), found.status]


if __name__ == "__main__":
    main()
