"""Files of another commit of this repository, for benchmarks that compare it with the working
tree."""

import subprocess
import tarfile
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def git(*args):
    """The stripped standard output of a git command in this repository.

    Raises SystemExit: git failed; its message is printed as one line.
    """
    done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise SystemExit(f"error: git {' '.join(args)}: {lines[-1] if lines else 'no message'}")
    return done.stdout.strip()


def commit_of(ref):
    """The full hash of the commit REF names.

    Raises SystemExit: REF names no commit of this repository.
    """
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=REPOSITORY, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"error: {ref!r} is not a commit of this repository (see git log)")
    return done.stdout.strip()


def export(ref, path, into):
    """Write the files under `path` at commit REF into the folder `into`, at their paths.

    Args: ref: a commit, tag or branch of this repository; path: a folder of the repository, e.g.
    "fairseq_entmax"; into: an existing folder.
    Returns: REF's full commit hash.
    Raises SystemExit: REF names no commit, or holds no `path`.
    """
    commit = commit_of(ref)
    with tempfile.TemporaryDirectory(prefix="export-") as scratch:
        archive = Path(scratch) / "files.tar"
        git("archive", "--output", str(archive), commit, path)
        with tarfile.open(archive) as files:
            files.extractall(into, filter="data")
    return commit
