"""A database without a recipe takes one only while empty, decided in the
write transaction that stores it: a writer that stores fingerprints (or
another recipe) between the check and the store makes the adoption fail."""

import pytest

import simhashdb
from conftest import storage_of


@pytest.mark.parametrize("other", ["fingerprints", "recipe"])
def test_a_recipe_is_adopted_only_if_nothing_was_written_first(db_path, backend, other):
    with simhashdb.DB(db_path) as first:
        storage = storage_of(first)
        write = storage.write

        def others_first(body, documents=0):  # another writer lands just before
            storage.write = write
            recipe = "simhashdb-2" if other == "recipe" else None
            with simhashdb.DB(db_path, recipe=recipe) as second:
                if other == "fingerprints":
                    second.insert("raw", 12345)
            return write(body, documents)

        storage.write = others_first
        with pytest.raises(simhashdb.ParameterMismatchError, match="cannot be compared"):
            first.insert_text("a", "some words of a text to fingerprint")
    with simhashdb.DB(db_path) as db:
        assert db.recipe is None if other == "fingerprints" else db.recipe.startswith(
            "simhashdb-2/")
        assert "a" not in db
