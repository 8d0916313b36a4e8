"""Draw the book's diagrams: one SVG per figure in ``notebooks/figures/``.

    python tools/figures.py            # (re)draw every figure
    python tools/figures.py --check    # exit 1 if a committed SVG differs from what this draws
    python tools/figures.py --png DIR  # also write PNG previews to DIR (for looking, not committed)

Every diagram is drawn with matplotlib patches, arrows and text, nothing else: no external tool,
no network, no randomness. The SVGs are deterministic (no date, a fixed hash salt, a fixed
creator string) and keep their text as text (``svg.fonttype = "none"``), so they are small and
stay crisp at any size. Symbols are mathtext (``$h_{t-1}$``) and follow each chapter's notation.

One colour per kind of thing, the same in every chapter (``PALETTE``): inputs and embeddings
blue; recurrent states, annotations and the vectors that are averaged green; weights (the GRU's
gates and attention's scores and weights) orange; feed-forward networks purple; normalisation
yellow; outputs and softmax over the vocabulary rose; positions teal; plain operations grey.
The figures are drawn on a canvas whose units are inches, 7 to 7.5 inches wide, so that a figure
shown about 700 pixels wide keeps its 10-11 pt text legible.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402
from matplotlib.path import Path as MplPath  # noqa: E402
from matplotlib.textpath import TextToPath  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
FIG_DIR = REPO_ROOT / "notebooks" / "figures"

RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "tfm-book-figures",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial", "Liberation Sans"],
    "mathtext.fontset": "dejavusans",
    "font.size": 11,
    "path.simplify": False,
}
# The matplotlib version goes into every SVG: byte-for-byte equality only holds for the version
# that drew them, and tests/test_figures.py reads it back to know whether to compare bytes.
METADATA = {"Date": None, "Creator": f"tools/figures.py (matplotlib {matplotlib.__version__})"}


def drawn_with(svg: Path) -> str | None:
    """The matplotlib version recorded in an SVG this script wrote, or None."""
    found = re.search(r"tools/figures\.py \(matplotlib ([^)\s]+)\)", svg.read_text(encoding="utf-8"))
    return found.group(1) if found else None
FONT_STACK = b"font-family: 'DejaVu Sans', 'Helvetica', 'Arial', 'Liberation Sans', sans-serif"

# kind -> (fill, edge). Light fills, saturated edges; text is always near-black.
PALETTE: dict[str, tuple[str, str]] = {
    "input": ("#e3eef9", "#3c78b4"),      # tokens, x_t, embeddings
    "state": ("#e2f2e2", "#3d8b3d"),      # h_t, s_i, annotations, candidates, values
    "weight": ("#fde8d7", "#d0692e"),     # gates, scores, attention weights, attention blocks
    "ffn": ("#ece4f5", "#7b5ba6"),        # feed-forward / MLP
    "norm": ("#fbf3c4", "#b0941a"),       # LayerNorm
    "output": ("#f8dee3", "#b84a62"),     # logits, softmax over the vocabulary, predictions
    "position": ("#dcf1ee", "#2e8c84"),   # positional information
    "op": ("#ffffff", "#6b6b6b"),         # +, ⊙, matmul, scale, linear maps
    "muted": ("#f2f2f2", "#b5b5b5"),      # pruned / inactive
}
INK = "#222222"
LINE = "#555555"
MUTED = "#a8a8a8"


@dataclass
class Node:
    """A drawn shape: its centre and half-sizes (inches); edge points for arrows."""

    x: float
    y: float
    hw: float
    hh: float
    round_: bool = False

    def top(self, dx: float = 0.0) -> tuple[float, float]:
        return (self.x + dx, self.y + self._dy(dx))

    def bottom(self, dx: float = 0.0) -> tuple[float, float]:
        return (self.x + dx, self.y - self._dy(dx))

    def left(self, dy: float = 0.0) -> tuple[float, float]:
        return (self.x - self._dx(dy), self.y + dy)

    def right(self, dy: float = 0.0) -> tuple[float, float]:
        return (self.x + self._dx(dy), self.y + dy)

    def _dy(self, dx: float) -> float:
        if self.round_:
            return max(self.hh ** 2 - dx ** 2, 0.0) ** 0.5
        return self.hh

    def _dx(self, dy: float) -> float:
        if self.round_:
            return max(self.hw ** 2 - dy ** 2, 0.0) ** 0.5
        return self.hw


class Canvas:
    """A figure whose data coordinates are inches, origin bottom left, no axes."""

    def __init__(self, width: float, height: float) -> None:
        self.fig = plt.figure(figsize=(width, height))
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.set_aspect("equal")
        self.ax.axis("off")
        self.width, self.height = width, height

    # shapes ---------------------------------------------------------------------------------
    def box(self, x: float, y: float, w: float, h: float, text: str = "", kind: str = "op",
            fs: float = 11, lw: float = 1.3, pad: float = 0.06, color: str = INK,
            ls: str = "-", zorder: float = 3, weight: str = "normal") -> Node:
        fill, edge = PALETTE[kind]
        self.ax.add_patch(FancyBboxPatch((x - w / 2 + pad, y - h / 2 + pad), w - 2 * pad, h - 2 * pad,
                                         boxstyle=f"round,pad={pad}", fc=fill, ec=edge, lw=lw,
                                         ls=ls, zorder=zorder))
        if text:
            self.text(x, y, text, fs=fs, color=color, zorder=zorder + 0.5, weight=weight)
        return Node(x, y, w / 2, h / 2)

    def circle(self, x: float, y: float, r: float = 0.14, text: str = "", kind: str = "op",
               fs: float = 11, lw: float = 1.2, zorder: float = 3) -> Node:
        fill, edge = PALETTE[kind]
        self.ax.add_patch(Circle((x, y), r, fc=fill, ec=edge, lw=lw, zorder=zorder))
        if text:
            self.text(x, y, text, fs=fs, zorder=zorder + 0.5)
        return Node(x, y, r, r, round_=True)

    def frame(self, x: float, y: float, w: float, h: float, color: str = "#9a9a9a",
              ls: str | tuple = (0, (4, 3)), lw: float = 1.0, zorder: float = 1,
              fill: str = "none") -> Node:
        """A rounded outline that groups shapes (a layer, a cell)."""
        self.ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                         boxstyle="round,pad=0,rounding_size=0.12",
                                         fc=fill, ec=color, lw=lw, ls=ls, zorder=zorder))
        return Node(x, y, w / 2, h / 2)

    def text(self, x: float, y: float, s: str, fs: float = 11, color: str = INK, ha: str = "center",
             va: str = "center", zorder: float = 5, weight: str = "normal", style: str = "normal",
             rotation: float = 0) -> None:
        self.ax.text(x, y, s, fontsize=fs, color=color, ha=ha, va=va, zorder=zorder,
                     fontweight=weight, fontstyle=style, rotation=rotation)

    # connections ----------------------------------------------------------------------------
    def arrow(self, *points: tuple[float, float], color: str = LINE, lw: float = 1.3,
              head: bool = True, ls: str = "-", zorder: float = 2.5, both: bool = False,
              halo: bool = False) -> None:
        """A polyline through ``points`` with an arrow head at the end (straight segments)."""
        if len(points) < 2:
            raise ValueError(f"arrow: need at least two points, got {len(points)}")
        codes = [MplPath.MOVETO] + [MplPath.LINETO] * (len(points) - 1)
        path = MplPath(points, codes)
        style = ("<|-|>" if both else "-|>") if head else "-"
        if halo:  # a white band under the line, so that a line it crosses shows a gap
            self.ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-", color="white", lw=lw + 5,
                                              zorder=zorder - 0.01, capstyle="butt"))
        self.ax.add_patch(FancyArrowPatch(path=path, arrowstyle=style, mutation_scale=11, color=color,
                                          lw=lw, ls=ls, zorder=zorder, joinstyle="miter",
                                          capstyle="butt"))

    def dot(self, x: float, y: float, r: float = 0.035, color: str = LINE) -> None:
        self.ax.add_patch(Circle((x, y), r, fc=color, ec=color, lw=0, zorder=4))

    def legend(self, x: float, y: float, items: Sequence[tuple[str, str]], fs: float = 9.5,
               dx: float = 1.35) -> None:
        """A row of small colour swatches with labels, starting at (x, y)."""
        for i, (kind, label) in enumerate(items):
            fill, edge = PALETTE[kind]
            self.ax.add_patch(FancyBboxPatch((x + i * dx, y - 0.07), 0.2, 0.14,
                                             boxstyle="round,pad=0.02", fc=fill, ec=edge, lw=1.0))
            self.text(x + i * dx + 0.28, y, label, fs=fs, ha="left", color="#444444")

    def svg(self) -> bytes:
        buf = io.BytesIO()
        self.fig.savefig(buf, format="svg", metadata=METADATA)
        # Mathtext glyphs are written with the one font that laid them out; give them the same
        # fallbacks as plain text, so a browser without DejaVu Sans shows a sans-serif, not a serif.
        return buf.getvalue().replace(b"font-family: 'DejaVu Sans';", FONT_STACK + b";")


# ---------------------------------------------------------------------------------------------
# Chapter 01
# ---------------------------------------------------------------------------------------------

def fig_01_unrolled_rnn() -> Canvas:
    """h_t = f_theta(x_t, h_{t-1}), h_0 = 0, unrolled over T steps with the same theta."""
    c = Canvas(7.4, 3.1)
    y_h, y_x, y_out = 1.65, 0.5, 2.75
    # the folded cell, left: its output comes back as the next step's h_{t-1}
    cell = c.box(0.85, y_h, 0.9, 0.62, r"$f_\theta$", "state", fs=13)
    x_in = c.box(0.7, y_x, 0.62, 0.42, r"$x_t$", "input")
    c.arrow(x_in.top(), cell.bottom(-0.15))
    c.arrow(cell.top(), (0.85, y_out - 0.2))
    c.text(0.85, y_out, r"$h_t$", fs=12)
    c.arrow(cell.right(0.15), (1.6, y_h + 0.15), (1.6, y_h - 0.62), (1.05, y_h - 0.62), cell.bottom(0.2))
    c.text(1.62, y_h - 0.82, r"$h_{t-1}$ (delay)", fs=9.5, color="#444444")
    c.text(2.1, y_h, "=", fs=18)
    # unrolled
    xs = [3.15, 4.3, 5.45, 6.85]
    labels = ["1", "2", "3", "T"]
    prev = (2.4, y_h)
    c.text(2.58, y_h + 0.17, r"$h_0{=}0$", fs=9.5, color="#444444")
    for i, (xc, k) in enumerate(zip(xs, labels, strict=True)):
        if k == "T":
            mid = (xs[i - 1] + xc) / 2
            c.arrow(prev, (mid - 0.2, y_h), head=False)
            c.text(mid, y_h, r"$\cdots$", fs=14)
            prev = (mid + 0.2, y_h)
        cell = c.box(xc, y_h, 0.72, 0.62, r"$f_\theta$", "state", fs=13)
        xb = c.box(xc, y_x, 0.6, 0.42, f"$x_{k}$", "input")
        c.arrow(xb.top(), cell.bottom())
        c.arrow(prev, cell.left())
        c.arrow(cell.top(), (xc, y_out - 0.2))
        c.text(xc, y_out, f"$h_{k}$", fs=12)
        if k in "23":
            c.text((xs[i - 1] + xc) / 2, y_h + 0.17, f"$h_{int(k) - 1}$", fs=9.5, color="#444444")
        prev = cell.right()
    c.text(5.0, 0.08, r"the same parameters $\theta$ at every step", fs=10, color="#444444")
    return c


def fig_01_gru_cell() -> Canvas:
    """The GRU of chapter 01, PyTorch's convention: h_t = (1 - z_t) n_t + z_t h_{t-1}."""
    c = Canvas(7.2, 4.4)
    y_top, y_bus = 3.85, 0.5
    x_r, x_lin, x_z, x_n, x_mix = 1.35, 2.75, 4.25, 5.75, 5.75
    # the state line along the top
    c.box(0.42, y_top, 0.68, 0.42, r"$h_{t-1}$", "state", fs=12)
    mul_z = c.circle(4.65, y_top, 0.15, r"$\odot$", fs=12)
    plus = c.circle(x_mix, y_top, 0.15, "+", fs=13)
    c.arrow((0.72, y_top), mul_z.left())
    c.arrow(mul_z.right(), plus.left())
    out = c.box(6.85, y_top, 0.56, 0.42, r"$h_t$", "state", fs=12)
    c.arrow(plus.right(), out.left())
    # the input bus along the bottom
    c.box(0.42, y_bus, 0.56, 0.42, r"$x_t$", "input", fs=12)
    c.arrow((0.7, y_bus), (x_n, y_bus), head=False)
    # reset gate
    r_box = c.box(x_r, 2.2, 0.95, 0.6, r"$\sigma$", "weight", fs=13)
    c.text(x_r, 2.2 - 0.48, "reset gate", fs=9.5, color="#444444")
    c.dot(x_r, y_top)
    c.arrow((x_r, y_top), r_box.top())
    c.dot(x_r - 0.2, y_bus)
    c.arrow((x_r - 0.2, y_bus), r_box.bottom(-0.2))
    # W_hn h_{t-1} + b_hn, then r_t ⊙ (...)
    lin = c.box(x_lin, 2.95, 1.5, 0.5, r"$W_{hn}h_{t-1}+b_{hn}$", "op", fs=10)
    c.dot(x_lin, y_top)
    c.arrow((x_lin, y_top), lin.top())
    mul_r = c.circle(x_lin, 2.2, 0.15, r"$\odot$", fs=12)
    c.arrow(lin.bottom(), mul_r.top())
    c.arrow(r_box.right(), mul_r.left())
    c.text((r_box.right()[0] + mul_r.left()[0]) / 2, 2.36, r"$r_t$", fs=12)
    # update gate
    z_box = c.box(x_z, 2.95, 0.95, 0.6, r"$\sigma$", "weight", fs=13)
    c.text(x_z - 0.1, 2.5, "update gate", fs=9.5, color="#444444")
    c.dot(x_z - 0.3, y_top)
    c.arrow((x_z - 0.3, y_top), z_box.top(-0.3))
    c.arrow((x_z + 0.4, y_bus), (x_z + 0.4, 2.2 - 0.3), head=False, halo=True, zorder=2.7)
    c.arrow((x_z + 0.4, 2.2 - 0.3), (x_z + 0.4, z_box.bottom()[1]), halo=True, zorder=2.7)
    c.dot(x_z + 0.4, y_bus)
    c.arrow(z_box.top(0.4), mul_z.bottom())
    c.text(4.8, 3.45, r"$z_t$", fs=12)
    # candidate
    n_box = c.box(x_n, 2.2, 0.95, 0.6, r"$\tanh$", "state", fs=12)
    c.text(x_n + 0.85, 2.2, "candidate", fs=9.5, color="#444444")
    c.arrow(mul_r.right(), n_box.left(), zorder=2.4)
    c.arrow((x_n, y_bus), n_box.bottom())
    c.text(x_n + 0.55, 1.2, r"$W_{in}x_t+b_{in}$", fs=9.5, color="#444444")
    mul_n = c.circle(x_n, 3.1, 0.15, r"$\odot$", fs=12)
    c.arrow(n_box.top(), mul_n.bottom())
    c.text(x_n + 0.22, 2.75, r"$n_t$", fs=12)
    one_minus = c.box(x_z + 0.4 + 0.55, 3.1, 0.62, 0.36, r"$1-$", "op", fs=10)
    c.arrow(z_box.right(0.15), one_minus.left(), head=False)
    c.arrow(one_minus.right(), mul_n.left())
    c.arrow(mul_n.top(), plus.bottom())
    c.text(x_n + 0.52, 3.45, r"$(1-z_t)\odot n_t$", fs=9.5, color="#444444")
    c.text(3.6, 0.12, r"$h_t = (1-z_t)\odot n_t + z_t\odot h_{t-1}$   "
           r"($z_t\approx 1$: keep,  $z_t\approx 0$: overwrite)", fs=10, color="#333333")
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 02
# ---------------------------------------------------------------------------------------------

def fig_02_encoder_decoder() -> Canvas:
    """Cho et al.'s encoder-decoder: every source word passes through c = h_S; teacher forcing."""
    c = Canvas(7.4, 4.6)
    y_tok, y_rnn, y_out, y_pred = 0.75, 1.95, 3.0, 3.7
    src = ["the", "cat", "sleeps", "<eos>"]
    xs_e = [0.5, 1.25, 2.0, 2.75]
    prev = None
    for j, (x, w) in enumerate(zip(xs_e, src, strict=True)):
        tok = c.box(x, y_tok, 0.7, 0.4, w, "input", fs=10)
        cell = c.box(x, y_rnn, 0.56, 0.5, "GRU", "state", fs=9)
        c.arrow(tok.top(), cell.bottom())
        c.text(x + 0.06, (y_tok + y_rnn) / 2, f"$E_x x_{j + 1}$" if j < 3 else r"$E_x x_S$", fs=8.5,
               color="#444444", ha="left")
        if prev is not None:
            c.arrow(prev.right(), cell.left())
        prev = cell
    c.text(1.62, 4.35, "encoder", fs=11.5, weight="bold", color="#3d8b3d")
    c.text(1.62, 4.05, r"$h_j = \mathrm{GRU}(E_x x_j,\ h_{j-1})$", fs=9.5, color="#444444")
    # the bottleneck
    ctx = c.box(3.58, y_rnn, 0.62, 0.62, r"$c$", "state", fs=14, lw=2.2)
    c.arrow(prev.right(), ctx.left())
    c.text(3.58, y_rnn + 0.48, r"$c = h_S$", fs=10)
    c.text(3.58, y_rnn + 0.74, "one vector,\nany length", fs=8.5, color="#b84a62", va="bottom")
    # decoder
    tgt_in = ["<bos>", "le", "chat", "dort"]
    tgt_out = ["le", "chat", "dort", "<eos>"]
    xs_d = [4.45, 5.2, 5.95, 6.7]
    prev = None
    bus_y = 1.3
    c.arrow(ctx.bottom(), (3.58, bus_y), (xs_d[-1] + 0.18, bus_y), head=False, color="#3d8b3d", lw=1.2)
    for i, (x, wi, wo) in enumerate(zip(xs_d, tgt_in, tgt_out, strict=True)):
        tok = c.box(x, y_tok, 0.7, 0.4, wi, "input", fs=10)
        cell = c.box(x, y_rnn, 0.6, 0.5, "GRU", "state", fs=9)
        c.arrow(tok.top(-0.1), cell.bottom(-0.1), halo=True, zorder=2.8)
        c.dot(x + 0.18, bus_y, color="#3d8b3d")
        c.arrow((x + 0.18, bus_y), cell.bottom(0.18), color="#3d8b3d", lw=1.2)
        out = c.box(x, y_out, 0.7, 0.44, "softmax", "output", fs=8.5)
        c.arrow(cell.top(), out.bottom())
        c.text(x, y_pred, wo, fs=10.5, color="#b84a62")
        c.arrow(out.top(), (x, y_pred - 0.17))
        c.text(x + 0.05, (y_rnn + y_out) / 2 + 0.02, f"$s_{i + 1}$", fs=9.5, color="#444444", ha="left")
        if prev is not None:
            c.arrow(prev.right(), cell.left())
        prev = cell
    c.arrow(ctx.right(), (xs_d[0] - 0.3, y_rnn))
    c.text((ctx.right()[0] + xs_d[0] - 0.3) / 2, y_rnn - 0.17, r"$s_0$", fs=9.5, color="#444444")
    c.text(7.1, y_pred, r"$y_i$", fs=10, color="#444444", ha="left")
    c.text(7.1, y_tok, r"$y_{i-1}$", fs=10, color="#444444", ha="left")
    c.text(5.58, 4.35, "decoder", fs=11.5, weight="bold", color="#3d8b3d")
    c.text(5.58, 4.05, r"$s_0 = \tanh(W_{\mathrm{init}}\,c),\ \ "
           r"s_i = \mathrm{GRU}([E_y y_{i-1};\,c],\ s_{i-1})$", fs=9, color="#444444")
    c.text(5.55, 0.22, r"teacher forcing: step $i$ reads the reference $y_{i-1}$",
           fs=9, color="#444444")
    c.text(1.62, 0.22, r"source $x_1, \dots, x_S$", fs=9, color="#444444")
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 03
# ---------------------------------------------------------------------------------------------

def fig_03_alignment_model() -> Canvas:
    """Bahdanau et al.'s attention for one target step i: e_ij, alpha_ij, c_i, s_i, and the output
    layer that reads s_i, c_i and E_y y_{i-1}."""
    c = Canvas(7.4, 5.2)
    # left: the weighted sum over the annotations and the decoder step
    xs = [0.6, 1.45, 2.3, 3.6]
    names = ["1", "2", "3", "S"]
    widths = [1.2, 3.2, 1.6, 0.8]           # an illustrative alignment: most weight on h_2
    sigma = c.circle(2.3, 2.3, 0.2, r"$\Sigma$", fs=12)
    for x, k, lw in zip(xs, names, widths, strict=True):
        ann = c.box(x, 0.6, 0.62, 0.44, f"$h_{k}$", "state", fs=11)
        c.arrow(ann.top(), sigma.bottom(0.0) if x == 2.3 else _toward(sigma, ann.top()), color="#d0692e",
                lw=lw)
        mx, my = 0.65 * ann.top()[0] + 0.35 * sigma.x, 0.65 * ann.top()[1] + 0.35 * sigma.y
        c.text(mx + (0.1 if x == 2.3 else -0.1 if x < 2.3 else 0.1), my,
               f"$\\alpha_{{i{k}}}$", fs=10, color="#b0541f", ha="left" if x >= 2.3 else "right")
    c.text(2.95, 0.6, r"$\cdots$", fs=13)
    c.text(2.1, 0.13, r"annotations $h_j$: forward and backward states, joined", fs=9.5,
           color="#444444")
    ctx = c.box(2.3, 3.0, 0.56, 0.42, r"$c_i$", "state", fs=12)
    c.arrow(sigma.top(), ctx.bottom())
    c.text(2.6, 2.55, r"$c_i = \Sigma_j\, \alpha_{ij} h_j$", fs=10, ha="left")
    gru = c.box(2.05, 3.8, 1.2, 0.46, "GRU", "state", fs=10)
    c.arrow(ctx.top(), gru.bottom(0.25))
    y_prev = c.box(1.35, 3.0, 0.8, 0.42, r"$E_y y_{i-1}$", "input", fs=10)
    c.arrow(y_prev.top(), (1.35, 3.5), (gru.bottom(-0.35)[0], 3.5), gru.bottom(-0.35))
    s_prev = c.box(0.45, 3.8, 0.7, 0.44, r"$s_{i-1}$", "state", fs=11)
    c.arrow(s_prev.right(), gru.left())
    s_new = c.box(3.6, 3.8, 0.56, 0.44, r"$s_i$", "state", fs=11)
    c.arrow(gru.right(), s_new.left())
    # the output layer (eq. 4; chapter 02's deep output): reads s_i, c_i and E_y y_{i-1}
    out = c.box(2.3, 4.75, 3.2, 0.42,
                r"$p(y_i) = \mathrm{softmax}(W_o\,\mathrm{maxout}(W_t[s_i; c_i; E_y y_{i-1}]))$",
                "output", fs=9)
    c.arrow(s_new.top(), (3.6, out.bottom()[1]))
    c.arrow(ctx.right(), (3.1, 3.0), (3.1, out.bottom()[1]), lw=1.0)
    c.arrow(y_prev.left(), (0.88, 3.0), (0.88, out.bottom()[1]), lw=1.0)
    # right: the alignment model, for every j
    c.frame(5.8, 2.2, 2.9, 4.05)
    c.text(5.8, 4.0, "scores for every $j$, then softmax", fs=10, color="#444444")
    sp = c.box(4.95, 0.6, 0.7, 0.42, r"$s_{i-1}$", "state", fs=11)
    c.text(4.95, 0.27, "the same $s_{i-1}$", fs=8.5, color="#444444")
    hj = c.box(6.6, 0.6, 0.62, 0.42, r"$h_j$", "state", fs=11)
    ws = c.box(4.95, 1.35, 0.8, 0.4, r"$W s_{i-1}$", "op", fs=10)
    uh = c.box(6.6, 1.35, 0.8, 0.4, r"$U h_j$", "op", fs=10)
    c.arrow(sp.top(), ws.bottom())
    c.arrow(hj.top(), uh.bottom())
    plus = c.circle(5.8, 1.8, 0.14, "+", fs=12)
    c.arrow(ws.top(), (4.95, 1.8), plus.left())
    c.arrow(uh.top(), (6.6, 1.8), plus.right())
    th = c.box(5.8, 2.35, 0.8, 0.4, r"$\tanh$", "weight", fs=10)
    c.arrow(plus.top(), th.bottom())
    vt = c.box(5.8, 2.95, 0.8, 0.4, r"$v^\top$", "weight", fs=10)
    c.arrow(th.top(), vt.bottom())
    c.text(6.3, 3.28, r"$e_{ij}$", fs=11, ha="left")
    sm = c.box(5.8, 3.6, 1.5, 0.4, r"softmax over $j$", "weight", fs=9.5)
    c.arrow(vt.top(), sm.bottom())
    c.arrow(sm.left(), (4.15, 3.6), (4.15, 1.45), (3.45, 1.45), color="#d0692e", ls=(0, (3, 2)), lw=1.1)
    c.text(4.22, 3.3, r"$\alpha_{ij}$", fs=10.5, color="#b0541f", ha="left")
    return c


def _toward(node: Node, start: tuple[float, float]) -> tuple[float, float]:
    """The point on a round node's edge facing ``start``."""
    dx, dy = start[0] - node.x, start[1] - node.y
    d = (dx * dx + dy * dy) ** 0.5
    return (node.x + node.hw * dx / d, node.y + node.hh * dy / d)


# ---------------------------------------------------------------------------------------------
# Chapter 04
# ---------------------------------------------------------------------------------------------

def _step_panel(c: Canvas, x0: float, y0: float, step: int) -> None:
    """One panel of chapter 04's derivation: positions 1..4, the output h_t of position t = 3."""
    w = 1.82
    title = {
        1: "1 · the GRU, unrolled", 2: "2 · free the weights", 3: "3 · free the candidates",
        4: "4 · separate Q, K, V", 5: "5 · several heads", 6: "6 · drop causality",
        7: "7 · add positions", 8: "8 · FFN after attention",
    }[step]
    formula = {
        1: r"$w_{t,i} = (1-z_i)\,z_{i+1}\cdots z_t$",
        2: r"$\alpha_{t,i} = \mathrm{softmax}_{i\leq t}(q_t^\top \tilde h_i)$",
        3: r"$\tilde h_i = \tanh(W x_i + b)$",
        4: r"$\alpha_{t,i} \propto \exp(q_t^\top k_i)$, reads $v_i$",
        5: r"$h_t = W_O[\mathrm{head}_1; \ldots; \mathrm{head}_h]$",
        6: r"$i \in \{1..T\}$: no mask",
        7: r"$x_i + p(i)$, each vector its own",
        8: r"$\mathrm{FFN}(h_t)$ at every position",
    }[step]
    c.text(x0 + w / 2, y0 + 2.14, title, fs=9, weight="bold")
    c.text(x0 + w / 2, y0 + 0.08, formula, fs=8.5, color="#444444")
    xs = [x0 + 0.38 + k * 0.4 for k in range(4)]
    t = 2  # index of the query position (t = 3 of 4)
    y_x, y_v, y_h = y0 + 0.42, y0 + 0.98, y0 + 1.6
    causal = step < 6
    for k, x in enumerate(xs):
        future = causal and k > t
        kind_x = "muted" if future else "input"
        xb = c.box(x, y_x, 0.3, 0.26, "", kind_x, lw=1.0, pad=0.03)
        c.text(x, y_x, f"$x_{k + 1}$", fs=8, color=MUTED if future else "#444444", zorder=6)
        if step >= 7:
            c.circle(x + 0.13, y_x + 0.15, 0.07, "", "position", lw=0.9)
        if step >= 4:
            kb = c.box(x - 0.075, y_v, 0.15, 0.26, "", "muted" if future else "weight", lw=0.9, pad=0.02)
            vb = c.box(x + 0.075, y_v, 0.15, 0.26, "", "muted" if future else "state", lw=0.9, pad=0.02)
            c.arrow(xb.top(), (x, kb.bottom()[1]), lw=0.9, color=MUTED if future else LINE)
            top = (x + 0.075, vb.top()[1])
        else:
            vb = c.box(x, y_v, 0.26, 0.26, "", "muted" if future else "state", lw=1.0, pad=0.03)
            c.arrow(xb.top(), vb.bottom(), lw=0.9, color=MUTED if future else LINE)
            top = vb.top()
            if step <= 2 and k > 0:    # the candidate reads the state h_{i-1}, not the candidate before
                col = MUTED if future else "#3d8b3d"
                xm = (xs[k - 1] + x) / 2
                c.arrow((xs[k - 1] + 0.13, y_v), (xm - 0.045, y_v), lw=0.9, color=col, head=False)
                c.circle(xm, y_v, 0.045, "", "muted" if future else "state", lw=0.8)
                c.arrow((xm + 0.045, y_v), vb.left(), lw=0.9, color=col)
                if k == 1:
                    c.text(xm, y_v - 0.2, "$h_{i-1}$", fs=7, color="#3d8b3d")
        if future:
            continue
        hx = xs[t]
        if step == 5:
            for dx, col in ((-0.06, "#d0692e"), (0.06, "#8a3a10")):
                c.arrow(top, (hx + dx, y_h - 0.14), lw=0.6 + 0.6 * (k == 1 if dx < 0 else k == 0),
                        color=col, head=False)
        else:
            lw = 0.8 + (1.4 if k in ((1,) if step != 1 else (2,)) else 0.0)
            c.arrow(top, (hx, y_h - 0.14), lw=lw, color="#d0692e", head=False)
    if step < 6:
        c.text(xs[3], y_v + 0.32, "future\nmasked", fs=7, color=MUTED)
    hb = c.box(xs[t], y_h, 0.36, 0.28, "", "state", lw=1.1, pad=0.03)
    c.text(xs[t] + 0.22, y_h + 0.06, "$h_t$", fs=9, ha="left")
    if step >= 2:    # the query of position t, from x_t, chooses the weights of the lines into h_t
        qb = c.box(xs[0] + 0.06, y_h, 0.3, 0.24, "$q_t$", "weight", fs=7.5, lw=1.0, pad=0.03)
        c.arrow(qb.right(), hb.left(), lw=0.8, color="#d0692e", ls=(0, (2.5, 1.5)))
        # from step 7 on, the query is computed from x_t + p(t): it carries its own position
        source = "from $x_t + p(t)$" if step >= 7 else "from $x_t$"
        c.text(xs[0] + 0.06, y_h + 0.2, source, fs=6.5, color="#444444")
        if step >= 7:
            c.circle(xs[0] + 0.06 + 0.15, y_h - 0.12, 0.055, "", "position", lw=0.8)
    if step == 8:
        fb = c.box(xs[t], y_h + 0.3, 0.56, 0.2, "", "ffn", lw=1.0, pad=0.02)
        c.arrow(hb.top(), fb.bottom(), lw=0.8)
    if step <= 3:
        c.text(xs[0] - 0.2, y_v, r"$\tilde h_i$", fs=8, ha="right", color="#444444")


def fig_04_derivation_steps() -> Canvas:
    """Chapter 04's eight steps from the GRU to self-attention, one small panel each."""
    c = Canvas(7.6, 5.3)
    for n in range(8):
        row, col = divmod(n, 4)
        x0, y0 = 0.1 + col * 1.87, 2.85 - row * 2.5
        c.frame(x0 + 0.91, y0 + 1.15, 1.8, 2.3, color="#cfcfcf", ls="-", lw=0.8)
        _step_panel(c, x0, y0, n + 1)
    c.legend(0.25, 0.14, [("input", "input $x_i$"), ("state", r"candidate, value, $h$"),
                               ("weight", "$q_t$, key, weights"), ("position", "position"), ("ffn", "FFN")],
             fs=8.5, dx=1.5)
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 05
# ---------------------------------------------------------------------------------------------

def fig_05_scaled_dot_product() -> Canvas:
    """Q, K, V from one sequence X, then softmax(Q K^T / sqrt(d_k)) V as five operations."""
    c = Canvas(7.2, 5.1)
    ys = {"V": 4.05, "Q": 2.45, "K": 0.85}
    kinds = {"Q": "weight", "K": "weight", "V": "state"}
    X = c.box(0.7, 2.45, 0.85, 0.6, "$X$", "input", fs=14)
    c.text(0.7, 2.0, r"$T \times d_{\mathrm{model}}$", fs=8.5, color="#444444")
    nodes = {}
    for name, y in ys.items():
        lin = c.box(2.0, y, 0.85, 0.46, f"$W^{name}$", "op", fs=11)
        if name == "Q":
            c.arrow(X.right(), lin.left())
        else:
            c.dot(1.4, 2.45)
            c.arrow((1.4, 2.45), (1.4, y), lin.left())
        nodes[name] = c.box(3.0, y, 0.55, 0.5, f"${name}$", kinds[name], fs=13)
        c.arrow(lin.right(), nodes[name].left())
        c.text(3.0, y - 0.42, r"$T \times d_v$" if name == "V" else r"$T \times d_k$", fs=8.5,
               color="#444444")
    c.text(1.85, 4.75, "one sequence, three projections", fs=9.5, color="#444444")
    # right: the pipeline, bottom to top
    xp = 5.3
    mm1 = c.box(xp, 1.45, 1.5, 0.46, r"MatMul $QK^\top$", "op", fs=10)
    sc = c.box(xp, 2.1, 1.5, 0.46, r"scale $1/√d_k$", "op", fs=10)
    mk = c.box(xp, 2.75, 1.5, 0.46, "mask (optional)", "op", fs=10, ls=(0, (3, 2)))
    sm = c.box(xp, 3.4, 1.5, 0.46, "softmax (rows)", "weight", fs=10)
    mm2 = c.box(xp, 4.05, 1.5, 0.46, r"MatMul $\cdot\,V$", "op", fs=10)
    for lo, hi in ((mm1, sc), (sc, mk), (mk, sm), (sm, mm2)):
        c.arrow(lo.top(), hi.bottom())
    c.arrow(nodes["Q"].right(), (4.05, 2.45), (4.05, 1.45), mm1.left())
    c.arrow(nodes["K"].right(), (xp, 0.85), mm1.bottom())
    c.arrow(nodes["V"].right(), mm2.left())
    out = c.box(xp, 4.72, 0.55, 0.42, "$Z$", "state", fs=12)
    c.arrow(mm2.top(), out.bottom())
    c.text(xp + 0.35, 4.72, r"$T \times d_v$", fs=8.5, color="#444444", ha="left")
    c.text(xp + 0.82, 1.78, r"scores $e_{ts}$: $T \times T$", fs=8.5, color="#444444", ha="left")
    c.text(xp + 0.82, 3.72, r"weights $\alpha_{ts}$", fs=9, color="#b0541f", ha="left")
    c.text(xp + 0.82, 2.75, "hidden scores:\nmost negative\nfloat", fs=8, color="#444444", ha="left")
    c.text(3.6, 0.2, r"$Z = \mathrm{softmax}(QK^\top/√d_k)\, V,"
           r"\qquad z_t = \Sigma_s\, \alpha_{ts} v_s$", fs=10)
    return c


def fig_05_heads_as_batch() -> Canvas:
    """Heads as a batch axis: (B, T, d_model) -> view (B, T, h, d_k) -> transpose (B, h, T, d_k)."""
    c = Canvas(7.4, 3.3)
    shades = ["#fbe3d2", "#f6c7a6", "#ef9f6d", "#d9733a"]
    T, h = 5, 4
    cw, ch = 0.13, 0.2
    # (B, T, d_model): one matrix, its columns in h slices
    x0, y0 = 0.35, 0.9
    for r in range(T):
        for g in range(h):
            for f in range(2):
                c.ax.add_patch(Rectangle((x0 + (2 * g + f) * cw, y0 + (T - 1 - r) * ch), cw, ch,
                                         fc=shades[g], ec="white", lw=0.8, zorder=2))
    c.text(x0 + h * cw, y0 + T * ch + 0.25, r"$(B, T, d_{\mathrm{model}})$", fs=10)
    c.text(x0 + h * cw, y0 - 0.25, "projected $Q$ (or $K$, $V$)", fs=8.5, color="#444444")
    c.text(x0 - 0.1, y0 + T * ch / 2, "$T$", fs=9, ha="right", color="#444444")
    c.arrow((2.0, 1.4), (2.65, 1.4))
    c.text(2.32, 1.62, "view", fs=9, color="#444444")
    c.text(2.32, 1.15, r"$(B, T, h, d_k)$", fs=8.5, color="#444444")
    # transpose: h matrices of T x d_k, stacked like a batch
    xb = 2.95
    for g in reversed(range(h)):
        ox, oy = xb + g * 0.22, 0.75 + g * 0.17
        for r in range(T):
            for f in range(2):
                c.ax.add_patch(Rectangle((ox + f * cw, oy + (T - 1 - r) * ch), cw, ch, fc=shades[g],
                                         ec="white", lw=0.8, zorder=2 + (h - g) * 0.01))
        c.ax.add_patch(Rectangle((ox, oy), 2 * cw, T * ch, fc="none", ec="#9a5a30", lw=0.8,
                                 zorder=2 + (h - g) * 0.01 + 0.005))
    c.text(3.55, 2.55, r"transpose(1, 2): $(B, h, T, d_k)$", fs=10)
    c.text(xb - 0.08, 0.95, "head 1", fs=8, ha="right", color="#444444")
    c.text(xb + 3 * 0.22 + 2 * cw + 0.08, 0.75 + 3 * 0.17 + T * ch - 0.1, "head $h$", fs=8, ha="left",
           color="#444444")
    c.text(x0 + cw, y0 + T * ch + 0.07, "$d_k$", fs=8, color="#444444")
    c.text(3.55, 0.4, "head axis next to the batch axis", fs=8.5, color="#444444")
    c.arrow((4.45, 1.4), (5.0, 1.4))
    att = c.box(5.95, 1.4, 1.65, 0.72, "attention on\nevery head at once", "weight", fs=9.5)
    c.text(5.95, 2.05, r"scores $(B, h, T, T)$", fs=8.5, color="#444444")
    c.text(5.95, 0.75, r"out $(B, h, T, d_k)$", fs=8.5, color="#444444")
    c.text(5.95, 0.35, r"back: $(B, T, d_{\mathrm{model}})$, then $W^O$", fs=8.5, color="#444444")
    c.arrow(att.right(), (7.3, 1.4))
    c.text(3.7, 3.05, r"$h$ heads of width $d_k = d_{\mathrm{model}}/h$: one reshape, no loop", fs=10)
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 06
# ---------------------------------------------------------------------------------------------

def fig_06_position_schemes() -> Canvas:
    """Where position enters: added to the input, rotating q and k, or a bias on the scores."""
    c = Canvas(7.5, 4.3)
    heads = [(1.25, "absolute: added to the input", "sinusoidal, learned"),
             (3.75, "rotary: rotates $q$ and $k$", "Su et al. 2021"),
             (6.25, "relative: a bias on the scores", "Shaw et al. 2018, T5, ALiBi")]
    for x, title, sub in heads:
        c.frame(x, 2.1, 2.4, 4.1, color="#cfcfcf", ls="-", lw=0.8)
        c.text(x, 3.95, title, fs=9.5, weight="bold")
        c.text(x, 3.7, sub, fs=8.5, color="#444444")
    # (a) absolute
    xa = 1.25
    xt = c.box(xa - 0.45, 0.6, 0.55, 0.42, "$x_i$", "input", fs=11)
    pt = c.box(xa + 0.45, 0.6, 0.55, 0.42, "$p_i$", "position", fs=11)
    plus = c.circle(xa, 1.3, 0.15, "+", fs=12)
    c.arrow(xt.top(), (xa - 0.45, 1.3), plus.left())
    c.arrow(pt.top(), (xa + 0.45, 1.3), plus.right())
    qkv = [c.box(xa + dx, 2.35, 0.58, 0.42, lab, kind, fs=10)
           for dx, lab, kind in ((-0.68, "$W_Q$", "op"), (0.0, "$W_K$", "op"), (0.68, "$W_V$", "op"))]
    c.dot(xa, 1.75)
    c.arrow(plus.top(), (xa, 1.75), head=False)
    for n in qkv:
        c.arrow((xa, 1.75), (n.x, 1.75), n.bottom())
    for n, lab in zip(qkv, ("$q$", "$k$", "$v$"), strict=True):
        c.arrow(n.top(), (n.x, 2.95))
        c.text(n.x, 3.1, lab, fs=10)
    c.text(xa, 0.25, r"$q_t = W_Q(x_t + p_t)$, $k_i = W_K(x_i + p_i)$", fs=8, color="#444444")
    # (b) rotary
    xr = 3.75
    qb = c.box(xr - 0.55, 0.75, 0.8, 0.42, r"$W_Q x_p$", "weight", fs=9.5)
    kb = c.box(xr + 0.55, 0.75, 0.8, 0.42, r"$W_K x_s$", "weight", fs=9.5)
    rq = c.box(xr - 0.55, 1.6, 0.6, 0.42, r"$R_p$", "position", fs=11)
    rk = c.box(xr + 0.55, 1.6, 0.6, 0.42, r"$R_s$", "position", fs=11)
    c.arrow(qb.top(), rq.bottom())
    c.arrow(kb.top(), rk.bottom())
    dotp = c.circle(xr, 2.4, 0.16, r"$\cdot$", fs=16)
    c.arrow(rq.top(), (xr - 0.55, 2.4), dotp.left())
    c.arrow(rk.top(), (xr + 0.55, 2.4), dotp.right())
    c.arrow(dotp.top(), (xr, 2.95))
    c.text(xr, 3.15, r"$\langle q, R_{s-p}\,k\rangle$", fs=10)
    c.text(xr, 0.25, "values not rotated; nothing added", fs=8, color="#444444")
    # (c) relative bias on the score matrix
    xc0, yc0, cs = 5.55, 1.15, 0.27
    n = 5
    offs = {-2: "#2e8c84", -1: "#6fb3ac", 0: "#b5dcd7", 1: "#dcf1ee", 2: "#f1f9f8"}
    for tq in range(n):
        for sk in range(n):
            off = max(-2, min(2, sk - tq))
            c.ax.add_patch(Rectangle((xc0 + sk * cs, yc0 + (n - 1 - tq) * cs), cs, cs, fc=offs[off],
                                     ec="white", lw=0.8, zorder=2))
            if abs(sk - tq) <= 1 or (tq, sk) in ((0, 4), (4, 0)):
                c.text(xc0 + (sk + 0.5) * cs, yc0 + (n - 1 - tq + 0.5) * cs,
                       f"{sk - tq:+d}" if sk != tq else "0",
                       fs=6.5, color="#1c4f4a" if off > -2 else "white", zorder=6)
    c.text(xc0 + n * cs / 2, yc0 + n * cs + 0.15, "keys $s$", fs=8.5, color="#444444")
    c.text(xc0 - 0.12, yc0 + n * cs / 2, "queries $t$", fs=8.5, color="#444444", rotation=90)
    c.text(xc0 + n * cs + 0.1, yc0 + n * cs - 0.1, "offset\n$s-t$", fs=8, color="#444444", ha="left",
           va="top")
    c.text(6.25, 3.1, r"$e_{ts} + b(s-t)$", fs=10)
    c.text(6.25, 0.8, r"Shaw: $b = q_t^\top a^K_{\mathrm{clip}(s-t)}/√d_k$", fs=8, color="#444444")
    c.text(6.25, 0.52, "T5: a learned scalar per offset bucket", fs=8, color="#444444")
    c.text(6.25, 0.25, r"ALiBi: $b = -m\,(t-s)$, fixed", fs=8, color="#444444")
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 07
# ---------------------------------------------------------------------------------------------

def _residual(c: Canvas, x: float, y_from: float, node: Node, side: float) -> None:
    """A residual branch: from the main line at y_from, around the sublayer, into ``node``'s side."""
    xs = x + side
    c.dot(x, y_from)
    end = node.left() if side < 0 else node.right()
    c.arrow((x, y_from), (xs, y_from), (xs, end[1]), end, color="#3c78b4", lw=1.2)


def fig_07_post_pre_ln() -> Canvas:
    """An encoder layer, post-LN (the paper's) and pre-LN, side by side."""
    c = Canvas(7.2, 5.6)
    bw = 1.7
    for x, title, formula in (
            (1.9, "post-LN (Vaswani et al. 2017)", r"$x \leftarrow \mathrm{LN}(x + \mathrm{Sublayer}(x))$"),
            (5.3, "pre-LN (later models)", r"$x \leftarrow x + \mathrm{Sublayer}(\mathrm{LN}(x))$")):
        c.text(x, 5.4, title, fs=10.5, weight="bold")
        c.text(x, 5.1, formula, fs=10)
    # post-LN
    x = 1.9
    xin = c.box(x, 0.35, 0.5, 0.36, "$x$", "input", fs=11)
    att = c.box(x, 1.2, bw, 0.44, "self-attention", "weight", fs=10)
    add1 = c.circle(x, 1.85, 0.14, "+", fs=12)
    ln1 = c.box(x, 2.4, bw, 0.42, r"LN$_1$", "norm", fs=10)
    ffn = c.box(x, 3.1, bw, 0.44, "FFN", "ffn", fs=10)
    add2 = c.circle(x, 3.75, 0.14, "+", fs=12)
    ln2 = c.box(x, 4.3, bw, 0.42, r"LN$_2$", "norm", fs=10)
    c.arrow(xin.top(), att.bottom())
    c.arrow(att.top(), add1.bottom())
    c.arrow(add1.top(), ln1.bottom())
    c.arrow(ln1.top(), ffn.bottom())
    c.arrow(ffn.top(), add2.bottom())
    c.arrow(add2.top(), ln2.bottom())
    c.arrow(ln2.top(), (x, 4.85))
    _residual(c, x, 0.78, add1, -1.1)
    _residual(c, x, 2.75, add2, -1.1)
    c.text(x + 1.0, 4.3, "every path to the output\npasses every LN", fs=8, color="#444444", ha="left")
    # pre-LN
    x = 5.3
    xin = c.box(x, 0.35, 0.5, 0.36, "$x$", "input", fs=11)
    ln1 = c.box(x, 1.05, bw, 0.42, r"LN$_1$", "norm", fs=10)
    att = c.box(x, 1.7, bw, 0.44, "self-attention", "weight", fs=10)
    add1 = c.circle(x, 2.35, 0.14, "+", fs=12)
    ln2 = c.box(x, 3.0, bw, 0.42, r"LN$_2$", "norm", fs=10)
    ffn = c.box(x, 3.65, bw, 0.44, "FFN", "ffn", fs=10)
    add2 = c.circle(x, 4.3, 0.14, "+", fs=12)
    c.arrow(xin.top(), ln1.bottom())
    c.arrow(ln1.top(), att.bottom())
    c.arrow(att.top(), add1.bottom())
    c.arrow(add1.top(), ln2.bottom())
    c.arrow(ln2.top(), ffn.bottom())
    c.arrow(ffn.top(), add2.bottom())
    c.arrow(add2.top(), (x, 4.85))
    _residual(c, x, 0.7, add1, 1.1)
    _residual(c, x, 2.6, add2, 1.1)
    c.text(x - 0.15, 4.72, "after the last layer:\none more LN", fs=8, color="#444444", ha="right")
    c.text(3.6, 0.1, "dropout on each sublayer's output before the sum (not drawn); "
           "blue: residual connections", fs=8, color="#444444")
    return c


def fig_07_transformer() -> Canvas:
    """The encoder-decoder Transformer: embeddings and positions, N encoder and N decoder layers."""
    c = Canvas(7.2, 7.4)
    bw = 1.75
    # encoder
    xe = 2.0
    src = c.box(xe, 0.35, 1.4, 0.38, "source tokens", "input", fs=9.5)
    emb = c.box(xe, 0.98, bw, 0.42, r"embedding $\times√d_{\mathrm{model}}$", "input", fs=9.5)
    pe = c.circle(xe, 1.6, 0.15, "+", fs=12)
    pos = c.box(xe - 1.25, 1.6, 0.7, 0.38, "PE", "position", fs=9.5)
    c.arrow(src.top(), emb.bottom())
    c.arrow(emb.top(), pe.bottom())
    c.arrow(pos.right(), pe.left())
    c.frame(xe, 3.27, 2.6, 3.0, color="#9a9a9a", ls="-", lw=1.0, fill="#fafafa")
    c.text(xe - 0.35, 4.56, "encoder layer", fs=9, color="#555555", weight="bold")
    c.text(xe - 1.5, 3.2, "$N\\times$", fs=12, ha="right")
    att = c.box(xe, 2.35, bw, 0.44, "self-attention", "weight", fs=9.5)
    an1 = c.box(xe, 2.95, bw, 0.38, "add & LN", "norm", fs=9.5)
    ffn = c.box(xe, 3.6, bw, 0.44, "FFN", "ffn", fs=9.5)
    an2 = c.box(xe, 4.2, bw, 0.38, "add & LN", "norm", fs=9.5)
    c.arrow(pe.top(), att.bottom())
    c.arrow(att.top(), an1.bottom())
    c.arrow(an1.top(), ffn.bottom())
    c.arrow(ffn.top(), an2.bottom())
    _residual(c, xe, 1.95, an1, -1.1)
    _residual(c, xe, 3.25, an2, -1.1)
    # decoder
    xd = 5.2
    tgt = c.box(xd, 0.35, 1.9, 0.38, "target, shifted right", "input", fs=9.5)
    demb = c.box(xd, 0.98, bw, 0.42, r"embedding $\times√d_{\mathrm{model}}$", "input", fs=9.5)
    dpe = c.circle(xd, 1.6, 0.15, "+", fs=12)
    dpos = c.box(xd + 1.25, 1.6, 0.7, 0.38, "PE", "position", fs=9.5)
    c.arrow(tgt.top(), demb.bottom())
    c.arrow(demb.top(), dpe.bottom())
    c.arrow(dpos.left(), dpe.right())
    c.frame(xd, 3.87, 2.6, 4.2, color="#9a9a9a", ls="-", lw=1.0, fill="#fafafa")
    c.text(xd, 5.73, "decoder layer", fs=9, color="#555555", weight="bold")
    c.text(xd + 1.5, 3.82, "$N\\times$", fs=12, ha="left")
    m_att = c.box(xd, 2.3, bw, 0.44, "masked self-attention", "weight", fs=9)
    dan1 = c.box(xd, 2.85, bw, 0.36, "add & LN", "norm", fs=9.5)
    x_att = c.box(xd, 3.55, bw, 0.44, "cross-attention", "weight", fs=9.5)
    dan2 = c.box(xd, 4.1, bw, 0.36, "add & LN", "norm", fs=9.5)
    dffn = c.box(xd, 4.75, bw, 0.44, "FFN", "ffn", fs=9.5)
    dan3 = c.box(xd, 5.28, bw, 0.36, "add & LN", "norm", fs=9.5)
    c.arrow(dpe.top(), m_att.bottom())
    c.arrow(m_att.top(), dan1.bottom())
    c.arrow(dan1.top(), x_att.bottom())
    c.arrow(x_att.top(), dan2.bottom())
    c.arrow(dan2.top(), dffn.bottom())
    c.arrow(dffn.top(), dan3.bottom())
    _residual(c, xd, 1.92, dan1, 1.1)
    _residual(c, xd, 3.15, dan2, 1.1)
    _residual(c, xd, 4.4, dan3, 1.1)
    c.text(xd + 0.2, 3.22, "$Q$", fs=8.5, color="#444444", ha="left")
    # memory m -> cross-attention keys and values
    c.arrow(an2.top(0.55), (xe + 0.55, 5.3), (3.65, 5.3), (3.65, 3.55), x_att.left(), color="#3d8b3d", lw=1.6)
    c.text(3.72, 3.72, "$K, V$", fs=8.5, color="#3d8b3d", ha="left")
    c.text(2.6, 5.45, "memory $m$ (to every decoder layer)", fs=8.5, color="#3d8b3d")
    # output
    lin = c.box(xd, 6.25, bw, 0.42, r"linear (tied to $E$)", "output", fs=9.5)
    sm = c.box(xd, 6.85, bw, 0.42, "softmax", "output", fs=9.5)
    c.arrow(dan3.top(), lin.bottom())
    c.arrow(lin.top(), sm.bottom())
    c.arrow(sm.top(), (xd, 7.3))
    c.text(xd - 1.05, 7.22, "next-token\nprobabilities", fs=8.5, color="#444444", ha="right")
    c.text(2.0, 6.6, "post-LN layers, as in the paper;\npre-LN moves each LN before its sublayer\n"
           "and adds one after each stack", fs=8.5, color="#444444")
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 08
# ---------------------------------------------------------------------------------------------

def fig_08_beam_search() -> Canvas:
    """Beam search with K = 2 on chapter 08's table model: greedy's best output is pruned."""
    c = Canvas(7.4, 4.7)
    cols = {0: 0.5, 1: 1.75, 2: 3.2, 3: 4.65}
    for k, x in cols.items():
        c.text(x, 4.5, "start" if k == 0 else f"step {k}", fs=9.5, color="#444444")
    kept, pruned, done = "state", "muted", "output"

    def node(x: float, y: float, tok: str, p: str, kind: str, ls: str = "-") -> Node:
        n = c.box(x, y, 1.1, 0.4, "", kind, ls=ls, lw=1.2)
        col = MUTED if kind == "muted" else INK
        c.text(x - 0.17, y, tok, fs=10, color=col, weight="bold")
        c.text(x + 0.32, y, p, fs=9, color=col if kind == "muted" else "#444444")
        return n

    def edge(a: Node, b: Node, live: bool, ls: str = "-") -> None:
        c.arrow(a.right(), (a.right()[0] + 0.18, a.y), (a.right()[0] + 0.18, b.y), b.left(),
                color=LINE if live else "#c8c8c8", lw=1.2 if live else 1.0, ls=ls)

    root = c.box(cols[0], 2.45, 0.8, 0.4, "<bos>", "input", fs=9.5)
    a = node(cols[1], 3.35, "a", ".50", kept)
    b = node(cols[1], 1.55, "b", ".40", kept)
    cc = node(cols[1], 0.55, "c", ".10", pruned)
    for n, live in ((a, True), (b, True), (cc, False)):
        edge(root, n, live)
    aa = node(cols[2], 4.05, "a", ".15", pruned)
    ae = node(cols[2], 3.55, "<eos>", ".125", pruned)
    ab = node(cols[2], 3.05, "b", ".125", pruned)
    ac = node(cols[2], 2.55, "c", ".10", pruned)
    ba = node(cols[2], 1.85, "a", ".20", kept)
    bb = node(cols[2], 1.25, "b", ".20", kept)
    for n in (aa, ae, ab, ac):
        edge(a, n, False)
    for n in (ba, bb):
        edge(b, n, True)
    bae = node(cols[3], 1.85, "<eos>", ".10", done)
    bbe = node(cols[3], 1.25, "<eos>", ".10", done)
    edge(ba, bae, True)
    edge(bb, bbe, True)
    aae = node(cols[3], 4.05, "<eos>", ".15", "muted", ls=(0, (3, 2)))
    edge(aa, aae, False, ls=(0, (3, 2)))
    c.text(cols[3] + 0.62, 4.05, "greedy: a a <eos>, .15\n(pruned by the beam at step 2)", fs=8.5,
           color="#8a8a8a", ha="left")
    c.text(cols[3] + 0.62, 1.55, "beam returns b a <eos>\nat .10 < greedy's .15", fs=8.5, color="#b84a62",
           ha="left")
    c.text(3.3, 0.12, "numbers: probability of the prefix, $p(y_{\\leq i} \\mid x)$; "
           "the beam keeps the $K = 2$ best", fs=8.5, color="#444444")
    c.legend(4.2, 0.62, [("state", "kept"), ("muted", "pruned"), ("output", "finished")], fs=8.5, dx=0.95)
    return c


def fig_09_kv_cache() -> Canvas:
    """One decoding step with the KV cache: the new token's query reads every cached key and value."""
    c = Canvas(7.6, 4.2)
    c.text(3.8, 4.0, "step $t$ of one layer: only the new token is computed; $K$ and $V$ grow by one column",
           fs=9.5, color="#444444")
    x_new = c.box(0.7, 0.55, 0.9, 0.42, "$x_t$", "input", fs=11)
    q = c.box(0.7, 1.75, 0.7, 0.42, "$q_t$", "weight", fs=11)
    c.arrow(x_new.top(), q.bottom())
    c.text(1.12, 1.15, "$W^Q, W^K, W^V$", fs=8.5, color="#444444", ha="left")
    cols = [2.0 + 0.62 * i for i in range(6)]
    news: dict[str, Node] = {}
    for row_y, name in ((3.05, "K"), (2.15, "V")):
        c.text(1.55, row_y, f"${name}$", fs=11, weight="bold")
        for i, x in enumerate(cols[:-1]):
            label = f"${name.lower()}_{{{i + 1}}}$" if i < 3 else ("$\\cdots$" if i == 3 else
                                                                    f"${name.lower()}_{{t-1}}$")
            c.box(x, row_y, 0.6, 0.5, label, "state", fs=9.5)
        news[name] = c.box(cols[-1], row_y, 0.6, 0.5, f"${name.lower()}_t$", "input", fs=9.5, lw=1.8)
    c.arrow(x_new.right(), (cols[-1], 0.55), news["V"].bottom(), color="#3c78b4", lw=1.0)
    c.arrow((cols[-1], 0.55), (cols[-1] - 0.42, 0.55), (cols[-1] - 0.42, 2.6), (cols[-1], 2.6),
            news["K"].bottom(), color="#3c78b4", lw=1.0, halo=True)
    c.frame((cols[0] + cols[-2]) / 2, 2.6, 0.62 * 5 + 0.1, 1.55, color="#3d8b3d")
    c.text((cols[0] + cols[-2]) / 2, 3.55, "cache: written at steps $1..t-1$, read again, never recomputed",
           fs=8.5, color="#3d8b3d")
    out = c.box(6.75, 2.6, 0.95, 0.5, "$o_t$", "output", fs=11)
    c.arrow(q.right(), (1.5, 1.75), (1.5, 1.45), (6.75, 1.45), out.bottom())
    c.text(5.0, 1.25, "$o_t = \\mathrm{softmax}(q_t K^\\top / √d_k)\\, V$: one query, $t$ keys",
           fs=8.5, color="#444444")
    c.arrow(news["K"].right(), (cols[-1] + 0.55, 3.05), (cols[-1] + 0.55, 2.6), out.left())
    c.arrow(news["V"].right(), (cols[-1] + 0.55, 2.15), (cols[-1] + 0.55, 2.6), head=False)
    c.legend(0.35, 0.12, [("input", "new this step"), ("state", "cached"), ("weight", "query"),
                          ("output", "output")], fs=8.5, dx=1.6)
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 10
# ---------------------------------------------------------------------------------------------

def fig_10_flash_tiling() -> Canvas:
    """FlashAttention's tiling: one (block_q x block_k) tile of scores at a time, with the running max m,
    sum l and output O kept per query row; causal tiles above the diagonal skipped."""
    c = Canvas(7.6, 4.7)
    n, tw, th = 4, 0.56, 0.42                     # 4 query blocks x 4 key blocks
    x0, y_top = 1.45, 3.6                         # the score grid's left edge and top edge
    cols = [x0 + tw * (j + 0.5) for j in range(n)]
    rows = [y_top - th * (i + 0.5) for i in range(n)]
    cur_i, cur_j = 2, 1                           # the tile being computed: i = 3, j = 2
    c.text(3.8, 4.5, r"causal attention, one tile of scores at a time: the $T \times S$ matrix is never "
           "stored", fs=9.5, color="#444444")
    # K^T on top, V below (both one block per column of key positions), Q on the left
    for j, x in enumerate(cols):
        c.box(x, y_top + 0.36, tw, 0.4, f"$K_{j + 1}^\\top$", "input" if j == cur_j else "muted", fs=9.5,
              lw=1.8 if j == cur_j else 1.0)
    c.text(cols[-1] + tw / 2 + 0.1, y_top + 0.36, "keys", fs=8.5, color="#444444", ha="left")
    y_v = rows[-1] - th / 2 - 0.36
    v_nodes = [c.box(x, y_v, tw, 0.4, f"$V_{j + 1}$", "state" if j == cur_j else "muted", fs=9.5,
                     lw=1.8 if j == cur_j else 1.0) for j, x in enumerate(cols)]
    c.text(cols[-1] + tw / 2 + 0.1, y_v, "values", fs=8.5, color="#444444", ha="left")
    for i, y in enumerate(rows):
        c.box(x0 - 0.45, y, 0.5, th, f"$Q_{i + 1}$", "input" if i == cur_i else "muted", fs=9.5,
              lw=1.8 if i == cur_i else 1.0)
    c.text(x0 - 0.45, y_top + 0.36, "queries", fs=8.5, color="#444444")
    # the grid of score tiles
    for i, y in enumerate(rows):
        for j, x in enumerate(cols):
            if j > i:
                kind, label = "muted", "skip"
            elif i == cur_i and j == cur_j:
                kind, label = "weight", "$S_{ij}$"
            elif i < cur_i or (i == cur_i and j < cur_j):  # earlier query blocks are finished
                kind, label = "state", "done"
            else:
                kind, label = "op", ""
            c.box(x, y, tw, th, label, kind, fs=9 if label == "$S_{ij}$" else 7.5,
                  lw=1.8 if kind == "weight" else 1.0, pad=0.03,
                  color=MUTED if label in ("skip", "done") else INK)
    # the state kept for every query row of block i
    fx, fy, fw, fh = 5.95, 2.55, 2.75, 2.2
    c.frame(fx, fy, fw, fh, color="#d0692e")
    c.text(fx, fy + fh / 2 - 0.22, "kept per query row of $Q_i$", fs=9, color="#b0541f")
    lines = [r"$m_{\mathrm{new}} = \max(m,\ \mathrm{rowmax}\, S_{ij})$",
             r"$\ell \leftarrow e^{m - m_{\mathrm{new}}} \ell"
             r" + \mathrm{rowsum}\, e^{S_{ij} - m_{\mathrm{new}}}$",
             r"$O \leftarrow e^{m - m_{\mathrm{new}}} O + e^{S_{ij} - m_{\mathrm{new}}} V_j$",
             r"$m \leftarrow m_{\mathrm{new}}$"]
    for k, line in enumerate(lines):
        c.text(fx - fw / 2 + 0.15, fy + 0.5 - 0.36 * k, line, fs=8.8, ha="left")
    c.text(fx, fy - fh / 2 + 0.2, r"after the last block: $O / \ell$", fs=8.5, color="#444444")
    c.arrow((cols[cur_j] + tw / 2, rows[cur_i]), (fx - fw / 2, rows[cur_i]), color="#d0692e", lw=1.3,
            halo=True)
    c.arrow(v_nodes[cur_j].bottom(), (cols[cur_j], y_v - 0.38), (fx - 0.6, y_v - 0.38),
            (fx - 0.6, fy - fh / 2), color="#3d8b3d", lw=1.3)
    c.text(x0 + tw * n / 2 + 1.0, y_v - 0.6, r"$S_{ij} = Q_i K_j^\top / √d$: a block_q $\times$ block_k tile",
           fs=8.5, color="#444444")
    c.text(3.8, 0.6, r"saved for the backward pass: $Q, K, V, O$ and $L = m + \log \ell$ per row "
           "(memory linear in $T$); the backward recomputes each tile", fs=8.5, color="#444444")
    c.legend(0.5, 0.22, [("weight", "tile in use"), ("state", "done"), ("op", "to do"),
                         ("muted", "skipped: above the diagonal")], fs=8.5, dx=1.62)
    return c



def fig_10_data_parallel() -> Canvas:
    """Data parallelism with two processes: each a replica of the model with its slice of the global
    batch (DistributedSampler), the gradients averaged by an all-reduce, identical optimiser steps."""
    c = Canvas(7.6, 4.9)
    c.text(3.8, 4.72, "one optimiser step with torchrun --nproc_per_node 2 (DistributedDataParallel)",
           fs=9.5, color="#444444")
    batch = c.box(3.8, 4.18, 5.2, 0.46, "global batch of $B$ sequences, epoch $e$ (same permutation on "
                  "every rank)", "input", fs=9)
    xs = (1.9, 5.7)
    grads = []
    for r, x in enumerate(xs):
        c.frame(x, 2.5, 3.3, 2.3, color="#9a9a9a")
        c.text(x - 1.5, 3.5, f"process rank {r}", fs=8.5, color="#444444", ha="left")
        part = c.box(x, 3.2, 2.6, 0.44, f"$B/2$ sequences: positions {r}, {r + 2}, {r + 4}, ...", "input",
                     fs=8.5)
        c.arrow((x, batch.bottom()[1]), part.top())
        model = c.box(x, 2.5, 2.6, 0.5, r"model replica $\theta$ (same weights)", "ffn", fs=9)
        c.arrow(part.bottom(), model.top())
        grad = c.box(x, 1.75, 2.6, 0.46, f"forward, backward: $g_{r} = \\nabla L_{r}(\\theta)$", "weight",
                     fs=9)
        c.arrow(model.bottom(), grad.top())
        grads.append(grad)
    c.text(3.8, 3.8, "DistributedSampler", fs=8.5, color="#3c78b4")
    ar = c.box(3.8, 0.98, 6.9, 0.46, r"all-reduce (gloo on CPUs, nccl on GPUs): both get "
               r"$\bar g = (g_0 + g_1)/2$", "op", fs=9, lw=1.6)
    for x, grad in zip(xs, grads, strict=True):
        c.arrow(grad.bottom(), (x, ar.top()[1]), color="#d0692e", both=True)
    c.text(3.8, 0.38, r"each rank: $\theta \leftarrow \mathrm{step}(\theta, \bar g)$, the same step, so the "
           "replicas stay equal; the loss curve equals one process's with batch $B$", fs=8.5, color="#444444")
    return c


# ---------------------------------------------------------------------------------------------
# Chapter 11
# ---------------------------------------------------------------------------------------------

def _text_width(s: str, fs: float) -> float:
    """The width in inches of plain text ``s`` at ``fs`` points, in the current rc font."""
    width, _, _ = TextToPath().get_text_width_height_descent(s, FontProperties(size=fs), ismath=False)
    return width / 72


def _pieces_width(pieces: Sequence[str], fs: float, pad: float, gap: float) -> float:
    return sum(_text_width(p, fs) + 2 * pad for p in pieces) + gap * (len(pieces) - 1)


def _pieces(c: Canvas, x: float, y: float, pieces: Sequence[str], kinds: Sequence[str], fs: float = 9,
            h: float = 0.26, pad: float = 0.045, gap: float = 0.04) -> float:
    """Subword pieces as small boxes side by side from ``x`` (left edge); returns the right edge."""
    for piece, kind in zip(pieces, kinds, strict=True):
        w = _text_width(piece, fs) + 2 * pad
        c.box(x + w / 2, y, w, h, piece, kind, fs=fs, lw=1.0, pad=0.03)
        x += w + gap
    return x - gap


# Sennrich et al.'s (2016) toy word counts: the figure draws what tfmlib.bpe learns from them.
BPE_TOY_WORDS = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
BPE_TOY_NEW_WORD = "lowest"
BPE_TOY_MERGES = 5  # enough for "lowest" to come out as low + est</w>


def _bpe_toy() -> tuple[list[tuple[tuple[str, str], int]], dict[str, list[list[str]]], list[list[str]]]:
    """What ``tfmlib.bpe`` does on the toy counts: the merges with the count each pair had when it
    was merged, every word after each merge, and the new word after each merge in the order learned.

    tfmlib (and with it torch) is imported here, not at the top, so that the other figures do not
    wait for it."""
    from tfmlib.bpe import BPE, learn_merges, merge_pair, split_word

    merges = learn_merges(BPE_TOY_WORDS, BPE_TOY_MERGES, min_frequency=1)
    words = {w: [split_word(w)] for w in BPE_TOY_WORDS}
    counted = []
    for pair in merges:  # the pair's count in the words as they are just before it is merged
        count = sum(n * list(zip(words[w][-1], words[w][-1][1:], strict=False)).count(pair)
                    for w, n in BPE_TOY_WORDS.items())
        counted.append((pair, count))
        for w in words:
            words[w].append(merge_pair(words[w][-1], pair))
    new = [split_word(BPE_TOY_NEW_WORD)]
    for pair in merges:
        new.append(merge_pair(new[-1], pair))
    encoded = BPE(merges).encode_word(BPE_TOY_NEW_WORD)
    if new[-1] != encoded:
        raise RuntimeError(f"fig_11_bpe: merging in order gives {new[-1]}, BPE.encode_word {encoded}")
    return counted, words, new


def fig_11_bpe() -> Canvas:
    """Byte-pair encoding: merges learned from Sennrich et al.'s toy word counts, a new word
    encoded with them, and one embedding matrix for the shared vocabulary (tied three ways)."""
    c = Canvas(7.7, 5.85)
    fs, pad, gap, row_h = 9, 0.035, 0.025, 0.37
    counted, steps, enc = _bpe_toy()
    merges = [pair for pair, _ in counted]
    # (a) learning merges ---------------------------------------------------------------------
    c.text(0.1, 5.67, "(a) learning merges from word counts: the most frequent adjacent pair becomes "
           "a symbol", fs=9.5, ha="left", weight="bold", color="#444444")
    x_label, label_w, col_gap = 0.3, 1.66, 0.12
    widths = {w: max(_pieces_width(s, fs, pad, gap) for s in steps[w]) for w in steps}
    lefts, x = {}, x_label + label_w + col_gap + 0.04
    for w in BPE_TOY_WORDS:
        lefts[w] = x
        x += widths[w] + col_gap
    y_head = 5.33
    c.text(x_label + label_w / 2, y_head, "merge: pair, count → symbol", fs=8.5, color="#444444")
    for w, n in BPE_TOY_WORDS.items():
        c.text(lefts[w] + widths[w] / 2, y_head, f"{w}  ×{n}", fs=9, color="#3c78b4", weight="bold")
    for r in range(len(merges) + 1):
        y = y_head - 0.38 - r * row_h
        if r == 0:
            c.text(x_label + label_w / 2, y, "characters and </w>", fs=8.5, color="#444444")
        else:
            (a, b), count = counted[r - 1]
            c.text(x_label - 0.1, y, f"{r}", fs=8.5, color="#444444", ha="right")
            c.box(x_label + label_w / 2, y, label_w, 0.29, f"({a}, {b})  {count} → {a + b}", "weight",
                  fs=8.5, lw=1.0, pad=0.03)
        for w in BPE_TOY_WORDS:
            pieces = steps[w][r]
            new = "".join(merges[r - 1]) if r else None
            _pieces(c, lefts[w], y, pieces, ["weight" if p == new else "input" for p in pieces], fs=fs,
                    pad=pad, gap=gap)
    y_sep = y_head - 0.38 - len(merges) * row_h - 0.27
    c.ax.plot([0.1, 7.6], [y_sep, y_sep], color="#cccccc", lw=0.8)
    # (b) encoding a new word -----------------------------------------------------------------
    c.text(0.1, y_sep - 0.22, "(b) encoding a new word", fs=9.5, ha="left", weight="bold", color="#444444")
    c.text(0.1, y_sep - 0.48, f"{BPE_TOY_NEW_WORD} is not a training word; the merges apply in the order "
           "learned", fs=8.5, ha="left", color="#444444")
    xb, y0 = 1.3, y_sep - 0.85
    for r, pieces in enumerate(enc):
        y = y0 - r * 0.33
        if r:
            a, b = merges[r - 1]
            c.text(xb - 0.12, y, f"({a}, {b})", fs=8.5, color="#d0692e", ha="right")
        else:
            c.box(xb - 0.52, y, 0.78, 0.27, BPE_TOY_NEW_WORD, "input", fs=9, lw=1.0, pad=0.03)
        last = r == len(enc) - 1
        new = "".join(merges[r - 1]) if r else None
        kinds = ["output" if last else "weight" if p == new else "input" for p in pieces]
        right = _pieces(c, xb, y, pieces, kinds, fs=fs, pad=0.045, gap=0.04)
        if last:
            c.text(right + 0.12, y, "two pieces, both learned", fs=8.5, color="#b84a62", ha="left")
    # (c) one vocabulary, one matrix ----------------------------------------------------------
    xc = 4.45
    c.ax.plot([xc - 0.15, xc - 0.15], [0.1, y_sep - 0.1], color="#cccccc", lw=0.8)
    c.text(xc, y_sep - 0.22, "(c) one vocabulary, one matrix", fs=9.5, ha="left", weight="bold",
           color="#444444")
    e_y = y_sep - 1.3
    emb = c.box(xc + 0.42, e_y, 0.8, 1.55, "", "input", lw=1.6)
    c.text(emb.x, e_y + 0.15, "$E$", fs=12)
    c.text(emb.x, e_y - 0.2, r"$|V| \times d$", fs=9)
    uses = (("source embedding\n√d · E[x]", "input", 0.56),
            ("target embedding\n√d · E[y]", "input", 0.0),
            ("output layer: logits\n" + r"$h\,E^\top + b$", "output", -0.56))
    for label, kind, dy in uses:
        n = c.box(xc + 2.2, e_y + dy, 1.75, 0.48, label, kind, fs=8.5, lw=1.0)
        c.arrow(emb.right(dy * 0.9), n.left())
    c.text(xc + 1.6, e_y - 1.05, "$|V|$ pieces learned from German and English\ntogether (Vaswani et al. "
           "2017, §3.4;\nPress and Wolf 2017)", fs=8.5, color="#444444")
    return c


FIGURES: dict[str, Callable[[], Canvas]] = {
    "01_unrolled_rnn.svg": fig_01_unrolled_rnn,
    "01_gru_cell.svg": fig_01_gru_cell,
    "02_encoder_decoder.svg": fig_02_encoder_decoder,
    "03_alignment_model.svg": fig_03_alignment_model,
    "04_derivation_steps.svg": fig_04_derivation_steps,
    "05_scaled_dot_product.svg": fig_05_scaled_dot_product,
    "05_heads_as_batch.svg": fig_05_heads_as_batch,
    "06_position_schemes.svg": fig_06_position_schemes,
    "07_post_pre_ln.svg": fig_07_post_pre_ln,
    "07_transformer.svg": fig_07_transformer,
    "08_beam_search.svg": fig_08_beam_search,
    "09_kv_cache.svg": fig_09_kv_cache,
    "10_flash_tiling.svg": fig_10_flash_tiling,
    "10_data_parallel.svg": fig_10_data_parallel,
    "11_bpe.svg": fig_11_bpe,
}


IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(((?:\.\./)?figures/[^)\s]+)\)")


def figure_links(path: Path) -> list[tuple[int, str]]:
    """The Markdown image links to ``figures/`` (or ``../figures/``) in a file: (line, target)."""
    found = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        found += [(lineno, m.group(1)) for m in IMAGE_LINK.finditer(line)]
    return found


def broken_figure_links(paths: Sequence[Path]) -> list[str]:
    """One message per image link in ``paths`` whose target file does not exist."""
    bad = []
    for path in paths:
        for lineno, target in figure_links(path):
            if not (path.parent / target).is_file():
                bad.append(f"{path}:{lineno}: {target} does not exist")
    return bad


def render(name: str) -> bytes:
    with plt.rc_context(RC):
        canvas = FIGURES[name]()
        try:
            return canvas.svg()
        finally:
            plt.close(canvas.fig)


def render_png(name: str, path: Path, dpi: int = 100) -> None:
    with plt.rc_context(RC):
        canvas = FIGURES[name]()
        canvas.fig.savefig(path, format="png", dpi=dpi)
        plt.close(canvas.fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the committed SVGs with what the script draws; exit 1 on a difference")
    parser.add_argument("--png", type=Path, default=None, help="also write PNG previews into this folder")
    parser.add_argument("--only", nargs="*", default=None, help="draw only these figures (file names)")
    args = parser.parse_args(argv)
    names = list(FIGURES) if not args.only else args.only
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        parser.error(f"unknown figures {unknown}; known: {sorted(FIGURES)}")
    bad: list[str] = []
    for name in names:
        data = render(name)
        target = FIG_DIR / name
        if args.check:
            if not target.exists():
                bad.append(f"{target.relative_to(REPO_ROOT)}: missing")
            elif target.read_bytes() != data:
                bad.append(f"{target.relative_to(REPO_ROOT)}: differs from what tools/figures.py draws")
        else:
            FIG_DIR.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if args.png is not None:
            args.png.mkdir(parents=True, exist_ok=True)
            render_png(name, args.png / (Path(name).stem + ".png"))
    if args.check:
        if args.only is None and FIG_DIR.exists():
            extra = sorted(p.name for p in FIG_DIR.glob("*.svg") if p.name not in FIGURES)
            bad += [f"notebooks/figures/{n}: not drawn by tools/figures.py" for n in extra]
        if bad:
            print(f"figures out of date (run `python tools/figures.py` and commit; drawn here with "
                  f"matplotlib {matplotlib.__version__}):", file=sys.stderr)
            for line in bad:
                print("  " + line, file=sys.stderr)
            return 1
        print(f"{len(names)} figures match tools/figures.py")
    else:
        print(f"wrote {len(names)} figures to {FIG_DIR.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
