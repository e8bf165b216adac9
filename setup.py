from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    name="simhashdb",
    version="0.1.0",
    description="Persistent near-duplicate fingerprint database (simhash) on LMDB",
    packages=["simhashdb"],
    python_requires=">=3.9",
    install_requires=["lmdb>=1.4", "msgpack>=1.0", "bitarray>=2.8", "tqdm>=4.60"],
    entry_points={"console_scripts": ["simhashdb-cli=simhashdb.cli:main_exit"]},
    extras_require={
        "test": [
            "pytest>=7",
            "hypothesis>=6",
            "numpy",
            # the reference libraries, so the tests compare outputs bit for bit
            "samecode==0.5.1",
            "simhash-pybind==0.0.3",
        ],
    },
    ext_modules=cythonize(
        [Extension("simhashdb._ext", ["ext/_ext.pyx"], extra_compile_args=["-O3"])],
        language_level=3,
    ),
)
