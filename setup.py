from setuptools import find_packages, setup

setup(
    name="fairseq-entmax",
    version="0.1.0",
    description="Sparse attention (sparsemax, entmax, learned alpha-entmax, top-k) for fairseq",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["fairseq_entmax", "fairseq_entmax.*"]),
    # fairseq itself is not listed: the PyPI releases do not install on Python 3.11 and
    # fairseq-fixed's metadata pulls torchaudio. See the README (make setup) for how to
    # install it; importing the fairseq layer without it says the same.
    install_requires=["torch>=2.0", "numpy"],
    entry_points={
        "console_scripts": [
            "fairseq-entmax-analyze = fairseq_entmax.analysis.cli:main",
        ],
    },
    extras_require={
        "test": ["pytest", "hypothesis", "entmax==1.3"],
    },
)
