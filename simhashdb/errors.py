"""The package's exceptions: every one derives from SimhashDBError."""


class SimhashDBError(Exception):
    """Base class of every error simhashdb raises."""


class InvalidFingerprintError(SimhashDBError, ValueError, TypeError):
    """A fingerprint is not an integer in [0, 2**64)."""


class InvalidArgumentError(SimhashDBError, ValueError, TypeError):
    """An argument has the wrong type or an unsupported value."""


class InvalidKeyError(SimhashDBError, ValueError, TypeError):
    """A document key is not str, bytes or int, or is too long."""


class InvalidMetadataError(SimhashDBError, ValueError, TypeError):
    """Document metadata cannot be encoded with msgpack."""


class InputError(SimhashDBError, ValueError):
    """A line or file of input cannot be read as a record (simhashdb.inputs)."""


class DamagedInputError(InputError):
    """A compressed input whose data is damaged."""


class KeyNotFoundError(SimhashDBError, KeyError):
    """``db[key]`` of a key with no document."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class DatabaseError(SimhashDBError):
    """The database cannot be opened or used as asked."""


class DatabaseNotFoundError(DatabaseError):
    """No database where one was to be opened without creating it."""


class ParameterMismatchError(DatabaseError, ValueError):
    """Explicit parameters disagree with those stored in the database."""


class FormatVersionError(DatabaseError):
    """The database was written by a newer simhashdb."""


class DiskFullError(DatabaseError):
    """The disk is full: nothing of the operation was written."""


class DatabaseBusyError(DatabaseError):
    """Another handle has the database open, so it cannot be compacted now."""


class DamagedError(DatabaseError):
    """The data file is damaged: LMDB faulted or found it corrupt, a run of
    the tables or bands is damaged, or what it holds contradicts itself (the
    LMDB backends raise it)."""


class DamagedPageError(DatabaseError):
    """A page of an LMDB B-tree that is not the page it should be, found by
    the LMDB backend's check of a data file before LMDB maps it (and caught
    there). Its argument: the page's number."""


class MapFullError(DatabaseError):
    """The LMDB map is full: the backend grows it and runs the transaction
    again (the native LMDB engine raises it)."""


class MapResizedError(DatabaseError):
    """Another process grew the LMDB map: the backend adopts its size and
    begins again (the native LMDB engine raises it)."""


class NodeTimeoutError(DatabaseError):
    """A Redis node does not answer in time (it hangs, or cannot be reached),
    and no replica took over from it."""


class Unavailable(DatabaseError):
    """The Redis backend's signal to retry after a refresh: a node did not
    answer, or the cluster is changing. ``node``: the ``host:port`` of a node
    that did not answer in time (else None)."""

    def __init__(self, message, node=None):
        super().__init__(message)
        self.node = node


class Superseded(DatabaseError):
    """A Redis writer lost its lock while applying a batch: the batch is
    pending, so the writer that took the lock over finishes it (or already
    did). ``fenced``: a write was refused by a fence (a later batch wrote
    there)."""

    def __init__(self, message, fenced=False):
        super().__init__(message)
        self.fenced = fenced


class DamagedDatabaseWarning(UserWarning):
    """A database whose files look damaged was opened read-only."""


class MaintenanceWarning(UserWarning):
    """Work that keeps the database fast waits: a stored batch's follow-up
    (merging the tables' runs) failed and the next write tries it again, or
    the fingerprint index waits for a writer with the database to itself."""


class CliError(SimhashDBError):
    """A command's input or options are wrong: ``simhashdb-cli`` prints one
    line on stderr and exits with status 1."""


class UsageError(CliError):
    """Options that do not go together: one line on stderr, exit status 2."""
