"""tfmlib.rnn: scratch cells equal PyTorch's, the unrolled GRU equals the recurrence, bad input fails."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tfmlib.data import BOS_ID, EOS_ID, PAD_ID
from tfmlib.rnn import (
    MPS_RNN_ISSUES,
    GRUCellScratch,
    GRULanguageModel,
    GRUScratch,
    RNNCellScratch,
    RNNLanguageModel,
    check_step_inputs,
    collate_lm,
    copy_gru_weights,
    copy_rnn_cell_weights,
    lm_loss,
    recurrent_device,
    unrolled_gru_state,
    unrolled_gru_weights,
)

# ----------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_rnn_cell_equals_torch(seed):
    g = torch.Generator().manual_seed(seed)
    I, H, B = (int(v) for v in torch.randint(1, 12, (3,), generator=g))
    torch.manual_seed(seed)
    ref = nn.RNNCell(I, H).double()
    mine = copy_rnn_cell_weights(ref, RNNCellScratch(I, H).double())
    x = torch.randn(B, I, dtype=torch.double, requires_grad=True)
    h = torch.randn(B, H, dtype=torch.double)
    torch.testing.assert_close(mine(x, h), ref(x, h))
    torch.testing.assert_close(mine(x), ref(x))  # h=None means zeros in both
    gx_ref, = torch.autograd.grad(ref(x, h).square().sum(), x)
    gx_mine, = torch.autograd.grad(mine(x, h).square().sum(), x)
    torch.testing.assert_close(gx_mine, gx_ref)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("batch_first", [True, False])
def test_gru_scratch_equals_torch_forward_and_gradients(seed, batch_first):
    g = torch.Generator().manual_seed(seed)
    I, H, B, T = (int(v) for v in torch.randint(1, 10, (4,), generator=g))
    torch.manual_seed(seed)
    ref = nn.GRU(I, H, batch_first=batch_first).double()
    mine = GRUScratch(I, H, batch_first=batch_first).double().copy_from_torch(ref)
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(*shape, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(B, H, dtype=torch.double, requires_grad=True)
    out_ref, h_ref = ref(x, h0[None])
    out_mine, h_mine = mine(x, h0)
    torch.testing.assert_close(out_mine, out_ref)
    torch.testing.assert_close(h_mine, h_ref[0])
    # gradients with respect to the inputs, the initial state and every weight
    w = torch.randn_like(out_ref)
    ref_params = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0]
    mine_params = dict(mine.cell.named_parameters())
    g_ref = torch.autograd.grad((out_ref * w).sum() + h_ref.sum(), [x, h0, *ref_params])
    g_mine = torch.autograd.grad((out_mine * w).sum() + h_mine.sum(), [x, h0, *mine_params.values()])
    torch.testing.assert_close(g_mine[0], g_ref[0])
    torch.testing.assert_close(g_mine[1], g_ref[1])
    grads = dict(zip(mine_params, g_mine[2:], strict=True))
    for k, gate in enumerate("rzn"):  # PyTorch stacks the gates as [r; z; n]
        rows = slice(k * H, (k + 1) * H)
        torch.testing.assert_close(grads[f"W_i{gate}.weight"], g_ref[2][rows])
        torch.testing.assert_close(grads[f"W_h{gate}.weight"], g_ref[3][rows])
        torch.testing.assert_close(grads[f"W_i{gate}.bias"], g_ref[4][rows])
        torch.testing.assert_close(grads[f"W_h{gate}.bias"], g_ref[5][rows])


def test_gru_cell_copies_from_grucell_and_second_layer():
    torch.manual_seed(0)
    ref = nn.GRUCell(3, 4).double()
    cell = copy_gru_weights(ref, GRUCellScratch(3, 4).double())
    x, h = torch.randn(5, 3, dtype=torch.double), torch.randn(5, 4, dtype=torch.double)
    torch.testing.assert_close(cell(x, h), ref(x, h))
    two = nn.GRU(3, 4, num_layers=2, batch_first=True).double()
    xs = torch.randn(2, 6, 3, dtype=torch.double)
    out, _ = two(xs)
    first = GRUScratch(3, 4).double().copy_from_torch(two)
    second = copy_gru_weights(two, GRUScratch(4, 4).double(), layer=1)
    torch.testing.assert_close(second(first(xs)[0])[0], out)


def test_gru_gates_are_the_gates():
    """The gates returned for plots are the ones that produce the states."""
    torch.manual_seed(1)
    gru = GRUScratch(3, 5).double()
    x = torch.randn(2, 7, 3, dtype=torch.double)
    out, h_last, gates = gru(x, return_gates=True)
    assert all(g.shape == (2, 7, 5) for g in gates)
    assert ((gates.z > 0) & (gates.z < 1)).all() and ((gates.r > 0) & (gates.r < 1)).all()
    assert (gates.n.abs() < 1).all()
    prev = torch.cat([torch.zeros(2, 1, 5, dtype=torch.double), out[:, :-1]], dim=1)
    torch.testing.assert_close(out, (1 - gates.z) * gates.n + gates.z * prev)
    torch.testing.assert_close(h_last, out[:, -1])


def test_gru_convention_is_pytorchs_not_the_flipped_one():
    """With z forced to 1 the state is copied (PyTorch: h' = (1 - z) n + z h)."""
    cell = GRUCellScratch(2, 3)
    with torch.no_grad():
        cell.W_iz.bias.fill_(50.0)
    h = torch.randn(4, 3)
    torch.testing.assert_close(cell(torch.randn(4, 2), h), h)


# ----------------------------------------------------------------------------- unrolled GRU


def _recurrence(z, n, h0):
    h = h0
    for t in range(z.shape[1]):
        h = (1 - z[:, t]) * n[:, t] + z[:, t] * h
    return h


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 12), H=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_unrolled_weights_reproduce_the_recurrence(B, T, H, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.rand(B, T, H, generator=g, dtype=torch.double)
    n = torch.rand(B, T, H, generator=g, dtype=torch.double) * 2 - 1
    h0 = torch.randn(B, H, generator=g, dtype=torch.double)
    w = unrolled_gru_weights(z)
    assert w.shape == (B, T + 1, H)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(dim=1), torch.ones(B, H, dtype=torch.double))
    torch.testing.assert_close(w[:, 0] * h0 + (w[:, 1:] * n).sum(1), _recurrence(z, n, h0))
    torch.testing.assert_close(unrolled_gru_state(z, n, h0), _recurrence(z, n, h0))
    # time-major and unbatched layouts give the same weights
    torch.testing.assert_close(unrolled_gru_weights(z.transpose(0, 1), batch_first=False),
                               w.transpose(0, 1))
    torch.testing.assert_close(unrolled_gru_weights(z[0]), w[0])


def test_unrolled_weights_by_hand():
    z = torch.tensor([[0.5], [0.25], [0.8]])  # (T=3, H=1)
    w = unrolled_gru_weights(z)[:, 0]
    want = [0.5 * 0.25 * 0.8, 0.5 * 0.25 * 0.8, 0.75 * 0.8, 0.2]  # h0, n1, n2, n3
    torch.testing.assert_close(w, torch.tensor(want))


def test_unrolled_weights_on_a_real_gru_run():
    torch.manual_seed(3)
    gru = GRUScratch(4, 6).double()
    x = torch.randn(3, 9, 4, dtype=torch.double)
    h0 = torch.randn(3, 6, dtype=torch.double)
    _, h_last, gates = gru(x, h0, return_gates=True)
    torch.testing.assert_close(unrolled_gru_state(gates.z, gates.n, h0), h_last)


# ----------------------------------------------------------------------------- language model


@pytest.mark.parametrize("cls", [GRULanguageModel, RNNLanguageModel])
def test_lm_shapes_loss_and_generation(cls):
    torch.manual_seed(0)
    lm = cls(vocab_size=30, embed_size=8, hidden_size=16, num_layers=2, dropout=0.1)
    inputs, targets = collate_lm([[5, 6, 7], [8], [9, 10, 11, 12, 13]])
    assert inputs.shape == targets.shape == (3, 6)
    assert inputs[:, 0].eq(BOS_ID).all()
    assert targets[1].tolist() == [8, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]
    assert lm(inputs).shape == (3, 6, 30)
    loss, n = lm_loss(lm, (inputs, targets))
    assert n == 3 + 1 + 1 + 1 + 5 + 1
    assert abs(loss.item() - math.log(30)) < 1.0  # untrained: near uniform
    logits, hidden = lm.forward_with_state(inputs)
    assert hidden.shape == (2, 3, 16)
    out = lm.generate([BOS_ID, 5], max_new_tokens=7, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    assert 1 <= len(out) <= 7 and PAD_ID not in out and BOS_ID not in out
    assert lm.generate([BOS_ID], max_new_tokens=4) == lm.generate([BOS_ID], max_new_tokens=4)


def test_lm_loss_ignores_padding():
    torch.manual_seed(0)
    lm = GRULanguageModel(12, 4, 8).eval()
    one = collate_lm([[4, 5, 6]])
    padded = collate_lm([[4, 5, 6], [7, 8, 9, 10, 11, 4, 5]])
    l1, _ = lm_loss(lm, one)
    logits = lm(padded[0])[:1, :4]
    l2 = torch.nn.functional.cross_entropy(logits[0], padded[1][0, :4])
    torch.testing.assert_close(l1, l2)


def test_lm_gates_match_states():
    torch.manual_seed(0)
    lm = GRULanguageModel(20, 6, 10)
    ids = torch.randint(4, 20, (2, 5))
    gates = lm.gates(ids)
    states, _ = lm.rnn(lm.embed(ids))
    prev = torch.cat([torch.zeros(2, 1, 10), states[:, :-1]], dim=1)
    torch.testing.assert_close((1 - gates.z) * gates.n + gates.z * prev, states, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="only a GRU"):
        RNNLanguageModel(20, 6, 10).gates(ids)


# ----------------------------------------------------------------------------- bad input


def test_bad_step_inputs():
    cell = GRUCellScratch(3, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, input_size=3\), got \(2, 5\)"):
        cell(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"x must have shape.*got \(3,\)"):
        cell(torch.randn(3))
    with pytest.raises(ValueError, match=r"h must have shape \(batch=2, hidden_size=4\), got \(2, 3\)"):
        cell(torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(TypeError, match="floating"):
        cell(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        check_step_inputs("who", [[1.0]], None, 1, 1)
    with pytest.raises(ValueError, match=r"RNNCellScratch: x must have shape"):
        RNNCellScratch(3, 4)(torch.randn(2, 4))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            GRUCellScratch(bad, 3)


def test_bad_sequence_inputs():
    gru = GRUScratch(3, 4)
    with pytest.raises(ValueError, match="empty sequence"):
        gru(torch.randn(2, 0, 3))
    with pytest.raises(ValueError, match=r"\(batch, time, input_size\) with input_size=3, got \(2, 5\)"):
        gru(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"\(time, batch, input_size\)"):
        GRUScratch(3, 4, batch_first=False)(torch.randn(2, 5, 2))
    with pytest.raises(ValueError, match="hidden_size"):
        gru(torch.randn(2, 5, 3), torch.randn(2, 7))
    with pytest.raises(ValueError, match="empty sequence"):
        unrolled_gru_weights(torch.rand(2, 0, 3))
    with pytest.raises(ValueError, match="z must have shape"):
        unrolled_gru_weights(torch.rand(2, 3, 4, 5))
    with pytest.raises(TypeError, match="floating"):
        unrolled_gru_weights(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="unrolled_gru_state"):
        unrolled_gru_state(torch.rand(2, 3, 4), torch.rand(2, 3, 4), torch.rand(2, 5))


def test_bad_copies():
    with pytest.raises(ValueError, match=r"src has \(input_size, hidden_size\)=\(3, 4\), dst has \(3, 5\)"):
        copy_gru_weights(nn.GRU(3, 4), GRUCellScratch(3, 5))
    with pytest.raises(ValueError, match="unidirectional"):
        copy_gru_weights(nn.GRU(3, 4, bidirectional=True), GRUCellScratch(3, 4))
    with pytest.raises(TypeError, match="nn.GRU or nn.GRUCell"):
        copy_gru_weights(nn.LSTM(3, 4), GRUCellScratch(3, 4))
    with pytest.raises(ValueError, match=r"\(3, 4\), dst has \(3, 6\)"):
        copy_rnn_cell_weights(nn.RNNCell(3, 4), RNNCellScratch(3, 6))
    with pytest.raises(TypeError, match="tanh"):
        copy_rnn_cell_weights(nn.RNNCell(3, 4, nonlinearity="relu"), RNNCellScratch(3, 4))


def test_bad_lm_inputs():
    lm = GRULanguageModel(10, 4, 8)
    with pytest.raises(TypeError, match="torch.long"):
        lm(torch.rand(2, 3))
    with pytest.raises(TypeError, match="torch.long"):
        lm(torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(batch, time\), got \(3,\)"):
        lm(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty sequence"):
        lm(torch.ones(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="prefix"):
        lm.generate([])
    with pytest.raises(ValueError, match="temperature"):
        lm.generate([BOS_ID], temperature=-1)
    with pytest.raises(ValueError, match="cell must be"):
        from tfmlib.rnn import RecurrentLanguageModel
        RecurrentLanguageModel(10, 4, 8, cell="lstm")
    with pytest.raises(ValueError, match="vocab_size"):
        GRULanguageModel(0, 4, 8)
    with pytest.raises(ValueError, match="empty batch"):
        collate_lm([])


def test_empty_batches_and_mismatched_dtypes_are_refused():
    with pytest.raises(ValueError, match=r"GRUCellScratch: empty batch \(x has shape \(0, 3\)\)"):
        GRUCellScratch(3, 4)(torch.randn(0, 3))
    with pytest.raises(ValueError, match="RNNCellScratch: empty batch"):
        RNNCellScratch(3, 4)(torch.randn(0, 3))
    with pytest.raises(ValueError, match="empty batch"):
        GRUScratch(3, 4)(torch.randn(0, 5, 3))
    with pytest.raises(TypeError, match="h must have x's dtype torch.float32, got torch.float64"):
        GRUCellScratch(3, 4)(torch.randn(2, 3), torch.randn(2, 4, dtype=torch.double))
    with pytest.raises(ValueError, match="empty batch"):
        GRULanguageModel(10, 4, 8)(torch.ones(0, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="dst must be an RNNCellScratch"):
        copy_rnn_cell_weights(nn.RNNCell(3, 4), GRUCellScratch(3, 4))
    with pytest.raises(TypeError, match="h0 must be a floating tensor"):
        unrolled_gru_state(torch.rand(2, 3, 4), torch.rand(2, 3, 4), [[0.0] * 4] * 2)


def test_lm_refuses_unknown_ids_and_bad_hidden_state():
    lm = GRULanguageModel(10, 4, 8, num_layers=2)
    with pytest.raises(ValueError, match=r"ids must be in \[0, vocab_size=10\), got values in \[1, 10\]"):
        lm(torch.tensor([[1, 10]]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 2\]"):
        lm(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match=r"hidden must have shape.*=\(2, 3, 8\), got \(1, 3, 8\)"):
        lm.forward_with_state(torch.ones(3, 4, dtype=torch.long), torch.zeros(1, 3, 8))
    _, hidden = lm.forward_with_state(torch.ones(3, 4, dtype=torch.long))
    assert lm.forward_with_state(torch.ones(3, 1, dtype=torch.long), hidden)[1].shape == (2, 3, 8)


def test_generate_restores_the_training_mode_even_after_an_error():
    lm = GRULanguageModel(10, 4, 8).train()
    lm.generate([BOS_ID], max_new_tokens=2)
    assert lm.training
    with pytest.raises(ValueError, match="vocab_size"):
        lm.generate([BOS_ID, 99])
    assert lm.training
    lm.eval()
    lm.generate([BOS_ID], max_new_tokens=2)
    assert not lm.training
    assert lm.generate([BOS_ID], max_new_tokens=0) == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate([BOS_ID], max_new_tokens=-1)


def test_lm_gates_work_in_double_precision():
    torch.manual_seed(0)
    lm = GRULanguageModel(20, 6, 10).double()
    ids = torch.randint(4, 20, (2, 5))
    gates = lm.gates(ids)
    assert gates.z.dtype == torch.double
    states, _ = lm.rnn(lm.embed(ids))
    prev = torch.cat([torch.zeros(2, 1, 10, dtype=torch.double), states[:, :-1]], dim=1)
    torch.testing.assert_close((1 - gates.z) * gates.n + gates.z * prev, states)


def test_collate_lm_accepts_tensors_and_rejects_non_integer_ids():
    from_lists = collate_lm([[5, 6], [7]])
    from_tensors = collate_lm([torch.tensor([5, 6]), torch.tensor([7])])
    assert all(torch.equal(a, b) for a, b in zip(from_lists, from_tensors, strict=True))
    assert collate_lm([[]])[0].tolist() == [[BOS_ID]] and collate_lm([[]])[1].tolist() == [[EOS_ID]]
    with pytest.raises(TypeError, match="sentence 1 holds non-integer token ids"):
        collate_lm([[5], [1.5]])
    with pytest.raises(TypeError, match="sentence 0 must be a list of token ids, got str"):
        collate_lm(["the cat"])


def test_lm_loss_counts_real_targets_on_the_device_without_reading_them():
    from tfmlib.data import PAD_ID
    from tfmlib.profiling import count_host_reads
    from tfmlib.rnn import GRULanguageModel, collate_lm, lm_loss

    torch.manual_seed(0)
    model = GRULanguageModel(10, 4, 8)
    inputs, targets = collate_lm([[4, 5, 6], [7]])
    lookup = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))  # reads nothing itself
    with count_host_reads() as reads:
        lm_loss(lookup, (inputs, targets))
    assert reads.total == 0, f"lm_loss must not read a value back (a host sync per step on a GPU): {reads}"
    loss, n = lm_loss(model, (inputs, targets))
    assert isinstance(n, torch.Tensor) and n.dim() == 0 and n.dtype == torch.int64, n
    assert n.device == targets.device and int(n) == 4 + 2, "three words + EOS, one word + EOS"
    logits = model(inputs)
    real = targets != PAD_ID
    expected = torch.nn.functional.cross_entropy(logits[real], targets[real])
    assert torch.allclose(loss, expected)
    empty_loss, empty_n = lm_loss(model, (inputs, torch.full_like(targets, PAD_ID)))
    assert int(empty_n) == 0 and torch.isnan(empty_loss), "all padding: nothing counted, the mean is NaN"
    with pytest.raises(ValueError, match="differ"):
        lm_loss(model, (inputs, targets[:, :-1]))


def test_fit_stops_on_an_all_padding_batch_of_lm_loss():
    from tfmlib.data import PAD_ID
    from tfmlib.rnn import GRULanguageModel, collate_lm, lm_loss
    from tfmlib.train import fit

    torch.manual_seed(0)
    model = GRULanguageModel(10, 4, 8)
    inputs, targets = collate_lm([[4, 5, 6], [7]])
    batches = [(inputs, targets), (inputs, torch.full_like(targets, PAD_ID))]
    with pytest.raises(ValueError, match="loss became nan at step 2"):
        fit(model, batches, lm_loss, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1, verbose=False)


# ----------------------------------------------------------------------------- MPS routing


def test_recurrent_device_keeps_recurrent_modules_off_mps_only():
    # torch.device("mps") can be named on any machine: the routing is a decision, tested as one.
    from tfmlib.rnn_attention import AttentionSeq2Seq, SelfAttentiveClassifier
    from tfmlib.seq2seq import Seq2Seq
    from tfmlib.transformer import Transformer

    recurrent = [GRULanguageModel(10, 4, 4), RNNLanguageModel(10, 4, 4), Seq2Seq(10, 10, embed=4, hidden=4),
                 AttentionSeq2Seq(10, 10, embed=4, enc_hidden=4, hidden=4, attn_size=4),
                 SelfAttentiveClassifier(10, 2, embed=4, hidden=4, attn_size=4, hops=1, mlp=4),
                 nn.Sequential(nn.Linear(2, 2), nn.LSTM(2, 2))]
    others = [Transformer(10, 10, d_model=8, heads=2, encoder_layers=1, decoder_layers=1, d_ff=8),
              nn.GRUCell(3, 3), GRUScratch(3, 3)]
    for model in recurrent:
        assert recurrent_device("mps", model) == torch.device("cpu"), \
            f"{type(model).__name__} holds an nn.RNNBase and must leave MPS"
        assert recurrent_device(torch.device("mps:0"), model) == torch.device("cpu")
    for model in others:
        assert recurrent_device("mps", model) == torch.device("mps"), \
            f"{type(model).__name__} has no nn.RNNBase and should stay on MPS"
    for model in recurrent + others:
        for dev in ("cpu", "cuda", "cuda:1"):
            assert recurrent_device(dev, model) == torch.device(dev), f"{dev} must never be rerouted"
    with pytest.raises(TypeError, match="device must be"):
        recurrent_device(3, nn.GRU(2, 2))
    with pytest.raises(TypeError, match="model must be"):
        recurrent_device("mps", "gru")
    issues = MPS_RNN_ISSUES.values()
    assert all(url.startswith("https://github.com/pytorch/pytorch/issues/") for url in issues), issues
