"""Tests of tfmlib.corpora on tiny fixtures written by the project (tests/fixtures, tmp_path).

The tests at the end use the real corpora in ``../shared/data`` (relative to the repository root)
and skip cleanly when that folder is absent.
"""

import contextlib
import gzip
import hashlib
import http.server
import io
import os
import socket
import subprocess
import sys
import threading
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


def test_sha256sum_refuses_a_file_descriptor(tmp_path):
    """open() takes an int as a file descriptor and closes it: the exercise sweep closed pytest's
    capture file that way; sha256sum must refuse anything but a path."""
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(TypeError, match="path must be"):
            sha256sum(read_fd)
        os.fstat(read_fd)  # still open
    finally:
        os.close(read_fd)
        os.close(write_fd)


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


# --------------------------------------------------------------------------- download (loopback only)


class _FileServer(http.server.ThreadingHTTPServer):
    """Serves ``files`` (``{"/path": bytes}``) on 127.0.0.1 and records every request.

    Paths in ``cut_once`` send half their body, then close the connection (once); paths in
    ``no_ranges`` ignore ``Range`` headers (status 200 and the whole file, as some servers do).
    """

    def __init__(self, files: dict[str, bytes]):
        super().__init__(("127.0.0.1", 0), _FileHandler)
        self.files = files
        self.cut_once: set[str] = set()
        self.no_ranges: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/raw/"


class _FileHandler(http.server.BaseHTTPRequestHandler):
    server: _FileServer

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        self.server.requests.append((self.path, self.headers.get("Range")))
        data = self.server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start, wanted = 0, self.headers.get("Range")
        if wanted and self.path not in self.server.no_ranges:
            start = int(wanted.removeprefix("bytes=").removesuffix("-"))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in self.server.cut_once:
            self.server.cut_once.discard(self.path)
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@contextlib.contextmanager
def serving(files: dict[str, bytes]):
    server = _FileServer({f"/raw/{name}": data for name, data in files.items()})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def tiny_gz_files() -> dict[str, bytes]:
    """Three small files under Multi30k's names (our own sentences, gzipped reproducibly)."""
    out = {}
    for split, lang in (("val", "en"), ("val", "de"), ("test_2016_flickr", "en")):
        # numbered, so that they compress to a few kilobytes and progress has something to count
        lines = [f"{text} ({split} {i})" for i in range(300) for text in TINY_MULTI30K[lang]]
        out[f"{split}.{lang}.gz"] = gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), mtime=0)
    return out


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def test_download_fetches_checks_and_keeps_good_files(tmp_path):
    files = tiny_gz_files()
    out = io.StringIO()
    with serving(files) as server:
        folder = corpora.download("multi30k", tmp_path / "m30k", base_url=server.url, files=list(files),
                                  checksums=digests(files), timeout=5, progress=out)
        assert folder == tmp_path / "m30k"
        assert {p.name for p in folder.iterdir()} == set(files)  # no .part left behind
        for name, data in files.items():
            assert (folder / name).read_bytes() == data
        assert load_multi30k(folder, "val", "de", "en")[0] == ("Ein Hund rennt auf dem Gras. (val 0)",
                                                               "A dog runs on the grass. (val 0)")
        log = out.getvalue()
        for name in files:
            assert f"{name}: done, checksum matches" in log
        assert "100%" in log
        # a second call finds them there, checks them and fetches nothing
        before = len(server.requests)
        corpora.download("multi30k", folder, base_url=server.url, files=list(files),
                         checksums=digests(files), timeout=5, progress=None)
        assert len(server.requests) == before == len(files)


def test_download_resumes_an_interrupted_file_with_a_range_request(tmp_path):
    files = tiny_gz_files()
    name = "val.en.gz"
    with serving(files) as server:
        server.cut_once.add(f"/raw/{name}")
        with pytest.raises(corpora.DownloadError, match="call download again to resume"):
            corpora.download("multi30k", tmp_path, base_url=server.url, files=[name],
                             checksums=digests(files), timeout=5, progress=None)
        part = tmp_path / f"{name}.part"
        half = len(files[name]) // 2
        assert part.read_bytes() == files[name][:half] and not (tmp_path / name).exists()
        out = io.StringIO()
        corpora.download("multi30k", tmp_path, base_url=server.url, files=[name],
                         checksums=digests(files), timeout=5, progress=out)
        assert server.requests[-1] == (f"/raw/{name}", f"bytes={half}-")
    assert (tmp_path / name).read_bytes() == files[name] and not part.exists()
    assert f"resuming after {half:,} bytes" in out.getvalue()


def test_download_starts_again_when_the_server_ignores_ranges(tmp_path):
    files = tiny_gz_files()
    name = "val.de.gz"
    (tmp_path / f"{name}.part").write_bytes(b"not the start of the file")
    out = io.StringIO()
    with serving(files) as server:
        server.no_ranges.add(f"/raw/{name}")
        corpora.download("multi30k", tmp_path, base_url=server.url, files=[name],
                         checksums=digests(files), timeout=5, progress=out)
        assert server.requests == [(f"/raw/{name}", f"bytes={len(b'not the start of the file')}-")]
    assert (tmp_path / name).read_bytes() == files[name]
    assert "does not resume" in out.getvalue()


def test_download_finishes_a_part_file_that_was_already_whole(tmp_path):
    # e.g. a run stopped between the last byte and the rename: the server answers 416 (nothing
    # after those bytes), the digest matches, the file gets its name
    files = tiny_gz_files()
    (tmp_path / "val.en.gz.part").write_bytes(files["val.en.gz"])
    with serving(files) as server:
        corpora.download("multi30k", tmp_path, base_url=server.url, files=["val.en.gz"],
                         checksums=digests(files), timeout=5, progress=None)
        assert server.requests == [("/raw/val.en.gz", f"bytes={len(files['val.en.gz'])}-")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.en.gz"]


def test_download_refuses_a_truncated_or_altered_file_from_the_server(tmp_path):
    files = tiny_gz_files()
    expected = digests(files)
    # truncated on the server, and one bit changed
    served = dict(files, **{"val.en.gz": files["val.en.gz"][:-40],
                            "val.de.gz": files["val.de.gz"][:-1] + bytes([files["val.de.gz"][-1] ^ 1])})
    with serving(served) as server:
        for name in ("val.en.gz", "val.de.gz"):
            with pytest.raises(ChecksumError, match=f"{name}.*deleted"):
                corpora.download("multi30k", tmp_path, base_url=server.url, files=[name],
                                 checksums=expected, timeout=5, progress=None)
            assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.part").exists()


def test_download_refuses_an_altered_file_already_there_and_fetches_nothing(tmp_path):
    files = tiny_gz_files()
    (tmp_path / "val.en.gz").write_bytes(b"edited by hand")
    with serving(files) as server:
        with pytest.raises(ChecksumError, match="already there.*delete it"):
            corpora.download("multi30k", tmp_path, base_url=server.url, files=["val.en.gz"],
                             checksums=digests(files), timeout=5, progress=None)
        assert server.requests == []
    assert (tmp_path / "val.en.gz").read_bytes() == b"edited by hand"


def test_download_names_the_url_of_a_404_and_of_an_unreachable_server(tmp_path):
    files = tiny_gz_files()
    with serving({k: v for k, v in files.items() if k != "val.de.gz"}) as server:
        with pytest.raises(corpora.DownloadError, match=r"HTTP 404 .*/raw/val\.de\.gz"):
            corpora.download("multi30k", tmp_path, base_url=server.url, files=["val.de.gz"],
                             checksums=digests(files), timeout=5, progress=None)
    assert list(tmp_path.iterdir()) == []
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(corpora.DownloadError, match=f"cannot reach http://127.0.0.1:{port}/"):
        corpora.download("multi30k", tmp_path, base_url=f"http://127.0.0.1:{port}/", files=["val.de.gz"],
                         checksums=digests(files), timeout=5, progress=None)


def test_download_default_folder_follows_tfm_corpora_dir(tmp_path, monkeypatch):
    files = tiny_gz_files()
    monkeypatch.setenv("TFM_CORPORA_DIR", str(tmp_path / "corpora"))
    with serving(files) as server:
        folder = corpora.download("multi30k", base_url=server.url, files=list(files),
                                  checksums=digests(files), timeout=5, progress=None)
    assert folder == tmp_path / "corpora" / "multi30k" == corpus_dir("multi30k")


def test_download_refuses_tatoeba_with_the_manual_steps_and_checks_its_arguments(tmp_path):
    for name in ("tatoeba", "tatoeba-fra-eng"):
        with pytest.raises(corpora.ManualDownloadRequired, match="turns away scripted downloads") as err:
            corpora.download(name, tmp_path)
        assert "browser" in str(err.value) and "fra-eng.zip" in str(err.value)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="unknown corpus 'wmt14'"):
        corpora.download("wmt14", tmp_path)
    with pytest.raises(ValueError, match="no file"):
        corpora.download("multi30k", tmp_path, files=["train.xx.gz"])
    with pytest.raises(TypeError, match="single str"):
        corpora.download("multi30k", tmp_path, files="train.en.gz")
    with pytest.raises(ValueError, match="no SHA-256"):
        corpora.download("multi30k", tmp_path, files=["val.en.gz"], checksums={})
    with pytest.raises(ValueError, match="timeout"):
        corpora.download("multi30k", tmp_path, timeout=0)
    with pytest.raises(TypeError, match="name must be a str"):
        corpora.download(None, tmp_path)


def test_download_knows_the_twelve_multi30k_files_at_a_pinned_commit():
    url, names = corpora.DOWNLOADS["multi30k"]
    assert sorted(names) == sorted(f"{s}.{l}.gz" for s in corpora.MULTI30K_SPLITS
                                   for l in corpora.MULTI30K_LANGS)
    assert "a3d2e0d26b56f3846f66a952536ffed4e401d05a" in url  # the commit KNOWN_SHA256 describes


def test_download_of_the_real_multi30k_files_and_the_command_line(tmp_path):
    """The real files (from ../shared/data) served on the loopback interface, checked against the
    digests the module carries; then the same through ``python -m tfmlib.corpora download``."""
    source = shared_corpus("multi30k")
    real = {name: (source / name).read_bytes() for name in corpora.DOWNLOADS["multi30k"][1]}
    with serving(real) as server:
        folder = corpora.download("multi30k", tmp_path / "api", base_url=server.url, timeout=10,
                                  progress=None)
        assert len(verify_checksums(folder, "multi30k")) == 12
        assert len(load_multi30k(folder, "test_2016_flickr")) == 1000
        done = subprocess.run([sys.executable, "-m", "tfmlib.corpora", "download", "multi30k",
                               "--dir", str(tmp_path / "cli"), "--base-url", server.url],
                              capture_output=True, text=True, timeout=120, cwd=corpora.REPO_ROOT)
        assert done.returncode == 0, done.stderr
        assert "[12/12]" in done.stderr and "ready in" in done.stdout
        assert verify(tmp_path / "cli", "multi30k") == {name: True for name in real}
        refused = subprocess.run([sys.executable, "-m", "tfmlib.corpora", "download", "tatoeba"],
                                 capture_output=True, text=True, timeout=120, cwd=corpora.REPO_ROOT)
        assert refused.returncode == 1 and "browser" in refused.stderr
