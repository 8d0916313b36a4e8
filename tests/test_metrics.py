"""tfmlib.metrics: BLEU is sacreBLEU's, buckets hold the right sentences, bad input fails."""

import math

import pytest
import sacrebleu

from tfmlib.metrics import DEFAULT_LENGTH_EDGES, bleu, bleu_by_length, bucket_label, exact_match

HYPS = ["the cat sat on the mat .", "a dog runs in the park", "hello there"]
REFS = ["the cat sat on the mat .", "a dog is running in the park", "hello world"]


def test_bleu_is_sacrebleus_corpus_bleu():
    got = bleu(HYPS, REFS)
    want = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert got.score == pytest.approx(want.score)
    assert got.brevity_penalty == pytest.approx(want.bp)
    assert "tok:13a" in got.signature and "case:mixed" in got.signature
    assert bleu(REFS, REFS).score == pytest.approx(100.0)
    assert bleu(["completely different words here"], ["the cat sat on the mat"]).score < 1
    assert "case:lc" in bleu(HYPS, REFS, lowercase=True).signature
    assert str(got).startswith("BLEU ")


def test_brevity_penalty_punishes_short_output():
    short = bleu(["the cat"], ["the cat sat on the mat"])
    assert short.brevity_penalty == pytest.approx(math.exp(1 - 6 / 2))


def test_bleu_by_length_buckets():
    lengths = [3, 10, 11, 17, 24, 25, 39, 40, 59, 2]
    hyps = [f"s{i} a b c d" for i in range(10)]
    refs = list(hyps)
    refs[7] = "something else entirely"
    rows = bleu_by_length(lengths, hyps, refs)
    assert [r["bucket"] for r in rows] == ["3-10", "11-17", "18-24", "25-39", "40+"]
    assert [r["n"] for r in rows] == [2, 2, 1, 2, 2]  # length 2 is below the first edge: left out
    assert rows[0]["bleu"] == pytest.approx(100.0) and rows[0]["exact"] == 1.0
    assert rows[-1]["exact"] == 0.5 and rows[-1]["hi"] is None
    assert bucket_label(DEFAULT_LENGTH_EDGES, 0) == "3-10"
    assert bucket_label(DEFAULT_LENGTH_EDGES, 4) == "40+"
    only_short = bleu_by_length([3, 4], ["a b", "c d"], ["a b", "c d"])
    assert [r["bucket"] for r in only_short] == ["3-10"], "empty buckets are left out"


def test_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        bleu([], [])
    with pytest.raises(TypeError, match="single str"):
        bleu("a b", "a b")
    with pytest.raises(TypeError, match=r"hypotheses\[1\] is a list"):
        exact_match(["a", ["b"]], ["a", "b"])
    with pytest.raises(ValueError, match="3 lengths for 2 sentences"):
        bleu_by_length([1, 2, 3], ["a", "b"], ["a", "b"])
    with pytest.raises(ValueError, match="strictly increasing"):
        bleu_by_length([5], ["a"], ["a"], edges=(10, 5))


def test_exact_match():
    assert exact_match(["a b", "c "], ["a b", "c"]) == 1.0
    assert exact_match(["a b", "c d"], ["a b", "c"]) == 0.5


def test_lowercase_applies_to_exact_matches_too():
    rows = bleu_by_length([5, 5], ["a dog runs .", "the cat"], ["A dog runs .", "The cat"], lowercase=True)
    assert rows[0]["exact"] == 1.0 and rows[0]["bleu"] == pytest.approx(100.0)
    assert bleu_by_length([5], ["a dog"], ["A dog"])[0]["exact"] == 0.0
