"""Recurrent networks: an RNN cell and a GRU from scratch, the unrolled GRU, and a GRU language model.

Introduced in chapter 01 (recurrent networks and the GRU).

* :class:`RNNCellScratch` and :class:`GRUCellScratch` are teaching versions: one time step,
  written so that every line is an equation of the chapter. :class:`GRUScratch` runs the GRU
  cell over a sequence and can return its gates for plots.
* :func:`copy_rnn_cell_weights` and :func:`copy_gru_weights` copy PyTorch's own modules'
  weights into them, so the tests (and the chapter) can show the two compute the same thing.
* :func:`unrolled_gru_weights` turns the update gates of a run into the weights of the unrolled
  GRU: the last hidden state is a convex combination of the initial state and every candidate.
* :class:`GRULanguageModel` (and :class:`RNNLanguageModel`, the same with a vanilla RNN) is the
  fast version later code uses: an embedding, ``nn.GRU`` and a linear read-out.
* :func:`recurrent_device` keeps PyTorch's recurrent modules off Apple's MPS, where they are
  known to fail (:data:`MPS_RNN_ISSUES`).

Shapes: ``B`` batch, ``T`` time steps, ``I`` input features, ``H`` hidden units, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfmlib.data import BOS_ID, EOS_ID, PAD_ID, as_id_list

INTRODUCED_IN = 1

__all__ = [
    "GRUCellScratch",
    "GRUGates",
    "GRULanguageModel",
    "GRUScratch",
    "RNNCellScratch",
    "RNNLanguageModel",
    "RecurrentLanguageModel",
    "check_sizes",
    "check_step_inputs",
    "collate_lm",
    "copy_gru_weights",
    "copy_rnn_cell_weights",
    "lm_loss",
    "MPS_RNN_ISSUES",
    "recurrent_device",
    "unrolled_gru_weights",
    "unrolled_gru_state",
]


# --------------------------------------------------------------------------- input checks


def check_step_inputs(who: str, x: Tensor, h: Tensor | None, input_size: int,
                      hidden_size: int) -> Tensor:
    """Check one time step's inputs and return ``h`` (zeros of shape ``(B, H)`` when ``None``).

    ``x`` must be a floating tensor of shape ``(B, input_size)`` with ``B >= 1`` and ``h`` one of
    shape ``(B, hidden_size)`` and ``x``'s dtype; anything else raises ``ValueError``/``TypeError``
    naming the argument.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{who}: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{who}: x must be a floating tensor, got dtype {x.dtype} "
                        "(embed token ids first)")
    if x.dim() != 2 or x.shape[1] != input_size:
        raise ValueError(f"{who}: x must have shape (batch, input_size={input_size}), "
                         f"got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError(f"{who}: empty batch (x has shape {tuple(x.shape)})")
    if h is None:
        return x.new_zeros(x.shape[0], hidden_size)
    if not isinstance(h, Tensor):
        raise TypeError(f"{who}: h must be a torch.Tensor or None, got {type(h).__name__}")
    if h.shape != (x.shape[0], hidden_size):
        raise ValueError(f"{who}: h must have shape (batch={x.shape[0]}, hidden_size={hidden_size}), "
                         f"got {tuple(h.shape)}")
    if h.dtype != x.dtype:
        raise TypeError(f"{who}: h must have x's dtype {x.dtype}, got {h.dtype}")
    return h


def check_sizes(who: str, input_size: int, hidden_size: int) -> None:
    """Raise ``ValueError`` unless ``input_size`` and ``hidden_size`` are positive ints."""
    for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{who}: {name} must be a positive int, got {v!r}")


# --------------------------------------------------------------------------- vanilla RNN


class RNNCellScratch(nn.Module):
    """One step of an Elman RNN: ``h' = tanh(W_xh x + W_hh h + b)``.

    ``forward(x, h)``: ``x`` is ``(B, I)``, ``h`` is ``(B, H)`` (zeros when ``None``); returns
    ``h'`` of shape ``(B, H)``. ``W_xh`` is ``(H, I)``, ``W_hh`` is ``(H, H)``, ``b`` is ``(H,)``.
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        check_sizes("RNNCellScratch", input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.W_xh = nn.Parameter(torch.empty(hidden_size, input_size))
        self.W_hh = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.b = nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.hidden_size)  # PyTorch's default for recurrent layers
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        h = check_step_inputs("RNNCellScratch", x, h, self.input_size, self.hidden_size)
        return torch.tanh(x @ self.W_xh.T + h @ self.W_hh.T + self.b)


def copy_rnn_cell_weights(src: nn.RNNCell, dst: RNNCellScratch) -> RNNCellScratch:
    """Copy a tanh ``nn.RNNCell``'s weights into ``dst`` (its two biases add up to ``dst.b``)."""
    if not isinstance(src, nn.RNNCell) or src.nonlinearity != "tanh":
        raise TypeError(f"copy_rnn_cell_weights: src must be a tanh nn.RNNCell, got {src!r}")
    # by attributes, not class: the chapter copies into its own (identical) RNNCellScratch
    if not all(hasattr(dst, a) for a in ("W_xh", "W_hh", "b", "input_size", "hidden_size")):
        raise TypeError(f"copy_rnn_cell_weights: dst must be an RNNCellScratch, got {type(dst).__name__}")
    if (src.input_size, src.hidden_size) != (dst.input_size, dst.hidden_size):
        raise ValueError(
            f"copy_rnn_cell_weights: src has (input_size, hidden_size)="
            f"{(src.input_size, src.hidden_size)}, dst has {(dst.input_size, dst.hidden_size)}"
        )
    with torch.no_grad():
        dst.W_xh.copy_(src.weight_ih)
        dst.W_hh.copy_(src.weight_hh)
        dst.b.copy_(src.bias_ih + src.bias_hh if src.bias else torch.zeros_like(dst.b))
    return dst


# --------------------------------------------------------------------------- GRU


class GRUGates(NamedTuple):
    """The gates of a GRU step (each ``(B, H)``) or of a run (each ``(B, T, H)``)."""

    z: Tensor  # update gate: how much of the old state to keep
    r: Tensor  # reset gate: how much of the old state the candidate may read
    n: Tensor  # candidate state


class GRUCellScratch(nn.Module):
    """One GRU step (Cho et al., 2014) in PyTorch's convention, the one ``nn.GRU`` computes::

        r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)        reset gate
        z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)        update gate
        n  = tanh(W_in x + b_in + r * (W_hn h + b_hn))     candidate
        h' = (1 - z) * n + z * h

    Cho et al. apply the reset gate before the matrix product, ``W_hn (r * h)``; PyTorch (and this
    cell) applies it after, ``r * (W_hn h + b_hn)``. ``z`` near 1 keeps the old state.
    Each ``W_i*`` is an ``nn.Linear(I, H)`` and each ``W_h*`` an ``nn.Linear(H, H)``, bias included.
    ``forward(x, h)``: ``x`` is ``(B, I)``, ``h`` is ``(B, H)`` (zeros when ``None``); returns
    ``h'`` of shape ``(B, H)``. ``step(x, h)`` returns ``(h', GRUGates(z, r, n))``.
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        check_sizes("GRUCellScratch", input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.W_ir, self.W_iz, self.W_in = (nn.Linear(input_size, hidden_size) for _ in range(3))
        self.W_hr, self.W_hz, self.W_hn = (nn.Linear(hidden_size, hidden_size) for _ in range(3))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.hidden_size)  # PyTorch's default for recurrent layers
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def step(self, x: Tensor, h: Tensor | None = None) -> tuple[Tensor, GRUGates]:
        h = check_step_inputs("GRUCellScratch", x, h, self.input_size, self.hidden_size)
        r = torch.sigmoid(self.W_ir(x) + self.W_hr(h))
        z = torch.sigmoid(self.W_iz(x) + self.W_hz(h))
        n = torch.tanh(self.W_in(x) + r * self.W_hn(h))
        h_new = (1 - z) * n + z * h
        return h_new, GRUGates(z, r, n)

    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        return self.step(x, h)[0]


class GRUScratch(nn.Module):
    """A one-layer GRU that runs :class:`GRUCellScratch` over time, step by step.

    ``forward(x, h0=None, return_gates=False)``: ``x`` is ``(B, T, I)`` (``(T, B, I)`` when
    ``batch_first=False``), ``h0`` is ``(B, H)`` (zeros when ``None``). Returns
    ``(outputs, h_last)`` with ``outputs`` ``(B, T, H)`` (time-major when ``batch_first=False``)
    and ``h_last`` ``(B, H)``; with ``return_gates`` also a :class:`GRUGates` whose tensors are laid
    out like ``outputs``. Unlike ``nn.GRU``, ``h0`` and ``h_last`` have no layer axis.
    """

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = True):
        super().__init__()
        self.cell = GRUCellScratch(input_size, hidden_size)
        self.input_size, self.hidden_size, self.batch_first = input_size, hidden_size, batch_first

    def forward(self, x: Tensor, h0: Tensor | None = None, return_gates: bool = False,
                ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, GRUGates]:
        if not isinstance(x, Tensor):
            raise TypeError(f"GRUScratch: x must be a torch.Tensor, got {type(x).__name__}")
        layout = "(batch, time, input_size)" if self.batch_first else "(time, batch, input_size)"
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"GRUScratch: x must have shape {layout} with input_size="
                             f"{self.input_size}, got {tuple(x.shape)}")
        if not self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[1] == 0:
            raise ValueError(f"GRUScratch: empty sequence (x has shape {tuple(x.shape)}, 0 time steps)")
        h = h0
        outputs, gates = [], []
        for t in range(x.shape[1]):
            h, g = self.cell.step(x[:, t], h)
            outputs.append(h)
            gates.append(g)
        out = torch.stack(outputs, dim=1)
        stacked = GRUGates(*(torch.stack(parts, dim=1) for parts in zip(*gates, strict=True)))
        if not self.batch_first:
            out = out.transpose(0, 1)
            stacked = GRUGates(*(g.transpose(0, 1) for g in stacked))
        return (out, h, stacked) if return_gates else (out, h)

    def copy_from_torch(self, gru: nn.GRU | nn.GRUCell) -> GRUScratch:
        """Copy a one-layer ``nn.GRU`` (or ``nn.GRUCell``) into this module; returns ``self``."""
        copy_gru_weights(gru, self.cell)
        return self


def copy_gru_weights(src: nn.GRU | nn.GRUCell, dst: GRUCellScratch | GRUScratch,
                     layer: int = 0) -> GRUCellScratch | GRUScratch:
    """Copy layer ``layer`` of ``src`` into ``dst`` (a cell, or a :class:`GRUScratch`).

    PyTorch stacks the three gates in the order reset, update, candidate:
    ``weight_ih_l0 = [W_ir; W_iz; W_in]`` of shape ``(3H, I)``, ``weight_hh_l0 = [W_hr; W_hz; W_hn]``
    of shape ``(3H, H)``, and the biases likewise. A bidirectional ``nn.GRU`` is refused.
    """
    cell = getattr(dst, "cell", dst)
    if not all(hasattr(cell, f"W_{side}{gate}") for side in "ih" for gate in "rzn"):
        raise TypeError(f"copy_gru_weights: dst must be a GRUCellScratch or GRUScratch, got "
                        f"{type(dst).__name__}")
    if isinstance(src, nn.GRU):
        if src.bidirectional or not 0 <= layer < src.num_layers:
            raise ValueError(f"copy_gru_weights: need a unidirectional nn.GRU with a layer {layer}, "
                             f"got {src!r}")
        suffix = f"_l{layer}"
        want_in = src.input_size if layer == 0 else src.hidden_size
    elif isinstance(src, nn.GRUCell):
        suffix, want_in = "", src.input_size
    else:
        raise TypeError(f"copy_gru_weights: src must be an nn.GRU or nn.GRUCell, got {type(src).__name__}")
    if (want_in, src.hidden_size) != (cell.input_size, cell.hidden_size):
        raise ValueError(f"copy_gru_weights: src has (input_size, hidden_size)="
                         f"{(want_in, src.hidden_size)}, dst has {(cell.input_size, cell.hidden_size)}")
    w_ih = getattr(src, "weight_ih" + suffix).chunk(3)
    w_hh = getattr(src, "weight_hh" + suffix).chunk(3)
    if src.bias:
        b_ih = getattr(src, "bias_ih" + suffix).chunk(3)
        b_hh = getattr(src, "bias_hh" + suffix).chunk(3)
    else:
        b_ih = b_hh = (torch.zeros(src.hidden_size),) * 3
    with torch.no_grad():
        for k, gate in enumerate("rzn"):
            getattr(cell, f"W_i{gate}").weight.copy_(w_ih[k])
            getattr(cell, f"W_i{gate}").bias.copy_(b_ih[k])
            getattr(cell, f"W_h{gate}").weight.copy_(w_hh[k])
            getattr(cell, f"W_h{gate}").bias.copy_(b_hh[k])
    return dst


# --------------------------------------------------------------------------- the unrolled GRU


def unrolled_gru_weights(z: Tensor, batch_first: bool = True) -> Tensor:
    """The weights of the unrolled GRU, from the update gates ``z`` of a run.

    With ``h_t = (1 - z_t) * n_t + z_t * h_{t-1}`` for ``t = 1..T``, the last state is

        h_T = w_0 * h_0 + sum_{i=1..T} w_i * n_i,
        w_0 = prod_{j=1..T} z_j,     w_i = (1 - z_i) * prod_{j=i+1..T} z_j,

    elementwise per hidden unit; the weights are non-negative and sum to one over ``i = 0..T``.
    ``z`` is ``(B, T, H)`` (``(T, B, H)`` when ``batch_first=False``) or ``(T, H)``; the result has
    ``T + 1`` positions on the same axis (position 0 weighs ``h_0``, position ``i`` weighs ``n_i``).
    """
    if not isinstance(z, Tensor) or not z.is_floating_point():
        raise TypeError(f"unrolled_gru_weights: z must be a floating tensor, got "
                        f"{getattr(z, 'dtype', type(z).__name__)}")
    if z.dim() not in (2, 3):
        raise ValueError(f"unrolled_gru_weights: z must have shape (B, T, H), (T, B, H) or (T, H), "
                         f"got {tuple(z.shape)}")
    axis = 1 if (z.dim() == 3 and batch_first) else 0
    if z.shape[axis] == 0:
        raise ValueError(f"unrolled_gru_weights: empty sequence (z has shape {tuple(z.shape)})")
    # keep[i] = prod_{j=i..T} z_j  (products over the suffix that starts at step i)
    keep = z.flip(axis).cumprod(axis).flip(axis)
    ones = torch.ones_like(z.narrow(axis, 0, 1))
    after = torch.cat([keep.narrow(axis, 1, z.shape[axis] - 1), ones], dim=axis)  # prod_{j>i} z_j
    w_candidates = (1 - z) * after
    w_h0 = keep.narrow(axis, 0, 1)
    return torch.cat([w_h0, w_candidates], dim=axis)


def unrolled_gru_state(z: Tensor, n: Tensor, h0: Tensor) -> Tensor:
    """``h_T`` computed from the unrolled form: ``w_0 * h0 + sum_i w_i * n_i``.

    ``z`` and ``n`` are ``(B, T, H)``, ``h0`` is ``(B, H)``; returns ``(B, H)``.
    """
    for name, t in (("z", z), ("n", n), ("h0", h0)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"unrolled_gru_state: {name} must be a floating tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if z.shape != n.shape or z.dim() != 3 or h0.shape != (z.shape[0], z.shape[2]):
        raise ValueError(f"unrolled_gru_state: need z, n of shape (B, T, H) and h0 of shape (B, H), "
                         f"got z {tuple(z.shape)}, n {tuple(n.shape)}, h0 {tuple(h0.shape)}")
    w = unrolled_gru_weights(z)
    return w[:, 0] * h0 + (w[:, 1:] * n).sum(dim=1)


# --------------------------------------------------------------------------- language models


class RecurrentLanguageModel(nn.Module):
    """Embedding -> a recurrent layer (``nn.GRU`` or ``nn.RNN``) -> linear read-out over the vocabulary.

    ``forward(ids, hidden=None)``: ``ids`` is ``(B, T)`` ``long``; returns logits ``(B, T, V)``
    for the *next* token at every position. ``forward_with_state`` also returns the final
    hidden state ``(num_layers, B, H)``, so generation can continue from it.
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0, cell: str = "gru"):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("embed_size", embed_size),
                        ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {v!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        if cell not in ("gru", "rnn"):
            raise ValueError(f"{type(self).__name__}: cell must be 'gru' or 'rnn', got {cell!r}")
        self.vocab_size, self.cell_type = vocab_size, cell
        self.embed = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        layer = nn.GRU if cell == "gru" else nn.RNN
        self.rnn = layer(embed_size, hidden_size, num_layers=num_layers, batch_first=True,
                         dropout=dropout if num_layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, vocab_size)

    def _check_ids(self, ids: Tensor) -> None:
        if not isinstance(ids, Tensor) or ids.dtype != torch.long:
            raise TypeError(f"{type(self).__name__}: ids must be a torch.long tensor of token ids, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)}")
        if ids.dim() != 2:
            raise ValueError(f"{type(self).__name__}: ids must have shape (batch, time), "
                             f"got {tuple(ids.shape)}")
        if ids.shape[0] == 0:
            raise ValueError(f"{type(self).__name__}: empty batch (ids has shape {tuple(ids.shape)})")
        if ids.shape[1] == 0:
            raise ValueError(f"{type(self).__name__}: empty sequence (ids has shape {tuple(ids.shape)})")
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one read back from the device, not two
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"{type(self).__name__}: ids must be in [0, vocab_size={self.vocab_size}), "
                             f"got values in [{lo}, {hi}] (unknown tokens should map to UNK_ID)")

    def _check_hidden(self, ids: Tensor, hidden: Tensor | None) -> None:
        if hidden is None:
            return
        want = (self.rnn.num_layers, ids.shape[0], self.rnn.hidden_size)
        if not isinstance(hidden, Tensor) or tuple(hidden.shape) != want:
            got = tuple(hidden.shape) if isinstance(hidden, Tensor) else type(hidden).__name__
            raise ValueError(f"{type(self).__name__}: hidden must have shape (num_layers, batch, "
                             f"hidden_size)={want}, got {got}")

    def forward_with_state(self, ids: Tensor, hidden: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``ids`` ``(B, T)`` long, ``hidden`` ``(num_layers, B, H)`` or ``None`` (zeros).

        Returns the logits ``(B, T, V)`` and the final hidden state ``(num_layers, B, H)``.
        """
        self._check_ids(ids)
        self._check_hidden(ids, hidden)
        states, hidden = self.rnn(self.drop(self.embed(ids)), hidden)
        return self.out(self.drop(states)), hidden

    def forward(self, ids: Tensor, hidden: Tensor | None = None) -> Tensor:
        """``ids`` ``(B, T)`` long -> next-token logits ``(B, T, V)``."""
        return self.forward_with_state(ids, hidden)[0]

    @torch.no_grad()
    def generate(self, prefix: list[int] | Tensor, max_new_tokens: int = 30, temperature: float = 0.0,
                 generator: torch.Generator | None = None, eos_id: int = EOS_ID) -> list[int]:
        """Continue ``prefix`` (token ids, usually starting with BOS) until EOS or ``max_new_tokens``.

        ``temperature=0`` picks the most likely token (greedy); a positive temperature samples
        from ``softmax(logits / temperature)`` (pass a seeded ``generator`` for repeatable samples).
        PAD and BOS are never produced. Returns the new ids (the EOS included when produced).
        """
        prefix = torch.as_tensor(prefix, dtype=torch.long).flatten()
        if prefix.numel() == 0:
            raise ValueError("generate: prefix must hold at least one token (e.g. [BOS_ID])")
        if temperature < 0:
            raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            logits, hidden = self.forward_with_state(prefix[None].to(device))
            new: list[int] = []
            for _ in range(max_new_tokens):
                last = logits[0, -1].float().cpu()
                last[[PAD_ID, BOS_ID]] = -math.inf  # never produce padding or a second start token
                if temperature == 0:
                    nxt = int(last.argmax())
                else:
                    probs = torch.softmax(last / temperature, dim=-1)
                    nxt = int(torch.multinomial(probs, 1, generator=generator))
                new.append(nxt)
                if nxt == eos_id:
                    break
                logits, hidden = self.forward_with_state(torch.tensor([[nxt]], device=device), hidden)
        finally:
            self.train(was_training)  # also after an error: leave the model as it was
        return new

    @torch.no_grad()
    def gates(self, ids: Tensor) -> GRUGates:
        """The gates of the (first) GRU layer on ``ids`` ``(B, T)``: each ``(B, T, H)``.

        Runs a :class:`GRUScratch` holding a copy of ``self.rnn``'s first layer, which computes
        the same states as ``nn.GRU`` but keeps the gates.
        """
        if self.cell_type != "gru":
            raise ValueError(f"gates: only a GRU has gates, this model's cell is {self.cell_type!r}")
        self._check_ids(ids)
        scratch = GRUScratch(self.rnn.input_size, self.rnn.hidden_size)
        scratch.copy_from_torch(self.rnn).to(device=ids.device, dtype=self.embed.weight.dtype)
        return scratch(self.embed(ids), return_gates=True)[2]


class GRULanguageModel(RecurrentLanguageModel):
    """A GRU language model: embedding -> ``nn.GRU`` -> linear. See :class:`RecurrentLanguageModel`."""

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0):
        super().__init__(vocab_size, embed_size, hidden_size, num_layers, dropout, cell="gru")


class RNNLanguageModel(RecurrentLanguageModel):
    """The same with a vanilla (tanh) ``nn.RNN``: the baseline that shows what the gates buy."""

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0):
        super().__init__(vocab_size, embed_size, hidden_size, num_layers, dropout, cell="rnn")


def collate_lm(seqs: Sequence[Sequence[int] | Tensor]) -> tuple[Tensor, Tensor]:
    """Sentences (id lists without BOS/EOS) -> ``(inputs, targets)``, both ``(B, T)`` ``long``.

    ``B = len(seqs)`` and ``T = 1 + the longest sentence``; a sentence may be a list of ints or a
    1-D integer tensor (anything else raises ``TypeError``/``ValueError`` naming it).

    ``inputs = [BOS] + s`` and ``targets = s + [EOS]``, padded with ``PAD_ID`` (which the loss
    ignores). Use it as a ``DataLoader``'s ``collate_fn``.
    """
    if len(seqs) == 0:
        raise ValueError("collate_lm: empty batch")
    seqs = [as_id_list(s, "collate_lm", f"sentence {b}") for b, s in enumerate(seqs)]
    longest = max(len(s) for s in seqs) + 1
    inputs = torch.full((len(seqs), longest), PAD_ID, dtype=torch.long)
    targets = torch.full((len(seqs), longest), PAD_ID, dtype=torch.long)
    for b, s in enumerate(seqs):
        inputs[b, : len(s) + 1] = torch.tensor([BOS_ID] + s)
        targets[b, : len(s) + 1] = torch.tensor(s + [EOS_ID])
    return inputs, targets


def lm_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Mean next-token cross-entropy over the real (non-pad) targets, and how many there were.

    ``batch`` is ``(inputs, targets)``, both ``(B, T)`` ids as :func:`collate_lm` makes them;
    ``model(inputs)`` must return logits ``(B, T, V)``. Padded targets do not count.

    Returns ``(loss, n_tokens)``: the loss a 0-d float tensor, ``n_tokens`` a 0-d ``int64`` tensor
    on the targets' device. The count stays on the device so that a training step never waits
    for it: reading it (``int(n_tokens)``) would make the host wait for the GPU at every step (a
    *host sync*, chapter 10); :func:`tfmlib.train.fit` reads the counts of many steps at once,
    when it reads their losses. Use ``int(n_tokens)`` where a Python number is wanted (evaluation loops).

    A batch whose targets are all padding has nothing to predict: its ``n_tokens`` is 0 and its
    loss NaN (the mean over no targets); ``fit`` stops with "loss became nan at step k" when it
    reads it. (The check is not made here: it would read the count back at every step.)
    ``ValueError`` when inputs and targets differ in shape.
    """
    inputs, targets = batch
    if inputs.shape != targets.shape:
        raise ValueError(f"lm_loss: inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)} differ")
    n_tokens = (targets != PAD_ID).sum()                    # 0-d int64 on the targets' device
    logits = model(inputs)                                  # (B, T, V)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID)
    return loss, n_tokens


# PyTorch's own issue tracker, open at the time of writing (check them before removing the routing):
MPS_RNN_ISSUES: dict[str, str] = {
    "backward through a packed sequence (nn.GRU/nn.LSTM) fails with grad_y missing or crashes the kernel":
        "https://github.com/pytorch/pytorch/issues/102911",
    "nn.GRU on MPS outputs NaN where the CPU gives finite values":
        "https://github.com/pytorch/pytorch/issues/94691",
}


def recurrent_device(device: torch.device | str, model: nn.Module) -> torch.device:
    """The device to run ``model`` on when ``device`` was asked for: ``device`` itself, except the
    CPU when ``device`` is Apple's MPS and ``model`` holds one of PyTorch's recurrent modules
    (``nn.GRU``, ``nn.RNN``, ``nn.LSTM``: any ``nn.RNNBase``), whose MPS kernels are known to fail
    (:data:`MPS_RNN_ISSUES`). The cells (``nn.GRUCell``) and the Transformer keep the device.

    ``recurrent_device("mps", Seq2Seq(...))`` is ``cpu``; on CUDA and the CPU nothing changes.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"recurrent_device: device must be a torch.device or a str, got "
                        f"{type(device).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"recurrent_device: model must be an nn.Module, got {type(model).__name__}")
    if device.type == "mps" and any(isinstance(m, nn.RNNBase) for m in model.modules()):
        return torch.device("cpu")
    return device
