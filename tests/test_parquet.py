"""Bad arguments to the Parquet calls are InvalidArgumentError that says what
was expected, never pyarrow's own TypeError or OSError."""

import pytest

from simhashdb import DB, RECIPE, InvalidArgumentError

pytest.importorskip("pyarrow")


@pytest.mark.parametrize("call, said", [
    (lambda db, tmp: db.import_parquet(None), "path of a Parquet file or directory.*got None"),
    (lambda db, tmp: db.import_parquet(5), "path of a Parquet file or directory.*got 5"),
    (lambda db, tmp: db.import_parquet(tmp / "a.parquet", key=None), "column names are str"),
    (lambda db, tmp: db.import_parquet(tmp / "a.parquet", fingerprint=3), "column names are str"),
    (lambda db, tmp: db.export_parquet(None), "path of a Parquet file or directory.*got None"),
    (lambda db, tmp: db.export_parquet(tmp / "missing" / "b.parquet"),
     "cannot write Parquet to .*missing"),
    (lambda db, tmp: db.export_parquet(tmp), "cannot write Parquet to"),
])
def test_bad_arguments_to_the_parquet_calls_say_what_was_expected(tmp_path, call, said):
    with DB(str(tmp_path / "db")) as db:
        db.insert("a", 1)
        db.export_parquet(tmp_path / "a.parquet")
        with pytest.raises(InvalidArgumentError, match=said):
            call(db, tmp_path)
        assert db.import_parquet(str(tmp_path / "a.parquet").encode()) == 1  # bytes are a path


def test_records_import_takes_the_recipe_before_their_first_batch(tmp_path):
    """A database without a recipe takes the texts' recipe before it writes a
    record, so a first batch of fingerprints alone cannot leave it unable to
    take the texts that follow (half the records written, then an error)."""
    text = "a text of enough words to give its signature bands of its own, and more words"
    with DB(str(tmp_path / "a"), recipe=RECIPE) as db:
        db.insert("fp", 12345)
        db.insert_text("text", text)
        records = sorted(db.export_records(), key=lambda record: record[4] is not None)
    with DB(str(tmp_path / "b")) as db:
        assert db.import_records(records, RECIPE, batch_size=1) == 2
        assert db.recipe == RECIPE and [m.key for m in db.query_text(text)] == ["text"]
