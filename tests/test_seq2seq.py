"""tfmlib.seq2seq: padding never leaks into the encoder or the loss, the fast decoder paths equal
the step-by-step ones, teacher forcing means what it says, training is reproducible, bad input fails."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tfmlib.data import BOS_ID, EOS_ID, Batch, Vocab, make_batch, pad_sequences
from tfmlib.seq2seq import (
    EncoderDecoder,
    GRUEncoder,
    Seq2Seq,
    check_source,
    count_parameters,
    train_translator,
    translation_loss,
)

SRC_V, TGT_V = 23, 29


def random_batch(seed: int, batch: int = 4, max_len: int = 9):
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(batch):
        n_src, n_tgt = (int(v) for v in torch.randint(1, max_len, (2,), generator=g))
        examples.append((torch.randint(4, SRC_V, (n_src,), generator=g).tolist(),
                         torch.randint(4, TGT_V, (n_tgt,), generator=g).tolist()))
    return examples, make_batch(examples)


def small_seq2seq(seed: int = 0, **kw) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12, **kw).double()


# ----------------------------------------------------------------------------- check_source


def test_check_source_accepts_a_batch_and_rejects_bad_ones():
    _, b = random_batch(0)
    check_source(b.src, b.src_mask, "t")
    with pytest.raises(ValueError, match="src must be"):
        check_source(b.src[0], b.src_mask[0], "t")
    with pytest.raises(TypeError, match="integer token ids"):
        check_source(b.src.float(), b.src_mask, "t")
    with pytest.raises(ValueError, match="must have src's shape"):
        check_source(b.src, b.src_mask[:, :-1], "t")
    with pytest.raises(TypeError, match="bool"):
        check_source(b.src, b.src_mask.long(), "t")
    with pytest.raises(ValueError, match="empty batch"):
        check_source(b.src[:0], b.src_mask[:0], "t")
    mask = b.src_mask.clone()
    mask[1] = False
    with pytest.raises(ValueError, match=r"row\(s\) \[1\] have no tokens"):
        check_source(b.src, mask, "t")
    holes = torch.ones_like(b.src_mask)
    holes[0, 0] = False
    with pytest.raises(ValueError, match="prefix"):
        check_source(b.src, holes, "t")
    longest = int(b.src_mask.sum(1).max())
    with pytest.raises(ValueError, match=f"{longest} tokens .* max_source_len={longest - 1}"):
        check_source(b.src, b.src_mask, "t", max_source_len=longest - 1)
    check_source(b.src, b.src_mask, "t", max_source_len=longest)


def test_models_check_their_input_and_arguments():
    model = small_seq2seq()
    _, b = random_batch(1)
    with pytest.raises(ValueError, match="tgt_in must be"):
        model(b.src, b.src_mask, b.tgt_in[:2])
    with pytest.raises(ValueError, match="teacher_forcing"):
        model(b.src, b.src_mask, b.tgt_in, teacher_forcing=1.5)
    with pytest.raises(ValueError, match="max_source_len"):
        Seq2Seq(SRC_V, TGT_V, embed=8, hidden=8, max_source_len=2)(b.src, b.src_mask, b.tgt_in)
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        Seq2Seq(SRC_V, TGT_V, hidden=0)


# ----------------------------------------------------------------------------- padding


@pytest.mark.parametrize("bidirectional", [False, True])
def test_encoder_ignores_padding(bidirectional):
    torch.manual_seed(0)
    enc = GRUEncoder(SRC_V, 6, 5, bidirectional=bidirectional).double()
    examples, b = random_batch(2, batch=5)
    states, final = enc(b.src, b.src_mask)
    assert states.shape == (5, b.src.shape[1], 5 * enc.directions)
    assert torch.all(states[~b.src_mask] == 0), "padded positions must have zero states"
    for i, (src, _) in enumerate(examples):
        alone, alone_mask = pad_sequences([src + [EOS_ID]])
        s1, f1 = enc(alone, alone_mask)
        n = len(src) + 1
        torch.testing.assert_close(states[i, :n], s1[0])
        torch.testing.assert_close(final[:, i], f1[:, 0])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_seq2seq_logits_of_a_sentence_do_not_depend_on_its_batch(bidirectional):
    model = small_seq2seq(bidirectional=bidirectional)
    examples, b = random_batch(3, batch=5)
    logits = model(b.src, b.src_mask, b.tgt_in)
    for i, ex in enumerate(examples):
        one = make_batch([ex])
        alone = model(one.src, one.src_mask, one.tgt_in)
        T = one.tgt_in.shape[1]
        torch.testing.assert_close(logits[i, :T], alone[0])


def test_translation_loss_ignores_padding_and_counts_real_tokens():
    model = small_seq2seq()
    examples, b = random_batch(4, batch=4)
    loss, n = translation_loss(model, b)
    assert n == sum(len(t) + 1 for _, t in examples)  # each target plus its EOS
    total = 0.0
    for ex in examples:
        l1, n1 = translation_loss(model, make_batch([ex]))
        total += l1.item() * n1
    assert loss.item() == pytest.approx(total / n, rel=1e-9)
    with pytest.raises(TypeError, match="expected a Batch"):
        translation_loss(model, (b.src, b.tgt_in))


# ----------------------------------------------------------------------------- decoder paths


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fast_teacher_forced_decoder_equals_the_step_loop(bidirectional):
    model = small_seq2seq(bidirectional=bidirectional)
    _, b = random_batch(5)
    enc = model.encode(b.src, b.src_mask)
    fast = model.decode_teacher_forced(b.tgt_in, enc)
    slow = EncoderDecoder.decode_teacher_forced(model, b.tgt_in, enc)
    torch.testing.assert_close(fast, slow)
    # and their gradients
    g_fast = torch.autograd.grad(fast.square().sum(), model.decoder.weight_hh_l0)[0]
    enc = model.encode(b.src, b.src_mask)
    g_slow = torch.autograd.grad(EncoderDecoder.decode_teacher_forced(model, b.tgt_in, enc).square().sum(),
                                 model.decoder.weight_hh_l0)[0]
    torch.testing.assert_close(g_fast, g_slow)


def test_free_running_feeds_back_the_models_own_argmax():
    model = small_seq2seq(seed=1)
    _, b = random_batch(6)
    free = model(b.src, b.src_mask, b.tgt_in, teacher_forcing=0.0)
    # Re-run teacher-forced on the model's own predictions: the logits must be the same.
    own = torch.cat([torch.full_like(b.tgt_in[:, :1], BOS_ID), free.argmax(-1)[:, :-1]], dim=1)
    torch.testing.assert_close(model(b.src, b.src_mask, own), free)
    # teacher forcing 1.0 through the loop path (p = 1 - tiny) equals the fast path
    almost = model(b.src, b.src_mask, b.tgt_in, teacher_forcing=1.0 - 1e-12)
    torch.testing.assert_close(almost, model(b.src, b.src_mask, b.tgt_in))
    assert not torch.allclose(free, almost), "free running should differ from teacher forcing"


def test_the_decoder_sees_the_source_only_through_the_summary():
    model = small_seq2seq(seed=2)
    _, b = random_batch(7)
    enc = model.encode(b.src, b.src_mask)
    # Replace the per-position memory by noise: a Seq2Seq decoder must not notice.
    noisy = enc._replace(memory=torch.randn_like(enc.memory))
    torch.testing.assert_close(model.decode_teacher_forced(b.tgt_in, enc),
                               model.decode_teacher_forced(b.tgt_in, noisy))
    changed = enc._replace(context=enc.context + 1)
    assert not torch.allclose(model.decode_teacher_forced(b.tgt_in, enc),
                              model.decode_teacher_forced(b.tgt_in, changed))


# ----------------------------------------------------------------------------- training


def toy_dataset(n: int = 64):
    """Copy task: the target is the source with ids shifted, a task a tiny model learns quickly."""
    from tfmlib.data import TranslationDataset

    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(8)]
    pairs = []
    for _ in range(n):
        k = int(torch.randint(2, 5, (1,), generator=g))
        idx = torch.randint(0, 8, (k,), generator=g).tolist()
        pairs.append((" ".join(words[i] for i in idx), " ".join(words[(i + 1) % 8] for i in idx)))
    vocab = Vocab.build([p[0].split() for p in pairs] + [p[1].split() for p in pairs])
    return TranslationDataset(pairs, vocab, vocab), vocab


def test_train_translator_learns_and_is_reproducible():
    ds, vocab = toy_dataset()
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Seq2Seq(len(vocab), len(vocab), embed=16, hidden=32)
        history, opt = train_translator(model, ds, epochs=12, batch_size=16, lr=1e-2, verbose=False)
        runs.append(history.step_loss)
    assert runs[0] == runs[1], "the same seed must give the same training run"
    losses = [e["train_loss"] for e in history.epochs]
    assert losses[-1] < 0.5 * losses[0], f"training did not reduce the loss: {losses}"
    assert isinstance(opt, torch.optim.Adam)


def test_count_parameters():
    model = small_seq2seq()
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())
    parts = count_parameters(model, by_child=True)
    assert sum(parts.values()) == count_parameters(model) and "encoder" in parts


def test_ids_outside_the_vocabulary_get_a_clear_error():
    model = small_seq2seq()
    _, b = random_batch(8)
    bad_src = b.src.clone()
    bad_src[0, 0] = SRC_V + 5
    with pytest.raises(ValueError, match=f"src holds the id {SRC_V + 5}, outside the vocabulary of {SRC_V}"):
        model(bad_src, b.src_mask, b.tgt_in)
    bad_tgt = b.tgt_in.clone()
    bad_tgt[0, 0] = -1
    with pytest.raises(ValueError, match=f"tgt_in holds the id -1, outside the vocabulary of {TGT_V}"):
        model(b.src, b.src_mask, bad_tgt)


# ----------------------------------------------------------------------------- no reads back per step
# On a GPU every read of a tensor's value (int(), bool(), .tolist(), .cpu(), torch.equal) makes the
# host wait for the device. These tests record such calls with a TorchFunctionMode on the CPU.
READS = {"__int__", "__bool__", "__float__", "__index__", "item", "tolist", "cpu", "equal", "numpy"}


class ValueReads(TorchFunctionMode):
    """Records the value reads (of tensors other than CPU-only bookkeeping) made inside it."""

    def __init__(self, ignore: tuple = ()):
        super().__init__()
        self.reads: list[str] = []
        self.ignore = ignore

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in READS and not any(args and args[0] is t for t in self.ignore):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def three_families():
    from tfmlib.rnn_attention import AttentionSeq2Seq
    from tfmlib.transformer import Transformer

    torch.manual_seed(0)
    return [Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12, bidirectional=True),
            AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=8, hidden=12, attn_size=8),
            Transformer(SRC_V, TGT_V, d_model=8, heads=2, encoder_layers=1, decoder_layers=1, d_ff=16,
                        dropout=0.0)]


@pytest.mark.parametrize("family", [0, 1, 2])
def test_translation_loss_reads_nothing_back_from_a_made_batch(family):
    model = three_families()[family]
    _, batch = random_batch(3, batch=5)
    by_hand = Batch(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, batch.tgt_mask)
    with ValueReads() as seen:
        loss, n = translation_loss(model, batch)
    # PyTorch's own RNN argument check reads the packed batch sizes, which live on the CPU
    # whatever the device; nothing else may be read.
    assert set(seen.reads) <= {"__int__"} and len(seen.reads) <= 1, \
        f"{type(model).__name__}: translation_loss read values back: {seen.reads}"
    with ValueReads() as seen_by_hand:
        loss_by_hand, n_by_hand = translation_loss(model, by_hand)
    assert len(seen_by_hand.reads) > len(seen.reads), "a batch without facts must still be checked"
    assert n == n_by_hand == int(batch.tgt_mask.sum()), "token counts differ"
    assert torch.equal(loss, loss_by_hand), "host facts changed the loss"


@pytest.mark.parametrize("family", [0, 1, 2])
def test_host_checked_batches_still_fail_clearly(family):
    model = three_families()[family]
    name = type(model).__name__
    bad_src = make_batch([([4, SRC_V], [5]), ([6], [7, 8])])
    with pytest.raises(ValueError, match=rf"{name}: src holds the id {SRC_V}, outside the vocabulary"):
        translation_loss(model, bad_src)
    bad_tgt = make_batch([([4], [5, TGT_V + 3])])
    with pytest.raises(ValueError, match=rf"{name}: tgt_in holds the id {TGT_V + 3}"):
        translation_loss(model, bad_tgt)
    model.max_source_len = 3
    too_long = make_batch([([4, 5, 6, 7], [5])])
    with pytest.raises(ValueError, match=rf"{name}: a source of 5 tokens .* max_source_len=3"):
        translation_loss(model, too_long)
    # outside translation_loss the checks read the tensors as before
    with pytest.raises(ValueError, match="outside the vocabulary"):
        check_source(bad_src.src, bad_src.src_mask, "t", vocab_size=SRC_V)


def test_gru_encoder_equals_the_packed_reference_and_uses_host_lengths():
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from tfmlib.seq2seq import host_checked

    torch.manual_seed(1)
    enc = GRUEncoder(SRC_V, 6, 5, bidirectional=True).double()
    _, batch = random_batch(4, batch=7)
    states, final = enc(batch.src, batch.src_mask)
    packed = pack_padded_sequence(enc.embed(batch.src), batch.src_mask.sum(1), batch_first=True,
                                  enforce_sorted=False)
    ref_states, ref_final = enc.rnn(packed)
    ref_states, _ = pad_packed_sequence(ref_states, batch_first=True, total_length=batch.src.shape[1])
    assert torch.equal(states, ref_states) and torch.equal(final, ref_final), \
        "sorting on the host changed the encoder's output"
    with host_checked(batch, "t") as used:
        lengths = batch.host_facts.src_lengths
        with ValueReads() as seen:
            enc(batch.src, batch.src_mask)
    assert used and lengths, "the batch's facts were not used"
    assert "cpu" not in seen.reads and "tolist" not in seen.reads, f"lengths read back: {seen.reads}"


def test_train_translator_routes_a_gru_model_off_mps(capsys):
    # On a machine without MPS, asking for it would fail at model.to("mps"); the routing moves
    # the GRU model to the CPU first, so this runs anywhere and must say so.
    vocab = Vocab.build([["a", "b", "c"]])
    from tfmlib.data import TranslationDataset

    data = TranslationDataset([("a b", "b a"), ("c", "c"), ("a c", "c a")] * 4, vocab, vocab)
    model = Seq2Seq(len(vocab), len(vocab), embed=4, hidden=4)
    history, _ = train_translator(model, data, epochs=1, batch_size=4, lr=1e-3, device="mps",
                                  verbose=False)
    assert len(history.step_loss) == 3, "training should have run on the CPU"
    assert next(model.parameters()).device.type == "cpu", "the model must be left on the CPU"
    out = capsys.readouterr().out
    assert "trains on the CPU, not mps" in out and "pytorch/pytorch/issues/102911" in out, out
