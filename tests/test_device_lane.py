"""The device lane: what must hold on every device, tested on each one present.

Every test is parametrised over ``cpu`` and, when present, ``cuda`` and ``mps``; a device that is
absent is skipped with the reason (on CI and on a machine without a GPU only ``cpu`` runs). These
are the places where a device has bitten the book or could: differentiating through a recurrent
layer in eval mode (cuDNN's RNN backward refuses it), the fast attention path against the written-out
one (the device picks its own SDPA kernel), beam search of width 1 against greedy decoding (index
bookkeeping on the device), a checkpoint written from the device and read on the CPU, and one
optimiser step of each model family through ``fit``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_seq2seq import SRC_V, TGT_V, random_batch
from torch import nn

from tfmlib.attention import fast_attention, scaled_dot_product_attention
from tfmlib.decoding import beam_search, greedy_decode
from tfmlib.rnn_attention import AttentionSeq2Seq
from tfmlib.seq2seq import Seq2Seq, translation_loss
from tfmlib.train import fit, load_checkpoint, save_checkpoint
from tfmlib.transformer import Transformer

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device on this machine")),
    pytest.param("mps", id="mps", marks=pytest.mark.skipif(
        not torch.backends.mps.is_available(), reason="no Apple MPS device on this machine")),
]

# float32 on every device; a GPU may sum in another order than the CPU
TOL = dict(atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- RNN gradients in eval mode


def input_gradient(rnn: nn.RNNBase, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The output at the last step and the gradient of its sum with respect to every input step.

    The pattern chapter 01 needs on a GPU: cuDNN's RNN backward runs only in training mode, so the
    layer is switched to ``train()`` for the differentiation (with dropout 0 it computes the same
    function) and put back in the mode it was in."""
    was_training = rnn.training
    rnn.train()
    try:
        x = x.detach().requires_grad_()
        out, _ = rnn(x)
        last = out[:, -1]
        (grad,) = torch.autograd.grad(last.sum(), x)
    finally:
        rnn.train(was_training)
    return last.detach(), grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cell", [nn.GRU, nn.RNN])
def test_gradient_through_a_recurrent_layer_in_eval_mode(device, cell):
    torch.manual_seed(0)
    rnn_cpu = cell(6, 10, num_layers=2, batch_first=True, dropout=0.0).eval()
    rnn = copy.deepcopy(rnn_cpu).to(device).eval()
    x_cpu = torch.randn(3, 7, 6)
    # the reference: plain autograd in eval mode, which the CPU allows
    x_ref = x_cpu.clone().requires_grad_()
    out_ref, _ = rnn_cpu(x_ref)
    (grad_ref,) = torch.autograd.grad(out_ref[:, -1].sum(), x_ref)

    last, grad = input_gradient(rnn, x_cpu.to(device))
    assert not rnn.training, "the layer is back in eval mode afterwards"
    if torch.device(device).type == "cpu":
        assert torch.equal(grad, grad_ref), "with dropout 0, train() differentiates the eval-mode function"
    torch.testing.assert_close(last.cpu(), out_ref[:, -1].detach(), **TOL)
    torch.testing.assert_close(grad.cpu(), grad_ref, **TOL)
    assert grad[:, 0].abs().sum() > 0, "the last output depends on the first input step"


# --------------------------------------------------------------------------- fast vs explicit attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_fast_attention_matches_the_explicit_one_forward_and_backward(device, causal):
    g = torch.Generator().manual_seed(1)
    B, h, T, S, d = 2, 3, 5, 7, 8
    q, k, v = (torch.randn(B, h, n, d, generator=g) for n in (T, S, S))
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[0, ..., 5:] = False                                  # padding in the first sentence
    if not causal:
        keep = keep.expand(B, 1, T, S).clone()
        keep[1, 0, 2] = False                                 # a query that may see nothing
    upstream = torch.randn(B, h, T, d, generator=g)

    def run(fn):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, keep.to(device), causal=causal)
        out = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(out, leaves, upstream.to(device))
        return [out.detach().cpu(), *(gr.cpu() for gr in grads)]

    explicit = run(scaled_dot_product_attention)
    fast = run(fast_attention)
    for name, a, b in zip(["output", "dq", "dk", "dv"], fast, explicit, strict=True):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, name=name: f"{name} on {device}: {m}")
    assert explicit[0].abs().sum() > 0 and explicit[1].abs().sum() > 0, "not a trivially zero case"


# --------------------------------------------------------------------------- decoding


def seq2seq() -> nn.Module:
    return Seq2Seq(SRC_V, TGT_V, embed=8, hidden=12)


def rnnsearch() -> nn.Module:
    return AttentionSeq2Seq(SRC_V, TGT_V, embed=8, enc_hidden=6, hidden=12, attn_size=10)


def transformer() -> nn.Module:
    return Transformer(SRC_V, TGT_V, d_model=16, heads=2, encoder_layers=1, decoder_layers=1, d_ff=32,
                       dropout=0.0, max_len=40)


FAMILIES = {"GRU seq2seq": seq2seq, "RNNsearch": rnnsearch, "Transformer": transformer}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_beam_of_one_is_greedy_on_the_device(device, family):
    torch.manual_seed(3)
    model = FAMILIES[family]().to(device)
    _, b = random_batch(7, batch=6)
    b = b.to(device)
    greedy = greedy_decode(model, b.src, b.src_mask, max_len=12)
    beam = beam_search(model, b.src, b.src_mask, beam_size=1, alpha=0.0, max_len=12)
    assert beam.tokens.device.type == torch.device(device).type
    assert beam.tokens.tolist() == greedy.tokens.tolist(), family
    assert beam.lengths.tolist() == greedy.lengths.tolist(), family


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_saved_on_the_device_loads_on_the_cpu(device, tmp_path):
    torch.manual_seed(4)
    model = transformer().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    _, b = random_batch(8, batch=4)
    loss, _ = translation_loss(model, b.to(device))
    loss.backward()
    opt.step()
    path = save_checkpoint(tmp_path / "m.pt", model, opt, config={"device": str(device)})

    fresh = transformer()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    ck = load_checkpoint(path, fresh, fresh_opt)                 # map_location defaults to the CPU
    for name, t in fresh.state_dict().items():
        assert t.device.type == "cpu", f"{name} loaded on {t.device}"
        torch.testing.assert_close(t, model.state_dict()[name].cpu(), rtol=0, atol=0)
    moments = [s["exp_avg"] for s in fresh_opt.state_dict()["state"].values()]
    assert moments and all(m.device.type == "cpu" for m in moments), "optimizer state on the CPU too"
    assert ck.config == {"device": str(device)}
    # and the CPU copy computes what the device model computes
    with torch.no_grad():
        fresh.eval()
        model.eval()
        torch.testing.assert_close(fresh(b.src, b.src_mask, b.tgt_in),
                                   model(*(t.to(device) for t in (b.src, b.src_mask, b.tgt_in))).cpu(), **TOL)


# --------------------------------------------------------------------------- one fit step per family


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_fit_step_per_model_family(device, family):
    torch.manual_seed(5)
    model_cpu = FAMILIES[family]()
    model = copy.deepcopy(model_cpu)
    _, b = random_batch(9, batch=5)
    histories = {}
    for where, m in (("cpu", model_cpu), (device, model)):
        before = [p.detach().clone() for p in m.parameters()]
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        histories[where] = fit(m, [b], translation_loss, opt, epochs=1, device=where, verbose=False)
        assert all(p.device.type == torch.device(where).type for p in m.parameters())
        changed = sum(not torch.equal(p0, p.detach().cpu())
                      for p0, p in zip(before, m.parameters(), strict=True))
        assert changed == len(before), f"{family} on {where}: {len(before) - changed} parameters did not move"
    hist = histories[device]
    assert len(hist.step_loss) == 1 and len(hist.epochs) == 1
    # the first loss is computed from the same weights on both devices
    assert hist.step_loss[0] == pytest.approx(histories["cpu"].step_loss[0], rel=1e-4), family
    assert hist.epochs[0]["train_loss"] == pytest.approx(hist.step_loss[0])
    torch.testing.assert_close([p.detach().cpu() for p in model.parameters()],
                               [p.detach() for p in model_cpu.parameters()], atol=1e-4, rtol=1e-3)
