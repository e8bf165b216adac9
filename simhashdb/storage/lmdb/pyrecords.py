"""The documents' records as the py-lmdb backend reads and writes them
(format.py): in zstd-compressed blocks of consecutive ids, or, in a file of
format 8 to 10, one an id; as the native engine does (``ext/_documents.pxi``)."""

from __future__ import annotations

from .format import ID_BYTES, RECORD_BLOCK_BYTES, TAKEN_IN, pack_block, unpack_block
from .pyruns import damaged_error, id_bytes


def _id(doc):
    return int.from_bytes(doc, "big")


def _packing_ratio(body, stored):
    """Body bytes a stored byte, as a block's target takes it: at most 4, so
    that a record read decodes at most about 8 KB."""
    return min(4.0, max(1.0, body / max(stored, 1)))


class Records:
    """The records of one transaction (``db`` in ``txn``; ``blocks``: in
    blocks), as its calls read and write them: the block last read kept
    decoded, new records appended in blocks once stored (:meth:`flush`)."""

    def __init__(self, txn, db, blocks, path):
        self._txn, self._db, self.blocks, self._path = txn, db, blocks, path
        self._cursor = txn.cursor(db)
        self._held = None  # (key, last id, {id: record}, stored bytes) of the block last read
        self._tail = []  # [(id, record)] appended, not yet stored
        self._tail_key = None  # the key of the stored block the tail took in, or None
        self._gone = set()  # ids removed, to take out of their blocks (flush)
        self._ratio = 1.0  # body bytes a stored byte, of the last block stored

    def _damaged(self, what):
        return damaged_error(self._path, what)

    def get(self, doc):
        """The record of id ``doc`` (8 bytes), or None."""
        if not self.blocks:
            return self._cursor.get(doc)
        self.flush()
        block = self._block_of(_id(doc))
        return None if block is None else block[2].get(_id(doc))

    def _block_of(self, doc):
        """The block that would hold id ``doc``, decoded; None where none would."""
        held = self._held
        if held is not None and held[0] <= doc <= held[1]:
            return held
        cursor, wanted = self._cursor, id_bytes(doc)
        if not cursor.set_range(wanted):
            if not cursor.last():
                return None
        elif cursor.key() != wanted and not cursor.prev():
            return None
        key = _id(cursor.key())
        if key > doc or len(cursor.key()) != ID_BYTES:
            raise self._damaged("the documents' blocks")
        if held is None or held[0] != key:
            records = unpack_block(key, cursor.value())
            if records is None:
                raise self._damaged("the block of documents at id %016x" % key)
            self._held = (key, records[-1][0], dict(records), len(cursor.value()))
        return self._held

    def items(self):
        """(id bytes, record) of every record in id order; once through,
        ``walked`` holds the items read (for a check against LMDB's count)."""
        walked, last = 0, -1
        for key, value in self._txn.cursor(self._db).iternext():
            walked += 1
            if not self.blocks:
                yield key, value
                continue
            records = unpack_block(_id(key), value) if len(key) == ID_BYTES else None
            if records is None or records[0][0] <= last:
                raise self._damaged("the block of documents at id %s" % key.hex())
            last = records[-1][0]
            for doc, record in records:
                yield id_bytes(doc), record
        self.walked = walked

    def append(self, items):
        """Store new records [(id bytes, record)], their ids ascending and above
        every stored one."""
        if not self.blocks:
            if self._cursor.putmulti(items, append=True)[1] != len(items):  # ids behind theirs
                raise self._damaged("meta's 'next id'")
            return
        for doc, record in items:
            doc = _id(doc)
            if not self._tail:
                self._begin_tail(doc)
            elif doc <= self._tail[-1][0]:
                raise self._damaged("meta's 'next id'")
            self._tail.append((doc, record))
        if sum(len(record) for _, record in self._tail) >= 2 * RECORD_BLOCK_BYTES * self._ratio:
            left = self._store(self._tail, False, self._tail_key, append=True)
            if len(left) < len(self._tail):  # (the block taken in is stored over)
                self._tail, self._tail_key = left, None

    def _begin_tail(self, doc):
        """Begin the records to append with id ``doc``, which must be above
        every stored id: the last stored block's records taken in where it is
        not full (under TAKEN_IN bytes)."""
        self._tail, self._tail_key = [], None
        if not self._cursor.last():
            return
        key, raw = _id(self._cursor.key()), self._cursor.value()
        held = self._block_of(key)[2]
        if max(held) >= doc:
            raise self._damaged("meta's 'next id'")
        if len(raw) < TAKEN_IN:
            self._tail, self._tail_key = sorted(held.items()), key
            self._ratio = _packing_ratio(sum(len(r) for r in held.values()), len(raw))

    def flush(self):
        """Take out the records removed and store those appended (before
        anything reads or changes records, and at the end of a call)."""
        if self._gone:
            self._remove_gone()
        if self._tail:
            self._store(self._tail, True, self._tail_key, append=True)
            self._tail, self._tail_key = [], None

    def _remove_gone(self):
        """Take the records removed out of their blocks, each block written once."""
        gone, self._gone = sorted(self._gone), set()
        at = 0
        while at < len(gone):
            block = self._block_of(gone[at])
            if block is None:
                raise self._damaged("the documents' blocks (no record of id %016x)" % gone[at])
            key, last, held, stored = block
            end = at
            while end < len(gone) and gone[end] <= last:
                end += 1
            taken = set(gone[at:end])
            if not taken <= held.keys():
                raise self._damaged("the documents' blocks (no record of id %016x)"
                                    % min(taken - held.keys()))
            self._rewrite(key, stored, [(doc, record) for doc, record in sorted(held.items())
                                        if doc not in taken])
            at = end

    def _store(self, records, whole, replaced, append):
        """Store ``records`` [(id, record)] as blocks of at most
        RECORD_BLOCK_BYTES each (a record larger alone): the first over the
        stored block keyed ``replaced`` where given, the others under their
        first ids (appended, or put where no block is: ``append``); returns
        what is left unless ``whole``: a last block not yet full."""
        first = 0
        while first < len(records):
            target, end, size = RECORD_BLOCK_BYTES * self._ratio * 0.97, first, 0
            while end < len(records) and (end == first or size + len(records[end][1]) <= target):
                size += len(records[end][1])
                end += 1
            if end == len(records) and not whole and size <= target:
                break
            key = replaced if first == 0 and replaced is not None else records[first][0]
            raw = pack_block(key, records[first:end])
            while len(raw) > RECORD_BLOCK_BYTES and end - first > 1:
                end = first + max(1, int((end - first) * RECORD_BLOCK_BYTES * 0.95 / len(raw)))
                raw = pack_block(key, records[first:end])
            if end - first > 1:
                size = sum(len(record) for _, record in records[first:end])
                self._ratio = _packing_ratio(size, len(raw))
            over = first == 0 and replaced is not None
            self._put(key, raw, append=append and not over, overwrite=over)
            first = end
        return records[first:]

    def _put(self, key, raw, append=False, overwrite=True):
        if self._held is not None and self._held[0] == key:
            self._held = None
        if not self._cursor.put(id_bytes(key), raw, append=append,
                                overwrite=overwrite):
            raise self._damaged("the documents' blocks (a block's key taken)")

    def replace(self, doc, record):
        """Replace the stored record of id ``doc``."""
        if not self.blocks:
            self._cursor.put(doc, record)
        else:
            self._edit(_id(doc), record)

    def delete(self, doc):
        """Remove the stored record of id ``doc`` (in blocks, once flushed: a
        block's removals are written together)."""
        if not self.blocks:
            self._txn.delete(doc, db=self._db)
        else:
            self._gone.add(_id(doc))

    def _edit(self, doc, record):
        """Write the block of id ``doc`` again with ``record`` in its place."""
        self.flush()
        block = self._block_of(doc)
        if block is None or doc not in block[2]:
            raise self._damaged("the documents' blocks (no record of id %016x)" % doc)
        self._rewrite(block[0], block[3], sorted({**block[2], doc: record}.items()))

    def _rewrite(self, key, stored, records):
        """Store ``records`` over the block keyed ``key`` (``stored``: its
        bytes), as more than one where they outgrew its room, or remove that
        block where there are none."""
        self._ratio = _packing_ratio(sum(len(r) for _, r in records), stored)
        self._held = None
        if records:
            self._store(records, True, key, append=False)
        else:
            self._txn.delete(id_bytes(key), db=self._db)
