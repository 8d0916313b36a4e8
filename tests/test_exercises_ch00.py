"""The preface's checker accepts a right answer and rejects typical wrong ones; the checker machinery
(hints, crash reports, mask grids) tested on chapter 02's padding exercises, which began here."""

import pytest
import torch

from tfmlib import exercises
from tfmlib.data import tokenize


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


def right_unknown_rate(sentences, vocab):
    tokens = [t for s in sentences for t in tokenize(s)]
    return sum(t not in vocab for t in tokens) / len(tokens)


@pytest.mark.parametrize("wrong", [
    lambda s, v: sum(t not in v for x in s for t in x.split()) / sum(len(x.split()) for x in s),  # spaces
    lambda s, v: len({t for x in s for t in tokenize(x) if t not in v})
    / sum(len(tokenize(x)) for x in s),                                                   # distinct words
    lambda s, v: 1 - right_unknown_rate(s, v),                                            # known rate
    lambda s, v: sum(t not in v for x in s for t in tokenize(x)),                         # a count
    lambda s, v: str(right_unknown_rate(s, v)),                                           # not a number
], ids=["whitespace-split", "distinct", "known-rate", "count", "string"])
def test_unknown_rate_rejects_wrong_answers(wrong, capsys):
    assert exercises.check("00.unknown_rate", right_unknown_rate)
    assert not exercises.check("00.unknown_rate", wrong)
    assert "not correct yet" in capsys.readouterr().out
    with pytest.raises(exercises.ExerciseFailed):
        exercises.check("00.unknown_rate", wrong, must_pass=True)


def test_unknown_rate_names_the_usual_mistakes(capsys):
    exercises.check("00.unknown_rate", lambda s, v: len({t for x in s for t in tokenize(x) if t not in v})
                    / sum(len(tokenize(x)) for x in s))
    assert "count every occurrence" in capsys.readouterr().out
    exercises.check("00.unknown_rate", lambda s, v: sum(t not in v for x in s for t in x.split())
                    / sum(len(x.split()) for x in s))
    assert "tokenize" in capsys.readouterr().out


def test_registry():
    assert exercises.names(0) == ["00.unknown_rate"]
    assert {"02.padding_mask", "02.padding_fraction"} <= set(exercises.names(2))
    with pytest.raises(KeyError, match="no exercise named"):
        exercises.check("99.nope", right_mask)
    with pytest.raises(ValueError, match="registered twice"):
        exercises.checker("00.unknown_rate", hint="")(right_mask)
    with pytest.raises(ValueError, match="must look like 'NN.short_name'"):
        exercises.checker("1.padding", hint="")  # names(1) could never find it


# ----------------------------------------------------------------------------- hints and reports


# Code that would hand a reader the answer; a hint names the section and the idea instead.
CODE_IN_HINTS = ("torch.", "@", ".T", "tril", "einsum(", "gather", "flip(", "tolist", "softmax(", "exp(",
                 "arange", "transpose(", "reshape", "view(", ".sum(", "log_softmax", "bmm", "[:, None",
                 "index(", "== ", "!= ")


@pytest.mark.parametrize("chapter", [0, 2, 3, 4])
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
