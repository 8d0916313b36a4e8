"""Checkers for chapter 01 (RNN and GRU).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("01.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close


def _ch01_cases(seed: int) -> tuple[int, int, int, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    batch, inp, hidden = (int(v) for v in torch.randint(2, 7, (3,), generator=g))
    return batch, inp, hidden, g


@checker("01.rnn_step", hint="h' = tanh(x @ W_xh.T + h @ W_hh.T + b): x is (B, I), W_xh is (H, I), "
         "so x @ W_xh.T is (B, H)")
def _check_rnn_step(rnn_step: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        W_xh, W_hh = torch.randn(H, D, generator=g) / D**0.5, torch.randn(H, H, generator=g) / H**0.5
        b = torch.randn(H, generator=g)
        want = torch.tanh(x @ W_xh.T + h @ W_hh.T + b)
        expect_close(rnn_step(x, h, W_xh, W_hh, b), want,
                     f"rnn_step(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


@checker("01.gru_step", hint="split the stacked weights with .chunk(3) in the order reset, update, "
         "candidate; n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)); h' = (1 - z) * n + z * h")
def _check_gru_step(gru_step: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        cell = torch.nn.GRUCell(D, H)
        with torch.no_grad():
            for p in cell.parameters():
                p.copy_(torch.randn(p.shape, generator=g))  # big weights: gates far from 0.5
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        with torch.no_grad():
            want = cell(x, h)
            got = gru_step(x, h, cell.weight_ih.clone(), cell.weight_hh.clone(),
                           cell.bias_ih.clone(), cell.bias_hh.clone())
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            W_ir, W_iz, W_in = cell.weight_ih.detach().chunk(3)
            W_hr, W_hz, W_hn = cell.weight_hh.detach().chunk(3)
            b_ir, b_iz, b_in = cell.bias_ih.detach().chunk(3)
            b_hr, b_hz, b_hn = cell.bias_hh.detach().chunk(3)
            z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
            n = torch.tanh(x @ W_in.T + b_in + torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
                           * (h @ W_hn.T + b_hn))
            if torch.allclose(got.double(), (z * n + (1 - z) * h).double(), atol=1e-5):
                raise Wrong("you swapped the roles of z: in PyTorch's convention z keeps the old "
                            "state, h' = (1 - z) * n + z * h")
        expect_close(got, want, f"gru_step(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


@checker("01.unrolled_weights", hint="w_0 = prod_{j=1..T} z_j and w_i = (1 - z_i) * prod_{j=i+1..T} z_j; "
         "return T + 1 rows (row 0 for h_0); the rows sum to one")
def _check_unrolled_weights(unrolled: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for seed in range(4):
        _, T, H, g = _ch01_cases(seed)
        z = torch.rand(T, H, generator=g)
        # the reference: run the recurrence on one-hot "candidates" and read off each one's share
        want = torch.empty(T + 1, H)
        for i in range(T + 1):
            h = torch.ones(H) if i == 0 else torch.zeros(H)
            for t in range(1, T + 1):
                n = torch.ones(H) if t == i else torch.zeros(H)
                h = (1 - z[t - 1]) * n + z[t - 1] * h
            want[i] = h
        expect_close(unrolled(z.clone()), want, f"unrolled(z of shape {tuple(z.shape)}) (row 0: h_0, "
                     "row i: n_i)")
