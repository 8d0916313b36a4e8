"""tfmlib.decoding: greedy decoding stops at EOS, pads after it, agrees with the model's own
teacher-forced argmax, returns attention, and translate() handles unknown, empty and long input."""

import pytest
import torch
from test_seq2seq import SRC_V, TGT_V, random_batch
from torch import Tensor

from tfmlib.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab
from tfmlib.decoding import default_max_len, encode_sources, greedy_decode, translate
from tfmlib.rnn_attention import AttentionSeq2Seq
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, Seq2Seq, StepOutput


class ScriptedModel(EncoderDecoder):
    """Emits a fixed token sequence per row (then keeps repeating its last token)."""

    max_source_len = 50

    def __init__(self, scripts: list[list[int]], vocab_size: int = 10):
        super().__init__()
        self.scripts, self.vocab_size = scripts, vocab_size
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        return EncoderOutput(src[..., None].float(), src_mask, torch.zeros(src.shape[0], 1))

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        t = int(state[0, 0])
        self.calls += 1
        logits = torch.zeros(prev.shape[0], self.vocab_size)
        for i, script in enumerate(self.scripts):
            logits[i, script[min(t, len(script) - 1)]] = 1.0
        return StepOutput(logits, state + 1)


def test_greedy_stops_at_eos_and_pads_after_it():
    model = ScriptedModel([[5, 6, EOS_ID], [7, EOS_ID], [4, 4, 4, 4, 4, 4]])
    src = torch.full((3, 2), 5)
    mask = torch.ones(3, 2, dtype=torch.bool)
    out = greedy_decode(model, src, mask, max_len=4)
    assert out.tokens.tolist() == [[5, 6, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID], [4, 4, 4, 4]]
    assert out.lengths.tolist() == [2, 1, 4]
    assert out.attention is None


def test_greedy_stops_as_soon_as_every_row_has_ended():
    model = ScriptedModel([[5, EOS_ID], [EOS_ID]])
    out = greedy_decode(model, torch.full((2, 3), 5), torch.ones(2, 3, dtype=torch.bool), max_len=50)
    assert model.calls == 2 and out.tokens.shape == (2, 2)
    assert default_max_len(torch.tensor([[True, True, False], [True, True, True]])) == 16


@pytest.mark.parametrize("make", [
    lambda: Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12),
    lambda: AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10),
])
def test_greedy_equals_the_teacher_forced_argmax_of_its_own_output(make):
    torch.manual_seed(0)
    model = make()
    _, b = random_batch(21, batch=6)
    out = greedy_decode(model, b.src, b.src_mask, max_len=12, return_attention=True)
    tgt_in = torch.cat([torch.full((6, 1), BOS_ID), out.tokens[:, :-1]], dim=1)
    with torch.no_grad():
        argmax = model(b.src, b.src_mask, tgt_in).argmax(-1)
    for i in range(6):
        n = int(out.lengths[i])
        stop = min(n + 1, out.tokens.shape[1])  # up to and including EOS
        assert out.tokens[i, :stop].tolist() == argmax[i, :stop].tolist()
        assert torch.all(out.tokens[i, stop:] == PAD_ID)
    if isinstance(model, AttentionSeq2Seq):
        assert out.attention.shape == (6, out.tokens.shape[1], b.src.shape[1])
        assert torch.all(out.attention.masked_select(~b.src_mask[:, None, :]) == 0)
        assert model.training, "greedy_decode must restore the training mode"


def test_greedy_rejects_bad_input():
    model = Seq2Seq(SRC_V, TGT_V, embed=8, hidden=8, max_source_len=5)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        greedy_decode(model, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                      max_len=0)
    with pytest.raises(ValueError, match="empty batch"):
        greedy_decode(model, torch.ones(0, 3, dtype=torch.long), torch.ones(0, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="max_source_len=5"):
        greedy_decode(model, torch.ones(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool))


def test_translate_texts_unknown_words_and_errors():
    vocab = Vocab.build([["the", "dog", "sees", "a", "cat", "."]])
    want = [[vocab["the"], UNK_ID, vocab["sees"], vocab["."], EOS_ID]]
    assert encode_sources(["The zorglub sees."], vocab) == want
    torch.manual_seed(0)
    model = Seq2Seq(len(vocab), len(vocab), embed=8, hidden=8, max_source_len=6)
    out = translate(model, ["the dog sees a cat", "zorglub ."], vocab, vocab, max_len=5)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        translate(model, ["the dog", "   "], vocab, vocab)
    with pytest.raises(TypeError, match="single str"):
        translate(model, "the dog", vocab, vocab)
    with pytest.raises(TypeError, match="sentence 0 is a int"):
        translate(model, [3], vocab, vocab)
    with pytest.raises(ValueError, match="sentence 0 has 7 tokens .* max_source_len=6"):
        translate(model, ["the dog sees a cat ."], vocab, vocab)


def test_translate_batches_do_not_change_results():
    vocab = Vocab.build([["the", "dog", "sees", "a", "cat", "big", "."]])
    torch.manual_seed(1)
    model = AttentionSeq2Seq(len(vocab), len(vocab), embed=8, enc_hidden=4, hidden=8, attn_size=8)
    sentences = ["the dog .", "a big big cat sees the dog .", "cat", "the cat sees a dog ."]
    assert translate(model, sentences, vocab, vocab, batch_size=1, max_len=8) == \
        translate(model, sentences, vocab, vocab, batch_size=4, max_len=8)
