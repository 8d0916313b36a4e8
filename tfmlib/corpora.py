"""Loaders for real parallel corpora: Tatoeba/Anki English-French and Multi30k.

Introduced in chapter 00 (preface). The book trains on its bundled synthetic corpus by default
(see ``tfmlib.synthetic``); these loaders let a reader who has downloaded a real corpus run the
same chapters on real sentences. The one visible switch is the environment variable
``TFM_CORPUS`` (or the argument of :func:`load_corpus`)::

    TFM_CORPUS=multi30k jupyter lab        # chapters 02, 03 and 08 now train on Multi30k de->en

Every loader returns *pairs* ``(source_text, target_text)`` of plain strings, the convention of
``tfmlib.data``. The project ships loader code and checksums, never the corpora themselves: a
reader downloads them into ``data/external/<name>/``, a folder that git ignores, or into any
folder named by ``TFM_CORPORA_DIR``. Multi30k takes one command, which checks every file's
SHA-256 and resumes an interrupted download::

    python -m tfmlib.corpora download multi30k     # or, in Python: download("multi30k")

Tatoeba's site turns away scripted downloads, so it is fetched by hand (:data:`TATOEBA_DOWNLOAD`).

=====================  ==================================================================
folder name            files
=====================  ==================================================================
``tatoeba-fra-eng``    ``fra.txt`` or ``fra.txt.gz`` or the archive ``fra-eng.zip``
``multi30k``           ``{split}.{lang}.gz`` (or unpacked ``{split}.{lang}``), for the splits
                       ``train``, ``val``, ``test_2016_flickr``, ``test_2017_flickr`` and the
                       languages ``en``, ``de``, ``fr``
=====================  ==================================================================
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import http.client
import io
import os
import random
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

INTRODUCED_IN = 0

Pair = tuple[str, str]

#: The repository root (the folder holding ``tfmlib/``); corpora are searched relative to it.
REPO_ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- download notes

TATOEBA_DOWNLOAD = """\
Tatoeba / ManyThings Anki English-French ("fra-eng"), downloaded by hand:
  1. Open https://www.manythings.org/anki/ in a browser and download fra-eng.zip (the site turns
     away scripted downloads, so tfmlib.corpora.download does not fetch it).
  2. Put it in data/external/tatoeba-fra-eng/ (create the folder). Keep the zip as it is (the
     loader reads fra.txt inside it) or unzip it there so that
     data/external/tatoeba-fra-eng/fra.txt exists. A gzipped fra.txt.gz works too.
  Or put the folder tatoeba-fra-eng/ inside any folder and set TFM_CORPORA_DIR to that folder.
  Licence: CC-BY 2.0 (https://creativecommons.org/licenses/by/2.0); attribution required:
  www.manythings.org/anki and tatoeba.org."""

MULTI30K_DOWNLOAD = """\
Multi30k (task 1, raw text):
  One command fetches the 12 files and checks their SHA-256 (it resumes if interrupted):
      python -m tfmlib.corpora download multi30k
  or by hand, from the GitHub repository multi30k/dataset, folder data/task1/raw:
      mkdir -p data/external/multi30k && cd data/external/multi30k
      for split in train val test_2016_flickr test_2017_flickr; do
        for lang in en de fr; do
          curl -LO https://github.com/multi30k/dataset/raw/master/data/task1/raw/$split.$lang.gz
        done
      done
  Keep them gzipped (train.de.gz, ...) or gunzip them (train.de, ...); both are read.
  Or put the folder multi30k/ inside any folder and set TFM_CORPORA_DIR to that folder.
  Terms: the Flickr30K terms apply (non-commercial research and educational use only);
  cite Elliott et al. (2016), "Multi30K: Multilingual English-German Image Descriptions"."""

DOWNLOAD_INSTRUCTIONS: dict[str, str] = {
    "tatoeba-fra-eng": TATOEBA_DOWNLOAD,
    "multi30k": MULTI30K_DOWNLOAD,
}

# --------------------------------------------------------------------------- checksums

#: SHA-256 digests of the official files, by corpus folder and file name. The ``.gz`` digests
#: of Multi30k are those of the files in multi30k/dataset (data/task1/raw, commit a3d2e0d);
#: the digests without ``.gz`` are those of the same files after ``gunzip``. The Tatoeba
#: digests are of the 2019-04-07 release (``fra.txt`` as found in ``fra-eng.zip`` of that date,
#: also gzipped, and its ``_about.txt``): manythings.org updates the file from time to time, so
#: a fresh download usually has a newer date and a different digest (it still loads fine).
KNOWN_SHA256: dict[str, dict[str, str]] = {
    "multi30k": {
        "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
        "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
        "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
        "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
        "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
        "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
        "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
        "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
        "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
        "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
        "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
        "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
        "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
        "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
        "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
        "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
        "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
        "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
        "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
        "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
        "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
        "test_2017_flickr.de": "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
        "test_2017_flickr.en": "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
        "test_2017_flickr.fr": "6f3764e31dac41e9455e612958bcfd4e877c5e15cd66df2c2b2be6d9bd83e5b6",
    },
    "tatoeba-fra-eng": {
        "fra.txt.gz": "12883bab6f23bddd35b38a71cbeb7029e48475935b72b4f59b52367040d04b1b",
        "fra.txt": "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104",
        "_about.txt": "79f39a53dbddaf7ab43c801f231089174a611f23987244056f9e3cb5aa79358b",
    },
}


class ChecksumError(ValueError):
    """A corpus file's SHA-256 digest differs from the known one (a corrupt or different file)."""


def sha256sum(path: str | Path) -> str:
    """The SHA-256 digest of a file as 64 lowercase hex digits (what ``sha256sum FILE`` prints).

    ``path`` must be a path: ``open`` would also take an integer as a file descriptor and close
    it afterwards, so an integer raises ``TypeError`` here instead.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"sha256sum: path must be a str or a path, got {type(path).__name__}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_corpus_name(name: str) -> None:
    if name not in KNOWN_SHA256:
        raise ValueError(f"unknown corpus folder {name!r}; choose one of {sorted(KNOWN_SHA256)}")


def verify(directory: str | Path, name: str) -> dict[str, bool]:
    """Check the files of corpus ``name`` found in ``directory`` against :data:`KNOWN_SHA256`.

    Returns ``{file_name: digest_matches}`` for each known file that is present (files not
    downloaded are left out). Raises ``FileNotFoundError`` when none of them is present.
    """
    _check_corpus_name(name)
    directory = Path(directory)
    result = {
        fname: sha256sum(directory / fname) == digest
        for fname, digest in sorted(KNOWN_SHA256[name].items())
        if (directory / fname).is_file()
    }
    if not result:
        raise FileNotFoundError(
            f"verify: no file of corpus {name!r} in {directory}\n{DOWNLOAD_INSTRUCTIONS[name]}"
        )
    return result


def verify_checksums(directory: str | Path, name: str) -> list[str]:
    """Like :func:`verify`, but raise :class:`ChecksumError` naming every file that differs.

    Returns the names of the files that were checked (all of them matched).
    """
    result = verify(directory, name)
    bad = [fname for fname, ok in result.items() if not ok]
    if bad:
        raise ChecksumError(
            f"{name}: SHA-256 mismatch for {', '.join(bad)} in {Path(directory)}; the files are "
            "corrupt or a different release: download them again (see the download instructions)"
        )
    return list(result)


# --------------------------------------------------------------------------- where corpora live

# Files whose presence marks a folder as holding the corpus.
_MARKER_FILES: dict[str, tuple[str, ...]] = {
    "tatoeba-fra-eng": ("fra.txt", "fra.txt.gz", "fra-eng.zip"),
    "multi30k": tuple(KNOWN_SHA256["multi30k"]),
}


def corpus_candidates(name: str) -> list[Path]:
    """The folders :func:`corpus_dir` searches for corpus ``name``, in order."""
    _check_corpus_name(name)
    places = []
    env = os.environ.get("TFM_CORPORA_DIR")
    if env:
        places.append(Path(env).expanduser() / name)
    places.append(REPO_ROOT / "data" / "external" / name)
    return places


def corpus_dir(name: str) -> Path:
    """Find the folder of corpus ``name`` (``"multi30k"`` or ``"tatoeba-fra-eng"``).

    Searches, in order, and returns the first folder that holds at least one of the corpus files:

    1. ``$TFM_CORPORA_DIR/<name>`` when the environment variable ``TFM_CORPORA_DIR`` is set
       (a folder that *contains* ``tatoeba-fra-eng/`` and ``multi30k/``);
    2. ``<repo>/data/external/<name>``, where the download instructions put it.

    Raises ``FileNotFoundError`` with the download instructions when none has it.
    """
    places = corpus_candidates(name)
    for place in places:
        if place.is_dir() and any((place / f).is_file() for f in _MARKER_FILES[name]):
            return place
    searched = "\n".join(f"  {p}" for p in places)
    raise FileNotFoundError(
        f"corpus {name!r} not found; searched:\n{searched}\n{DOWNLOAD_INSTRUCTIONS[name]}"
    )


# --------------------------------------------------------------------------- download

#: Where :func:`download` fetches Multi30k: the raw files of multi30k/dataset at the commit whose
#: digests :data:`KNOWN_SHA256` carries (a pinned commit, so the files cannot change under them).
MULTI30K_URL = ("https://raw.githubusercontent.com/multi30k/dataset/"
                "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/")

#: The corpora :func:`download` fetches: ``{folder name: (base URL, file names)}``.
DOWNLOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "multi30k": (MULTI30K_URL, tuple(f for f in KNOWN_SHA256["multi30k"] if f.endswith(".gz"))),
}

#: Corpora whose site does not serve scripts: :func:`download` refuses them with these reasons.
MANUAL_DOWNLOADS: dict[str, str] = {
    "tatoeba-fra-eng": "manythings.org turns away scripted downloads (it serves browsers), and this "
                       "module does not pretend to be one",
}

_CORPUS_ALIASES = {"tatoeba": "tatoeba-fra-eng"}


class DownloadError(RuntimeError):
    """A download failed (HTTP error, network error, interrupted transfer); nothing was kept
    under the file's own name. An interrupted file stays as ``<name>.part`` for the next try."""


class ManualDownloadRequired(RuntimeError):
    """:func:`download` does not fetch this corpus; the message says how to get it by hand."""


def _fetch(url: str, part: Path, timeout: float, progress: TextIO | None, label: str) -> None:
    """Append ``url``'s bytes to ``part``, resuming after the bytes it already holds (HTTP Range).

    A server that answers a range request with the whole file (status 200) makes it start again
    from the first byte. Raises :class:`DownloadError` for an HTTP or network error, and for a
    transfer that ends before the announced length (``part`` keeps what arrived).
    """
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # nothing after what we have: the partial file may be whole
            return
        raise DownloadError(f"{label}: HTTP {err.code} {err.reason} for {url}") from err
    except (urllib.error.URLError, OSError) as err:
        raise DownloadError(f"{label}: cannot reach {url}: {getattr(err, 'reason', err)}") from err
    with response:
        resumed = response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise DownloadError(f"{label}: the server sent bytes {response.headers.get('Content-Range')!r}, "
                                f"not those after the {have:,} in {part.name}: delete it and try again")
        if have and not resumed:
            _say(progress, f"{label}: the server does not resume; starting again from the first byte")
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        done, next_report = have, 0.0
        with open(part, "ab" if resumed else "wb") as out:
            if resumed:
                _say(progress, f"{label}: resuming after {have:,} bytes")
            while True:
                try:
                    block = response.read(1 << 16)
                except (http.client.IncompleteRead, OSError) as err:
                    of = f" of {total:,}" if total is not None else ""
                    raise DownloadError(
                        f"{label}: the transfer stopped after {done:,}{of} bytes ({err}); "
                        f"{part.name} keeps them: call download again to resume") from err
                if not block:
                    break
                out.write(block)
                done += len(block)
                if total and progress is not None and done / total >= next_report:
                    _say(progress, f"{label}: {done:,} of {total:,} bytes ({done / total:.0%})")
                    next_report = min(1.0, done / total + 0.25)
        if total is not None and done < total:
            raise DownloadError(f"{label}: the transfer stopped after {done:,} of {total:,} bytes; "
                                f"{part.name} keeps them: call download again to resume")


def _say(progress: TextIO | None, message: str) -> None:
    if progress is not None:
        print(message, file=progress, flush=True)


def download(name: str, directory: str | Path | None = None, *, base_url: str | None = None,
             files: Sequence[str] | None = None, checksums: Mapping[str, str] | None = None,
             timeout: float = 60.0, progress: TextIO | None = sys.stderr) -> Path:
    """Download corpus ``name`` into ``directory`` and check every file's SHA-256; returns the folder.

    ``name`` is ``"multi30k"`` (its 12 ``.gz`` files, about 5 MB, from :data:`MULTI30K_URL`);
    ``"tatoeba"`` / ``"tatoeba-fra-eng"`` raises :class:`ManualDownloadRequired` with the steps to
    follow in a browser (:data:`MANUAL_DOWNLOADS` says why). ``directory`` defaults to where
    :func:`corpus_dir` looks first: ``$TFM_CORPORA_DIR/<name>`` when that variable is set,
    ``<repo>/data/external/<name>`` otherwise.

    Each file is written to ``<file>.part`` and renamed only once its digest equals
    ``checksums[file]`` (default :data:`KNOWN_SHA256`), so a file under its own name is always a
    checked one:

    * a file already there with the right digest is kept (nothing is fetched);
    * a file already there with another digest is refused (:class:`ChecksumError`), never
      overwritten: delete it to download it again;
    * an interrupted transfer keeps ``<file>.part`` and raises :class:`DownloadError`; the next
      call resumes after its bytes (an HTTP ``Range`` request), or starts again when the server
      ignores ranges;
    * a downloaded file whose digest differs is deleted and refused (:class:`ChecksumError`);
    * an HTTP error (a 404, ...) or an unreachable server raises :class:`DownloadError` naming the URL.

    ``base_url`` (default: the corpus's own) and ``checksums`` exist so that tests can serve
    their own files; ``files`` picks some of the corpus's files (default: all). Progress goes to
    ``progress`` (``None`` for silence); ``timeout`` is in seconds, per network operation.
    """
    if not isinstance(name, str):
        raise TypeError(f"download: name must be a str, got {type(name).__name__}")
    key = _CORPUS_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in MANUAL_DOWNLOADS:
        raise ManualDownloadRequired(f"download: {key} is not downloaded by script: "
                                     f"{MANUAL_DOWNLOADS[key]}.\n{DOWNLOAD_INSTRUCTIONS[key]}")
    if key not in DOWNLOADS:
        raise ValueError(f"download: unknown corpus {name!r}; choose one of {sorted(DOWNLOADS)} "
                         f"(by hand: {sorted(MANUAL_DOWNLOADS)})")
    default_url, known_files = DOWNLOADS[key]
    if files is None:
        files = known_files
    elif isinstance(files, str):
        raise TypeError("download: files must be a list of file names, got a single str")
    unknown = [f for f in files if f not in known_files]
    if unknown:
        raise ValueError(f"download: {key} has no file(s) {unknown}; its files are {list(known_files)}")
    digests = dict(KNOWN_SHA256[key]) if checksums is None else dict(checksums)
    missing = [f for f in files if f not in digests]
    if missing:
        raise ValueError(f"download: no SHA-256 given for {missing}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"download: timeout must be a number of seconds > 0, got {timeout!r}")
    folder = Path(directory) if directory is not None else corpus_candidates(key)[0]
    base = (base_url or default_url).rstrip("/") + "/"
    folder.mkdir(parents=True, exist_ok=True)
    _say(progress, f"{key}: {len(files)} file(s) into {folder}")
    for i, fname in enumerate(files, 1):
        label = f"[{i}/{len(files)}] {fname}"
        target, part = folder / fname, folder / f"{fname}.part"
        if target.exists():
            if sha256sum(target) != digests[fname]:
                raise ChecksumError(f"download: {target} is already there but its SHA-256 differs from "
                                    f"the known one (a corrupt or different file); delete it to download "
                                    "it again")
            _say(progress, f"{label}: already there, checksum matches")
            continue
        _fetch(base + fname, part, timeout, progress, label)
        got = sha256sum(part)
        if got != digests[fname]:
            part.unlink()
            raise ChecksumError(f"download: {base + fname} gave a file whose SHA-256 is {got}, not "
                                f"{digests[fname]}; it was deleted (the server's copy is corrupt or "
                                "a different release)")
        os.replace(part, target)
        _say(progress, f"{label}: done, checksum matches")
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfmlib.corpora download NAME [--dir DIR]``: :func:`download` from a shell."""
    parser = argparse.ArgumentParser(prog="python -m tfmlib.corpora",
                                     description="Download a real corpus and check its SHA-256 sums.")
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("download", help="download a corpus (resumes an interrupted download)")
    get.add_argument("name", help=f"one of {sorted(DOWNLOADS)} ({sorted(MANUAL_DOWNLOADS)} by hand)")
    get.add_argument("--dir", default=None, help="target folder (default: $TFM_CORPORA_DIR/NAME or "
                                                 "data/external/NAME)")
    get.add_argument("--base-url", default=None, help="fetch the files from another server")
    args = parser.parse_args(argv)
    try:
        folder = download(args.name, args.dir, base_url=args.base_url)
    except (DownloadError, ChecksumError, ManualDownloadRequired, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.name}: ready in {folder}")
    return 0


# --------------------------------------------------------------------------- text clean-up

# French typography puts a narrow no-break space (U+202F) or a no-break space (U+00A0) before
# "?", "!", ":" and ";"; the thin space (U+2009) turns up too. All become a plain space.
_ODD_SPACES = str.maketrans({"\u202f": " ", "\u00a0": " ", "\u2009": " "})


def normalize_text(text: str) -> str:
    """Replace narrow/no-break/thin spaces by plain spaces, runs of spaces by one, and strip the ends.

    What BLEU's tokenizer ignores anyway; afterwards ``tfmlib.data.detokenize(tokenize(s))`` gives
    back ``s.lower()`` exactly for every sentence of both corpora (``tests/test_data.py``).
    """
    return " ".join(text.translate(_ODD_SPACES).split())


def _read_text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (``.gz`` allowed), without line ends (``\\n`` or ``\\r\\n``).

    Only ``\\n`` ends a line (``str.splitlines`` would also split at rare Unicode separators and
    break the line-by-line alignment of parallel files).
    """
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return _split_lines(raw.decode("utf-8-sig"))


def _split_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


# --------------------------------------------------------------------------- Tatoeba / Anki

TATOEBA_FILES = ("fra.txt", "fra.txt.gz", "fra-eng.zip")


def parse_tatoeba_lines(lines: Iterable[str], where: str = "<lines>") -> list[Pair]:
    """Parse ``English<TAB>French[<TAB>attribution]`` lines into ``(english, french)`` pairs.

    Odd spaces are normalised (see :func:`normalize_text`), empty lines skipped, the attribution
    column dropped. A line with fewer than 2 or more than 3 columns, or an empty sentence, raises
    ``ValueError`` naming ``where`` (the file) and the line number.
    """
    pairs = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if not 2 <= len(cols) <= 3:
            raise ValueError(
                f"{where}:{lineno}: expected 'English<TAB>French[<TAB>attribution]', "
                f"got {len(cols)} column(s): {line[:60]!r}"
            )
        en, fr = normalize_text(cols[0]), normalize_text(cols[1])
        if not en or not fr:
            raise ValueError(f"{where}:{lineno}: empty English or French sentence: {line[:60]!r}")
        pairs.append((en, fr))
    return pairs


def load_tatoeba(path: str | Path) -> list[Pair]:
    """Read the Tatoeba/Anki English-French file: a list of ``(english, french)`` pairs.

    ``path`` is ``fra.txt``, ``fra.txt.gz``, the archive ``fra-eng.zip`` (its ``fra.txt`` is
    read), or a folder holding one of them (tried in that order). Each line is
    ``English<TAB>French<TAB>attribution``; older releases have no third column. U+202F and U+00A0
    spaces become plain spaces, both sides are stripped, empty lines skipped. Lines keep the file's
    order (short sentences first). Many English sentences appear several times with different
    French translations: split them with :func:`split_by_source`, never by line.

    Download (for readers with internet): ``fra-eng.zip`` from https://www.manythings.org/anki/
    in a browser, into ``data/external/tatoeba-fra-eng/`` (the site turns away scripted
    downloads, so :func:`download` refuses this corpus and prints these steps).

    Expected files: ``fra-eng.zip`` (holding ``fra.txt`` and ``_about.txt``), or ``fra.txt``
    unzipped from it, or ``fra.txt.gz``. The release of 2019-04-07 has 167,130 lines;
    :data:`KNOWN_SHA256` has its digests (newer releases differ and are larger).

    Licence: the sentences come from tatoeba.org and are released under CC-BY 2.0
    (https://creativecommons.org/licenses/by/2.0). Attribution: www.manythings.org/anki and
    tatoeba.org. The third column names each sentence's Tatoeba contributors.

    Raises ``FileNotFoundError`` (with these instructions) when the file is missing and
    ``ValueError`` naming the file and line for a malformed line.
    """
    path = Path(path)
    if path.is_dir():
        found = [path / f for f in TATOEBA_FILES if (path / f).is_file()]
        if not found:
            raise FileNotFoundError(
                f"load_tatoeba: none of {list(TATOEBA_FILES)} in {path}\n{TATOEBA_DOWNLOAD}"
            )
        path = found[0]
    if not path.is_file():
        raise FileNotFoundError(f"load_tatoeba: no file {path}\n{TATOEBA_DOWNLOAD}")
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            members = [m for m in zf.namelist() if Path(m).name == "fra.txt"]
            if not members:
                raise FileNotFoundError(
                    f"load_tatoeba: {path} holds no fra.txt (it has {zf.namelist()[:5]})"
                )
            text = io.TextIOWrapper(zf.open(members[0]), encoding="utf-8-sig").read()
        return parse_tatoeba_lines(_split_lines(text), where=f"{path}:{members[0]}")
    return parse_tatoeba_lines(_read_text_lines(path), where=str(path))


def source_key(sentence: str) -> str:
    """The key that decides whether two source sentences are "the same" for splitting.

    Case and runs of spaces are ignored, because the book's tokenizer lowercases: ``"Go."`` and
    ``"go."`` must not end up one in training and one in the test set.
    """
    return " ".join(normalize_text(sentence).casefold().split())


def split_by_source(
    pairs: Sequence[Pair], valid: float = 0.02, test: float = 0.02, seed: int = 0
) -> dict[str, list[Pair]]:
    """Split pairs into ``{"train", "valid", "test"}`` by *distinct source sentence*.

    All translations of one source sentence (compared with :func:`source_key`) land in the same
    split, so no test sentence is seen in training. The distinct sources are shuffled with
    ``random.Random(seed)``; the first ``round(test * n_sources)`` go to test, the next
    ``round(valid * n_sources)`` to valid, the rest to train. Within a split, pairs keep their
    input order. The result depends only on ``pairs`` and ``seed``. ``valid`` and ``test`` are
    fractions of the distinct sources (not of the pairs).
    """
    for arg, value in (("valid", valid), ("test", test)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"split_by_source: {arg} must be in [0, 1), got {value}")
    if valid + test >= 1.0:
        raise ValueError(f"split_by_source: valid + test must be < 1, got {valid} + {test}")
    keys = list(dict.fromkeys(source_key(src) for src, _ in pairs))  # first-seen order
    random.Random(seed).shuffle(keys)
    n_test, n_valid = round(test * len(keys)), round(valid * len(keys))
    split_of = {k: "test" for k in keys[:n_test]}
    split_of.update({k: "valid" for k in keys[n_test:n_test + n_valid]})
    out: dict[str, list[Pair]] = {"train": [], "valid": [], "test": []}
    for pair in pairs:
        out[split_of.get(source_key(pair[0]), "train")].append(pair)
    return out


# --------------------------------------------------------------------------- Multi30k

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")
MULTI30K_LANGS = ("en", "de", "fr")
_SPLIT_ALIASES = {"valid": "val"}


def _multi30k_file(directory: Path, split: str, lang: str) -> Path:
    for fname in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (directory / fname).is_file():
            return directory / fname
    raise FileNotFoundError(
        f"load_multi30k: neither {split}.{lang}.gz nor {split}.{lang} in {directory}\n"
        f"{MULTI30K_DOWNLOAD}"
    )


def _read_multi30k_side(path: Path) -> list[str]:
    lines = [normalize_text(line) for line in _read_text_lines(path)]
    for lineno, line in enumerate(lines, 1):
        if not line:
            raise ValueError(f"{path}:{lineno}: empty sentence (the files must be aligned line by line)")
    return lines


def load_multi30k(directory: str | Path, split: str, src: str = "de", tgt: str = "en") -> list[Pair]:
    """Read one split of Multi30k (task 1) as ``(src_sentence, tgt_sentence)`` pairs.

    ``split`` is one of ``train`` (29,000 pairs), ``val`` (1,014; ``valid`` is accepted too),
    ``test_2016_flickr`` (1,000) and ``test_2017_flickr`` (1,000); ``src`` and ``tgt`` are two
    different languages among ``en``, ``de``, ``fr``. Line ``i`` of ``{split}.{src}`` and of
    ``{split}.{tgt}`` are translations of each other; each file is read as ``{split}.{lang}.gz``
    or, unpacked, ``{split}.{lang}``.

    Download (for readers with internet): ``python -m tfmlib.corpora download multi30k``
    (:func:`download`), or by hand, the raw files of the GitHub repository ``multi30k/dataset``,
    folder ``data/task1/raw``::

        mkdir -p data/external/multi30k && cd data/external/multi30k
        for split in train val test_2016_flickr test_2017_flickr; do
          for lang in en de fr; do
            curl -LO https://github.com/multi30k/dataset/raw/master/data/task1/raw/$split.$lang.gz
          done
        done

    Expected files: ``{train,val,test_2016_flickr,test_2017_flickr}.{en,de,fr}.gz``; check them
    with ``verify(directory, "multi30k")``.

    Terms: the repository has no licence file; its maintainers state that the Flickr30K terms
    apply: non-commercial research and educational use only. Cite Elliott et al. (2016),
    *Multi30K: Multilingual English-German Image Descriptions*, and Elliott et al. (2017) for
    French and the 2017 test set.

    Raises ``ValueError`` for an unknown split or language (listing the valid ones) and when the
    two files have different numbers of lines; ``FileNotFoundError`` (with the download
    instructions) when the folder or a file is missing.
    """
    split = _SPLIT_ALIASES.get(split, split)
    if split not in MULTI30K_SPLITS:
        raise ValueError(
            f"load_multi30k: unknown split {split!r}; choose one of {list(MULTI30K_SPLITS)} "
            "('valid' means 'val')"
        )
    for arg, lang in (("src", src), ("tgt", tgt)):
        if lang not in MULTI30K_LANGS:
            raise ValueError(
                f"load_multi30k: unknown {arg} language {lang!r}; choose from {list(MULTI30K_LANGS)}"
            )
    if src == tgt:
        raise ValueError(f"load_multi30k: src and tgt must differ, got {src!r} twice")
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"load_multi30k: no folder {directory}\n{MULTI30K_DOWNLOAD}")
    src_path = _multi30k_file(directory, split, src)
    tgt_path = _multi30k_file(directory, split, tgt)
    src_lines, tgt_lines = _read_multi30k_side(src_path), _read_multi30k_side(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"load_multi30k: {src_path.name} has {len(src_lines)} lines but {tgt_path.name} has "
            f"{len(tgt_lines)}; the files are not aligned (download them again)"
        )
    return list(zip(src_lines, tgt_lines, strict=True))


# --------------------------------------------------------------------------- the book's switch

#: Fractions of the distinct English sentences that ``load_corpus("tatoeba")`` holds out, and the
#: seed of that split. Fixed, so every chapter (and every reader) sees the same test set.
TATOEBA_VALID, TATOEBA_TEST, TATOEBA_SEED = 0.02, 0.02, 0

_LANG_NAMES = {"en": "English", "de": "German", "fr": "French"}

#: The corpora :func:`load_corpus` knows, with a one-line description each.
CORPORA: dict[str, str] = {
    "synthetic": "the bundled English->French corpus from tfmlib.synthetic (default; no download)",
    "tatoeba": "Tatoeba/Anki English->French (fra-eng, ~167k pairs, short everyday sentences; "
               f"{TATOEBA_VALID:.0%}/{TATOEBA_TEST:.0%} of distinct English sentences held out "
               "for valid/test; CC-BY 2.0)",
    "multi30k": "Multi30k German->English image captions (same as multi30k-de-en; "
                "29k/1,014/1,000 pairs; non-commercial use)",
}
CORPORA.update({
    f"multi30k-{s}-{t}": f"Multi30k {_LANG_NAMES[s]}->{_LANG_NAMES[t]} image captions "
                         "(train/val/test_2016_flickr)"
    for s in MULTI30K_LANGS for t in MULTI30K_LANGS if s != t
})


def load_corpus(name: str | None = None) -> dict[str, list[Pair]]:
    """Load a translation corpus as ``{"train": [...], "valid": [...], "test": [...]}`` pairs.

    This is the book's one switch for the translation chapters. ``name`` defaults to the
    environment variable ``TFM_CORPUS``, and to ``"synthetic"`` when that is unset. Choices
    (see :data:`CORPORA`):

    * ``"synthetic"``: ``tfmlib.synthetic.load_bundled(split)`` for each split; no download.
    * ``"tatoeba"``: :func:`load_tatoeba` on ``corpus_dir("tatoeba-fra-eng")``, English->French,
      split by :func:`split_by_source` with ``valid=0.02, test=0.02, seed=0`` (2% of the distinct
      English sentences each, the same for everyone).
    * ``"multi30k"`` (= ``"multi30k-de-en"``) or ``"multi30k-<src>-<tgt>"`` with two of
      ``en``, ``de``, ``fr``: :func:`load_multi30k` on ``corpus_dir("multi30k")``; the splits are
      ``train``, ``val`` (as ``"valid"``) and ``test_2016_flickr`` (as ``"test"``).

    Raises ``ValueError`` listing the choices for an unknown name, and ``FileNotFoundError``
    with download instructions when a real corpus is not on disk.
    """
    if name is None:
        name = os.environ.get("TFM_CORPUS") or "synthetic"
    if not isinstance(name, str):
        raise TypeError(f"load_corpus: name must be a str or None, got {type(name).__name__}")
    key = name.strip().lower()
    if key == "synthetic":
        from tfmlib.synthetic import load_bundled

        return {split: load_bundled(split) for split in ("train", "valid", "test")}
    if key == "tatoeba":
        pairs = load_tatoeba(corpus_dir("tatoeba-fra-eng"))
        return split_by_source(pairs, valid=TATOEBA_VALID, test=TATOEBA_TEST, seed=TATOEBA_SEED)
    if key == "multi30k":
        key = "multi30k-de-en"
    if key in CORPORA and key.startswith("multi30k-"):
        _, src, tgt = key.split("-")
        directory = corpus_dir("multi30k")
        return {
            "train": load_multi30k(directory, "train", src, tgt),
            "valid": load_multi30k(directory, "val", src, tgt),
            "test": load_multi30k(directory, "test_2016_flickr", src, tgt),
        }
    choices = "\n".join(f"  {k}: {v}" for k, v in CORPORA.items())
    raise ValueError(f"load_corpus: unknown corpus {name!r}; choose one of:\n{choices}")


if __name__ == "__main__":
    sys.exit(main())
