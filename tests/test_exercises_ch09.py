"""Chapter 09 exercise checkers accept the reference solutions and reject typical wrong answers."""

import math

import pytest
import torch
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub

from tfmlib import exercises
from tfmlib.sampling import top_p_filter

NAMES = ["09.cache_bytes", "09.cached_step", "09.top_p"]


def test_chapter_09_exercises_are_registered_and_never_raise(capsys):
    assert exercises.names(9) == NAMES
    def keyword_stub(**kwargs):
        raise NotImplementedError

    for name in NAMES:
        assert not exercises.check(name, keyword_stub if name == "09.cache_bytes" else _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out


@pytest.mark.parametrize("name", NAMES)
def test_09_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("cumsum", "sort(", "softmax(", "@", "transpose", "element_size", "2 *",
                               "return ", "torch.", "masked_fill", "scatter"))


# ----------------------------------------------------------------------------- 09.top_p


def top_p_ref(logits, p):
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = (sorted_p.cumsum(-1) - sorted_p) >= p
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)


def top_p_inclusive(logits, p):   # keeps while the mass *including* the token is below p: one too few
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) >= p
    return logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)


def top_p_unsorted_back(logits, p):  # forgets to put the pattern back in token order
    probs = torch.softmax(logits, -1)
    sorted_p, _ = probs.sort(-1, descending=True)
    return logits.masked_fill((sorted_p.cumsum(-1) - sorted_p) >= p, -math.inf)


def test_top_p_accepts_the_solution_and_the_package():
    _accepts("09.top_p", top_p_ref)
    _accepts("09.top_p", top_p_filter)


@pytest.mark.parametrize("wrong", [top_p_inclusive, top_p_unsorted_back,
                                   lambda lg, p: lg,                                          # no filtering
                                   lambda lg, p: torch.softmax(lg, -1),                        # returns probs
                                   lambda lg, p: lg.masked_fill(torch.softmax(lg, -1) < 1 - p, -math.inf)])
def test_top_p_rejects_wrong_answers(wrong):
    _rejects("09.top_p", wrong)


# ----------------------------------------------------------------------------- 09.cached_step


def cached_step_ref(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    keys, values = K[:, :, :length + 1], V[:, :, :length + 1]
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ values, length + 1


def cached_step_whole_buffer(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    return torch.softmax(q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ V, length + 1


def cached_step_no_write(q, k, v, K, V, length):
    keys, values = torch.cat([K[:, :, :length], k], 2), torch.cat([V[:, :, :length], v], 2)
    return torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ values, length + 1


def cached_step_unscaled(q, k, v, K, V, length):
    out, n = cached_step_ref(q, k, v, K, V, length)
    keys, values = K[:, :, :n], V[:, :, :n]
    return torch.softmax(q @ keys.transpose(-2, -1), -1) @ values, n


def test_cached_step_accepts_the_solution():
    _accepts("09.cached_step", cached_step_ref)


@pytest.mark.parametrize("wrong", [cached_step_whole_buffer, cached_step_no_write, cached_step_unscaled,
                                   lambda q, k, v, K, V, n: cached_step_ref(q, k, v, K, V, n)[0]])
def test_cached_step_rejects_wrong_answers(wrong):
    _rejects("09.cached_step", wrong)


# ----------------------------------------------------------------------------- 09.cache_bytes


def cache_bytes_ref(*, layers, d_model, tokens, batch, dtype):
    return 2 * layers * d_model * tokens * batch * torch.empty((), dtype=dtype).element_size()


def test_cache_bytes_accepts_the_solution():
    _accepts("09.cache_bytes", cache_bytes_ref)


@pytest.mark.parametrize("wrong", [
    lambda **a: cache_bytes_ref(**a) // 2,                                           # keys only
    lambda **a: cache_bytes_ref(**a) // torch.empty((), dtype=a["dtype"]).element_size(),  # numbers
    lambda **a: 2 * a["layers"] * a["d_model"] * a["tokens"] * 4,                    # no batch, no dtype
])
def test_cache_bytes_rejects_wrong_answers(wrong):
    _rejects("09.cache_bytes", wrong)
