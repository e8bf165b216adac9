# Written by tools/write_format_pxi.py from simhashdb/storage/lmdb/format.py: change that, not this

cdef enum:
    RUN_SLOTS = 8
    RUN_RATIO = 4
    BAND_RATIO = 3
    BAND_RATIO_SPREAD = 31
    INDEX_SLOTS = 8
    KEY_SLOTS = 8
    ID_BYTES = 8
    KEY_LENGTH_BYTES = 2
    RECORD_BLOCK_BYTES = 2022
    RECORD_BLOCK_LEVEL = 3
    TABLE_KEY_BYTES = 2
    BAND_DIRECTORY = 32768
    RUN_RECORD_BYTES = 13
    RUN_KEY_BYTES = 12
    CHECKSUM_BIT = 31
    RECENT_LIMIT = 8192
    RECENT_FINGERPRINTS = 65535
    RECENT_GROUP_BYTES = 6
