"""The preface's checker accepts a right answer and rejects typical wrong ones; the checker machinery
(hints, crash reports, mask grids) tested on chapter 02's padding exercises, which began here."""

import pytest
import torch

from tfmlib import exercises
from tfmlib.data import Vocab, tokenize


def right_mask(lengths, max_len):
    return torch.arange(max_len)[None, :] < lengths[:, None]


def stub(*args):
    raise NotImplementedError


def test_unsolved_reports_hint_and_never_raises(capsys):
    assert not exercises.check("02.padding_mask", stub)
    out = capsys.readouterr().out
    assert "not solved yet" in out and "Hint" in out
    with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
        exercises.check("02.padding_mask", stub, must_pass=True)


def test_crashing_answer_is_reported_not_raised(capsys):
    assert not exercises.check("02.padding_mask", lambda l, m: 1 / 0)
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_verdict_is_a_bool_that_displays_nothing(capsys):
    verdict = exercises.check("02.padding_mask", right_mask)
    assert verdict and verdict.passed and verdict.name == "02.padding_mask"
    assert not exercises.check("02.padding_mask", stub)
    assert verdict._ipython_display_() is None  # IPython shows nothing more than the printed line
    assert "correct!" in capsys.readouterr().out


def right_curve(train, test, sizes):
    test_tokens = [t for s in test for t in tokenize(s)]
    rates = []
    for n in sizes:
        vocab = Vocab.build(tokenize(s) for s in train[:n])
        rates.append(sum(t not in vocab for t in test_tokens) / len(test_tokens))
    return rates


def curve_with(split=tokenize, first=lambda n: n, count=None, eos=0):
    """A wrong curve: another tokenizer, another number of sentences, another count or denominator."""
    def curve(train, test, sizes):
        rates = []
        for n in sizes:
            vocab = Vocab.build(split(s) for s in train[: max(first(n), 0)])
            tokens = [t for s in test for t in split(s)]
            unknown = [t for t in tokens if t not in vocab]
            rates.append((count(unknown) if count else len(unknown)) / (len(tokens) + eos * len(test)))
        return rates
    return curve


def macro_average(train, test, sizes):
    return [sum(right_curve(train, [s], [n])[0] for s in test) / len(test) for n in sizes]


def leaky_curve(train, test, sizes):
    test_tokens = [t for s in test for t in tokenize(s)]
    vocabs = [Vocab.build([tokenize(s) for s in train[:n]] + [test_tokens]) for n in sizes]
    return [sum(t not in vocab for t in test_tokens) / len(test_tokens) for vocab in vocabs]


# each wrong answer, and the diagnosis it must get (a substring of the checker's message)
WRONG_CURVES = {
    "no-lowercase": (curve_with(split=lambda s: tokenize(s, lowercase=False)), "'Le' and 'le' are one token"),
    "whitespace-split": (curve_with(split=str.split), "not on spaces"),
    "lowercased-whitespace-split": (curve_with(split=lambda s: s.lower().split()), "l'ours is two tokens"),
    "distinct-words": (curve_with(count=lambda u: len(set(u))), "count every occurrence"),
    "macro-average": (macro_average, "pool the tokens"),
    "eos-counted": (curve_with(eos=1), "<eos>"),
    "one-sentence-too-many": (curve_with(first=lambda n: n + 1), "off by one"),
    "one-sentence-too-few": (curve_with(first=lambda n: n - 1), "off by one"),
    "whole-training-split": (curve_with(first=lambda n: 10**9), "does not depend on n"),
    "test-in-vocabulary": (leaky_curve, "has seen the test sentences"),
    # review 2026-11-27, finding 1: a repeated test sentence is counted once
    "deduplicated-test": (lambda tr, te, sz: right_curve(tr, list(dict.fromkeys(te)), sz),
                          "repeated ones too"),
    "known-rate": (lambda *a: [1 - r for r in right_curve(*a)], "the fractions it lacks"),
    "sorted-sizes": (lambda tr, te, sz: right_curve(tr, te, sorted(sz)), "in the order of sizes"),
    "one-number": (lambda tr, te, sz: right_curve(tr, te, sz)[-1], "one rate per size"),
    "strings": (lambda *a: [str(r) for r in right_curve(*a)], "finite number"),
}


def test_unknown_rate_curve_accepts_the_right_answer():
    assert exercises.check("00.unknown_rate_curve", right_curve, must_pass=True)


@pytest.mark.parametrize("name", WRONG_CURVES)
def test_unknown_rate_curve_rejects_wrong_answers_with_a_diagnosis(name, capsys):
    wrong, says = WRONG_CURVES[name]
    assert not exercises.check("00.unknown_rate_curve", wrong)
    out = capsys.readouterr().out
    assert "not correct yet" in out and says in out, out
    with pytest.raises(exercises.ExerciseFailed):
        exercises.check("00.unknown_rate_curve", wrong, must_pass=True)


def test_unknown_rate_curve_rejects_the_chapter_cell_as_a_one_point_answer(capsys):
    """The preface measures one rate, with one vocabulary; that is not a curve."""
    def one_rate(sentences, vocab):
        tokens = [t for s in sentences for t in tokenize(s)]
        return sum(t not in vocab for t in tokens) / len(tokens)

    assert not exercises.check("00.unknown_rate_curve", one_rate)
    assert "raised" in capsys.readouterr().out


def test_registry():
    assert exercises.names(0) == ["00.unknown_rate_curve"]
    assert {"02.padding_mask", "02.first_state_only"} <= set(exercises.names(2))
    with pytest.raises(KeyError, match="no exercise named"):
        exercises.check("99.nope", right_mask)
    with pytest.raises(ValueError, match="registered twice"):
        exercises.checker("00.unknown_rate_curve", hint="")(right_mask)
    with pytest.raises(ValueError, match="must look like 'NN.short_name'"):
        exercises.checker("1.padding", hint="")  # names(1) could never find it


# ----------------------------------------------------------------------------- hints and reports


# Code that would hand a reader the answer; a hint names the section and the idea instead.
CODE_IN_HINTS = ("torch.", "@", ".T", "tril", "einsum(", "gather", "flip(", "tolist", "softmax(", "exp(",
                 "arange", "transpose(", "reshape", "view(", ".sum(", "log_softmax", "bmm", "[:, None",
                 "index(", "== ", "!= ")


@pytest.mark.parametrize("chapter", [0, 1, 2, 3, 4])
def test_hints_point_the_way_without_code(chapter):
    assert exercises.names(chapter), f"chapter {chapter} registers no exercises"
    for name in exercises.names(chapter):
        hint = exercises.hint(name)
        for code in CODE_IN_HINTS:
            assert code not in hint, f"{name}'s hint gives away code: {code!r} in {hint!r}"
        assert "section" in hint.lower(), f"{name}'s hint should say where in the chapter to look: {hint!r}"


def test_a_crash_is_reported_with_the_failing_line_and_the_input_shapes(capsys):
    def padding_mask(lengths, max_len):
        grid = torch.arange(max_len + 1)
        return grid < lengths  # (max_len + 1,) against (batch,): the reader's bug

    verdict = exercises.check("02.padding_mask", padding_mask)
    assert not verdict
    message = capsys.readouterr().out
    assert "your code raised RuntimeError" in message, message
    assert "of padding_mask: return grid < lengths" in message, message
    assert "lengths: Tensor(3,) int64, max_len: 3" in message, message


def test_a_wrong_mask_is_shown_as_a_grid(capsys):
    verdict = exercises.check("02.padding_mask", lambda lengths, max_len: torch.arange(max_len)[None, :]
                              <= lengths[:, None])
    assert not verdict
    message = capsys.readouterr().out
    assert "expected (left) and yours (right)" in message, message
    assert "■ ■ ■        ■ ■ ■\n    ■ · ·        ■ ■ ·" in message, message


def test_format_mask():
    assert exercises.format_mask(torch.ones(2, 3, dtype=torch.bool).tril()) == "    ■ · ·\n    ■ ■ ·"
    four_d = exercises.format_mask(torch.ones(2, 1, 2, 2, dtype=torch.bool))
    assert four_d.startswith("(first of shape (2, 1, 2, 2))"), four_d
    assert exercises.describe(torch.zeros(2, 5, dtype=torch.bool)) == "Tensor(2, 5) bool"
    assert exercises.describe([1, 2, 3]) == "list of 3"
