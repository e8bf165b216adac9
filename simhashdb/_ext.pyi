"""Types of the native kernels (simhashdb._ext) the package exports."""

from typing import Any, Iterable, Union

from array import array

Fingerprints = Union[Iterable[int], "array[int]", memoryview, Any]  # ints, array('Q'), numpy uint64

MAX_FINGERPRINT: int
SIGNATURE_BYTES: int
WIDE_SIGNATURE_BYTES: int
BINS: int
BANDS: int

def check_fingerprint(x: Any) -> int: ...
def as_fingerprints(hashes: Fingerprints) -> memoryview: ...
def num_differing_bits(a: int, b: int) -> int: ...
def num_differing_bits_many(hashes: Fingerprints, other: Union[int, Fingerprints]) -> "array[int]": ...
def shown(value: Any) -> str: ...
def narrow(signature: bytes) -> bytes: ...
def __getattr__(name: str) -> Any: ...  # the internal kernels
