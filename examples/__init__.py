"""Examples built on fairseq_entmax: the quickstart, the paper's translation recipes and the
reduced-scale reproduction, with the pipeline of stages they share (fairseq_entmax.pipeline).

A package, so that the scripts and the tests import each other's modules by their full name.
Run a script as a module from the repository root, e.g.

    .venv/bin/python -m examples.quickstart.quickstart
"""
