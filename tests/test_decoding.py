"""tfmlib.decoding: greedy decoding stops at EOS, pads after it, agrees with the model's own
teacher-forced argmax, returns attention, and translate() handles unknown, empty and long input.
Beam search: a beam of one is greedy, a wide beam is exhaustive, a narrow one can lose to greedy
(it is a heuristic), EOS ends a hypothesis, batching changes nothing, bad input fails clearly."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_seq2seq import SRC_V, TGT_V, random_batch
from torch import Tensor

from tfmlib.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocab, detokenize, make_batch, pad_sequences
from tfmlib.decoding import (
    beam_search,
    decode_length,
    default_max_len,
    encode_sources,
    greedy_decode,
    length_penalty,
    sequence_log_probs,
    translate,
)
from tfmlib.rnn_attention import AttentionSeq2Seq
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, Seq2Seq, StepOutput
from tfmlib.transformer import Transformer


class ScriptedModel(EncoderDecoder):
    """Emits a fixed token sequence per source row (then keeps repeating its last token).

    Its state is ``(row, step)`` per row, so it follows its rows when a decoder drops finished ones
    from the batch; ``batch_sizes`` records how many rows each call of ``decode_step`` ran on."""

    max_source_len = 50

    def __init__(self, scripts: list[list[int]], vocab_size: int = 10):
        super().__init__()
        self.scripts, self.vocab_size = scripts, vocab_size
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.batch_sizes: list[int] = []

    @property
    def calls(self) -> int:
        return len(self.batch_sizes)

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        rows = torch.arange(src.shape[0])
        return EncoderOutput(src[..., None].float(), src_mask, torch.stack([rows, torch.zeros_like(rows)], 1))

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        self.batch_sizes.append(prev.shape[0])
        logits = torch.zeros(prev.shape[0], self.vocab_size)
        for i, (row, t) in enumerate(state.tolist()):
            script = self.scripts[row]
            logits[i, script[min(t, len(script) - 1)]] = 1.0
        return StepOutput(logits, state + torch.tensor([0, 1]))


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
    assert out.tokens.tolist() == [[5, EOS_ID], [EOS_ID, PAD_ID]]


def test_greedy_runs_the_model_only_on_rows_still_decoding():
    model = ScriptedModel([[4, 4, 4, EOS_ID], [EOS_ID], [6, EOS_ID], [7, 7, 7, 7, 7, 7]])
    out = greedy_decode(model, torch.full((4, 2), 5), torch.ones(4, 2, dtype=torch.bool), max_len=6)
    assert model.batch_sizes == [4, 3, 2, 2, 1, 1], "a row that ended must leave the batch"
    assert out.tokens.tolist() == [[4, 4, 4, EOS_ID, PAD_ID, PAD_ID], [EOS_ID] + [PAD_ID] * 5,
                                   [6, EOS_ID] + [PAD_ID] * 4, [7] * 6]
    assert out.lengths.tolist() == [3, 0, 1, 6]
    assert default_max_len(torch.tensor([[True, True, False], [True, True, True]])) == 16


@pytest.mark.parametrize("make", [
    lambda: Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12),
    lambda: AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10),
    lambda: Transformer(SRC_V, TGT_V, d_model=16, heads=2, encoder_layers=1, decoder_layers=2, d_ff=24,
                        dropout=0.0),
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


class CopyModel(EncoderDecoder):
    """'Translates' a sentence into itself: step t emits source token t (the source's EOS last)."""

    max_source_len = 50

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        return EncoderOutput(src[..., None].float(), src_mask, torch.zeros(src.shape[0], 1, dtype=torch.long))

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        token = enc.memory[:, :, 0].long().gather(1, state.clamp(max=enc.memory.shape[1] - 1))[:, 0]
        return StepOutput(F.one_hot(token, self.vocab_size).float(), state + 1)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translate_returns_the_translations_in_the_order_asked(beam_size):
    vocab = Vocab.build([["the", "dog", "sees", "a", "cat", "big", "."]])
    sentences = ["the dog sees a big cat.", "a cat", "the big dog.", "dog", "a cat sees the dog."]
    # translate decodes in batches sorted by length, and must put each answer back in its place
    copied = translate(CopyModel(len(vocab)), sentences, vocab, vocab, batch_size=2, beam_size=beam_size)
    assert copied == sentences


# ----------------------------------------------------------------------------- beam search


def small_transformer_model(seed: int = 0, tgt_vocab: int = TGT_V) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(SRC_V, tgt_vocab, d_model=16, heads=2, encoder_layers=1, decoder_layers=2, d_ff=24,
                       dropout=0.0).double()


MODELS = {
    "seq2seq": lambda: Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12).double(),
    "attention": lambda: AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12,
                                          attn_size=10).double(),
    "transformer": small_transformer_model,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_beam_of_one_without_length_penalty_is_greedy(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    _, b = random_batch(31, batch=6)
    greedy = greedy_decode(model, b.src, b.src_mask, max_len=10)
    beam = beam_search(model, b.src, b.src_mask, beam_size=1, alpha=0.0, max_len=10)
    assert beam.tokens.tolist() == greedy.tokens.tolist()
    assert beam.lengths.tolist() == greedy.lengths.tolist()
    torch.testing.assert_close(beam.scores, sequence_log_probs(model, b.src, b.src_mask, greedy.tokens,
                                                               greedy.lengths).float(), atol=1e-5, rtol=0)


def test_sequence_log_probs_sums_the_step_log_probabilities():
    model = small_transformer_model(1)
    _, b = random_batch(32, batch=3)
    out = greedy_decode(model, b.src, b.src_mask, max_len=6)
    want = torch.zeros(3, dtype=torch.double)
    enc = model.encode(b.src, b.src_mask)
    state, prev = enc.state, torch.full((3,), BOS_ID)
    for t in range(out.tokens.shape[1]):
        step = model.decode_step(prev, state, enc)
        lp = torch.log_softmax(step.logits, -1).gather(1, out.tokens[:, t:t + 1])[:, 0]
        scored = t <= out.lengths  # the tokens before EOS, and the EOS itself
        want += torch.where(scored & (t < out.tokens.shape[1]), lp, torch.zeros_like(lp))
        state, prev = step.state, out.tokens[:, t]
    got = sequence_log_probs(model, b.src, b.src_mask, out.tokens, out.lengths)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_wide_beam_finds_the_exact_best_output(alpha):
    """With more beams than prefixes, beam search is exhaustive: it must return the output with the
    best (length-normalised) score among every possible output of up to max_len tokens."""
    import itertools

    V, max_len = 6, 4                        # ids 0..5, of which 2 is EOS
    model = small_transformer_model(2, tgt_vocab=V)
    src, mask = pad_sequences([[5, 6, 7, EOS_ID], [8, EOS_ID]])
    beam = beam_search(model, src, mask, beam_size=V ** (max_len - 1), alpha=alpha, max_len=max_len)
    words = [i for i in range(V) if i != EOS_ID]
    for b in range(2):
        best = -float("inf")
        for n in range(max_len):             # n words, then EOS
            for seq in itertools.product(words, repeat=n):
                tokens = torch.tensor([[*seq, EOS_ID]])
                s = sequence_log_probs(model, src[b:b + 1], mask[b:b + 1], tokens, torch.tensor([n]))
                best = max(best, float(s) / length_penalty(n + 1, alpha))
        assert float(beam.normalized[b]) == pytest.approx(best, abs=1e-4)


class TableModel(EncoderDecoder):
    """Next-token probabilities looked up from the prefix: a model small enough to reason about."""

    max_source_len = 10
    A, B, C = 4, 5, 6

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        return EncoderOutput(src[..., None].float(), src_mask, torch.zeros(src.shape[0], 0, dtype=torch.long))

    def probabilities(self, prefix: tuple[int, ...]) -> dict[int, float]:
        A, B, C = self.A, self.B, self.C
        table = {(): {A: 0.5, B: 0.4, C: 0.1}, (A,): {A: 0.3, EOS_ID: 0.25, B: 0.25, C: 0.2},
                 (A, A): {EOS_ID: 1.0}, (B,): {A: 0.5, B: 0.5}}
        return table.get(prefix, {EOS_ID: 0.5, A: 0.2, B: 0.2, C: 0.1})

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        prefix = torch.cat([state, prev[:, None]], 1)
        logits = torch.full((prev.shape[0], 8), -1e9)
        for i, row in enumerate(prefix[:, 1:].tolist()):
            for token, p in self.probabilities(tuple(row)).items():
                logits[i, token] = math.log(p)
        return StepOutput(logits, prefix)


def test_beam_search_is_a_heuristic_a_wider_beam_can_score_below_greedy():
    """Greedy: a (0.5), a (0.3), EOS (1.0): probability 0.15. A beam of two drops the prefix `a a`
    (0.15) for `b a` and `b b` (0.2 each), whose best endings are worth 0.1: beam search returns a
    less probable output than greedy. A beam of three keeps `a a` and finds 0.15 again."""
    model = TableModel()
    src, mask = torch.tensor([[5, EOS_ID]]), torch.ones(1, 2, dtype=torch.bool)
    greedy = greedy_decode(model, src, mask, max_len=6)
    assert greedy.tokens.tolist() == [[TableModel.A, TableModel.A, EOS_ID]]
    two = beam_search(model, src, mask, beam_size=2, alpha=0.0, max_len=6)
    three = beam_search(model, src, mask, beam_size=3, alpha=0.0, max_len=6)
    assert float(two.scores[0]) == pytest.approx(math.log(0.1))
    assert float(three.scores[0]) == pytest.approx(math.log(0.15))
    assert three.tokens.tolist() == greedy.tokens.tolist()


def test_beam_search_stops_a_hypothesis_at_eos_and_pads_after_it():
    model = ScriptedModel([[5, 6, EOS_ID], [7, EOS_ID]])
    out = beam_search(model, torch.full((2, 2), 5), torch.ones(2, 2, dtype=torch.bool), beam_size=3,
                      max_len=8, alpha=0.6)
    assert out.tokens.tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert out.lengths.tolist() == [2, 1]


def test_beam_search_runs_the_model_only_on_sentences_still_searching():
    model = ScriptedModel([[5, EOS_ID], [6, 6, 6, 6, EOS_ID], [EOS_ID]])
    out = beam_search(model, torch.full((3, 2), 5), torch.ones(3, 2, dtype=torch.bool), beam_size=2,
                      max_len=8, alpha=0.0)
    assert out.tokens.tolist() == [[5, EOS_ID, PAD_ID, PAD_ID, PAD_ID], [6, 6, 6, 6, EOS_ID],
                                   [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]]
    # 3 sentences x 2 prefixes; the third is done after step 1, the first after step 2
    assert model.batch_sizes == [6, 4, 2, 2, 2], "a sentence that is done must leave the batch"


def test_beam_search_returns_the_best_prefix_when_nothing_ends():
    model = ScriptedModel([[4, 4, 4, 4, 4, 4]])
    out = beam_search(model, torch.full((1, 2), 5), torch.ones(1, 2, dtype=torch.bool), beam_size=2,
                      max_len=3)
    assert out.tokens.tolist() == [[4, 4, 4]] and out.lengths.tolist() == [3]


def test_beam_search_batches_do_not_change_results():
    model = small_transformer_model(3)
    examples, b = random_batch(33, batch=4)
    together = beam_search(model, b.src, b.src_mask, beam_size=3, max_len=7)
    for i, ex in enumerate(examples):
        alone = make_batch([ex])
        one = beam_search(model, alone.src, alone.src_mask, beam_size=3, max_len=7)
        n = int(one.lengths[0])
        assert together.tokens[i, : n + 1].tolist() == one.tokens[0, : n + 1].tolist()
        assert float(together.scores[i]) == pytest.approx(float(one.scores[0]), abs=1e-6)


def test_length_penalty_and_beam_errors():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        length_penalty(3, -0.1)
    model = Seq2Seq(SRC_V, TGT_V, embed=8, hidden=8, max_source_len=5)
    src, mask = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="beam_size must be a positive int"):
        beam_search(model, src, mask, beam_size=0)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        beam_search(model, src, mask, max_len=0)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        beam_search(model, src, mask, alpha=-1.0)
    with pytest.raises(ValueError, match="empty batch"):
        beam_search(model, src[:0], mask[:0])
    with pytest.raises(ValueError, match="max_source_len=5"):
        beam_search(model, torch.ones(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool))


def test_translate_with_a_beam():
    vocab = Vocab.build([["the", "dog", "sees", "a", "cat", "."]])
    torch.manual_seed(0)
    model = Transformer(len(vocab), len(vocab), d_model=16, heads=2, encoder_layers=1, decoder_layers=1,
                        d_ff=16)
    out = translate(model, ["the dog sees a cat .", "a cat"], vocab, vocab, beam_size=3, max_len=6)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)


# ----------------------------------------------------------------------------- the model's limits (issue 14)


def never_stopping_transformer(max_len: int = 12) -> Transformer:
    """A Transformer that has not learnt to stop: EOS is never the most probable token."""
    torch.manual_seed(0)
    model = Transformer(SRC_V, TGT_V, d_model=16, heads=2, encoder_layers=1, decoder_layers=1, d_ff=16,
                        dropout=0.0, max_len=max_len)
    with torch.no_grad():
        model.generator.bias[EOS_ID] = -1e4
    return model


def test_default_max_len_is_clamped_to_the_models_limit():
    """Issue 14, bug 4: the default 2*S+10 ignored the model's max_len, so greedy_decode, beam_search and
    translate raised part-way ("a target of 13 tokens is longer than this model's max_len=12")."""
    model = never_stopping_transformer(12)
    src = torch.randint(4, SRC_V, (2, 4))
    src_mask = torch.ones(2, 4, dtype=torch.bool)
    assert default_max_len(src_mask) == 18 and default_max_len(src_mask, 12) == 12
    assert decode_length(model, src_mask, None) == 12 and decode_length(model, src_mask, 5) == 5
    out = greedy_decode(model, src, src_mask)
    assert out.tokens.shape == (2, 12) and out.lengths.tolist() == [12, 12], "clamped to max_len=12"
    beam = beam_search(model, src, src_mask, beam_size=2)
    assert beam.tokens.shape == (2, 12), "beam search clamped to max_len=12"
    vocab = Vocab.build([[f"w{i}" for i in range(SRC_V - 4)]])
    tgt_vocab = Vocab.build([[f"v{i}" for i in range(TGT_V - 4)]])
    texts = translate(model, ["w1 w2 w3", "w4"], vocab, tgt_vocab)            # used to raise part-way
    ids = [vocab.encode(["w4"], eos=True)]
    src1, mask1 = pad_sequences(ids)
    assert texts[1] == detokenize(tgt_vocab.decode(greedy_decode(model, src1, mask1).tokens[0].tolist()))


@pytest.mark.parametrize("decode", ["greedy", "beam", "translate"])
def test_an_explicit_max_len_above_the_models_limit_is_refused_before_decoding(decode):
    model = never_stopping_transformer(12)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the error must come before any decoding step")

    model.decode_step = must_not_run
    src, src_mask = torch.randint(4, SRC_V, (1, 4)), torch.ones(1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="max_len=13 is more than this model's max_target_len=12"):
        if decode == "greedy":
            greedy_decode(model, src, src_mask, max_len=13)
        elif decode == "beam":
            beam_search(model, src, src_mask, max_len=13)
        else:
            vocab = Vocab.build([["a"]])
            translate(model, ["a"], vocab, Vocab.build([[f"v{i}" for i in range(TGT_V - 4)]]), max_len=13)


def test_translate_checks_the_vocabularies_against_the_model_up_front():
    """Issue 14, bug 5: a target Vocab smaller than the model's vocabulary failed only after the whole
    batch was decoded."""
    model = never_stopping_transformer()

    def must_not_run(*args, **kwargs):
        raise AssertionError("the error must come before any decoding step")

    model.decode_step = must_not_run
    small = Vocab.build([["a", "b"]])                                         # 6 tokens < TGT_V
    with pytest.raises(ValueError, match=rf"tgt_vocab has 6 tokens but .* tgt_vocab_size={TGT_V}"):
        translate(model, ["a b"], small, small)
    big = Vocab.build([[f"w{i}" for i in range(SRC_V)]])
    with pytest.raises(ValueError, match=rf"src_vocab has {SRC_V + 4} tokens .* src_vocab_size={SRC_V}"):
        translate(model, ["w1"], big, Vocab.build([[f"v{i}" for i in range(TGT_V - 4)]]))


def test_decoding_refuses_a_model_without_room_for_the_special_tokens():
    """The Transformer refuses such a vocabulary at construction; any other model is checked when it
    decodes, instead of failing with a raw IndexError."""
    model = Seq2Seq(SRC_V, 2, embed=8, hidden=8)
    src, src_mask = torch.randint(4, SRC_V, (1, 3)), torch.ones(1, 3, dtype=torch.bool)
    for decode in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match="tgt_vocab_size=2 has no room for the special tokens"):
            decode(model, src, src_mask)
