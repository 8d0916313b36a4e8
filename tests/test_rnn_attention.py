"""tfmlib.rnn_attention: padded positions get exactly zero weight, the scores are the papers'
formulas, the fast decoder path equals the step loop, the self-attentive embedding and its penalty."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_seq2seq import SRC_V, TGT_V, random_batch

from tfmlib.data import EOS_ID, make_batch, pad_sequences
from tfmlib.rnn_attention import (
    AdditiveScore,
    AttentionSeq2Seq,
    DotScore,
    GeneralScore,
    SelfAttentiveClassifier,
    SelfAttentiveEncoder,
    attention_penalty,
    masked_softmax,
)
from tfmlib.seq2seq import EncoderDecoder


def small_attention(score: str = "additive", seed: int = 0) -> AttentionSeq2Seq:
    torch.manual_seed(seed)
    return AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10,
                            score=score).double()


# ----------------------------------------------------------------------------- masked softmax


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 10_000))
def test_masked_softmax_zero_on_padding_and_sums_to_one(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, length, generator=g, dtype=torch.double) * 5
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None] < lengths[:, None]
    w = masked_softmax(scores, mask)
    assert torch.all(w[~mask] == 0), "a padded position must get exactly zero weight"
    torch.testing.assert_close(w.sum(-1), torch.ones(batch, dtype=torch.double))
    for i in range(batch):  # on the real positions it is the ordinary softmax
        n = int(lengths[i])
        torch.testing.assert_close(w[i, :n], torch.softmax(scores[i, :n], -1))


def test_masked_softmax_fully_masked_row_is_zero_without_nan_gradients():
    scores = torch.randn(3, 5, requires_grad=True)
    mask = torch.tensor([[True] * 5, [False] * 5, [True, True, False, False, False]])
    w = masked_softmax(scores, mask)
    assert torch.all(w[1] == 0)
    (w * torch.randn(3, 5)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1] == 0) and torch.all(scores.grad[2, 2:] == 0)


def test_masked_softmax_rejects_bad_masks():
    with pytest.raises(TypeError, match="bool"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask \(2, 4\) does not broadcast to scores \(2, 3\)"):
        masked_softmax(torch.randn(2, 3), torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- scores


def test_scores_are_the_papers_formulas():
    torch.manual_seed(0)
    B, S, Q, K, D = 3, 5, 4, 6, 7
    query, memory = torch.randn(B, Q, dtype=torch.double), torch.randn(B, S, K, dtype=torch.double)
    add = AdditiveScore(Q, K, D).double()
    gen = GeneralScore(Q, K).double()
    got_add = add(query, add.prepare(memory))
    got_gen = gen(query, gen.prepare(memory))
    for b in range(B):
        for j in range(S):
            pre = add.W.weight @ query[b] + add.U.weight @ memory[b, j] + add.U.bias
            e = add.v.weight[0] @ torch.tanh(pre)
            torch.testing.assert_close(got_add[b, j], e)
            torch.testing.assert_close(got_gen[b, j], query[b] @ gen.W_a.weight @ memory[b, j])
    dot = DotScore(K, K)
    q2 = torch.randn(B, K, dtype=torch.double)
    torch.testing.assert_close(dot(q2, dot.prepare(memory)), torch.einsum("bk,bsk->bs", q2, memory))
    with pytest.raises(ValueError, match="must be equal for a dot product"):
        DotScore(Q, K)


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("score", ["additive", "dot", "general"])
def test_padded_source_positions_get_exactly_zero_weight(score):
    model = AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10, score=score)
    _, b = random_batch(11, batch=5)
    weights = model.attention_weights(b.src, b.src_mask, b.tgt_in)   # (B, T, S)
    assert weights.shape == (5, b.tgt_in.shape[1], b.src.shape[1])
    assert torch.all(weights.masked_select(~b.src_mask[:, None, :]) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))


@pytest.mark.parametrize("score", ["additive", "dot", "general"])
def test_attention_fast_path_equals_step_loop_and_ignores_padding(score):
    model = small_attention(score)
    examples, b = random_batch(12, batch=5)
    enc = model.encode(b.src, b.src_mask)
    fast = model.decode_teacher_forced(b.tgt_in, enc)
    torch.testing.assert_close(fast, EncoderDecoder.decode_teacher_forced(model, b.tgt_in, enc))
    for i, ex in enumerate(examples):
        one = make_batch([ex])
        T = one.tgt_in.shape[1]
        torch.testing.assert_close(fast[i, :T], model(one.src, one.src_mask, one.tgt_in)[0])


def test_context_is_the_weighted_sum_of_annotations_over_the_source_index():
    model = small_attention()
    _, b = random_batch(13)
    enc = model.encode(b.src, b.src_mask)
    context, weights = model.attend(enc.state, enc)
    want = torch.stack([sum(weights[i, j] * enc.memory[i, j] for j in range(b.src.shape[1]))
                        for i in range(b.src.shape[0])])
    torch.testing.assert_close(context, want)


def test_initial_state_reads_the_backward_encoder_at_the_first_word():
    model = small_attention()
    src, mask = pad_sequences([[5, 6, 7, EOS_ID]])
    enc = model.encode(src, mask)
    annotations = enc.memory  # (1, S, 2 * enc_hidden): [forward; backward]
    backward_at_first = annotations[0, 0, model.encoder.hidden:]
    torch.testing.assert_close(enc.state[0], torch.tanh(model.init_state(backward_at_first)))


def test_attention_model_rejects_bad_arguments():
    with pytest.raises(ValueError, match="score must be one of"):
        AttentionSeq2Seq(SRC_V, TGT_V, score="cosine")
    with pytest.raises(ValueError, match="needs hidden == 2 \\* enc_hidden; got hidden=12, enc_hidden=8"):
        AttentionSeq2Seq(SRC_V, TGT_V, enc_hidden=8, hidden=12, score="dot")
    with pytest.raises(ValueError, match="enc_hidden must be a positive int"):
        AttentionSeq2Seq(SRC_V, TGT_V, enc_hidden=0)


# ----------------------------------------------------------------------------- Lin et al. 2017


def test_self_attentive_encoder_shapes_and_masking():
    torch.manual_seed(0)
    enc = SelfAttentiveEncoder(SRC_V, embed=8, hidden=5, attn_size=7, hops=3)
    _, b = random_batch(14, batch=4)
    M, A = enc(b.src, b.src_mask)
    assert M.shape == (4, 3, 10) and A.shape == (4, 3, b.src.shape[1])
    assert torch.all(A.masked_select(~b.src_mask[:, None, :]) == 0)
    torch.testing.assert_close(A.sum(-1), torch.ones(4, 3))
    H, _ = enc.encoder(b.src, b.src_mask)
    torch.testing.assert_close(M, torch.einsum("brs,bsd->brd", A, H))
    clf = SelfAttentiveClassifier(SRC_V, 3, embed=8, hidden=5, attn_size=7, hops=2, mlp=9)
    logits, A2 = clf(b.src, b.src_mask)
    assert logits.shape == (4, 3) and A2.shape == (4, 2, b.src.shape[1])


def test_attention_penalty_values():
    one_hot_distinct = torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]])
    assert attention_penalty(one_hot_distinct).item() == 0.0
    same_uniform = torch.full((1, 2, 2), 0.5)  # A A^T = all 0.5: (0.5 - 1)^2 * 2 + 0.5^2 * 2
    assert attention_penalty(same_uniform).item() == pytest.approx(1.0)
    same_one_hot = torch.tensor([[[1.0, 0], [1.0, 0]]])  # off-diagonal 1: penalty 2
    assert attention_penalty(same_one_hot).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="must be"):
        attention_penalty(torch.ones(2, 3))


def test_attention_weights_runs_in_eval_mode_and_checks_its_input():
    torch.manual_seed(0)
    model = AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10, dropout=0.5)
    _, b = random_batch(15)
    first = model.attention_weights(b.src, b.src_mask, b.tgt_in)
    assert model.training, "the training mode must be restored"
    torch.testing.assert_close(first, model.attention_weights(b.src, b.src_mask, b.tgt_in))  # no dropout
    with pytest.raises(ValueError, match="tgt_in must be"):
        model.attention_weights(b.src, b.src_mask, b.tgt_in[:1])
    bad = b.src.clone()
    bad[0, 0] = SRC_V
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.attention_weights(bad, b.src_mask, b.tgt_in)
