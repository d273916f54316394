# One entry point for set-up, the main job and the tests.
# `make setup` is idempotent: a second run on the same machine only checks a stamp file.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done

# fairseq-fixed's own requirements pull in torchaudio and scikit-learn, which translation
# does not use (torchaudio drags in another torch): install it with --no-deps and
# list what it really needs at run time here (scikit-learn: fairseq imports every task at
# start-up, audio_classification among them, which imports sklearn).
FAIRSEQ := fairseq-fixed==0.12.3.1
FAIRSEQ_RUNTIME := hydra-core==1.3.2 omegaconf==2.3.0 bitarray regex sacrebleu tqdm numpy cffi cython scikit-learn
# tensorboardX: fairseq's fallback writer for --tensorboard-logdir (torch.utils.tensorboard first).
TOOLS := tensorboardX
# This package's extras (pyproject.toml): dev = test (analysis, examples, huggingface, pytest, hypothesis,
# entmax) + ruff.
EXTRAS := dev
RUFF := $(VENV)/bin/ruff

.PHONY: setup demo test test-fast lint format bench bench-compare clean gpu-check gpu-data gpu-wheels

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install cython numpy setuptools wheel $(FAIRSEQ_RUNTIME) $(TOOLS)
	$(PY) -c "import fairseq" 2>/dev/null || $(PIP) install --no-build-isolation --no-deps $(FAIRSEQ)
	$(PIP) install -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: setup
	$(PY) -m examples.quickstart.quickstart

# One worker per core (pytest-xdist): most tests wait on fairseq commands run one at a time.
# --dist loadfile: a file's tests stay on one worker, which runs its module fixtures (a recipe,
# quickstart or training run of up to minutes) once.
test: setup
	$(PY) -m pytest tests -q -n auto --dist loadfile --no-loadscope-reorder

# The inner loop: every test not marked slow (the slow ones train through fairseq-train or
# run a recipe; each test file says which): about a minute of CPU time.
test-fast: setup
	$(PY) -m pytest tests -q -m "not slow" -n auto

# ruff's linter and formatter, configured in pyproject.toml; `lint` changes nothing.
lint: setup
	$(RUFF) check .
	$(RUFF) format --check .

format: setup
	$(RUFF) check --fix-only .
	$(RUFF) format .

bench: setup
	$(PY) -m benchmarks.maps normalizers --rounds 5 --threads 1

# The normalizer benchmark of the working tree against the commit REF, in fresh processes that
# alternate between the two (python -m benchmarks.maps against): run it before a change to a
# normalizer lands. BENCH_COMPARE_ARGS adds options, e.g. --threads 1 --clock cpu on a busy machine.
bench-compare: setup
	@test -n "$(REF)" || { echo "usage: make bench-compare REF=<commit> [BENCH_COMPARE_ARGS=...]"; exit 2; }
	$(PY) -m benchmarks.maps against $(REF) --max-ratio 1.10 $(BENCH_COMPARE_ARGS)

# The GPU check (python -m benchmarks.gpu_check): on a CUDA machine, the GPU-only tests and every
# GPU benchmark in one report; without a CUDA device it stops at once, exit status 2. Not
# through `setup`: on the GPU machine, which has no network, benchmarks/gpu_install.sh makes
# the .venv from carried wheels. PY=python3 runs it with another Python.
GPU_CHECK_ARGS ?= --data .gpu-data --out gpu-check-out
gpu-check:
	@command -v $(PY) >/dev/null || { echo "$(PY) not found: run make setup (or, offline, bash benchmarks/gpu_install.sh install)"; exit 2; }
	$(PY) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# Real text for the GPU check: the first lines of a shared corpus, with its SOURCE.txt (origin
# and licence), copied into .gpu-data/, which git ignores (data is never committed) and which
# a GPU run carries.
GPU_DATA_SOURCE ?= ../shared/data/iwslt16_de_en_sample
GPU_DATA_LINES ?= 4000
gpu-data:
	mkdir -p .gpu-data
	head -n $(GPU_DATA_LINES) $(GPU_DATA_SOURCE)/train.de > .gpu-data/train.de
	head -n $(GPU_DATA_LINES) $(GPU_DATA_SOURCE)/train.en > .gpu-data/train.en
	cp $(GPU_DATA_SOURCE)/SOURCE.txt .gpu-data/

# The wheels (and fairseq-fixed's sdist) that the GPU machine lacks, for an offline install
# there (benchmarks/gpu_install.sh says how), into .whl/, which git ignores.
gpu-wheels:
	bash benchmarks/gpu_install.sh download

clean:
	rm -rf $(VENV) build dist *.egg-info
