"""The four translation tasks of Correia et al. (2019), Table 1, as recipe configurations.

Each task says where its official data is, how to turn it into line-aligned plain text
(train/valid/test.{src,tgt}), the training settings of the paper, and which real text in
../shared/data its smoke mode runs on.
"""
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from entmax_recipes.pipeline import PipelineError, TrainSettings, log  # noqa: E402

# The paper: Transformer base (6+6 layers, d=512, 8 heads), batches of 8192 tokens, linear
# warm-up then inverse square root decay. fairseq's usual Adam settings for that model.
PAPER_ARCH = "adaptively_sparse_transformer"   # fairseq's `transformer` (base) sizes
PAPER_MAX_TOKENS = 8192


@dataclass
class SmokeData:
    """Real text from ../shared/data for the smoke mode: split -> (file stem relative to the
    shared data folder, first line, end line); the files are f"{stem}.{lang}"."""
    splits: dict
    note: str


@dataclass
class Task:
    name: str
    title: str
    pairs: tuple                 # supported (src, tgt); the first is the paper's direction
    downloads: list              # (url, file name) of the official data
    prepare: object              # function(downloads_dir, out_dir, src, tgt) -> writes plain text
    train: TrainSettings
    smoke: SmokeData
    paper_bleu: dict             # the paper's tokenized BLEU (Table 1), paper direction only
    bpe_merges: int = 32000
    clean_max_len: int = 250
    clean_max_ratio: float = 1.5     # None: no length-ratio rule
    beam: int = 5
    lenpen: float = 1.0
    data_notes: str = ""


# --------------------------------------------------------------------------- downloading

def download(url, dest):
    """Fetch url into dest (skipped when dest exists: put files there by hand when offline)."""
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading {url}")
    partial = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done, next_report = 0, 0
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if done >= next_report:
                    log(f"  {done >> 20} MiB" + (f" of {total >> 20} MiB" if total else ""))
                    next_report = done + (50 << 20)
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise PipelineError(
            f"could not download {url} ({error}). Offline? Copy that file to {dest} yourself, or give "
            "--raw-dir DIR with plain text train/valid/test.{src,tgt}."
        ) from None
    partial.rename(dest)
    return dest


def _member_lines(archive, tail):
    """Lines of the one file inside a .tgz/.tar.gz/.zip archive whose path ends with `tail`
    (a file name, or the folders above it too where the archive holds several files of that
    name, as KFTT's data/orig and data/tok do)."""
    archive = Path(archive)

    def matching(names):
        found = [n for n in names if n == tail or n.endswith("/" + tail)]
        if not found:
            raise PipelineError(f"{archive} has no file {tail}: is the download complete? Delete it and rerun.")
        if len(found) > 1:
            raise PipelineError(f"{archive} has several files ending in {tail} ({', '.join(found)}): "
                                "the recipe cannot tell which to read")
        return found[0]

    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            data = z.read(matching(z.namelist()))
    else:
        with tarfile.open(archive) as tar:
            data = tar.extractfile(matching(tar.getnames())).read()
    # Split on "\n" only: some corpora hold \r or Unicode line separators inside sentences.
    text = data.decode("utf-8", errors="replace")
    return [line.replace("\r", " ") for line in text.split("\n")[:-1 if text.endswith("\n") else None]]


def _write(out_dir, split, lang, lines):
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(out_dir) / f"{split}.{lang}", "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line.strip() + "\n")


def _sacrebleu_set(test_set, src, tgt, out_dir, split):
    """A dev/test set through sacrebleu, which downloads the official WMT/IWSLT files."""
    from sacrebleu.utils import get_reference_files, get_source_file

    pair = f"{src}-{tgt}"
    try:
        source = get_source_file(test_set, pair)
        reference = get_reference_files(test_set, pair)[0]
    except (Exception, SystemExit) as error:  # sacrebleu raises, or calls sys.exit, on network or checksum errors
        raise PipelineError(f"could not get {test_set} {pair} through sacrebleu ({error}). Offline? "
                            "Give --raw-dir DIR with plain text train/valid/test.{src,tgt}.") from None
    shutil.copyfile(source, Path(out_dir) / f"{split}.{src}")
    shutil.copyfile(reference, Path(out_dir) / f"{split}.{tgt}")


# --------------------------------------------------------------------------- the four tasks

def iwslt_training_lines(archive, lang):
    """The sentences of WIT3's train.tags file: it interleaves talk metadata lines (<url>,
    <talkid>, <title>, ...) with them; both sides have the same metadata lines, so dropping
    them keeps the alignment."""
    return [l for l in _member_lines(archive, f"train.tags.de-en.{lang}") if not l.lstrip().startswith("<")]


def prepare_iwslt17(downloads, out_dir, src, tgt):
    for lang in ("de", "en"):
        _write(out_dir, "train", lang, iwslt_training_lines(downloads / "de-en.tgz", lang))
    _sacrebleu_set("iwslt17/dev2010", src, tgt, out_dir, "valid")
    _sacrebleu_set("iwslt17/tst2015", src, tgt, out_dir, "test")


def prepare_kftt(downloads, out_dir, src, tgt):
    archive = downloads / "kftt-data-1.0.tar.gz"
    for split, name in (("train", "train"), ("valid", "dev"), ("test", "test")):
        for lang in ("ja", "en"):
            # data/tok holds tokenized files of the same names: the recipe tokenizes itself.
            _write(out_dir, split, lang, _member_lines(archive, f"data/orig/kyoto-{name}.{lang}"))


def prepare_wmt16_ro_en(downloads, out_dir, src, tgt):
    for lang in ("ro", "en"):
        lines = _member_lines(downloads / "training-parallel-ep-v8.tgz", f"europarl-v8.ro-en.{lang}")
        lines += _member_lines(downloads / "en-ro.txt.zip", f"SETIMES.en-ro.{lang}")
        _write(out_dir, "train", lang, lines)
    _sacrebleu_set("wmt16/dev", src, tgt, out_dir, "valid")
    _sacrebleu_set("wmt16", src, tgt, out_dir, "test")


def prepare_wmt14_en_de(downloads, out_dir, src, tgt):
    for lang in ("en", "de"):
        with open(Path(out_dir) / f"train.{lang}", "w", encoding="utf-8") as out:
            for archive, name in (("training-parallel-europarl-v7.tgz", "europarl-v7.de-en"),
                                  ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
                                  ("training-parallel-nc-v9.tgz", "news-commentary-v9.de-en")):
                for line in _member_lines(downloads / archive, f"{name}.{lang}"):
                    out.write(line.strip() + "\n")
    _sacrebleu_set("wmt13", src, tgt, out_dir, "valid")
    _sacrebleu_set("wmt14/full", src, tgt, out_dir, "test")


def _settings(max_update, dropout, lr, save_interval_updates=0):
    return TrainSettings(arch=PAPER_ARCH, max_update=max_update, max_tokens=PAPER_MAX_TOKENS, lr=lr,
                         warmup_updates=4000, dropout=dropout, topk=8, keep_last_epochs=5,
                         save_interval_updates=save_interval_updates)


TASKS = {
    "iwslt17": Task(
        name="iwslt17", title="IWSLT17 de-en (TED talks)", pairs=(("de", "en"), ("en", "de")),
        downloads=[("https://raw.githubusercontent.com/hlt-mt/WIT3/master/archive/2017-01-trnted/texts/de/en/de-en.tgz",
                    "de-en.tgz")],
        prepare=prepare_iwslt17, train=_settings(max_update=40000, dropout=0.3, lr=5e-4),
        smoke=SmokeData({"train": ("iwslt16_de_en_sample/train", 0, 3000),
                         "valid": ("iwslt16_de_en_sample/valid", 0, 200),
                         "test": ("iwslt16_de_en_sample/test", 0, 200)},
                        "IWSLT16 TED sample: first 3000 training pairs, tst2013 (200) valid, tst2014 (200) test"),
        paper_bleu={"softmax": 29.79, "entmax15": 29.83, "alpha_entmax": 29.90},
        data_notes="train: WIT3 2017-01-trnted train.tags (metadata lines dropped); valid: dev2010; "
                   "test: tst2015 (the paper does not name its split; change prepare_iwslt17 to use another)",
    ),
    "kftt": Task(
        name="kftt", title="KFTT ja-en (Wikipedia, Kyoto)", pairs=(("ja", "en"), ("en", "ja")),
        downloads=[("http://www.phontron.com/kftt/download/kftt-data-1.0.tar.gz", "kftt-data-1.0.tar.gz")],
        prepare=prepare_kftt, train=_settings(max_update=50000, dropout=0.3, lr=5e-4),
        # Japanese is split into characters before BPE, so Japanese sides are much longer
        # than English ones: no length-ratio filter.
        clean_max_ratio=None,
        smoke=SmokeData({"train": ("kftt_dev_test/tune", 0, 1235),
                         "valid": ("kftt_dev_test/valid", 0, 200),
                         "test": ("kftt_dev_test/test", 0, 200)},
                        "KFTT tune (1235 pairs) as training data, dev (200) valid, test (200) test"),
        paper_bleu={"softmax": 21.57, "entmax15": 22.13, "alpha_entmax": 21.74},
        data_notes="KFTT 1.0 data/orig (untokenised) kyoto-train/dev/test; Japanese: characters + joint BPE",
    ),
    "wmt16": Task(
        name="wmt16", title="WMT16 ro-en (news)", pairs=(("ro", "en"), ("en", "ro")),
        downloads=[("https://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz",
                    "training-parallel-ep-v8.tgz"),
                   ("https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip", "en-ro.txt.zip")],
        prepare=prepare_wmt16_ro_en, train=_settings(max_update=60000, dropout=0.3, lr=7e-4),
        smoke=SmokeData({"train": ("wmt_testsets/newstest2016", 0, 1599),
                         "valid": ("wmt_testsets/newstest2016", 1599, 1799),
                         "test": ("wmt_testsets/newstest2016", 1799, 1999)},
                        "newstest2016 ro-en split in three: lines 1-1599 train, 1600-1799 valid, 1800-1999 test"),
        paper_bleu={"softmax": 32.70, "entmax15": 33.10, "alpha_entmax": 32.89},
        data_notes="train: Europarl v8 + SETimes2 (~600k pairs); valid: newsdev2016; test: newstest2016",
    ),
    "wmt14": Task(
        name="wmt14", title="WMT14 en-de (news)", pairs=(("en", "de"), ("de", "en")),
        downloads=[("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", "training-parallel-europarl-v7.tgz"),
                   ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", "training-parallel-commoncrawl.tgz"),
                   ("https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", "training-parallel-nc-v9.tgz")],
        prepare=prepare_wmt14_en_de,
        # Epochs of 4.5M pairs are long: checkpoint (and average) every 5000 updates.
        train=_settings(max_update=200000, dropout=0.1, lr=7e-4, save_interval_updates=5000),
        smoke=SmokeData({"train": ("wmt_testsets/newstest2013", 0, 3000),
                         "valid": ("wmt_testsets/newstest2014", 0, 200),
                         "test": ("wmt_testsets/newstest2014", 200, 400)},
                        "newstest2013 (3000 pairs) as training data, newstest2014 lines 1-200 valid, 201-400 test"),
        paper_bleu={"softmax": 26.02, "entmax15": 25.89, "alpha_entmax": 26.93},
        data_notes="train: Europarl v7 + CommonCrawl + News Commentary v9 (~4.5M pairs); valid: newstest2013; "
                   "test: newstest2014 (full)",
    ),
}

# Smoke mode: every stage at tiny scale (a few hundred updates, small BPE, tiny model).
SMOKE_BPE_MERGES = 1000
SMOKE_TRAIN = TrainSettings(
    arch=PAPER_ARCH, max_update=200, max_tokens=2048, lr=2e-3, warmup_updates=50, dropout=0.1, topk=8,
    keep_last_epochs=3, log_interval=50,
    model_args=["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
                "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128,
                "--encoder-attention-heads", 4, "--decoder-attention-heads", 4],
)


def write_smoke_data(task, shared_data, src, tgt, out_dir):
    """Copy the smoke mode's line ranges of the shared real text into out_dir."""
    for split, (stem, start, stop) in task.smoke.splits.items():
        for lang in (src, tgt):
            path = Path(shared_data) / f"{stem}.{lang}"
            if not path.is_file():
                raise PipelineError(f"smoke data {path} not found: the smoke mode reads ../shared/data "
                                    "(or --shared-data DIR)")
            with open(path, encoding="utf-8", newline="\n") as f:
                lines = f.read().split("\n")[start:stop]
            _write(out_dir, split, lang, lines)
