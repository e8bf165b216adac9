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
    return module
