# All metadata, dependencies, extras and the console script are in pyproject.toml; this file
# stays for tools that still call `setup.py` directly.
from setuptools import setup

setup()
