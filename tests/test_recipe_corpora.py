"""The data preparation of the paper recipes (examples/translation/corpora.py), fully offline:
small fake archives with the member layout and file names of the official downloads, and
sacreBLEU's dev/test sets replaced by small files, so each task's prepare function runs as it
would on the real data; the outputs are checked for what training and scoring rely on (line
alignment, the right member read, metadata dropped, Romanian normalised as in the WMT16 ro-en
systems, IWSLT14 processed as fairseq's prepare-iwslt14.sh)."""

import io
import re
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from examples.translation import corpora
from fairseq_entmax.pipeline.corpus import check_parallel_corpus, read_lines
from fairseq_entmax.pipeline.download import download
from fairseq_entmax.pipeline.tokenization import scoring_tokenize
from fairseq_entmax.pipeline.tools import PipelineError

REPO = Path(__file__).resolve().parents[1]

# Romanian letters with diacritics in both the cedilla (legacy) and comma-below forms.
ROMANIAN_DIACRITICS = "ŞşŢţȘșȚțĂăÂâÎî"


def _tar_gz(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _zip(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text.encode("utf-8"))


def _text(lines):
    return "".join(line + "\n" for line in lines)


def _counts(out, src, tgt, splits=("train", "valid", "test")):
    return check_parallel_corpus({s: (out / f"{s}.{src}", out / f"{s}.{tgt}") for s in splits})


class FakeSacrebleu:
    """Stands in for corpora._sacrebleu_set: writes test_set's source and reference from `sets`
    (test_set -> {lang: lines}) to out_dir/{split}.{src,tgt}, as sacreBLEU's files would be
    copied, and records what was asked for."""

    def __init__(self, sets):
        self.sets, self.calls = sets, []

    def __call__(self, test_set, src, tgt, out_dir, split):
        self.calls.append((test_set, split))
        for lang in (src, tgt):
            (Path(out_dir) / f"{split}.{lang}").write_text(_text(self.sets[test_set][lang]), encoding="utf-8")


# --------------------------------------------------------------------------- KFTT


def _kftt_archive(downloads, test_orig_ja=None):
    """kftt-data-1.0.tar.gz with the official members; every file's text says which file it is."""
    files = {}
    # data/tok first: the recipe must pick members by their folder, wherever they are.
    tok = {
        "train.cln": (
            ["日本 の 水墨 画 を 一変 さ せ た 。", "京都 に 生まれ る 。"],
            ["He revolutionized the Japanese ink painting .", "He was born in Kyoto ."],
        ),
        "train": (
            ["日本 の 水墨 画 を 一変 さ せ た 。", "京都 に 生まれ る 。", "長い 長い 未 清掃 の 文 。"],
            ["He revolutionized the Japanese ink painting .", "He was born in Kyoto .", "A long uncleaned sentence ."],
        ),
        "dev": (["開発 の 文 。"], ["A dev sentence ."]),
        "test": (["試験 の 文 一 。", "「 試験 」 の 文 二 。"], ["Test sentence one .", '" Test " sentence two .']),
        "tune": (["調整 の 文 。"], ["A tune sentence ."]),
    }
    orig = {
        "train": (
            ["日本の水墨画を一変させた。", "京都に生まれる。", "長い長い未清掃の文。"],
            ["He revolutionized the Japanese ink painting.", "He was born in Kyoto.", "A long uncleaned sentence."],
        ),
        "dev": (["開発の文。"], ["A dev sentence."]),
        "test": (test_orig_ja or ["試験の文一。", "「試験」の文二。"], ["Test sentence one.", '"Test" sentence two.']),
        "tune": (["調整の文。"], ["A tune sentence."]),
    }
    for folder, sets in (("tok", tok), ("orig", orig)):
        for name, (ja, en) in sets.items():
            files[f"kftt-data-1.0/data/{folder}/kyoto-{name}.ja"] = _text(ja)
            files[f"kftt-data-1.0/data/{folder}/kyoto-{name}.en"] = _text(en)
    files["kftt-data-1.0/README.txt"] = "The Kyoto Free Translation Task\n"
    _tar_gz(downloads / "kftt-data-1.0.tar.gz", files)
    return tok, orig


def test_kftt_reads_the_cleaned_tokenised_training_set_and_untokenised_test_references(tmp_path):
    downloads, out = tmp_path / "downloads", tmp_path / "raw"
    downloads.mkdir()
    tok, orig = _kftt_archive(downloads)
    corpora.prepare_kftt(downloads, out, "ja", "en")

    # train is data/tok/kyoto-train.cln (2 pairs), not data/tok/kyoto-train (3) nor data/orig.
    for i, lang in enumerate(("ja", "en")):
        assert read_lines(out / f"train.{lang}") == tok["train.cln"][i]
        assert read_lines(out / f"valid.{lang}") == tok["dev"][i]
        assert read_lines(out / f"test.{lang}") == tok["test"][i]
        # The references sacreBLEU scores against: data/orig, untokenised, aligned with test.
        assert read_lines(out / f"test.orig.{lang}") == orig["test"][i]
    assert _counts(out, "ja", "en") == {"train": 2, "valid": 1, "test": 2}
    assert _counts(out, "ja", "en", splits=("test.orig",)) == {"test.orig": 2}
    assert "kftt" in corpora.PRETOKENIZED_TASKS


def test_kftt_refuses_untokenised_references_that_do_not_match_the_test_set(tmp_path):
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    _kftt_archive(downloads, test_orig_ja=["試験の文一。"])
    with pytest.raises(PipelineError, match="kyoto-test.ja has 1 lines"):
        corpora.prepare_kftt(downloads, tmp_path / "raw", "ja", "en")


# --------------------------------------------------------------------------- IWSLT17


def _iwslt_xml(setid, lang, talks):
    body = "".join(
        f'<doc docid="{talk}" genre="lectures">\n<url>http://www.ted.com/talks/{talk}</url>\n'
        f"<talkid>{talk}</talkid>\n<title>Talk {talk}</title>\n"
        + "".join(f'<seg id="{i}"> {seg} </seg>\n' for i, seg in enumerate(segs, 1))
        + "</doc>\n"
        for talk, segs in talks
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="{setid}" srclang="{lang}">\n'
        f"{body}</srcset>\n</mteval>\n"
    )


def _segs(xml):
    return [s.strip() for s in re.findall(r"<seg id=\"\d+\">(.*?)</seg>", xml)]


@pytest.mark.parametrize("src,tgt", [("de", "en"), ("en", "de")])
def test_iwslt17_training_text_without_talk_metadata_and_dev_test_sets(tmp_path, monkeypatch, src, tgt):
    downloads, out = tmp_path / "downloads", tmp_path / "raw"
    downloads.mkdir()
    metadata = [
        "<url>http://www.ted.com/talks/1</url>",
        "<keywords>talks, science</keywords>",
        "<speaker>Jane Doe</speaker>",
        "<talkid>1</talkid>",
        "<title>A talk</title>",
        "<description>TED Talk Subtitles and Transcript: a talk</description>",
    ]
    train = {
        "de": ["Hallo Welt.", "Das ist <b>fett</b> nicht.", "Zwei."],
        "en": ["Hello world.", "That is not <b>bold</b>.", "Two."],
    }
    files = {}
    for lang in ("de", "en"):
        lines = metadata[:3] + train[lang][:1] + metadata[3:] + train[lang][1:]
        files[f"de-en/train.tags.de-en.{lang}"] = _text(lines)
    xml = {}
    for split in ("dev2010", "tst2015"):
        for lang in ("de", "en"):
            name = f"de-en/IWSLT17.TED.{split}.de-en.{lang}.xml"
            xml[(split, lang)] = files[name] = _iwslt_xml(
                f"iwslt2017-{split}",
                lang,
                [(7, [f"{split} {lang} eins", f"{split} {lang} zwei"]), (8, [f"{split} {lang} drei"])],
            )
    _tar_gz(downloads / "de-en.tgz", files)
    # sacreBLEU would take the <seg> lines of these xml files.
    fake = FakeSacrebleu(
        {
            f"iwslt17/{split}": {lang: _segs(xml[(split, lang)]) for lang in ("de", "en")}
            for split in ("dev2010", "tst2015")
        }
    )
    monkeypatch.setattr(corpora, "_sacrebleu_set", fake)

    corpora.prepare_iwslt17(downloads, out, src, tgt)
    for lang in ("de", "en"):
        assert read_lines(out / f"train.{lang}") == train[lang]
        assert read_lines(out / f"valid.{lang}") == _segs(xml[("dev2010", lang)])
        assert read_lines(out / f"test.{lang}") == _segs(xml[("tst2015", lang)])
    assert sorted(fake.calls) == [("iwslt17/dev2010", "valid"), ("iwslt17/tst2015", "test")]
    assert _counts(out, src, tgt) == {"train": 3, "valid": 3, "test": 3}


# --------------------------------------------------------------------------- IWSLT14


def _iwslt14_archive(downloads):
    """de-en.tgz with prepare-iwslt14.sh's members: train.tags with talk metadata, and the
    five dev/test sets plus one it does not read; each test sentence names its set."""
    metadata = {
        "start": ["<url>http://www.ted.com/talks/1</url>", "<keywords>talks</keywords>", "<talkid>1</talkid>"],
        "title": {"de": "<title>Ein Vortrag</title>", "en": "<title>A talk</title>"},
        "description": {"de": "<description>Über Dinge</description>", "en": "<description>On things</description>"},
    }
    pairs = [(f"Satz Nummer {i}, „schön“!", f'Sentence number {i}, "nice"!') for i in range(1, 51)]
    pairs[9] = ("Kurz.", "This English side is far too long for its German side.")  # ratio > 1.5
    pairs[19] = (" ".join(["Wort"] * 176), " ".join(["word"] * 176))  # > 175 tokens
    files = {}
    for side, lang in enumerate(("de", "en")):
        lines = metadata["start"] + [metadata["title"][lang], metadata["description"][lang]]
        lines += [pair[side] for pair in pairs]
        files[f"de-en/train.tags.de-en.{lang}"] = _text(lines)
    sets = {}
    for name in (*corpora.IWSLT14_TEST_SETS, "IWSLT14.TEDX.dev2014"):
        for lang in ("de", "en"):
            segs = [f"{name} {lang} Eins’s", f"{name} {lang} zwei"]
            sets[(name, lang)] = segs
            files[f"de-en/{name}.de-en.{lang}.xml"] = _iwslt_xml(name, lang, [(3, segs)])
    _tar_gz(downloads / "de-en.tgz", files)
    return pairs, sets


@pytest.mark.parametrize("src,tgt", [("de", "en"), ("en", "de")])
def test_iwslt14_is_prepared_as_prepare_iwslt14_sh(tmp_path, src, tgt):
    downloads, out = tmp_path / "downloads", tmp_path / "raw"
    downloads.mkdir()
    pairs, sets = _iwslt14_archive(downloads)
    corpora.prepare_iwslt14(downloads, out, src, tgt)

    # Training text: metadata lines dropped, title and description kept as sentences, the pairs of
    # length ratio > 1.5 or > 175 tokens dropped, Moses-tokenised without escaping, lowercased.
    kept = [("ein vortrag", "a talk"), ("über dinge", "on things")]
    kept += [
        (f"satz nummer {i} , „ schön “ !", f'sentence number {i} , " nice " !')
        for i in range(1, 51)
        if i not in (10, 20)
    ]
    # Every 23rd cleaned pair is a validation pair, the others are training pairs.
    for side, lang in enumerate(("de", "en")):
        assert read_lines(out / f"valid.{lang}") == [kept[22][side], kept[45][side]]
        assert read_lines(out / f"train.{lang}") == [p[side] for i, p in enumerate(kept, 1) if i not in (23, 46)]
        # Test: the five sets in prepare-iwslt14.sh's order, ’ made ', tokenised and lowercased; the
        # raw sentences beside them for sacreBLEU.
        raw = [seg for name in corpora.IWSLT14_TEST_SETS for seg in sets[(name, lang)]]
        assert read_lines(out / f"test.orig.{lang}") == raw
        test = read_lines(out / f"test.{lang}")
        assert test == [line.lower() for line in scoring_tokenize([seg.replace("’", "'") for seg in raw], lang)]
        assert test[0].startswith("iwslt14.ted.dev2010 ") and "’" not in "".join(test) and "'" in test[0]
    assert _counts(out, src, tgt) == {"train": 48, "valid": 2, "test": 10}
    assert "iwslt14" in corpora.PRETOKENIZED_TASKS


# --------------------------------------------------------------------------- WMT16 ro-en


def test_normalize_romanian_applies_the_wmt16_scripts_mappings():
    # Cedilla and comma forms of s and t, breve a, circumflex a and i, lower and upper case.
    assert corpora.normalize_romanian("Ş ş Ţ ţ Ș ș Ț ț Ă ă Â â Î î") == "S s T t S s T t A a A a I i"
    assert (
        corpora.normalize_romanian("Ştiinţa şi ţara sunt în „noi”, îţi spun.")
        == 'Stiinta si tara sunt in "noi", iti spun.'
    )
    # Curly quotes, an en dash and an ellipsis: Moses punctuation normalisation.
    assert corpora.normalize_romanian("“Da” – a spus… ‘bine’") == "\"Da\" - a spus... 'bine'"
    # Non-printing characters (byte-order mark, zero-width space, a control character) go.
    assert corpora.normalize_romanian("\ufeffCasa\u200b mare\x07 e aici") == "Casa mare e aici"
    # Nothing else changes: other letters, digits, case.
    text = "Bucuresti, 2016: 10 ani de Erasmus & UE (Bruxelles)."
    assert corpora.normalize_romanian(text) == text
    assert not set(corpora.normalize_romanian(ROMANIAN_DIACRITICS)) & set(ROMANIAN_DIACRITICS)


# One Romanian line with every diacritic in both forms and curly quotes, with its English side.
RO_LINE = "Ştiinţa şi ţara — ştiinţa, știința și țara: mă, câine, în „casă” şi “acasă”. ĂÂÎȘȚŞŢ"
RO_EXPECTED = 'Stiinta si tara - stiinta, stiinta si tara: ma, caine, in "casa" si "acasa". AAISTST'
EN_LINE = "Science and the country: “Romania’s” homes in Timișoara."
EN_EXPECTED = 'Science and the country: "Romania\'s" homes in Timișoara.'


@pytest.mark.parametrize("src,tgt", [("ro", "en"), ("en", "ro")])
def test_wmt16_joins_europarl_and_setimes_and_normalises_romanian_in_every_split(tmp_path, monkeypatch, src, tgt):
    downloads, out = tmp_path / "downloads", tmp_path / "raw"
    downloads.mkdir()
    europarl = {"ro": ["Reluarea sesiunii", RO_LINE], "en": ["Resumption of the session", EN_LINE]}
    setimes = {"ro": ["Bună ziua, ţară!", "Al doilea rând."], "en": ["Good day, country!", "The second line."]}
    _tar_gz(
        downloads / "training-parallel-ep-v8.tgz",
        {f"training-parallel-ep-v8/europarl-v8.ro-en.{lang}": _text(europarl[lang]) for lang in ("ro", "en")},
    )
    _zip(
        downloads / "en-ro.txt.zip",
        {
            **{f"SETIMES.en-ro.{lang}": _text(setimes[lang]) for lang in ("ro", "en")},
            "SETIMES.en-ro.ids": "a\tb\t1\t1\na\tb\t2\t2\n",
            "README": "OPUS\n",
            "LICENSE": "CC-BY\n",
        },
    )
    fake = FakeSacrebleu(
        {
            "wmt16/dev": {"ro": ["Dezvoltare în ţară.", RO_LINE], "en": ["Development in the country.", EN_LINE]},
            "wmt16": {"ro": [RO_LINE, "Ultimul test – gata."], "en": [EN_LINE, "Last test – done."]},
        }
    )
    monkeypatch.setattr(corpora, "_sacrebleu_set", fake)

    corpora.prepare_wmt16_ro_en(downloads, out, src, tgt)
    assert sorted(fake.calls) == [("wmt16", "test"), ("wmt16/dev", "valid")]
    assert read_lines(out / "train.ro") == ["Reluarea sesiunii", RO_EXPECTED, "Buna ziua, tara!", "Al doilea rand."]
    assert read_lines(out / "train.en") == [
        "Resumption of the session",
        EN_EXPECTED,
        "Good day, country!",
        "The second line.",
    ]
    assert read_lines(out / "valid.ro") == ["Dezvoltare in tara.", RO_EXPECTED]
    assert read_lines(out / "test.ro") == [RO_EXPECTED, "Ultimul test - gata."]
    # The English side keeps its text (ș of a place name included): only punctuation changes.
    assert read_lines(out / "valid.en") == ["Development in the country.", EN_EXPECTED]
    assert read_lines(out / "test.en") == [EN_EXPECTED, "Last test - done."]
    for split in ("train", "valid", "test"):
        assert not set((out / f"{split}.ro").read_text(encoding="utf-8")) & set(ROMANIAN_DIACRITICS)
    assert _counts(out, src, tgt) == {"train": 4, "valid": 2, "test": 2}


# --------------------------------------------------------------------------- WMT14 en-de


def test_wmt14_concatenates_the_three_corpora_of_the_official_archives(tmp_path, monkeypatch):
    downloads, out = tmp_path / "downloads", tmp_path / "raw"
    downloads.mkdir()
    corpus = {
        "europarl": {
            "en": ["Resumption of the session", "I declare resumed."],
            "de": ["Wiederaufnahme der Sitzungsperiode", "Ich erkläre sie für wiederaufgenommen."],
        },
        "commoncrawl": {
            "en": ["iron cement", "Cookies help us.\u2028Really."],
            "de": ["Eisenkitt", "Cookies helfen uns.\u2028Wirklich."],
        },
        "nc": {"en": ["$10,000 Gold?"], "de": ["Gold für 10.000 Dollar?"]},
    }
    _tar_gz(
        downloads / "training-parallel-europarl-v7.tgz",
        {
            **{f"training/europarl-v7.de-en.{lang}": _text(corpus["europarl"][lang]) for lang in ("en", "de")},
            # Other pairs of the same archive: not read.
            "training/europarl-v7.fr-en.en": "French Europarl English side\n",
            "training/europarl-v7.fr-en.fr": "Europarl en français\n",
        },
    )
    _tar_gz(
        downloads / "training-parallel-commoncrawl.tgz",
        {
            **{f"commoncrawl.de-en.{lang}": _text(corpus["commoncrawl"][lang]) for lang in ("en", "de")},
            "commoncrawl.de-en.annotation": "x\ny\n",
            "commoncrawl.fr-en.en": "French Common Crawl\n",
        },
    )
    _tar_gz(
        downloads / "training-parallel-nc-v9.tgz",
        {
            **{f"training/news-commentary-v9.de-en.{lang}": _text(corpus["nc"][lang]) for lang in ("en", "de")},
            "training/news-commentary-v9.cs-en.en": "Czech NC English side\n",
        },
    )
    fake = FakeSacrebleu(
        {
            "wmt13": {"en": ["A valid line."], "de": ["Eine Zeile."]},
            "wmt14/full": {"en": ["A test line.", "Two."], "de": ["Eine Testzeile.", "Zwei."]},
        }
    )
    monkeypatch.setattr(corpora, "_sacrebleu_set", fake)

    corpora.prepare_wmt14_en_de(downloads, out, "en", "de")
    for lang in ("en", "de"):
        assert read_lines(out / f"train.{lang}") == [
            line for name in ("europarl", "commoncrawl", "nc") for line in corpus[name][lang]
        ]
    assert read_lines(out / "test.de") == ["Eine Testzeile.", "Zwei."]
    assert sorted(fake.calls) == [("wmt13", "valid"), ("wmt14/full", "test")]
    assert _counts(out, "en", "de") == {"train": 5, "valid": 1, "test": 2}


# --------------------------------------------------------------------------- downloads, smoke


def test_a_file_already_in_the_downloads_folder_is_not_fetched_again(tmp_path):
    path = tmp_path / "kftt-data-1.0.tar.gz"
    path.write_bytes(b"already here")
    assert download("http://127.0.0.1:9/unreachable.tar.gz", path, "put it there by hand") == path
    assert path.read_bytes() == b"already here"


def test_an_archive_with_two_files_of_the_asked_name_is_refused(tmp_path):
    archive = tmp_path / "corpus.tgz"
    _tar_gz(archive, {"corpus/a/train.en": "one\n", "corpus/b/train.en": "two\n"})
    with pytest.raises(PipelineError, match="several files ending in train.en"):
        corpora._member_lines(archive, "train.en")
    assert corpora._member_lines(archive, "b/train.en") == ["two"]


def test_smoke_data_copies_the_line_ranges_of_the_shared_text(tmp_path):
    shared = tmp_path / "shared"
    (shared / "sample").mkdir(parents=True)
    for lang in ("de", "en"):
        (shared / "sample" / f"all.{lang}").write_text(_text(f"{lang} {i}" for i in range(10)), encoding="utf-8")
    task = SimpleNamespace(
        name="iwslt17",
        smoke=SimpleNamespace(
            splits={"train": ("sample/all", 0, 6), "valid": ("sample/all", 6, 8), "test": ("sample/all", 8, 10)}
        ),
    )
    out = tmp_path / "raw"
    corpora.write_smoke_data(task, shared, "de", "en", out)
    assert read_lines(out / "valid.en") == ["en 6", "en 7"]
    assert read_lines(out / "test.de") == ["de 8", "de 9"]
    assert _counts(out, "de", "en") == {"train": 6, "valid": 2, "test": 2}
    with pytest.raises(PipelineError, match="smoke data .* not found"):
        corpora.write_smoke_data(task, tmp_path / "elsewhere", "de", "en", tmp_path / "raw2")
