"""The reduced-scale reproduction's corpus without --data: Multi30k's official .gz files are
downloaded into the cache and kept only when their checksums match; offline or on a wrong
checksum the command stops with one line naming the file, the URL and --data, and leaves
nothing half written. The "official source" here is a local folder (and a file:// URL) holding
the gzipped files of ../shared/data/multi30k, which are the official text."""

import gzip
import sys
from pathlib import Path

import pytest

from examples.reproduction import multi30k
from fairseq_entmax.pipeline.tools import PipelineError
from helpers import run

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
SCRIPT = (sys.executable, "-m", "examples.reproduction.reduced_scale")

pytestmark = pytest.mark.requires((MULTI30K / "train.de").exists(), f"needs Multi30k in {MULTI30K}")


@pytest.fixture
def official(tmp_path):
    """A folder laid out as the official data/task1/raw: <stem>.<lang>.gz."""
    folder = tmp_path / "official"
    folder.mkdir()
    for split, stem in multi30k.OFFICIAL_STEMS.items():
        for lang in multi30k.LANGUAGES:
            (folder / f"{stem}.{lang}.gz").write_bytes(gzip.compress((MULTI30K / f"{split}.{lang}").read_bytes()))
    return folder


@pytest.mark.parametrize("as_url", [False, True], ids=["folder", "file:// URL"])
def test_the_download_fills_the_cache_with_the_official_text(official, tmp_path, as_url):
    cache = tmp_path / "cache"
    source = official.as_uri() if as_url else str(official)
    assert multi30k.fetch_multi30k(cache, source) == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(multi30k.SHA256)
    for name in multi30k.SHA256:
        assert (cache / name).read_bytes() == (MULTI30K / name).read_bytes()
    # a second call reads the cache: the source is no longer needed
    assert multi30k.fetch_multi30k(cache, str(tmp_path / "gone")) == cache


def test_a_file_with_another_checksum_is_not_kept(official, tmp_path):
    (official / "val.en.gz").write_bytes(gzip.compress(b"a changed caption\n"))
    cache = tmp_path / "cache"
    checksum = r"valid\.en from .*/val\.en\.gz has sha256 .*, not the recorded .*--data DIR"
    with pytest.raises(PipelineError, match=checksum):
        multi30k.fetch_multi30k(cache, str(official))
    # the files before it are kept (checked); the failed one and its partial copy are not
    assert sorted(p.name for p in cache.iterdir()) == ["train.de", "train.en", "valid.de"]


@pytest.mark.parametrize("broken", ["missing", "not gzip"])
def test_offline_or_broken_download_stops_in_one_line(official, tmp_path, broken):
    """Through the real command: exit 2, one line with the file, the URL and --data; no
    traceback, nothing half written in the cache, no work dir."""
    if broken == "missing":
        (official / "train.de.gz").unlink()
    else:
        (official / "train.de.gz").write_bytes(b"<html>rate limited</html>")
    cache, work = tmp_path / "cache", tmp_path / "work"
    proc = run(
        [*SCRIPT, "--cache-dir", cache, "--download-from", official, "--work-dir", work],
        check=False,
        timeout=120,
        cwd=REPO,
    )
    errors = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert "train.de" in errors[0] and (official / "train.de.gz").as_uri() in errors[0] and "--data DIR" in errors[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert list(cache.iterdir()) == [] and not work.exists()
