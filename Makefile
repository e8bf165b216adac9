VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test bench clean

$(VENV)/.installed: setup.py pyproject.toml ext/_ext.pyx
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(PY) examples/stdlib_demo.py

test: $(VENV)/.installed
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info simhashdb/*.so ext/*.c demo.db
