#!/usr/bin/env bash
# The GPU check's install on the GPU machine, which has no network: wheels downloaded here,
# carried there, installed there offline.
#
#   bash benchmarks/gpu_install.sh download         # here (make gpu-wheels): into .whl/
#   bash benchmarks/gpu_install.sh download --all   # also fairseq's runtime needs the GPU image has
#   bash benchmarks/gpu_install.sh install          # there, offline, from .whl/
#
# The GPU machine (nvidia-h200) has Python 3.12, torch 2.11 (CUDA 13), Triton, torchaudio,
# numpy, cython, regex, sacrebleu, tqdm, scikit-learn, PyYAML, pytest and matplotlib. It lacks
# what `download` fetches for CPython 3.12 on manylinux x86_64: hydra-core 1.3.2, omegaconf
# 2.3.0 and antlr4-python3-runtime 4.9.3 (published as an sdist only: its pure-Python wheel is
# built here), bitarray, cffi and pycparser, the entmax package (the benchmark's reference),
# setuptools (to install this package), and fairseq-fixed 0.12.3.1 twice: its cp312 wheel and
# its sdist (built there only if the wheel does not import), and transformers 5.24.0 with what
# it needs (the huggingface step; pure Python but tokenizers and safetensors). The versions are those
# `make setup PYTHON=python3.12` installs. `download --all` adds fairseq's runtime needs that
# the image already holds (numpy, cython, regex, sacrebleu, tqdm, scikit-learn and their
# dependencies), for a machine without them.
#
# `install` installs into the Python that runs the check (PYTHON, default python3) with
# `pip install --no-index --find-links .whl`, so that pip takes nothing from an index and keeps
# what the machine has where it suffices; then it checks that fairseq and fairseq_entmax import
# and that fairseq-train runs.
#
# The whole check: `make gpu-wheels gpu-data` here, .whl/ and .gpu-data/ copied into the GPU
# machine's checkout, then from its root (the check's own budget, 520 s, leaves the install a
# minute of a 10-minute slot):
#   bash benchmarks/gpu_install.sh install; make gpu-check PY=python3 GPU_CHECK_ARGS="--data .gpu-data --out OUT"
# OUT then holds gpu-check.md, gpu-check.json and the steps' logs and JSON (work/). The
# check runs even when the install failed: its environment step says what does not import.
# `--steps NAME ...` in GPU_CHECK_ARGS runs only those steps.
set -euo pipefail

cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-python3}
FAIRSEQ=fairseq-fixed==0.12.3.1
TRANSFORMERS=transformers==5.24.0
# Not on the GPU image (as its package list read): fetched for it.
MISSING=(hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 cffi==2.1.1 pycparser==3.12 entmax==1.3 setuptools==84.2.1)
# fairseq's runtime needs (the Makefile's FAIRSEQ_RUNTIME) and the check's that the image holds.
ON_IMAGE=(numpy cython regex sacrebleu tqdm scikit-learn pyyaml packaging pytest)
# Every manylinux tag a CPython 3.12 x86_64 wheel may carry: pip matches each tag exactly.
PLATFORMS=()
for tag in manylinux1 manylinux2010 manylinux2014; do PLATFORMS+=(--platform "${tag}_x86_64"); done
for minor in $(seq 5 39); do PLATFORMS+=(--platform "manylinux_2_${minor}_x86_64"); done
TARGET=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}")

download() {
    local all=${1:-}
    mkdir -p "$WHEELS"
    # A Python with torch, cython and numpy (the sdist's metadata imports them): DOWNLOAD_PYTHON,
    # else the project's .venv.
    local python=${DOWNLOAD_PYTHON:-.venv/bin/python}
    [ -x "$python" ] || python=python3
    local pip=("$python" -m pip)
    # antlr4-python3-runtime 4.9.3 (omegaconf's pin) has no wheel on PyPI: build its pure-Python one.
    "${pip[@]}" wheel --quiet --no-deps --wheel-dir "$WHEELS" antlr4-python3-runtime==4.9.3
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: "${TARGET[@]}" -d "$WHEELS" "${MISSING[@]}" "$FAIRSEQ"
    # transformers with its dependencies resolved for the GPU's Python, less those the image
    # holds (numpy alone is 15 MB of the carried folder).
    local resolved_dir wheel name
    resolved_dir=$(mktemp -d)
    "${pip[@]}" download --quiet --only-binary=:all: "${TARGET[@]}" -d "$resolved_dir" "$TRANSFORMERS"
    for wheel in "$resolved_dir"/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
        [[ " ${ON_IMAGE[*]} " == *" $name "* && $all != --all ]] || mv "$wheel" "$WHEELS"/
    done
    rm -rf "$resolved_dir"
    # The sdist, for a build there if the wheel fails: torch, cython and numpy make its
    # metadata, so it is fetched without building anything.
    "${pip[@]}" download --quiet --no-deps --no-binary=:all: --no-build-isolation -d "$WHEELS" "$FAIRSEQ"
    if [ "$all" = "--all" ]; then
        # With their dependencies, resolved for the GPU's Python (antlr4 from the wheel above);
        # not entmax's, which is torch (there already).
        local requirement resolved=()
        for requirement in "${MISSING[@]}"; do
            [[ $requirement == entmax* ]] || resolved+=("$requirement")
        done
        "${pip[@]}" download --quiet --only-binary=:all: "${TARGET[@]}" --find-links "$WHEELS" -d "$WHEELS" \
            "${ON_IMAGE[@]}" "${resolved[@]}" antlr4-python3-runtime==4.9.3
    fi
    ls -l "$WHEELS"
    du -sh "$WHEELS"
}

install() {
    local pip=("$PYTHON" -m pip install --no-index --find-links "$WHEELS" --disable-pip-version-check)
    # fairseq-fixed's own metadata requires torchaudio (which would pull another torch) and
    # scikit-learn: installed with --no-deps, its real runtime needs named here, the image's
    # versions kept where they satisfy them.
    "${pip[@]}" hydra-core==1.3.2 omegaconf==2.3.0 bitarray cffi regex sacrebleu tqdm numpy cython scikit-learn \
        entmax==1.3 pytest
    if [ "${FAIRSEQ_FROM:-wheel}" = wheel ] && "${pip[@]}" --no-deps "$FAIRSEQ" && "$PYTHON" -c "import fairseq"; then
        echo "fairseq: from its cp312 wheel"
    else
        # The wheel failed (or FAIRSEQ_FROM=sdist): build the sdist against the image's torch,
        # without CUDA_HOME, which would add CUDA extensions (minutes of nvcc) that translation
        # does not use.
        "$PYTHON" -m pip uninstall --yes fairseq-fixed 2>/dev/null || true
        env -u CUDA_HOME "${pip[@]}" --no-deps --no-build-isolation "$WHEELS"/fairseq_fixed-0.12.3.1.tar.gz
        echo "fairseq: built from its sdist"
    fi
    # For the huggingface step only: without it the other steps still run.
    "${pip[@]}" "$TRANSFORMERS" || echo "transformers: not installed; the huggingface step will fail"
    # This package, editable; its build backend (setuptools >= 77) comes from the wheels.
    "${pip[@]}" --no-deps -e .
    (cd / && "$PYTHON" -c "import fairseq, fairseq_entmax, torch; print('fairseq', fairseq.__version__, \
'fairseq_entmax', fairseq_entmax.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())")
    # Where benchmarks/training.py looks for it: beside the Python that runs the check.
    "$("$PYTHON" -c 'import pathlib, sys; print(pathlib.Path(sys.executable).parent)')"/fairseq-train --help >/dev/null
    echo "fairseq-train --help: ok"
}

case "${1:-}" in
    download) download "${2:-}" ;;
    install) install ;;
    *)
        echo "usage: $0 download [--all] | install" >&2
        exit 2
        ;;
esac
