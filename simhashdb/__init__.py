"""simhashdb: a persistent near-duplicate fingerprint database.

Fingerprints: :func:`fingerprint` (text), :func:`compute` (simhash of feature
hashes), :func:`compute_weighted`, :func:`num_differing_bits`;
:func:`fingerprint_with_signature` and :func:`resemblance` behind the text
methods of :class:`DB`; halo hashes in :mod:`simhashdb.halohash`, n-grams in
:mod:`simhashdb.chunking`.
"""

__version__ = "0.16.2"

from ._ext import (
    check_fingerprint,
    num_differing_bits,
    num_differing_bits_many,
)
from ._text import (
    compute,
    compute_weighted,
    fast_hash,
)
from .db import DB
from .maintenance import relayout, upgrade
from .errors import (
    DamagedDatabaseWarning,
    DatabaseBusyError,
    DatabaseError,
    DatabaseNotFoundError,
    DiskFullError,
    FormatVersionError,
    InvalidArgumentError,
    InvalidFingerprintError,
    InvalidKeyError,
    InvalidMetadataError,
    KeyNotFoundError,
    MaintenanceWarning,
    NodeTimeoutError,
    ParameterMismatchError,
    SimhashDBError,
)
from .matching import find_all, find_all_indices, find_clusters
from .records import MAX_KEY_SIZE, Record, check_record
from .results import Decision, Match, Pair, TextMatch, TextPair
from .fingerprint import (
    RECIPE,
    RECIPES,
    fingerprint,
    fingerprint_many,
    fingerprint_with_signature,
    html_to_text,
    main_content,
    normalize,
    resemblance,
    shingle,
    strip_html,
    tokenize,
    unsigned_hash,
)

__all__ = [
    "MAX_KEY_SIZE",
    "RECIPE",
    "RECIPES",
    "DB",
    "DamagedDatabaseWarning",
    "DatabaseBusyError",
    "DatabaseError",
    "DatabaseNotFoundError",
    "Decision",
    "DiskFullError",
    "FormatVersionError",
    "InvalidKeyError",
    "InvalidMetadataError",
    "KeyNotFoundError",
    "MaintenanceWarning",
    "Match",
    "NodeTimeoutError",
    "Pair",
    "TextMatch",
    "TextPair",
    "ParameterMismatchError",
    "Record",
    "InvalidArgumentError",
    "InvalidFingerprintError",
    "SimhashDBError",
    "check_fingerprint",
    "check_record",
    "compute",
    "compute_weighted",
    "fast_hash",
    "find_all",
    "find_all_indices",
    "find_clusters",
    "fingerprint",
    "fingerprint_many",
    "fingerprint_with_signature",
    "html_to_text",
    "main_content",
    "normalize",
    "num_differing_bits",
    "num_differing_bits_many",
    "resemblance",
    "shingle",
    "strip_html",
    "tokenize",
    "unsigned_hash",
    "relayout",
    "upgrade",
]
