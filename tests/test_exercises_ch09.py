"""Chapter 09 exercise checkers accept the reference solutions and reject typical wrong answers,
each with the diagnosis it must get."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub

from tfmlib import exercises
from tfmlib.exercises.ch09 import _TinyLM

NAMES = ["09.gqa_step", "09.left_padded_generate", "09.window_step"]


def test_chapter_09_exercises_are_registered_and_never_raise(capsys):
    assert exercises.names(9) == NAMES
    for name in NAMES:
        assert not exercises.check(name, _stub)
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "ZeroDivisionError" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_09_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("cumsum", "sort(", "softmax(", "@", "transpose", "element_size", "2 *",
                               "return ", "torch.", "masked_fill", "scatter", "repeat_interleave", "expand",
                               "% ", " // ", "tril", "is_causal", "argmax", "[:, ", " - 1", " / "))
    assert "section" in exercises.hint(name), f"{name}'s hint should say where in the chapter to look"


def _diagnosed(name, wrong, message, capsys):
    _rejects(name, wrong)
    capsys.readouterr()
    exercises.check(name, wrong)
    out = capsys.readouterr().out
    assert message in out, out


# ----------------------------------------------------------------------------- 09.gqa_step


def _widen(x, heads):
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def gqa_step_ref(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    keys, values = _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H)
    return torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ values, length + 1


def gqa_step_sdpa(q, k, v, K, V, length):         # the fused kernel, no causal mask: also right
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    keys, values = _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H)
    return F.scaled_dot_product_attention(q, keys, values), length + 1


def gqa_tiled(q, k, v, K, V, length):             # head h reads key-value head h % G
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    r = q.shape[1] // K.shape[1]
    keys, values = K[:, :, :length + 1].repeat(1, r, 1, 1), V[:, :, :length + 1].repeat(1, r, 1, 1)
    return F.scaled_dot_product_attention(q, keys, values), length + 1


def gqa_is_causal(q, k, v, K, V, length):         # the chapter's pitfall: a top-left causal mask
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    return F.scaled_dot_product_attention(q, _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H),
                                          is_causal=True), length + 1


def gqa_whole_buffer(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    return F.scaled_dot_product_attention(q, _widen(K, H), _widen(V, H)), length + 1


def gqa_widened_copy(q, k, v, K, V, length):      # widens the cache first, then writes into the copy
    H = q.shape[1]
    Kw, Vw = _widen(K, H), _widen(V, H)
    Kw[:, :, length] = _widen(k, H)[:, :, 0]
    Vw[:, :, length] = _widen(v, H)[:, :, 0]
    return F.scaled_dot_product_attention(q, Kw[:, :, :length + 1], Vw[:, :, :length + 1]), length + 1


def gqa_unscaled(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    keys, values = _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H)
    return torch.softmax(q @ keys.transpose(-2, -1), -1) @ values, length + 1


def gqa_per_kv_head(q, k, v, K, V, length):      # one output per key-value head
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    G = K.shape[1]
    return F.scaled_dot_product_attention(q[:, :G], K[:, :, :length + 1], V[:, :, :length + 1]), length + 1


def _gqa_written(q, k, v, K, V, length):
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    H = q.shape[1]
    return _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H)


def gqa_float32(q, k, v, K, V, length):          # review 06-09-10, finding 6: a float32 result
    keys, values = _gqa_written(q, k, v, K, V, length)
    return F.scaled_dot_product_attention(q.float(), keys.float(), values.float()), length + 1


def gqa_attend_then_write(q, k, v, K, V, length):  # finding 8: attends over the garbage at slot length
    H = q.shape[1]
    out = F.scaled_dot_product_attention(q, _widen(K[:, :, :length + 1], H), _widen(V[:, :, :length + 1], H))
    K[:, :, length] = k[:, :, 0]
    V[:, :, length] = v[:, :, 0]
    return out, length + 1


def gqa_new_key_left_out(q, k, v, K, V, length):   # finding 8: K[:, :, :length]
    _gqa_written(q, k, v, K, V, length)
    H = q.shape[1]
    n = max(length, 1)
    return F.scaled_dot_product_attention(q, _widen(K[:, :, :n], H), _widen(V[:, :, :n], H)), length + 1


def gqa_scale_by_d(q, k, v, K, V, length):         # finding 8: 1 / d instead of 1 / sqrt(d)
    keys, values = _gqa_written(q, k, v, K, V, length)
    return torch.softmax(q @ keys.transpose(-2, -1) / q.shape[-1], -1) @ values, length + 1


def gqa_softmax_over_heads(q, k, v, K, V, length):  # finding 8: the softmax over the head axis
    keys, values = _gqa_written(q, k, v, K, V, length)
    return torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1]), 1) @ values, length + 1


def test_09_gqa_step_accepts_the_solutions():
    _accepts("09.gqa_step", gqa_step_ref)
    _accepts("09.gqa_step", gqa_step_sdpa)


@pytest.mark.parametrize("wrong, message", [
    (gqa_tiled, "h mod G"),
    (gqa_is_causal, "is_causal=True"),
    (gqa_whole_buffer, "whole buffer"),
    (gqa_widened_copy, "in place"),
    (gqa_unscaled, "not scaled"),
    (gqa_per_kv_head, "one row per *query* head"),
    (lambda q, k, v, K, V, n: gqa_step_ref(q, k, v, K, V, n)[0], "return a pair"),
    (lambda q, k, v, K, V, n: (gqa_step_ref(q, k, v, K, V, n)[0], n), "the length is"),
    (gqa_float32, "compute in the inputs' dtype"),
    (gqa_attend_then_write, "write the new key and value first, then attend"),
    (gqa_new_key_left_out, "the new key and value are part of what the query sees"),
    (gqa_scale_by_d, "divided the scores by d"),
    (gqa_softmax_over_heads, "softmax ran over the query heads axis"),
], ids=["tiled-groups", "is-causal", "whole-buffer", "widened-copy", "unscaled", "per-kv-head", "no-length",
        "length-unchanged", "float32", "attend-then-write", "new-key-left-out", "scale-by-d",
        "softmax-over-heads"])
def test_09_gqa_step_rejects_with_a_diagnosis(wrong, message, capsys):
    _diagnosed("09.gqa_step", wrong, message, capsys)


# ----------------------------------------------------------------------------- 09.window_step


def window_step_ref(q, k, v, K, V, pos):
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    n = min(pos + 1, W)                         # slots 0..pos before the buffer fills, all W after
    scores = q @ K[:, :, :n].transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ V[:, :, :n]


def window_linear_index(q, k, v, K, V, pos):     # writes at pos: runs off the buffer once it is full
    K[:, :, pos] = k[:, :, 0]
    V[:, :, pos] = v[:, :, 0]
    return F.scaled_dot_product_attention(q, K[:, :, :pos + 1], V[:, :, :pos + 1])


def window_next_slot(q, k, v, K, V, pos):        # off by one: overwrites the slot after the oldest
    W = K.shape[2]
    K[:, :, (pos + 1) % W] = k[:, :, 0]
    V[:, :, (pos + 1) % W] = v[:, :, 0]
    return F.scaled_dot_product_attention(q, K, V)


def window_whole_buffer(q, k, v, K, V, pos):     # reads unwritten slots before the buffer fills
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    return F.scaled_dot_product_attention(q, K, V)


def window_up_to_slot(q, k, v, K, V, pos):       # treats the ring as a line: slots 0..pos % W only
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    return F.scaled_dot_product_attention(q, K[:, :, :pos % W + 1], V[:, :, :pos % W + 1])


def window_attend_then_write(q, k, v, K, V, pos):
    W = K.shape[2]
    if pos < W:  # before the buffer fills there is nothing to evict: this answer goes wrong after
        K[:, :, pos] = k[:, :, 0]
        V[:, :, pos] = v[:, :, 0]
        return F.scaled_dot_product_attention(q, K[:, :, :pos + 1], V[:, :, :pos + 1])
    out = F.scaled_dot_product_attention(q, K, V)
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    return out


def window_too_small(q, k, v, K, V, pos):        # leaves out the oldest token of a full window
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    keep = torch.arange(W) != (pos + 1) % W if pos >= W - 1 else torch.arange(W) <= pos
    return F.scaled_dot_product_attention(q, K[:, :, keep], V[:, :, keep])


def window_is_causal(q, k, v, K, V, pos):
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    n = min(pos + 1, W)
    return F.scaled_dot_product_attention(q, K[:, :, :n], V[:, :, :n], is_causal=True)


def window_unscaled(q, k, v, K, V, pos):
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    n = min(pos + 1, W)
    return torch.softmax(q @ K[:, :, :n].transpose(-2, -1), -1) @ V[:, :, :n]


def window_float32(q, k, v, K, V, pos):            # review 06-09-10, finding 6
    return window_step_ref(q, k, v, K, V, pos).float()


def window_new_token_forgotten(q, k, v, K, V, pos):  # finding 7: slots 0..pos - 1, the new token left out
    W = K.shape[2]
    K[:, :, pos % W] = k[:, :, 0]
    V[:, :, pos % W] = v[:, :, 0]
    n = min(max(pos, 1), W)
    return F.scaled_dot_product_attention(q, K[:, :, :n], V[:, :, :n])


def test_09_window_step_accepts_the_solution():
    _accepts("09.window_step", window_step_ref)


@pytest.mark.parametrize("wrong, message", [
    (window_linear_index, "slot pos mod W"),
    (window_next_slot, "must be written, in place, into slot"),
    (window_whole_buffer, "only slots 0.."),
    (window_up_to_slot, "wrapped around"),
    (window_attend_then_write, "write first, then attend"),
    (window_too_small, "the new one included"),
    (window_is_causal, "is_causal=True"),
    (window_unscaled, "not scaled"),
    (window_float32, "compute in the inputs' dtype"),
    (window_new_token_forgotten, "the window includes the new token itself"),
], ids=["linear-index", "next-slot", "whole-buffer", "up-to-slot", "attend-then-write", "too-small",
        "is-causal", "unscaled", "float32", "new-token-forgotten"])
def test_09_window_step_rejects_with_a_diagnosis(wrong, message, capsys):
    _diagnosed("09.window_step", wrong, message, capsys)


# ----------------------------------------------------------------------------- 09.left_padded_generate


def _padded(prompts, left=True):
    P = max(len(p) for p in prompts)
    rows = [[0] * (P - len(p)) + p if left else p + [0] * (P - len(p)) for p in prompts]
    return torch.tensor(rows)


def _generate(model, ids, keep, positions, steps, mask_of):
    new = []
    for _ in range(steps):
        logits = model(ids, positions, mask_of(keep))
        token = logits[:, -1].argmax(-1)
        new.append(token)
        ids = torch.cat([ids, token[:, None]], 1)
        keep = torch.cat([keep, torch.ones_like(keep[:, :1])], 1)
        positions = torch.cat([positions, positions[:, -1:] + 1], 1)
    return torch.stack(new, 1)


def _causal_and_keys(keep):
    T = keep.shape[1]
    return torch.ones(T, T, dtype=torch.bool).tril()[None] & keep[:, None, :]


def left_padded_generate_ref(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return _generate(model, ids, keep, positions, steps, _causal_and_keys)


def lp_right_padded(model, prompts, steps):
    ids = _padded(prompts, left=False)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return _generate(model, ids, keep, positions, steps, _causal_and_keys)


def lp_shared_positions(model, prompts, steps):        # what tfmlib's generate would do: arange for every row
    ids = _padded(prompts)
    keep = ids != 0
    positions = torch.arange(ids.shape[1]).expand_as(ids).clone()
    return _generate(model, ids, keep, positions, steps, _causal_and_keys)


def lp_positions_from_one(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    return _generate(model, ids, keep, keep.long().cumsum(1), steps, _causal_and_keys)


def lp_pads_attended(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return _generate(model, ids, keep, positions, steps,
                     lambda kp: torch.ones(kp.shape[1], kp.shape[1], dtype=torch.bool).tril().expand(
                         kp.shape[0], -1, -1))


def lp_not_causal(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return _generate(model, ids, keep, positions, steps,
                     lambda kp: kp[:, None, :].expand(-1, kp.shape[1], -1))


def lp_transposed(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    return _generate(model, ids, keep, positions, steps,
                     lambda kp: torch.ones(kp.shape[1], kp.shape[1], dtype=torch.bool).triu()[None]
                     & kp[:, None])


def lp_one_row_at_a_time(model, prompts, steps):        # the shortcut: no batch at all
    return torch.cat([left_padded_generate_ref(model, [p], steps) for p in prompts])


def lp_negative_pad_positions(model, prompts, steps):
    ids = _padded(prompts)
    keep = ids != 0
    return _generate(model, ids, keep, keep.long().cumsum(1) - 1, steps, _causal_and_keys)


def lp_with_prompt(model, prompts, steps):
    ids = _padded(prompts)
    return torch.cat([ids, left_padded_generate_ref(model, prompts, steps)], 1)


def lp_pads_never_unmasked_new(model, prompts, steps):  # the new column joins the mask as padding
    ids = _padded(prompts)
    keep = ids != 0
    positions = (keep.long().cumsum(1) - 1).clamp(min=0)
    new = []
    for _ in range(steps):
        token = model(ids, positions, _causal_and_keys(keep))[:, -1].argmax(-1)
        new.append(token)
        ids = torch.cat([ids, token[:, None]], 1)
        keep = torch.cat([keep, torch.zeros_like(keep[:, :1])], 1)
        positions = torch.cat([positions, positions[:, -1:] + 1], 1)
    return torch.stack(new, 1)


def lp_keep_from_ids(model, prompts, steps):       # finding 23: the padding re-derived from ids != PAD
    ids = _padded(prompts)
    new = []
    for _ in range(steps):
        keep = ids != 0
        positions = (keep.long().cumsum(1) - 1).clamp(min=0)
        token = model(ids, positions, _causal_and_keys(keep))[:, -1].argmax(-1)
        new.append(token)
        ids = torch.cat([ids, token[:, None]], 1)
    return torch.stack(new, 1)


def lp_padding_at_39(model, prompts, steps):       # padding at the last position: any position is allowed
    ids = _padded(prompts)
    keep = ids != 0
    positions = torch.where(keep, keep.long().cumsum(1) - 1, torch.full_like(ids, 39))
    return _generate(model, ids, keep, positions, steps, _causal_and_keys)


def test_09_left_padded_generate_accepts_the_solution():
    _accepts("09.left_padded_generate", left_padded_generate_ref)
    _accepts("09.left_padded_generate", lp_padding_at_39)


def test_09_a_checker_model_generates_pad_and_the_ids_shortcut_differs():
    """One of the checker's models may emit id 0; re-deriving the padding from the ids then gives other
    tokens than generating alone (review 2026-11-27-exercises-06-09-10, finding 23)."""
    model = _TinyLM(20, emits_pad=True)
    prompts = [[5, 11], [6], [3, 1, 7, 7, 2]]
    want = torch.tensor([model.alone(p, 5) for p in prompts])
    assert (want == 0).any()
    assert torch.equal(left_padded_generate_ref(_TinyLM(20, emits_pad=True), prompts, 5), want)
    assert not torch.equal(lp_keep_from_ids(_TinyLM(20, emits_pad=True), prompts, 5), want)


@pytest.mark.parametrize("wrong, message", [
    (lp_right_padded, "padded on the right"),
    (lp_shared_positions, "count from the batch's first column"),
    (lp_positions_from_one, "off by one"),
    (lp_pads_attended, "attend to the padding"),
    (lp_not_causal, "later tokens"),
    (lp_transposed, "transposed"),
    (lp_one_row_at_a_time, "as one batch"),
    (lp_negative_pad_positions, "positions must be in"),
    (lp_with_prompt, "without the prompt"),
    (lp_pads_never_unmasked_new, "step 1 differs"),
    (lp_keep_from_ids, "a generated token is a token even if its id is PAD_ID"),
], ids=["right-padded", "shared-positions", "positions-from-one", "pads-attended", "not-causal", "transposed",
        "one-row-at-a-time", "negative-pad-positions", "with-prompt", "new-tokens-masked", "keep-from-ids"])
def test_09_left_padded_generate_rejects_with_a_diagnosis(wrong, message, capsys):
    _diagnosed("09.left_padded_generate", wrong, message, capsys)


def test_09_tiny_model_sees_positions_and_padding():
    """The checker's model must be able to tell the mistakes apart by their outputs too: shifting the
    positions or unmasking the padding changes its greedy continuation of the checker's prompts."""
    model = _TinyLM(0)
    prompts = [[4, 7, 2, 9, 5], [6], [3, 3, 8]]
    want = torch.tensor([model.alone(p, 5) for p in prompts])
    assert torch.equal(left_padded_generate_ref(model, prompts, 5), want)
    for wrong in (lp_shared_positions, lp_pads_attended, lp_not_causal):
        assert not torch.equal(wrong(_TinyLM(0), prompts, 5), want), wrong.__name__
