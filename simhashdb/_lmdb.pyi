"""The native LMDB backend (simhashdb._lmdb): internal, used by lmdb_native."""

from typing import Any

def __getattr__(name: str) -> Any: ...
