"""Installation: the wheel that carries the LMDB C library, the warnings of a
build and of a process without the native backend, install instructions that
work from a checkout, and a `make run` that installs only what it runs."""

import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
import zipfile

import pytest

import simhashdb
from simhashdb import cli
from simhashdb.storage import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI = bool(os.environ.get("CI"))


def lmdb_installed():
    try:
        return subprocess.run(["pkg-config", "--exists", "lmdb"]).returncode == 0
    except OSError:
        return False


def make_commands(target):
    """What `make TARGET` would run on a fresh checkout (nothing is run)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target], capture_output=True,
                          text=True, check=True).stdout


def test_make_run_installs_the_package_alone():
    run, test = make_commands("run"), make_commands("test")
    for needed in ("liblmdb-dev", "pip install --quiet -e .", "stdlib_demo.py"):
        assert needed in run
    for other in ("java", "redis-server", "'simhashdb[test]'"):  # the extra brings pyspark
        assert other not in run and other in test
