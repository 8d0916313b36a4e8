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


def _reset_before_step(x: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    """The checkers' reference: Cho et al.'s reset-before GRU step, ``n = tanh(.. + W_hn (r * h) + b_hn)``.

    Private: a chapter must not import it (it would answer exercise 1 for the reader)."""
    r, z, xn, W_hn, b_hn = _gates(x, h, w)
    n = torch.tanh(xn + (r * h) @ W_hn.T + b_hn)
    return (1 - z) * n + z * h


def _reset_after_step(x: torch.Tensor, h: torch.Tensor, w: Weights) -> torch.Tensor:
    r, z, xn, W_hn, b_hn = _gates(x, h, w)
    return (1 - z) * torch.tanh(xn + r * (h @ W_hn.T + b_hn)) + z * h


def _step_mistakes(x: torch.Tensor, h: torch.Tensor, w: Weights) -> list[tuple[str, torch.Tensor]]:
    """(diagnosis, what a typical wrong answer computes) for one reset-before step."""
    r, z, xn, W_hn, b_hn = _gates(x, h, w)
    W_ih, W_hh, b_ih, b_hh = w

    def swap_rz(t: torch.Tensor) -> torch.Tensor:
        a, b, c = t.chunk(3)
        return torch.cat([b, a, c])

    n = torch.tanh(xn + (r * h) @ W_hn.T + b_hn)
    mistakes = [
        ("this is the reset-after form, r * (W_hn h + b_hn), which nn.GRU computes (and cuDNN; Keras "
         "calls it reset_after=True, ONNX linear_before_reset=1). Cho et al. reset h before the product: "
         "W_hn (r * h)",
         _reset_after_step(x, h, w)),
        ("you swapped the roles of z: in PyTorch's convention (and Cho et al.'s eq. 7) z keeps the old "
         "state, h' = (1 - z) * n + z * h", z * n + (1 - z) * h),
        ("the reset gate multiplies b_hn too: in the reset-before form it only resets h, and b_hn is added "
         "after the product", (1 - z) * torch.tanh(xn + (r * h) @ W_hn.T + r * b_hn) + z * h),
        ("r multiplies W_hn h, after the product: that is the reset-after form with b_hn moved out of the "
         "gate's reach, halfway between the two. Cho et al. reset h itself, before W_hn mixes the units",
         (1 - z) * torch.tanh(xn + r * (h @ W_hn.T) + b_hn) + z * h),
        ("the reset gate is missing: the candidate reads the whole of h; in Cho et al.'s form it reads r * h",
         (1 - z) * torch.tanh(xn + h @ W_hn.T + b_hn) + z * h),
        ("the gates are read in the wrong order: nn.GRUCell stacks its three blocks as reset, update, "
         "candidate (rows 0 to H, H to 2H, 2H to 3H)",
         _reset_before_step(x, h, (swap_rz(W_ih), swap_rz(W_hh), swap_rz(b_ih), swap_rz(b_hh)))),
        ("you returned the candidate n; the new state mixes it with the old one through z", n),
    ]
    if W_hn.shape[0] == W_hn.shape[1]:
        mistakes.append(("W_hn is used untransposed: nn.GRUCell's weights have one row per output unit, "
                         "so a batch of rows h is multiplied by the transpose",
                         (1 - z) * torch.tanh(xn + (r * h) @ W_hn + b_hn) + z * h))
    return mistakes


@checker("01.gru_step_reset_before",
         hint="Section 3 lists two places for the reset gate; this exercise asks for the one nn.GRU does not "
              "use (Cho et al., 2014, eq. 8). Keep nn.GRU's weight layout and its meaning of z, and ask "
              "yourself whether b_hn is inside or outside the part that the reset gate touches.")
def _check_gru_step_reset_before(step: Callable[..., torch.Tensor]) -> None:
    for seed in range(5):
        B, D, H, g = _ch01_cases(seed)
        if seed == 4:
            D = H  # a square case, where weights used untransposed still compute something
        w = _gru_weights(D, H, g)
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        want = _reset_before_step(x, h, w)
        with torch.no_grad():
            got = step(x, h, *(t.clone() for t in w))
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(
                got.double(), want.double(), atol=1e-5):
            for message, wrong in _step_mistakes(x, h, w):
                if torch.allclose(got.double(), wrong.double(), atol=1e-5):
                    raise Wrong(message)
        expect_close(got, want, f"gru_step_reset_before(x {tuple(x.shape)}, h {tuple(h.shape)}, ...)")


def _regated(w: Weights, src: torch.Tensor) -> Weights:
    """``w`` with reset-gate row ``k`` replaced by row ``src[k]`` in all four tensors (unit k gated by
    ``r_src[k]``)."""
    H = w[1].shape[1]
    out = tuple(t.clone() for t in w)
    for t in out:
        t[:H] = t[:H][src]
    return out  # type: ignore[return-value]


def _conversion_mistakes(w: Weights, src: torch.Tensor) -> list[tuple[str, Weights]]:
    """(diagnosis, the nn.GRUCell weights a typical wrong conversion returns) for a ``W_hn`` whose row
    ``k`` has its only nonzero entry in column ``src[k]``."""
    W_ih, W_hh, b_ih, b_hh = w
    H = W_hh.shape[1]

    def biases(into: slice | None, keep_b_hn: bool, regate: bool = True) -> Weights:
        new_ih, new_hh = b_ih.clone(), b_hh.clone()
        if into is not None:
            new_ih[into] += b_hh[2 * H:]
        if not keep_b_hn:
            new_hh[2 * H:] = 0
        return _regated((W_ih, W_hh, new_ih, new_hh), src) if regate else (W_ih, W_hh, new_ih, new_hh)

    mistakes = [
        ("these are the weights unchanged: nn.GRUCell multiplies b_hn by r, and the reset-before cell does "
         "not (with a diagonal W_hn the products agree; the bias is what differs)", _regated(w, src)),
        ("b_hn disappeared: it has to move out of the reset gate's reach, not vanish", biases(None, False)),
        ("b_hn is counted twice: you added it to the candidate's input bias but left it inside the part "
         "that nn.GRUCell multiplies by r", biases(slice(2 * H, 3 * H), True)),
        ("b_hn went into the reset gate's block; it belongs to the candidate's block (the third)",
         biases(slice(0, H), False)),
        ("b_hn went into the update gate's block; it belongs to the candidate's block (the third)",
         biases(slice(H, 2 * H), False)),
    ]
    if not torch.equal(src, torch.arange(H)):
        mistakes.append((
            "this W_hn has one nonzero entry per row, but not always on the diagonal: Cho et al.'s unit k "
            "then reads the gate r_j of the unit j its row points to, while nn.GRUCell multiplies unit k "
            "by its own reset gate, the k-th row of the reset block. The bias is right; which weights "
            "compute that row?", biases(slice(2 * H, 3 * H), False, regate=False)))
    return mistakes


def _one_per_row(H: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``W_hn`` (H, H) with at most one nonzero entry per row, mostly off the diagonal, and ``src``:
    row ``k``'s nonzero column (``k`` for the empty row). Unit 0 points at unit 1, unit 1 at unit 0 (a
    swap), unit 2 at unit 1 again (not a permutation), the last row is empty, and the rows between
    point at random units."""
    src = torch.randint(0, H, (H,), generator=g)
    src[:3] = torch.tensor([1, 0, 1])[:H]
    src[-1] = H - 1
    W_hn = torch.zeros(H, H)
    W_hn[torch.arange(H), src] = torch.randn(H, generator=g)
    W_hn[H - 1] = 0.0
    return W_hn, src


def _not_convertible(H: int, g: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """(the case's diagnosis, a W_hn that no nn.GRUCell weights match): each has a row with two or
    more nonzero entries."""
    A = torch.randn(H, H, generator=g)
    nearly = torch.diag(torch.randn(H, generator=g))
    nearly[H - 1, 0] = 1e-3
    return [
        ("returned weights for a dense W_hn, with off-diagonal entries everywhere: unit k of Cho et al.'s "
         "cell reads r_j h_j for every j, and no nn.GRU weights compute that cell (raise ValueError)", A),
        ("returned weights for a symmetric W_hn: symmetry does not let r pass through W_hn; a symmetric "
         "W_hn with off-diagonal entries still mixes r_j into unit k (raise ValueError)", A + A.T),
        ("returned weights for an upper triangular W_hn: its first row has several nonzero entries, so "
         "unit 0 still mixes the gates of several units (raise ValueError)", A.triu()),
        ("returned weights for a W_hn that is diagonal but for one entry of 1e-3: any nonzero entry beside "
         "the diagonal one mixes a second gate into its unit, however small; test for exact zeros, not for "
         "small entries (raise ValueError)", nearly),
    ]


@checker("01.reset_before_as_nn_gru",
         hint="Compare the two candidate formulas of section 3 unit by unit: which gate values does unit k "
              "of each form read, and which gate could nn.GRUCell's unit k be made to compute? Where must "
              "b_hn go so that the reset gate no longer reaches it? Where no weights work, raise ValueError.")
def _check_reset_before_as_nn_gru(convert: Callable[..., Weights]) -> None:
    for seed in range(5):
        B, D, H, g = _ch01_cases(seed)
        if seed == 4:
            H = 5  # room for a swap, a repeated unit, a random row and an empty one
        w = _gru_weights(D, H, g, diagonal_hn=True)
        src = torch.arange(H)
        what = "a diagonal W_hn"
        if seed == 4:  # one nonzero per row, off the diagonal: the reset gate's rows must follow it
            W_hn, src = _one_per_row(H, g)
            w[1][2 * H:] = W_hn
            what = (f"a W_hn with one nonzero entry per row, in columns {src.tolist()[:-1]} "
                    "(the last row is 0)")
        x, h = torch.randn(B, D, generator=g), torch.randn(B, H, generator=g)
        try:
            got = convert(*(t.clone() for t in w))
        except ValueError as err:
            if seed == 4:
                raise Wrong(f"raised ValueError ({err}) for {what}: Cho et al.'s unit k then reads a single "
                            "gate, r_j for the j of its row; could nn.GRUCell's unit k compute that gate?"
                            ) from None
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
            out, want = cell(x, h), _reset_before_step(x, h, w)
            if not torch.allclose(out.double(), want.double(), atol=1e-5):
                for message, wrong in _conversion_mistakes(w, src):
                    if torch.allclose(out.double(), _reset_after_step(x, h, wrong).double(), atol=1e-5):
                        raise Wrong(message)
            expect_close(out, want, f"nn.GRUCell with your weights, on a reset-before cell with {what} "
                                    f"(H={H})")
        message, W_hn = _not_convertible(H, g)[seed % 4]
        w = _gru_weights(D, H, g)
        w[1][2 * H:] = W_hn
        try:
            convert(*(t.clone() for t in w))
        except ValueError:
            continue
        raise Wrong(message)


@checker("01.gates_for_weights",
         hint="Question 4's hint and section 4: P_i, the product of the gates after step i, in terms of "
              "the w's. How does the gate of step i relate P_i to P_(i-1)? Decide what a gate should be "
              "where both are zero.")
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
        got_w = _unrolled(z.double())
        if not torch.allclose(got_w, w, atol=1e-6):
            for message, wrong in _gate_mistakes(w):
                decided = w.cumsum(0)[1:] > 0  # where the gate is not free (not 0 / 0)
                if wrong.shape == z.shape and torch.allclose(z.double()[decided], wrong[decided], atol=1e-6):
                    raise Wrong(message)
        expect_close(got_w, w, f"the unrolled weights of your gates, for {what}", atol=1e-6)


def _gate_mistakes(w: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(diagnosis, what a typical wrong answer returns) for weights ``w`` of shape ``(T + 1, H)``."""
    prefix = w.cumsum(0)                # P_i = w_0 + ... + w_i
    suffix = w.flip(0).cumsum(0).flip(0)  # w_i + ... + w_T

    def ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        return torch.where(den > 0, num / den.clamp_min(1e-300), torch.ones_like(den))

    mistakes = [
        ("these are the weights w_1 ... w_T themselves; a gate is the share of the state that a step "
         "keeps, a ratio of two consecutive P's", w[1:]),
        ("1 - w_i is not the gate: w_i = (1 - z_i) P_i, and P_i (the product of the later gates) is 1 only "
         "at the last step", 1 - w[1:]),
        ("these are the products of the gates (the P's), not the gates", prefix[:-1]),
        ("these are the products of the gates (the P's), not the gates", prefix[1:]),
        ("the P's run the wrong way in time: P_i, the product of the gates after step i, is the sum of the "
         "weights up to i (w_0 to w_i), not from i on", ratio(suffix[1:], suffix[:-1])),
    ]
    if w.shape[0] - 1 == w.shape[1]:
        mistakes.append(("your gates are transposed: one row per step, one column per hidden unit",
                         ratio(prefix[:-1], prefix[1:]).T))
    return mistakes


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


def _lstm_weights(f: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """The reference, ``(T, H) -> (T + 1, H)``: ``w_0 = prod_{j=1..T} f_j``, ``w_k = i_k prod_{j>k} f_j``."""
    later = torch.cat([f.flip(0).cumprod(0).flip(0), f.new_ones(1, f.shape[1])])  # row k: prod of f_{k+1..T}
    return torch.cat([later[:1], i * later[1:]])


def _lstm_unrolled(f: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """The weights by running ``c_t = f_t c_{t-1} + i_t g_t`` on one-hot candidates (and ``c_0``)."""
    T, H = f.shape
    w = f.new_empty(T + 1, H)
    for k in range(T + 1):
        c = f.new_ones(H) if k == 0 else f.new_zeros(H)
        for t in range(1, T + 1):
            c = f[t - 1] * c + i[t - 1] * (f.new_ones(H) if t == k else f.new_zeros(H))
        w[k] = c
    return w


def _lstm_mistakes(f: torch.Tensor, i: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(diagnosis, what a typical wrong answer returns) for gates ``f``, ``i`` of shape ``(T, H)``."""
    T, H = f.shape
    want = _lstm_weights(f, i)
    from_step = f.flip(0).cumprod(0).flip(0)  # row k - 1: prod of f_k .. f_T, the gate of step k included
    mistakes = [
        ("these are the GRU's weights with z = f: the LSTM does not couple its gates, and a new candidate "
         "g_k enters with its input gate i_k, not with 1 - f_k", _lstm_weights(f, 1 - f)),
        ("off by one: the products include the forget gate of step k itself; the candidate g_k is added "
         "after f_k has acted, so only the forget gates of the later steps act on it",
         torch.cat([from_step[:1], i * from_step])),
        ("the products run over the steps before k; a candidate has to survive the forget gates of the "
         "steps after it", torch.cat([want[:1], i * torch.cat([f.new_ones(1, H), f.cumprod(0)[:-1]])])),
        ("you normalised the weights to sum to one; the LSTM's do not (that is the difference from the "
         "GRU): keep them as the recurrence makes them", want / want.sum(0, keepdim=True)),
        ("row 0 weighs the initial memory c_0, which every forget gate acts on: the product of all of them",
         torch.cat([f.new_zeros(1, H), want[1:]])),
        ("row 0 weighs the initial memory c_0, which every forget gate acts on: the product of all of them",
         torch.cat([f.new_ones(1, H), want[1:]])),
    ]
    if T + 1 == H:
        mistakes.append(("your weights are transposed: one row per position (row 0 for c_0), one column "
                         "per hidden unit", want.T))
    return mistakes


@checker("01.lstm_memory_weights",
         hint="Section 4 unrolls the GRU's last line; do the same with the LSTM's memory line, where two "
              "independent gates replace the update gate and its complement. Ask which forget gates a "
              "candidate written at step k passes through before the end, and what happens to the "
              "telescoping sum.")
def _check_lstm_memory_weights(weights_for: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    for seed in range(5):
        _, T, H, g = _ch01_cases(seed)
        if seed == 4:
            H = T + 1  # a square answer, where transposed weights keep the shape
        f, i = (torch.rand(T, H, generator=g, dtype=torch.double) for _ in range(2))
        if seed == 3:
            # a gate that forgets nothing, one that forgets everything (at step 2: the products before
            # and after it differ), and a step that writes nothing
            f[0], f[1, 0], i[-1] = 1.0, 0.0, 0.0
        want = _lstm_unrolled(f, i)
        got = weights_for(f.clone(), i.clone())
        what = f"lstm_memory_weights(f, i of shape {(T, H)})"
        if isinstance(got, torch.Tensor) and got.shape == want.shape and got.isnan().any() and (f == 0).any():
            raise Wrong(f"{what} contains NaN, and one forget gate is exactly 0 (it forgets everything, "
                        "allowed in [0, 1]): dividing one product of gates by another gives 0 / 0 there; "
                        "build each weight from the gates it needs, without dividing")
        if isinstance(got, torch.Tensor) and got.shape == (T, H):
            raise Wrong(f"{what} has shape {(T, H)}, expected {(T + 1, H)}: one row for the initial memory "
                        "c_0 (row 0), then one per candidate g_1 ... g_T")
        if (isinstance(got, torch.Tensor) and got.shape == want.shape
                and not torch.allclose(got.double(), want, atol=1e-6)):
            for message, wrong in _lstm_mistakes(f, i):
                if wrong.shape == got.shape and torch.allclose(got.double(), wrong, atol=1e-6):
                    raise Wrong(message)
        expect_close(got, want, what, atol=1e-6, rtol=1e-5)  # float32 arithmetic is fine
