"""Build the compressed-runs prototype of issue 22 (tools/runs_prototype/_runs.pyx,
RUNS.md) in place, as ``tools/runs_prototype/_runs*.so``, for run_study.py,
run_import.py and runs_prototype/checks.py. It shares the codec and the merge
(ext/_runs.pxi) with the native backend; the package does not ship it.

Usage: python tools/build_runs_prototype.py
Needs: Cython, the LMDB C library and pkg-config (as the native backend).
"""

import os
import subprocess

from Cython.Build import cythonize
from setuptools import Extension, setup

TOOLS = os.path.dirname(os.path.abspath(__file__))
PROTOTYPE = os.path.join(TOOLS, "runs_prototype")

if __name__ == "__main__":
    os.chdir(os.path.dirname(TOOLS))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "lmdb"], check=True,
                           capture_output=True, text=True).stdout.split()
    study = Extension("_runs", ["tools/runs_prototype/_runs.pyx"], include_dirs=["ext"],
                      extra_compile_args=["-O3"] + [f for f in flags if not f.startswith("-l")],
                      extra_link_args=[f for f in flags if f.startswith("-l")] or ["-llmdb"])
    setup(name="runs-prototype", script_args=["build_ext", "--build-lib", PROTOTYPE],
          ext_modules=cythonize([study], language_level=3, include_path=["ext"]))
