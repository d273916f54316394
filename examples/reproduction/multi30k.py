"""Multi30k task 1 (Elliott et al., 2016; German-English image captions, raw and cased), the
reduced-scale reproduction's corpus: downloaded from its official repository
(github.com/multi30k/dataset, data/task1/raw/*.gz) into a cache, each file checked against the
sha256 recorded here before it is kept.

The checksums are of the gunzipped files (train, val, test_2016_flickr), so a recompressed copy
on a mirror passes as long as its text is the official one.
"""

from pathlib import Path

from fairseq_entmax.pipeline.download import download

OFFICIAL_SOURCE = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
DEFAULT_CACHE = Path.home() / ".cache" / "fairseq-entmax" / "multi30k"
LANGUAGES = ("de", "en")
# The split names of the pipeline -> the official file stems.
OFFICIAL_STEMS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SHA256 = {
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "valid.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "valid.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "test.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
}


def _url(source, name):
    """The URL of one official file under `source`, a URL or a local folder."""
    if "://" in source:
        return f"{source.rstrip('/')}/{name}"
    return (Path(source) / name).resolve().as_uri()


def fetch_multi30k(cache_dir=DEFAULT_CACHE, source=OFFICIAL_SOURCE):
    """The folder of Multi30k's train/valid/test.{de,en}, downloading the files not cached yet, each kept only
    once its checksum matches (pipeline.download).

    Args: cache_dir: the cache folder (created if needed); source: where the official `<stem>.<lang>.gz` files
    are: a URL (https://, file://) or a local folder.
    Returns: cache_dir, a Path.
    Raises PipelineError: a file cannot be downloaded (offline, not found, not gzip) or its checksum differs;
    the message names the file, the URL and `--data DIR`.
    """
    instead = "give a folder with train/valid/test.{de,en} as --data DIR instead"
    for split, stem in OFFICIAL_STEMS.items():
        for lang in LANGUAGES:
            name = f"{split}.{lang}"
            download(_url(source, f"{stem}.{lang}.gz"), Path(cache_dir) / name, instead, SHA256[name], gunzip=True)
    return Path(cache_dir)
