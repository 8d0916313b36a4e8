"""Scoring translations: corpus BLEU with sacreBLEU, and BLEU by source length.

Introduced in chapter 02 (sequence to sequence).

BLEU (Papineni et al. 2002) compares n-gram counts (n = 1..4) of the hypotheses with those of
the references over the whole test set, times a brevity penalty. Scores depend on tokenization
and casing, so the book never computes BLEU by hand for its results: it calls sacreBLEU
(Post 2018) with its default ``13a`` tokenization on detokenized text, and reports the metric's
*signature* with each score so that numbers can be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU

INTRODUCED_IN = 2

__all__ = ["BleuScore", "DEFAULT_LENGTH_EDGES", "bleu", "bleu_by_length", "bucket_label", "exact_match"]

# Source-length buckets (tokens, period included) of chapters 02, 03 and 08: 3-10, 11-17, 18-24,
# 25-39, 40+.
DEFAULT_LENGTH_EDGES = (3, 11, 18, 25, 40)


@dataclass(frozen=True)
class BleuScore:
    """A corpus BLEU score (0-100), its n-gram precisions, brevity penalty and sacreBLEU signature."""

    score: float
    precisions: tuple[float, ...]
    brevity_penalty: float
    n_sentences: int
    signature: str

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return f"BLEU {self.score:.2f} ({p}, BP {self.brevity_penalty:.3f}, {self.n_sentences} sentences)"


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str], who: str) -> None:
    for name, seq in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(seq, str):
            raise TypeError(f"{who}: {name} must be a list of strings, got a single str")
        bad = [i for i, s in enumerate(seq) if not isinstance(s, str)]
        if bad:
            raise TypeError(f"{who}: {name}[{bad[0]}] is a {type(seq[bad[0]]).__name__}, not a str")
    if len(hypotheses) != len(references):
        raise ValueError(f"{who}: {len(hypotheses)} hypotheses but {len(references)} references")
    if len(hypotheses) == 0:
        raise ValueError(f"{who}: no sentences to score")


def bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> BleuScore:
    """Corpus BLEU of detokenized ``hypotheses`` against one reference each (sacreBLEU, ``13a``)."""
    _check_pairs(hypotheses, references, "bleu")
    metric = BLEU(lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuScore(float(result.score), tuple(float(p) for p in result.precisions), float(result.bp),
                     len(hypotheses), str(metric.get_signature()))


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The fraction of hypotheses identical to their reference (after stripping outer spaces)."""
    _check_pairs(hypotheses, references, "exact_match")
    return sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=False)) / len(hypotheses)


def bucket_label(edges: Sequence[int], i: int) -> str:
    """The label of bucket ``i`` of ``edges``: ``"3-10"``, ..., ``"40+"`` for the last one."""
    return f"{edges[i]}+" if i == len(edges) - 1 else f"{edges[i]}-{edges[i + 1] - 1}"


def bleu_by_length(source_lengths: Sequence[int], hypotheses: Sequence[str], references: Sequence[str],
                   edges: Sequence[int] = DEFAULT_LENGTH_EDGES, lowercase: bool = False) -> list[dict]:
    """Corpus BLEU and exact-match rate within each source-length bucket.

    Bucket ``i`` holds the sentences with ``edges[i] <= length < edges[i + 1]`` (the last bucket is
    open-ended; sentences shorter than ``edges[0]`` are left out). Returns one dict per non-empty
    bucket: ``bucket`` (label), ``lo``, ``hi`` (``None`` for the last), ``n``, ``bleu``, ``exact``.
    ``lowercase`` applies to both BLEU and the exact matches.
    """
    _check_pairs(hypotheses, references, "bleu_by_length")
    if len(source_lengths) != len(hypotheses):
        raise ValueError(f"bleu_by_length: {len(source_lengths)} lengths for {len(hypotheses)} sentences")
    if len(edges) == 0 or list(edges) != sorted(set(edges)):
        raise ValueError(f"bleu_by_length: edges must be strictly increasing, got {list(edges)}")
    rows = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        idx = [k for k, n in enumerate(source_lengths) if n >= lo and (hi is None or n < hi)]
        if not idx:
            continue
        hyps, refs = [hypotheses[k] for k in idx], [references[k] for k in idx]
        same = exact_match([h.lower() for h in hyps], [r.lower() for r in refs]) if lowercase else \
            exact_match(hyps, refs)
        rows.append({"bucket": bucket_label(edges, i), "lo": lo, "hi": hi, "n": len(idx),
                     "bleu": bleu(hyps, refs, lowercase).score, "exact": same})
    return rows
