"""Load the peer libraries the benchmarks compare against.

PyPI ``simhash`` (1e0ng) and ``simhash-pybind`` both install a top-level
``simhash`` package, so each peer is installed into its own folder under
``.peers/`` (``pip install --target``) and loaded from there under its own name.
"""

import importlib
import pathlib
import subprocess
import sys

PEERS_DIR = pathlib.Path(__file__).resolve().parent.parent / ".peers"
PEERS = {
    # simhash 2.1.2 overflows a uint8 under numpy 2 on repeated features
    "simhash_1e0ng": ["simhash==2.1.2", "numpy<2"],
    "simhash_pybind": ["simhash-pybind==0.0.3"],
}


def load(name):
    """Import peer ``name`` (a key of PEERS) from its own folder, installing it
    there on first use; None where it cannot be had."""
    target = PEERS_DIR / name
    if not target.exists():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
             *PEERS[name]], capture_output=True, text=True)
        if result.returncode != 0:
            print("peer %s unavailable: %s" % (name, result.stderr.strip()[-200:]))
            return None
    saved_path, saved_module = list(sys.path), sys.modules.pop("simhash", None)
    sys.path.insert(0, str(target))
    try:
        module = importlib.import_module("simhash")
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("simhash", None)
        if saved_module is not None:
            sys.modules["simhash"] = saved_module
    if name == "simhash_1e0ng":
        _widen_weighted_bits(module)
    return module


def _widen_weighted_bits(module):
    """simhash 2.1.2 multiplies a uint8 bit array by a feature's weight; where
    numpy 2 was imported first (its folder's numpy<2 is then not the one in
    use), a weight above 255 overflows instead of widening as numpy 1 did.
    Widen the bits first: the same fingerprints as under numpy 1."""
    cls = module.Simhash
    raw = cls.__dict__["_bitarray_from_bytes"]
    if getattr(raw, "widened", False):
        return
    if isinstance(raw, staticmethod):
        function = raw.__func__

        def widened(b):
            return function(b).astype("int64")
        replacement = staticmethod(widened)
    else:
        def widened(self, b):
            return raw(self, b).astype("int64")
        replacement = widened
    widened.widened = replacement.widened = True
    cls._bitarray_from_bytes = replacement
