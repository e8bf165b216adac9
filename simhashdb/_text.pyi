"""Types of the native text kernels (simhashdb._text) the package exports."""

from typing import Any, Iterable

from ._ext import Fingerprints

def fast_hash(data: bytes) -> int: ...
def compute(hashes: Fingerprints) -> int: ...
def compute_weighted(pairs: Iterable[tuple[int, float]]) -> int: ...
def __getattr__(name: str) -> Any: ...  # the internal kernels
