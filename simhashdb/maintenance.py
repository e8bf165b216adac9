"""Changing a database's form in place: :func:`upgrade` from an earlier
simhashdb's format, :func:`relayout` to other tables for its distance."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union

from . import params
from .db import DB
from .storage.registry import open_storage


def upgrade(path: Union[str, os.PathLike], *, backend: Any = None,
            progress: Optional[Callable[[int, int], None]] = None) -> None:
    """Convert a database made by an earlier simhashdb to this version's
    format, which it then opens writable. An LMDB database of simhashdb 0.15
    or earlier (format 10 and before) is copied into this format (its
    documents put in compressed blocks; those of 0.8 and earlier given ids),
    its tables and bands built again, and the copy put in its place once
    whole: a crash leaves the old database or the converted one. It needs the
    database to itself and free disk space for the copy. A database of this
    format is left as it is.

    :param progress: called with (1, 1) once the database is converted.
    :raises DatabaseBusyError: another process or handle has it open.
    """
    storage = open_storage(path, create=False, backend=backend)
    try:
        if storage.old_documents or storage.old_records:
            params.convert_documents(storage)
    finally:
        storage.close()
    DB(path, backend=backend).close()
    if progress is not None:
        progress(1, 1)


def relayout(path: Union[str, os.PathLike], *, blocks: Optional[int] = None,
             table_distance: Optional[int] = None, expected_size: Optional[int] = None,
             backend: Any = None) -> dict[str, int]:
    """Build the tables of the database at ``path`` again in another layout
    for its distance: the one ``blocks`` and ``table_distance`` give, or the
    one a new database of ``expected_size`` documents (default: those it
    holds) would get on this machine (see :meth:`Layout.choose`), written as a
    compacted copy put in the database's place once whole, so a crash leaves
    the database as it was or relaid out. Returns the layout it has:
    ``{"blocks", "table_distance", "tables"}``.

    :raises DatabaseBusyError: another process or handle has it open.
    :raises DatabaseError: its backend keeps no files of its own (Redis).
    """
    params.check_layout_arguments(blocks=blocks, table_distance=table_distance,
                                  expected_size=expected_size)
    DB(path, backend=backend, create=False).close()  # brought to this format first
    storage = open_storage(path, create=False, backend=backend)
    try:
        layout = params.relayout(storage, blocks, table_distance, expected_size)
    finally:
        storage.close()
    return {"blocks": layout.blocks, "table_distance": layout.distance, "tables": layout.tables}
