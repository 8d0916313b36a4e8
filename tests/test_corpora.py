"""Tests of tfmlib.corpora on tiny fixtures written by the project (tests/fixtures, tmp_path).

The tests at the end use the real corpora in ``../shared/data`` (relative to the repository root)
and skip cleanly when that folder is absent.
"""

import gzip
import hashlib
import sys
import types
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlib import corpora
from tfmlib.corpora import (
    CORPORA,
    ChecksumError,
    corpus_dir,
    load_corpus,
    load_multi30k,
    load_tatoeba,
    sha256sum,
    source_key,
    split_by_source,
    verify,
    verify_checksums,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FRA_SAMPLE = FIXTURES / "fra_sample.txt"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

FRA_SAMPLE_PAIRS = [
    ("Hello.", "Bonjour."),
    ("Stop!", "Arrête !"),
    ("Who is it?", "Qui est-ce ?"),
    ("I am cold.", "J'ai froid."),
    ("The cat sleeps.", "Le chat dort."),
    ("The cat sleeps.", "Le chat est en train de dormir."),
    ("We are late.", "Nous sommes en retard."),
    ("Where is the station?", "Où est la gare ?"),
]


def test_module_is_introduced_in_the_preface():
    assert corpora.INTRODUCED_IN == 0
    assert "chapter 00 (preface)" in corpora.__doc__


# --------------------------------------------------------------------------- Tatoeba / Anki


def test_load_tatoeba_reads_pairs_normalises_spaces_and_drops_attribution():
    pairs = load_tatoeba(FRA_SAMPLE)
    assert pairs == FRA_SAMPLE_PAIRS
    for en, fr in pairs:
        assert "\u202f" not in en + fr and "\u00a0" not in en + fr
        assert en == en.strip() and fr == fr.strip()
    # the fixture really has the odd spaces, a missing third column and an empty line
    raw = FRA_SAMPLE.read_text(encoding="utf-8")
    assert "\u202f" in raw and "\u00a0" in raw and "\n\n" in raw
    assert any(line.count("\t") == 1 for line in raw.splitlines())


def test_normalize_text_turns_every_run_of_spaces_into_one_plain_space():
    assert corpora.normalize_text(" Qui\u202f?  Va\u00a0\u00a0!\t ") == "Qui ? Va !"
    assert corpora.normalize_text("a  bird emerges") == "a bird emerges"  # as in Multi30k's train.en


def test_load_tatoeba_reads_gz_zip_and_folder(tmp_path):
    raw = FRA_SAMPLE.read_bytes()
    gz = tmp_path / "gz" / "fra.txt.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(raw))
    assert load_tatoeba(gz) == FRA_SAMPLE_PAIRS

    archive = tmp_path / "zip" / "fra-eng.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("_about.txt", "about these sentences\n")
        zf.writestr("fra.txt", raw)
    assert load_tatoeba(archive) == FRA_SAMPLE_PAIRS
    assert load_tatoeba(archive.parent) == FRA_SAMPLE_PAIRS  # a folder holding the zip

    nested = tmp_path / "nested.zip"  # some mirrors put the file in a folder inside the zip
    with zipfile.ZipFile(nested, "w") as zf:
        zf.writestr("fra-eng/fra.txt", raw)
    assert load_tatoeba(nested) == FRA_SAMPLE_PAIRS

    crlf = tmp_path / "fra.txt"
    crlf.write_bytes(raw.replace(b"\n", b"\r\n"))
    assert load_tatoeba(crlf) == FRA_SAMPLE_PAIRS


def test_load_tatoeba_malformed_line_names_file_and_line(tmp_path):
    bad = tmp_path / "fra.txt"
    bad.write_text("Hi.\tSalut.\n\nNo tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"fra\.txt:3:.*1 column"):
        load_tatoeba(bad)
    bad.write_text("Hi.\tSalut.\tattribution\textra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"fra\.txt:1:.*4 column"):
        load_tatoeba(bad)
    bad.write_text("Hi.\t \u202f\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"fra\.txt:1: empty"):
        load_tatoeba(bad)
    archive = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("fra.txt", "Hi.\tSalut.\nBroken\n")
    with pytest.raises(ValueError, match=r"fra-eng\.zip:fra\.txt:2:"):
        load_tatoeba(archive)


def test_load_tatoeba_missing_file_explains_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="manythings.org/anki"):
        load_tatoeba(tmp_path / "fra.txt")
    with pytest.raises(FileNotFoundError, match="CC-BY 2.0"):
        load_tatoeba(tmp_path)  # a folder without any of the files
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("deu.txt", "Hi.\tHallo.\n")
    with pytest.raises(FileNotFoundError, match="no fra.txt"):
        load_tatoeba(archive)


def test_split_by_source_keeps_all_translations_together():
    pairs = load_tatoeba(FRA_SAMPLE)
    for seed in range(20):
        splits = split_by_source(pairs, valid=0.25, test=0.25, seed=seed)
        where = {split: {src for src, _ in ps} for split, ps in splits.items()}
        assert sum("The cat sleeps." in srcs for srcs in where.values()) == 1
        assert sorted(p for ps in splits.values() for p in ps) == sorted(pairs)
        # 7 distinct sources: round(0.25 * 7) = 2 in valid and in test
        assert len(where["valid"]) == len(where["test"]) == 2
    assert split_by_source(pairs, 0.25, 0.25, seed=3) == split_by_source(pairs, 0.25, 0.25, seed=3)
    assert len({str(split_by_source(pairs, 0.25, 0.25, seed=s)) for s in range(10)}) > 1


def test_split_by_source_ignores_case_and_spacing_of_the_source():
    pairs = [("Go.", "Va !"), ("go.", "Bouge !"), ("Go. ", "Vas-y !"), ("Run!", "Cours !")]
    assert source_key("Go.") == source_key(" go.") == source_key("GO.")
    for seed in range(10):
        splits = split_by_source(pairs, valid=0.0, test=0.5, seed=seed)
        go = [split for split, ps in splits.items() for src, _ in ps if src.lower().strip() == "go."]
        assert len(go) == 3 and len(set(go)) == 1


def test_split_by_source_checks_fractions():
    with pytest.raises(ValueError, match="valid"):
        split_by_source([("a", "b")], valid=-0.1)
    with pytest.raises(ValueError, match="test"):
        split_by_source([("a", "b")], test=1.0)
    with pytest.raises(ValueError, match="valid \\+ test"):
        split_by_source([("a", "b")], valid=0.5, test=0.5)
    assert split_by_source([]) == {"train": [], "valid": [], "test": []}


@settings(max_examples=60, deadline=None, database=None)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from(["a", "A", "b", "c ", "d", "e", "f", "g"]), st.text(max_size=3)),
        max_size=40,
    ),
    valid=st.floats(0.0, 0.45),
    test=st.floats(0.0, 0.45),
    seed=st.integers(0, 2**32),
)
def test_split_by_source_never_leaks_a_source(pairs, valid, test, seed):
    splits = split_by_source(pairs, valid=valid, test=test, seed=seed)
    keys = {name: {source_key(src) for src, _ in ps} for name, ps in splits.items()}
    assert not keys["train"] & keys["valid"]
    assert not keys["train"] & keys["test"]
    assert not keys["valid"] & keys["test"]
    assert sorted(p for ps in splits.values() for p in ps) == sorted(pairs)  # nothing lost or added
    assert splits == split_by_source(list(pairs), valid=valid, test=test, seed=seed)  # deterministic


# --------------------------------------------------------------------------- Multi30k

TINY_MULTI30K = {
    "en": ["A dog runs on the grass.", "Two children play\u00a0football.", "A woman reads a book."],
    "de": ["Ein Hund rennt auf dem Gras.", "Zwei Kinder spielen Fußball.", "Eine Frau liest ein Buch."],
    "fr": ["Un chien court sur l'herbe.", "Deux enfants jouent au football\u202f!",
           "Une femme lit un livre."],
}


def write_tiny_multi30k(directory: Path, splits=("train", "val", "test_2016_flickr"), gz=True) -> Path:
    """A tiny Multi30k folder with our own sentences (reversed in 'val', first two in tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang, lines in TINY_MULTI30K.items():
            lines = {"train": lines, "val": lines[::-1]}.get(split, lines[:2])
            data = ("\n".join(lines) + "\n").encode("utf-8")
            if gz:
                (directory / f"{split}.{lang}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / f"{split}.{lang}").write_bytes(data)
    return directory


def test_load_multi30k_reads_aligned_files(tmp_path):
    folder = write_tiny_multi30k(tmp_path / "multi30k")
    train = load_multi30k(folder, "train")  # de -> en by default
    assert train[0] == ("Ein Hund rennt auf dem Gras.", "A dog runs on the grass.")
    assert train[1][1] == "Two children play football."  # U+00A0 became a plain space
    assert load_multi30k(folder, "train", src="en", tgt="fr")[1] == (
        "Two children play football.", "Deux enfants jouent au football !")
    assert load_multi30k(folder, "valid") == load_multi30k(folder, "val") == train[::-1]
    assert len(load_multi30k(folder, "test_2016_flickr")) == 2


def test_load_multi30k_reads_uncompressed_files(tmp_path):
    plain = write_tiny_multi30k(tmp_path / "plain", splits=("train",), gz=False)
    gz = write_tiny_multi30k(tmp_path / "gz", splits=("train",))
    assert load_multi30k(plain, "train", "en", "de") == load_multi30k(gz, "train", "en", "de")


def test_load_multi30k_rejects_mismatched_line_counts(tmp_path):
    folder = write_tiny_multi30k(tmp_path / "multi30k", splits=("train",))
    (folder / "train.en.gz").write_bytes(gzip.compress(b"Only one line.\n"))
    with pytest.raises(ValueError, match=r"train\.de\.gz has 3 lines but train\.en\.gz has 1"):
        load_multi30k(folder, "train")
    (folder / "train.en.gz").write_bytes(gzip.compress(b"One.\n\nThree.\n"))
    with pytest.raises(ValueError, match=r"train\.en\.gz:2: empty"):
        load_multi30k(folder, "train")


def test_load_multi30k_rejects_unknown_split_and_language(tmp_path):
    folder = write_tiny_multi30k(tmp_path / "multi30k")
    with pytest.raises(ValueError, match="unknown split 'test'.*test_2016_flickr"):
        load_multi30k(folder, "test")
    with pytest.raises(ValueError, match=r"unknown src language 'cs'.*\['en', 'de', 'fr'\]"):
        load_multi30k(folder, "train", src="cs")
    with pytest.raises(ValueError, match="unknown tgt language 'EN'"):
        load_multi30k(folder, "train", tgt="EN")
    with pytest.raises(ValueError, match="must differ"):
        load_multi30k(folder, "train", src="en", tgt="en")


def test_load_multi30k_missing_folder_or_file_explains_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="multi30k/dataset"):
        load_multi30k(tmp_path / "nowhere", "train")
    folder = write_tiny_multi30k(tmp_path / "multi30k", splits=("train",))
    with pytest.raises(FileNotFoundError, match=r"(?s)test_2017_flickr\.de\.gz.*data/task1/raw"):
        load_multi30k(folder, "test_2017_flickr")
    with pytest.raises(FileNotFoundError, match="Flickr30K"):
        load_multi30k(folder, "val")


# --------------------------------------------------------------------------- checksums


def test_sha256sum_matches_hashlib(tmp_path):
    f = tmp_path / "abc.txt"
    f.write_bytes(b"abc")
    assert sha256sum(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 10_000)  # more than one read block
    assert sha256sum(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_known_digests_look_like_sha256():
    for name, files in corpora.KNOWN_SHA256.items():
        assert files, name
        for fname, digest in files.items():
            assert len(digest) == 64 and int(digest, 16) >= 0, (name, fname)
    multi = corpora.KNOWN_SHA256["multi30k"]
    for split in corpora.MULTI30K_SPLITS:
        for lang in corpora.MULTI30K_LANGS:
            assert f"{split}.{lang}.gz" in multi and f"{split}.{lang}" in multi


def test_verify_reports_and_raises_on_a_mismatch(tmp_path, monkeypatch):
    folder = write_tiny_multi30k(tmp_path / "multi30k", splits=("train",))
    good = sha256sum(folder / "train.en.gz")
    known = {"train.en.gz": good, "train.de.gz": "0" * 64, "val.en.gz": "1" * 64}
    monkeypatch.setitem(corpora.KNOWN_SHA256, "multi30k", known)
    # only the files present are checked
    assert verify(folder, "multi30k") == {"train.de.gz": False, "train.en.gz": True}
    with pytest.raises(ChecksumError, match=r"mismatch for train\.de\.gz"):
        verify_checksums(folder, "multi30k")
    known["train.de.gz"] = sha256sum(folder / "train.de.gz")
    assert sorted(verify_checksums(folder, "multi30k")) == ["train.de.gz", "train.en.gz"]
    with pytest.raises(FileNotFoundError, match="no file of corpus"):
        verify(tmp_path, "multi30k")
    with pytest.raises(ValueError, match="unknown corpus folder"):
        verify(folder, "europarl")
    assert issubclass(ChecksumError, ValueError)


def test_real_digests_reject_our_fixture(tmp_path):
    (tmp_path / "fra.txt").write_bytes(FRA_SAMPLE.read_bytes())
    assert verify(tmp_path, "tatoeba-fra-eng") == {"fra.txt": False}
    with pytest.raises(ChecksumError, match="fra.txt"):
        verify_checksums(tmp_path, "tatoeba-fra-eng")


# --------------------------------------------------------------------------- where corpora live


@pytest.fixture
def fake_repo(tmp_path, monkeypatch):
    """A fake repository root next to a fake ``shared/`` folder; TFM_CORPORA_DIR unset."""
    repo = tmp_path / "work" / "repo"
    repo.mkdir(parents=True)
    monkeypatch.setattr(corpora, "REPO_ROOT", repo)
    monkeypatch.delenv("TFM_CORPORA_DIR", raising=False)
    monkeypatch.delenv("TFM_CORPUS", raising=False)
    return repo


def test_corpus_dir_search_order(fake_repo, tmp_path, monkeypatch):
    # a developer's copy beside the repository is not a place readers have: never searched
    write_tiny_multi30k(fake_repo.parent / "shared" / "data" / "multi30k", splits=("train",))
    with pytest.raises(FileNotFoundError):
        corpus_dir("multi30k")
    external = write_tiny_multi30k(fake_repo / "data" / "external" / "multi30k", splits=("train",))
    assert corpus_dir("multi30k") == external
    env = tmp_path / "mydata"
    (env / "multi30k").mkdir(parents=True)  # an empty folder does not count
    monkeypatch.setenv("TFM_CORPORA_DIR", str(env))
    assert corpus_dir("multi30k") == external
    write_tiny_multi30k(env / "multi30k", splits=("val",))
    assert corpus_dir("multi30k") == env / "multi30k"
    assert corpora.corpus_candidates("multi30k") == [env / "multi30k", external]


def test_corpus_dir_missing_lists_places_and_download(fake_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("TFM_CORPORA_DIR", str(tmp_path / "mydata"))
    with pytest.raises(FileNotFoundError, match=r"(?s)mydata.*data/external.*manythings\.org/anki"):
        corpus_dir("tatoeba-fra-eng")
    with pytest.raises(FileNotFoundError, match=r"(?s)multi30k/dataset"):
        corpus_dir("multi30k")
    with pytest.raises(ValueError, match="choose one of"):
        corpus_dir("wmt14")


# --------------------------------------------------------------------------- load_corpus


def test_load_corpus_unknown_name_lists_choices():
    with pytest.raises(ValueError, match=r"(?s)unknown corpus 'nope'.*synthetic.*tatoeba.*multi30k-en-fr"):
        load_corpus("nope")
    with pytest.raises(ValueError, match="multi30k-en-en"):
        load_corpus("multi30k-en-en")
    with pytest.raises(TypeError, match="name must be a str or None, got int"):
        load_corpus(3)


def test_corpora_describes_every_choice_in_one_line(fake_repo):
    assert {"synthetic", "tatoeba", "multi30k", "multi30k-de-en", "multi30k-en-fr"} <= set(CORPORA)
    assert len(CORPORA) == 3 + 6
    for name, text in CORPORA.items():
        assert text and "\n" not in text, name
        if name != "synthetic":  # every listed name is accepted: it only lacks the files here
            with pytest.raises(FileNotFoundError):
                load_corpus(name)


def test_load_corpus_synthetic_is_the_default(fake_repo, monkeypatch):
    calls = []

    def load_bundled(split: str) -> list[tuple[str, str]]:
        calls.append(split)
        return [(f"{split} source", f"{split} target")]

    fake = types.ModuleType("tfmlib.synthetic")
    fake.load_bundled = load_bundled
    monkeypatch.setitem(sys.modules, "tfmlib.synthetic", fake)
    expected = {s: [(f"{s} source", f"{s} target")] for s in ("train", "valid", "test")}
    assert load_corpus() == expected
    assert load_corpus("synthetic") == expected
    monkeypatch.setenv("TFM_CORPUS", "Synthetic")
    assert load_corpus() == expected
    assert calls == ["train", "valid", "test"] * 3


def test_load_corpus_multi30k_and_tatoeba_from_tfm_corpora_dir(fake_repo, tmp_path, monkeypatch):
    data = tmp_path / "mydata"
    write_tiny_multi30k(data / "multi30k")
    (data / "tatoeba-fra-eng").mkdir(parents=True)
    (data / "tatoeba-fra-eng" / "fra.txt").write_bytes(FRA_SAMPLE.read_bytes())
    monkeypatch.setenv("TFM_CORPORA_DIR", str(data))

    monkeypatch.setenv("TFM_CORPUS", "multi30k")
    splits = load_corpus()
    assert set(splits) == {"train", "valid", "test"}
    assert splits["train"][0] == ("Ein Hund rennt auf dem Gras.", "A dog runs on the grass.")
    assert splits["valid"] == splits["train"][::-1] and len(splits["test"]) == 2
    assert load_corpus("multi30k-de-en") == splits
    assert load_corpus("multi30k-en-fr")["train"][2] == ("A woman reads a book.", "Une femme lit un livre.")

    tatoeba = load_corpus("tatoeba")
    assert sorted(p for ps in tatoeba.values() for p in ps) == sorted(FRA_SAMPLE_PAIRS)
    assert tatoeba == split_by_source(FRA_SAMPLE_PAIRS, corpora.TATOEBA_VALID, corpora.TATOEBA_TEST,
                                      corpora.TATOEBA_SEED)


# --------------------------------------------------------------------------- the real corpora


def shared_corpus(name: str) -> Path:
    folder = SHARED_DATA / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (real corpora are optional)")
    return folder


@pytest.fixture(scope="module")
def real_tatoeba() -> list[tuple[str, str]]:
    return load_tatoeba(shared_corpus("tatoeba-fra-eng") / "fra.txt.gz")


def test_real_multi30k_sizes_and_checksums():
    folder = shared_corpus("multi30k")
    checked = verify_checksums(folder, "multi30k")
    assert len(checked) == 12  # the 12 .gz files
    sizes = {"train": 29000, "val": 1014, "test_2016_flickr": 1000, "test_2017_flickr": 1000}
    for split, n in sizes.items():
        pairs = load_multi30k(folder, split)
        assert len(pairs) == n, split
        assert all(src and tgt for src, tgt in pairs)
    assert len(load_multi30k(folder, "train", "en", "fr")) == 29000
    assert load_multi30k(folder, "train")[1][1] == (
        "Several men in hard hats are operating a giant pulley system.")


def test_real_tatoeba_size_checksum_and_split(real_tatoeba):
    folder = shared_corpus("tatoeba-fra-eng")
    assert verify(folder, "tatoeba-fra-eng") == {"_about.txt": True, "fra.txt.gz": True}
    assert len(real_tatoeba) == 167130
    assert real_tatoeba[0] == ("Go.", "Va !")
    assert not any("\u202f" in en + fr or "\u00a0" in en + fr for en, fr in real_tatoeba)
    splits = split_by_source(real_tatoeba, valid=corpora.TATOEBA_VALID, test=corpora.TATOEBA_TEST,
                             seed=corpora.TATOEBA_SEED)
    keys = {name: {source_key(src) for src, _ in ps} for name, ps in splits.items()}
    assert not keys["train"] & keys["valid"] and not keys["train"] & keys["test"]
    assert not keys["valid"] & keys["test"]
    assert sum(len(ps) for ps in splits.values()) == 167130
    n_sources = sum(len(k) for k in keys.values())
    assert n_sources < 167130  # many English sentences have several translations
    assert len(keys["test"]) == round(0.02 * n_sources) == len(keys["valid"])
