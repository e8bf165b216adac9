"""Write ext/_format.pxi, the native engine's copy of the LMDB file format's
constants, from simhashdb/storage/lmdb/format.py (tests/test_format.py checks
that the two agree). Run it after changing format.py, then rebuild.

Usage: python tools/write_format_pxi.py
"""

import os

from simhashdb.storage.lmdb import format as lmdb_format

PXI = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ext", "_format.pxi")

if __name__ == "__main__":
    with open(PXI, "w") as f:
        f.write(lmdb_format.native_constants())
    print("wrote", PXI)
