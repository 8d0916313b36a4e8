"""Checkers for chapter 01 (RNN and GRU).

Registered on import by ``tfmlib.exercises``; a reader calls ``exercises.check("01.name", answer)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core import Wrong, checker, expect_close

Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _ch01_cases(seed: int) -> tuple[int, int, int, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    batch, inp, hidden = (int(v) for v in torch.randint(2, 7, (3,), generator=g))
    return batch, inp, hidden, g


def _gru_weights(D: int, H: int, g: torch.Generator, diagonal_hn: bool = False) -> Weights:
    """Random stacked GRU weights ``(W_ih (3H, D), W_hh (3H, H), b_ih (3H,), b_hh (3H,))``.

    Standard-normal entries put the gates far from 0.5, so that wrong placements show.
    """
    W_ih, W_hh = torch.randn(3 * H, D, generator=g), torch.randn(3 * H, H, generator=g)
    b_ih, b_hh = torch.randn(3 * H, generator=g), torch.randn(3 * H, generator=g)
    if diagonal_hn:
        W_hh[2 * H:] = torch.diag(torch.randn(H, generator=g))
    return W_ih, W_hh, b_ih, b_hh


def _gates(x: torch.Tensor, h: torch.Tensor, w: Weights) -> tuple[torch.Tensor, ...]:
    """``r, z, x-side candidate term, (W_hn, b_hn)`` of a GRU step with stacked weights ``w``."""
    W_ih, W_hh, b_ih, b_hh = w
    W_ir, W_iz, W_in = W_ih.chunk(3)
    W_hr, W_hz, W_hn = W_hh.chunk(3)
    b_ir, b_iz, b_in = b_ih.chunk(3)
    b_hr, b_hz, b_hn = b_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    return r, z, x @ W_in.T + b_in, W_hn, b_hn


def reset_before_step(x: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    """The checkers' reference: Cho et al.'s reset-before GRU step, ``n = tanh(.. + W_hn (r * h) + b_hn)``."""
    r, z, xn, W_hn, b_hn = _gates(x, h, w)
    n = torch.tanh(xn + (r * h) @ W_hn.T + b_hn)
    return (1 - z) * n + z * h


def _reset_after_step(x: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    r, z, xn, W_hn, b_hn = _gates(x, h, w)
    return (1 - z) * torch.tanh(xn + r * (h @ W_hn.T + b_hn)) + z * h


@checker("01.gru_step_reset_before",
         hint="Section 3 lists two places for the reset gate; this exercise asks for the one nn.GRU does not "
              "use (Cho et al., 2014, eq. 8). Keep nn.GRU's weight layout and its meaning of z, and ask "
              "yourself whether b_hn is inside or outside the part that the reset gate touches.")
def _check_gru_step_reset_before(step: Callable[..., torch.Tensor]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        w = _gru_weights(D, H, g)
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        want = reset_before_step(x, h, w)
        with torch.no_grad():
            got = step(x, h, *(t.clone() for t in w))
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            def close(other: torch.Tensor, got: torch.Tensor = got) -> bool:
                return torch.allclose(got.double(), other.double(), atol=1e-5)

            if close(_reset_after_step(x, h, w)):
                raise Wrong("this is the reset-after form, r * (W_hn h + b_hn), which nn.GRU computes (and "
                            "cuDNN; Keras calls it reset_after=True, ONNX linear_before_reset=1). Cho et al. "
                            "reset h before the product: W_hn (r * h)")
            r, z, xn, W_hn, b_hn = _gates(x, h, w)
            if close(z * torch.tanh(xn + (r * h) @ W_hn.T + b_hn) + (1 - z) * h):
                raise Wrong("you swapped the roles of z: in PyTorch's convention (and Cho et al.'s eq. 7) z "
                            "keeps the old state, h' = (1 - z) * n + z * h")
            if close((1 - z) * torch.tanh(xn + (r * h) @ W_hn.T + r * b_hn) + z * h):
                raise Wrong("the reset gate multiplies b_hn too: in the reset-before form it only resets h, "
                            "and b_hn is added after the product")
        expect_close(got, want, f"gru_step_reset_before(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


@checker("01.reset_before_as_nn_gru",
         hint="Compare the two candidate formulas of section 3 unit by unit: when does multiplying by r "
              "before W_hn give the same as multiplying after? Where must b_hn go so that the reset gate "
              "no longer reaches it? For any other W_hn, raise ValueError.")
def _check_reset_before_as_nn_gru(convert: Callable[..., Weights]) -> None:
    for seed in range(4):
        B, D, H, g = _ch01_cases(seed)
        w = _gru_weights(D, H, g, diagonal_hn=True)
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        try:
            got = convert(*(t.clone() for t in w))
        except ValueError as err:
            raise Wrong(f"raised ValueError ({err}) for a W_hn that is diagonal: that cell has an exact "
                        "nn.GRU equivalent") from None
        four_tensors = isinstance(got, tuple | list) and len(got) == 4
        if not (four_tensors and all(isinstance(t, torch.Tensor) for t in got)):
            raise Wrong("return a tuple of four tensors (W_ih, W_hh, b_ih, b_hh) in nn.GRUCell's layout")
        cell = torch.nn.GRUCell(D, H)
        for name, t, ref in zip(("W_ih", "W_hh", "b_ih", "b_hh"), got, w, strict=True):
            if t.shape != ref.shape:
                raise Wrong(f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        with torch.no_grad():
            for p, t in zip((cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh), got, strict=True):
                p.copy_(t)
            expect_close(cell(x, h), reset_before_step(x, h, w),
                         f"nn.GRUCell with your weights, on a reset-before cell with diagonal W_hn (H={H})")
        w = _gru_weights(D, H, g)
        try:
            convert(*(t.clone() for t in w))
        except ValueError:
            continue
        raise Wrong("returned weights for a W_hn with off-diagonal entries: no nn.GRU weights compute that "
                    "cell (raise ValueError)")


@checker("01.gates_for_weights",
         hint="Question 4 and section 4: write P_i, the product of the gates after step i, as a sum of "
              "weights (the telescoping sum); then each gate is a ratio of two consecutive P's. Decide "
              "what a gate should be where that ratio is 0 / 0.")
def _check_gates_for_weights(gates_for: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for seed in range(5):
        _, T, H, g = _ch01_cases(seed)
        w = torch.distributions.Dirichlet(torch.ones(T + 1)).sample((H,)).T.double()  # (T + 1, H)
        if seed >= 2:  # exact zeros: all weight on one candidate, or none on the first few
            w[:, 0] = 0.0
            w[1 + seed % T, 0] = 1.0
            w[: 1 + seed % T, 1] = 0.0
            w[:, 1] /= w[:, 1].sum()
        z = gates_for(w.clone())
        what = f"gates_for_weights(w of shape {tuple(w.shape)})"
        if not isinstance(z, torch.Tensor):
            raise Wrong(f"{what} should return a torch.Tensor, got {type(z).__name__}")
        if z.shape != (T, H):
            raise Wrong(f"{what} has shape {tuple(z.shape)}, expected {(T, H)} (one gate per step and unit)")
        if torch.isnan(z).any():
            raise Wrong(f"{what} contains NaN: some weights are exactly zero, and there the ratio is 0 / 0; "
                        "any gate value works at such a step, so choose one")
        if (z < -1e-9).any() or (z > 1 + 1e-9).any():
            lo, hi = z.min().item(), z.max().item()
            raise Wrong(f"{what} has gates outside [0, 1] (min {lo:.3g}, max {hi:.3g})")
        expect_close(_unrolled(z.double()), w, f"the unrolled weights of your gates, for {what}", atol=1e-6)


def _unrolled(z: torch.Tensor) -> torch.Tensor:
    """Section 4's weights by running the recurrence on one-hot candidates: ``(T, H) -> (T + 1, H)``."""
    T, H = z.shape
    w = z.new_empty(T + 1, H)
    for i in range(T + 1):
        h = z.new_ones(H) if i == 0 else z.new_zeros(H)
        for t in range(1, T + 1):
            h = (1 - z[t - 1]) * (z.new_ones(H) if t == i else z.new_zeros(H)) + z[t - 1] * h
        w[i] = h
    return w
