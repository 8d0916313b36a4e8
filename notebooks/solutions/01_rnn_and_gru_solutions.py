# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Solutions: recurrent networks and the GRU
#
# Worked solutions to the exercises of chapter 01. Each coding solution is followed by its
# checker with `must_pass=True`, so this notebook fails loudly if a solution (or a checker)
# breaks. Try the exercises in the chapter before reading on.

# %%
import torch
from torch import Tensor

from tfmlib import exercises
from tfmlib.config import setup

run = setup(seed=0, smoke=dict(fit_steps=150), cpu=dict(fit_steps=1500), gpu=dict(fit_steps=1500))

# %% [markdown]
# ## Coding exercises
#
# **1. Cho et al.'s GRU.** Cut each stacked tensor into its three blocks (reset, update, candidate).
# The only change from `nn.GRU` is where $r$ acts: it multiplies the state *before* the product
# with $W_{hn}$, and $b_{hn}$ is added afterwards, out of the gate's reach. The update gate keeps
# PyTorch's (and Cho et al.'s eq. 7) meaning: $z$ near 1 keeps the old state.

# %%
def gru_step_reset_before(x: Tensor, h: Tensor, W_ih: Tensor, W_hh: Tensor, b_ih: Tensor,
                          b_hh: Tensor) -> Tensor:
    W_ir, W_iz, W_in = W_ih.chunk(3)
    W_hr, W_hz, W_hn = W_hh.chunk(3)
    b_ir, b_iz, b_in = b_ih.chunk(3)
    b_hr, b_hz, b_hn = b_hh.chunk(3)
    r = torch.sigmoid(x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    n = torch.tanh(x @ W_in.T + b_in + (r * h) @ W_hn.T + b_hn)
    return (1 - z) * n + z * h


exercises.check("01.gru_step_reset_before", gru_step_reset_before, must_pass=True)

# %% [markdown]
# The wrong answers the checker names are the ways this step is usually miswritten: the
# reset-after form (what `nn.GRU` computes, so copying the chapter's cell unchanged), $r$ applied
# to $b_{hn}$ as well (half of each form), $r$ applied after the product but with $b_{hn}$ outside
# it ($r \odot (W_{hn} h) + b_{hn}$, the other half-way form), no reset at all, $z$ and $1 - z$
# swapped (Chung et al.'s convention), the blocks read in the order update, reset (Keras's order, not PyTorch's),
# the weights used untransposed, and the candidate returned in place of the new state.
#
# How different are the two placements? One step of `nn.GRUCell` and of the reset-before step, on
# the same weights and the same random batch (PyTorch's default initialisation, float64):

# %%
torch.manual_seed(0)
cell = torch.nn.GRUCell(6, 9).double()
x_step, h_step = torch.randn(4, 6, dtype=torch.double), torch.randn(4, 9, dtype=torch.double)
with torch.no_grad():
    after = cell(x_step, h_step)
    before = gru_step_reset_before(x_step, h_step, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
gap = (after - before).abs()
print(f"reset-after (nn.GRUCell) vs reset-before, same weights: max |difference| {gap.max():.3f}, "
      f"mean {gap.mean():.3f} (the state itself has mean |h'| {after.abs().mean():.3f})")
assert gap.max() > 1e-2, "the two placements should be different functions"

# %% [markdown]
# A difference of that size, on the first step from the same weights, is not rounding: the two
# forms are different functions, and it compounds over a sequence. Exercise 2 asks when weights
# can be converted between them.

# %% [markdown]
# **2. When `nn.GRU` can compute Cho et al.'s cell.** Compare the candidates unit by unit. In
# `nn.GRU`, unit $k$ reads $r_k \big(\sum_j (W_{hn})_{kj} h_j + (b_{hn})_k\big)$: one gate value
# scales its whole hidden-side term. In Cho et al.'s form it reads
# $\sum_j (W_{hn})_{kj}\, r_j h_j + (b_{hn})_k$: the gate $r_j$ of every unit $j$ in row $k$ of
# $W_{hn}$ enters. The two agree for all inputs when $W_{hn}$ is diagonal, because then
# $r_k (W_{hn})_{kk} h_k$ is the same product in either order; the bias must then leave the gate's
# reach, which it does if it is moved from $b_{hn}$ (inside the gate in `nn.GRU`) to $b_{in}$
# (outside). The same holds when row $k$ has its one nonzero entry off the diagonal, in column
# $j$: Cho et al.'s unit $k$ reads $(W_{hn})_{kj}\, r_j h_j$, a single gate, and `nn.GRU`'s unit
# $k$ computes that gate if its row of the reset block (in $W_{ih}$, $W_{hh}$, $b_{ih}$ and
# $b_{hh}$) is a copy of unit $j$'s: the reset gate is just another output of the step, and which
# row feeds which unit is the weights' choice. So the condition is *at most one nonzero entry per
# row of $W_{hn}$* (a diagonal, or a permutation of one, with repeats allowed). With two nonzero
# entries in row $k$, in columns $j \ne l$, Cho et al.'s unit $k$ depends on two different gates
# $r_j$ and $r_l$, and `nn.GRU`'s unit $k$ has only one gate to multiply with, so no choice of
# weights reproduces it (for gates that vary with the input; two units with identical gates would
# be a degenerate exception). Symmetric or triangular $W_{hn}$ are no exception; nor is a single
# off-diagonal entry of $10^{-3}$ beside the diagonal: the test is for exact zeros.

# %%
def reset_before_as_nn_gru(W_ih: Tensor, W_hh: Tensor, b_ih: Tensor, b_hh: Tensor
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    H = W_hh.shape[1]
    nonzero = W_hh[2 * H:] != 0                      # W_hn's pattern, (H, H)
    if (nonzero.sum(dim=1) > 1).any():
        raise ValueError("a row of W_hn has two nonzero entries: that unit reads two reset gates, and "
                         "nn.GRU's unit has one; no weights make it compute this cell")
    src = nonzero.int().argmax(dim=1)                # row k's nonzero column (0 for an empty row)
    W_ih, W_hh, b_ih, b_hh = (t.clone() for t in (W_ih, W_hh, b_ih, b_hh))
    for t in (W_ih, W_hh, b_ih, b_hh):
        t[:H] = t[:H][src]                           # unit k's reset gate computes r_src[k]
    b_ih[2 * H:] += b_hh[2 * H:]   # b_hn moves to b_in, where the reset gate does not reach it
    b_hh[2 * H:] = 0
    return W_ih, W_hh, b_ih, b_hh


exercises.check("01.reset_before_as_nn_gru", reset_before_as_nn_gru, must_pass=True)

# %% [markdown]
# The answers the checker turns away each stop one step short. Returning the weights unchanged
# gets the diagonal right but leaves $b_{hn}$ where `nn.GRUCell` multiplies it by $r$; zeroing
# $b_{hn}$ without moving it loses a bias; adding it to $b_{in}$ without zeroing it counts it
# twice; moving it into the first or second block changes a gate instead of the candidate.
# Raising for every cell misses that the diagonal case has an exact equivalent; raising for every
# non-diagonal $W_{hn}$ misses the re-indexed gates (the checker's last case has one nonzero entry
# per row, off the diagonal); moving the bias there without re-indexing leaves unit $k$ gated by
# $r_k$. Never raising (or returning `None`) claims a conversion that does not exist, and so does
# raising only when $W_{hn}$ is not symmetric, not triangular, has no zero entry, or is not
# diagonal within a tolerance: each of those lets through a matrix with a row of two nonzero
# entries. (Symmetry is the tempting one: "$W \operatorname{diag}(r) = \operatorname{diag}(r) W$
# for a symmetric $W$" is false; that identity needs $W$ to commute with every diagonal matrix,
# which only a diagonal $W$ does.)

# %% [markdown]
# The argument says "no weights", which is stronger than "not these weights". A measurement makes
# it concrete: train an `nn.GRUCell` to imitate a reset-before cell (random weights, random inputs
# and states, mean squared error on the next state), and, as a control, train a second
# `nn.GRUCell` from a different initialisation to imitate a reset-*after* teacher, which it can
# match exactly. Same sizes, optimiser and steps for both.

# %%
def imitate(teacher_step, steps: int, seed: int, I: int = 4, H: int = 8) -> list[float]:
    """Fit an nn.GRUCell to `teacher_step(x, h)`; return the mean squared error every 10% of the steps."""
    g = torch.Generator().manual_seed(seed)
    student = torch.nn.GRUCell(I, H)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    errors = []
    for step in range(steps):
        x, h = torch.randn(256, I, generator=g), torch.randn(256, H, generator=g)
        loss = (student(x, h) - teacher_step(x, h)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % (steps // 10) == 0:
            errors.append(loss.item())
    return errors


I, H = 4, 8
g = torch.Generator().manual_seed(1)
teacher_w = [t * 0.7 for t in (torch.randn(3 * H, I, generator=g), torch.randn(3 * H, H, generator=g),
                               torch.randn(3 * H, generator=g), torch.randn(3 * H, generator=g))]
teacher_after = torch.nn.GRUCell(I, H)
with torch.no_grad():
    for p, t in zip((teacher_after.weight_ih, teacher_after.weight_hh, teacher_after.bias_ih,
                     teacher_after.bias_hh), teacher_w, strict=True):
        p.copy_(t)
results = {}
for seed in range(3):
    torch.manual_seed(seed)
    results["reset-before teacher", seed] = imitate(
        lambda x, h: gru_step_reset_before(x, h, *teacher_w), run.fit_steps, seed)
    torch.manual_seed(seed)
    results["nn.GRUCell teacher", seed] = imitate(lambda x, h: teacher_after(x, h).detach(), run.fit_steps, seed)
for (name, seed), errs in results.items():
    print(f"{name:22s} seed {seed}: MSE after 10% / 50% / 100% of {run.fit_steps} steps: "
          f"{errs[0]:.2e} / {errs[4]:.2e} / {errs[-1]:.2e}")
worst_control = max(results["nn.GRUCell teacher", s][-1] for s in range(3))
best_before = min(results["reset-before teacher", s][-1] for s in range(3))
print(f"best final error against the reset-before teacher / worst against the nn.GRUCell teacher: "
      f"{best_before / worst_control:.0f}x")
if run.profile != "smoke":
    assert best_before > 10 * worst_control, "nn.GRUCell should not be able to imitate a reset-before cell"

# %% [markdown]
# Against its own kind, the student's error keeps falling; against Cho et al.'s cell it levels off
# far above (the printed ratio, over three seeds each). That is what "not reproducible with
# `nn.GRU` weights" means in practice: loading a reset-before checkpoint (Keras with
# `reset_after=False`, an ONNX model with `linear_before_reset=0`) into `nn.GRU` needs a different
# cell, not a conversion, unless its $W_{hn}$ happens to be diagonal.
#
# **3. Gates for any weighting.** Question 4's construction, in code. With
# $P_i = \prod_{j = i+1}^{T} z_j$, the weights telescope: $w_i = P_i - P_{i-1}$ and $w_0 = P_0$, so
# $P_i = w_0 + \dots + w_i$, a cumulative sum, and each gate is the ratio $z_i = P_{i-1} / P_i$
# (at most 1, because the $P$'s grow). Where $P_i = 0$, all weights up to $i$ are zero and so is
# $P_{i-1}$: the ratio is $0/0$, and any gate value works, because a zero product downstream
# already zeroes everything before it. We choose 1.

# %%
def gates_for_weights(w: Tensor) -> Tensor:
    P = w.cumsum(dim=0)                                  # P[i] = w_0 + ... + w_i, (T + 1, H)
    ratio = P[:-1] / P[1:].clamp_min(torch.finfo(w.dtype).tiny)
    return torch.where(P[1:] > 0, ratio, torch.ones_like(ratio)).clamp(0, 1)


exercises.check("01.gates_for_weights", gates_for_weights, must_pass=True)

# %% [markdown]
# The tempting wrong answers read the weights as if they were gates: $w_i$ itself, or $1 - w_i$,
# which would be right only if $P_i$ were 1 at every step (it is 1 only at the last). Returning
# the $P$'s instead of their ratios gives products of gates, not gates; summing the weights from
# $i$ on, instead of up to $i$, runs the products the wrong way in time (the same index slip the
# chapter shows for the forward formula). And dividing without deciding the $0/0$ case puts NaN
# into exactly the gates that do not matter.

# %% [markdown]
# The example of question 4, all the weight on the third word of a five-word sentence: the gates
# are 0 at step 3 (write) and 1 afterwards (keep); before step 3 they are the arbitrary 1s of the
# $0/0$ case.

# %%
from tfmlib.rnn import unrolled_gru_weights  # noqa: E402 (the package's z -> w, for the round trip)

w_third = torch.zeros(6, 1, dtype=torch.double)
w_third[3] = 1.0
z_third = gates_for_weights(w_third)
print("gates z_1..z_5:", z_third[:, 0].tolist())
assert torch.equal(unrolled_gru_weights(z_third), w_third), "the gates should give back the weights"

# %% [markdown]
# **4. The LSTM's memory, unrolled.** Substitute the memory line into itself, as section 4 does
# for the GRU: $c_T = f_T c_{T-1} + i_T g_T = f_T f_{T-1} c_{T-2} + f_T i_{T-1} g_{T-1} + i_T g_T
# = \dots$, so
#
# $$ w_0 = \prod_{j=1}^{T} f_j, \qquad w_k = i_k \prod_{j=k+1}^{T} f_j . $$
#
# A candidate written at step $k$ enters with its input gate $i_k$ and then passes the forget
# gates of every *later* step; $f_k$ acts on what was there before $g_k$ arrived, so it is not
# in $w_k$'s product (including it is the off-by-one the checker names). Running the products
# backwards in time gives all of them in one pass. The telescoping sum of section 4 needed
# $1 - z_k$ where $i_k$ stands now; with two independent gates it does not telescope, and the
# weights need not sum to one: normalising them, or writing the GRU's weights with $z = f$, are
# the answers that miss this.

# %%
def lstm_memory_weights(f: Tensor, i: Tensor) -> Tensor:
    T, H = f.shape
    rows, survive = [], torch.ones(H, dtype=f.dtype)   # survive: product of the forget gates after k
    for k in range(T, 0, -1):
        rows.append(i[k - 1] * survive)
        survive = survive * f[k - 1]
    return torch.stack([survive] + rows[::-1])          # row 0: c_0, through every forget gate


exercises.check("01.lstm_memory_weights", lstm_memory_weights, must_pass=True)

# %% [markdown]
# Why not compute the products once, forwards, and divide:
# $w_k = i_k \prod_{j \le T} f_j \,/\, \prod_{j \le k} f_j$? It is right while every forget gate is
# positive. But a gate can be exactly 0, which the exercise allows: a float32 sigmoid of a
# pre-activation below about $-89$ rounds to 0, and a gate that forgets everything is a
# legitimate one. There the quotient is $0/0$, for every candidate after the forgetting step,
# which are exactly the ones that survive it (four steps, $f_2 = 0$, every $i = 0.5$):

# %%
f_zero = torch.tensor([[0.9], [0.0], [0.8], [0.7]], dtype=torch.double)
i_zero = torch.full_like(f_zero, 0.5)
total, prefix = f_zero.prod(dim=0), f_zero.cumprod(dim=0)
print("divide the products:  ", torch.cat([total[None], i_zero * total / prefix])[:, 0].tolist())
print("later gates, no divide:", lstm_memory_weights(f_zero, i_zero)[:, 0].tolist())
assert not lstm_memory_weights(f_zero, i_zero).isnan().any()

# %% [markdown]
# The quotient returns NaN for $g_2, g_3, g_4$, whose weights are $0.5 \cdot 0.8 \cdot 0.7 = 0.28$,
# $0.35$ and $0.5$: everything written after the reset. The checker sets one forget gate to 0 and
# names this answer. (It compares to $10^{-6}$, so the same loop in float32 passes: the exercise is
# about which gates enter each product, not about rounding.)

# %% [markdown]
# On a real `nn.LSTMCell` (PyTorch's default initialisation, random inputs): compute its gates
# step by step (`nn.LSTMCell` stacks them as input, forget, candidate, output), rebuild $c_T$ from
# the weights, and look at their sum per hidden unit.

# %%
torch.manual_seed(0)
lstm, T_lstm, H_lstm = torch.nn.LSTMCell(8, 16).double(), 30, 16
xs = torch.randn(T_lstm, 1, 8, dtype=torch.double)
h_l, c_l = torch.zeros(1, H_lstm, dtype=torch.double), torch.randn(1, H_lstm, dtype=torch.double)
c_start, forget, inputs, candidates = c_l[0], [], [], []
with torch.no_grad():
    for x_t in xs:
        pre = x_t @ lstm.weight_ih.T + lstm.bias_ih + h_l @ lstm.weight_hh.T + lstm.bias_hh
        i_t, f_t, g_t, _ = pre.chunk(4, dim=1)
        inputs.append(torch.sigmoid(i_t)[0])
        forget.append(torch.sigmoid(f_t)[0])
        candidates.append(torch.tanh(g_t)[0])
        h_l, c_l = lstm(x_t, (h_l, c_l))
w_lstm = lstm_memory_weights(torch.stack(forget), torch.stack(inputs))
rebuilt = w_lstm[0] * c_start + (w_lstm[1:] * torch.stack(candidates)).sum(0)
print(f"c_T rebuilt from the weights vs nn.LSTMCell: max |error| {(rebuilt - c_l[0]).abs().max():.1e}")
sums = w_lstm.sum(0)
print(f"sum of the weights per hidden unit, at init: min {sums.min():.3f}, median {sums.median():.3f}, "
      f"max {sums.max():.3f}")
assert torch.allclose(rebuilt, c_l[0], atol=1e-12), "the unrolled weights should rebuild c_T"

gated = {"f = i = 0.9 (both open)": (0.9, 0.9), "f = 0.5, i = 0.5 (GRU-like, sum 1)": (0.5, 0.5),
         "f = 0.99, i = 0.9 (keep and add)": (0.99, 0.9)}
for name, (f_val, i_val) in gated.items():
    w_const = lstm_memory_weights(torch.full((T_lstm, 1), f_val, dtype=torch.double),
                                  torch.full((T_lstm, 1), i_val, dtype=torch.double))
    print(f"constant gates {name:36s}: weights sum to {w_const.sum().item():.3f} after {T_lstm} steps")

# %% [markdown]
# The weights rebuild the cell's memory to rounding error. At initialisation both gates sit near
# $\sigma(0) = 0.5$, so the sums spread around one (the printed median and range): the untrained
# LSTM behaves much like a GRU. But nothing ties them: with both gates open the weights sum to far more
# than one (the printed constant-gate cases), so $c_t$ can *accumulate*: add a candidate to what
# it keeps instead of averaging the two, and count (Gers & Schmidhuber, 2001, trained LSTMs to
# count this way; Weiss, Goldberg & Yahav, 2018, showed that trained LSTMs do, and GRUs do not).
# The price is a memory that is not bounded by 1, which is why the LSTM reads it out through
# another $\tanh$ and an output gate, $h_t = o_t \odot \tanh(c_t)$, where the GRU's state is
# its output directly. For attention (chapters 03 and 04) the GRU's reading is the closer one:
# weights that sum to one, a convex combination.

# %% [markdown]
# ## Questions
#
# **1. A bound above one, yet decay.** $\lVert W_{hh}\rVert_2$ bounds how much *one* step can
# stretch a vector; the bound $\lVert W_{hh}\rVert^{T-t}$ is only an upper bound, and it is loose
# when the direction stretched most by one step is not the one stretched most by the next (for a
# non-symmetric matrix it usually is not). The chapter printed $\lVert W_{hh}\rVert_2$ above one
# and a decaying gradient: no contradiction, the bound just says nothing useful there.
#
# What governs the decay over many steps? For powers of one fixed matrix, the rate per step tends
# to the spectral radius (Gelfand's formula, $\lVert W^k \rVert^{1/k} \to \rho(W)$, and
# $\rho \le \lVert W \rVert_2$ always). The RNN's product is not a power: each factor
# $\operatorname{diag}(1 - h_k^2)\, W_{hh}$ has its own diagonal. The long-run rate of such a
# product of varying matrices is its top Lyapunov exponent,
# $\lambda = \lim_k \frac1k \log \lVert J_k \cdots J_1 \rVert$ (it exists for stationary random
# factors, by Furstenberg–Kesten), and it is not a function of $\rho(W_{hh})$ alone. The
# chapter's $2 \times 2$ example shows why "$\rho$ pulled down by $\tanh'$" is only a heuristic:
# $W = \begin{pmatrix} 1 & 1 \\ -1 & -1 \end{pmatrix}$ has $W^2 = 0$, so $\rho(W) = 0$, while
# $\operatorname{diag}(1, 0.5)\, W$ has $\rho = 0.5$; a diagonal factor $\le 1$ raised the rate.
# It can happen because $W$ is non-normal (its eigenvectors are not orthogonal). For the random
# $W_{hh}$ of the chapter, the measured factor per step was below $\rho$; that is an observation
# about those matrices, which the chapter asserts as such, not a theorem. The cell below estimates
# the Lyapunov exponent of the chapter's default RNN directly (the mean log growth per step of a
# vector pushed through the Jacobians, renormalised at every step; the gradient, which multiplies
# their transposes, has the same long-run rate) and compares it with $\rho$.

# %%
torch.manual_seed(0)
H_lyap, steps = 64, 400
W_xh = (torch.rand(H_lyap, 32) * 2 - 1) / H_lyap ** 0.5  # PyTorch's default U(-1/sqrt(H), 1/sqrt(H))
W_hh = (torch.rand(H_lyap, H_lyap) * 2 - 1) / H_lyap ** 0.5
b = (torch.rand(H_lyap) * 2 - 1) / H_lyap ** 0.5
h, v, log_growth = torch.zeros(H_lyap), torch.randn(H_lyap), 0.0
for _ in range(steps):
    h = torch.tanh(W_xh @ torch.randn(32) + W_hh @ h + b)
    v = (1 - h ** 2) * (W_hh @ v)     # the Jacobian diag(1 - h^2) W_hh applied to a tangent vector
    log_growth += v.norm().log().item()
    v = v / v.norm()
rho_hh = torch.linalg.eigvals(W_hh).abs().max().item()
print(f"Lyapunov estimate: factor per step {torch.tensor(log_growth / steps).exp():.3f}; "
      f"spectral radius of W_hh {rho_hh:.3f}; largest singular value "
      f"{torch.linalg.matrix_norm(W_hh, ord=2):.3f}")

# %% [markdown]
# For this matrix and these inputs the estimated rate is below $\rho$, as the chapter's
# measurement found, and far below the largest singular value; the $2 \times 2$ example says
# not to expect that for every matrix.

# %% [markdown]
# **2. A GRU that always keeps.** With $z_t \approx 0.98$, each new candidate enters the state
# with weight $1 - z_t \approx 0.02$: the network barely listens to its input, and its state
# moves slowly. The same factor scales learning: differentiating
# $h_t = (1 - z_t) \odot n_t + z_t \odot h_{t-1}$ with respect to the input,
#
# $$ \frac{\partial h_t}{\partial x_t} = \operatorname{diag}(1 - z_t)\,\frac{\partial n_t}{\partial x_t}
#    + \operatorname{diag}(h_{t-1} - n_t)\,\operatorname{diag}\big(z_t (1 - z_t)\big)\, W_{iz}, $$
#
# and both terms carry a factor $1 - z_t \approx 0.02$. The gradients that would teach the
# input-side weights are about 25 times smaller than in a GRU with $z \approx 0.5$. Gradients reach far back, but
# what they reach is a state that hardly depends on any one word. A language model initialised
# that way starts as a slow, smooth integrator of its inputs and predicts poorly at first; it
# can learn (the biases are trainable), but it must first learn to *lower* $z$ for the units
# that should react to the current word. A moderate positive bias on the update gate (the GRU
# analogue of the LSTM "forget-gate bias of 1", Jozefowicz, Zaremba & Sutskever, 2015) is
# a common compromise.
#
# **3. A constant gate.** With $z_t = z$, $\prod_{j=i+1}^{T} z_j = z^{T-i}$, so
# $w_i = (1 - z)\, z^{T-i}$ and $w_0 = z^T$: an exponential moving average of the candidates.
# A candidate's weight halves after $k$ steps when $z^k = 1/2$, i.e. $k = \ln 2 / (-\ln z)$;
# for $z = 0.9$ that is about 6.6 steps.
#
# **4. Every weighting is reachable.** Work backwards from $P_T = 1$. Since
# $w_i = P_i - P_{i-1}$ (section 4), $P_{i-1} = P_i - w_i$, so
# $P_i = 1 - \sum_{k > i} w_k = \sum_{k \le i} w_k$, a non-decreasing sequence in $[0, 1]$
# with $P_0 = w_0$. Choose $z_i = P_{i-1} / P_i$ (and $z_i = 0$ where $P_i = 0$); then
# $0 \le z_i \le 1$, the product $\prod_{j > i} z_j$ telescopes to $P_i / P_T = P_i$, and
# $(1 - z_i) P_i = P_i - P_{i-1} = w_i$. (Where $P_i = 0$, all weights up to $i$ are zero, and
# the first later $z_j = 0$ makes the product zero, as it should be.) So a GRU unit could in
# principle put, say, all its weight on the third word of the sentence: write at step 3
# ($z_3 = 0$), then keep ($z_j = 1$) at every later step. The limitation is *when and from
# what* the weights are chosen: $z_i$ must be decided at step $i$ from $x_i$ and $h_{i-1}$
# alone, before the network knows which later prediction will need the word, and the choice is
# then fixed for every later use.
#
# **5. What attention can do that these weights cannot.** (a) Depend on a *query* chosen at read
# time (the decoder's current state, another word of the sentence): different queries get
# different weights over the same positions. The GRU commits to one weighting per unit while
# it reads (question 4). (b) Keep every value vector and retrieve any one of them later: the
# GRU stores only the blend, $H$ numbers, and once two candidates have been averaged into a
# unit no later question can separate them again. Attention's memory grows with the length
# of the input; the GRU's is fixed. Also: attention weights are computed in parallel for all
# positions, and the values they average do not depend on each other, while each GRU
# candidate $n_i$ depends on the previous state. (One thing goes the other way: the GRU has a
# separate weighting for every hidden unit, while one attention head uses the same weight for
# all features of a value vector; multi-head attention, chapter 05, recovers some of that.)
#
# **6. Parameters at equal width.** An `nn.RNN` layer has $W_{ih}$ ($H \times E$), $W_{hh}$
# ($H \times H$) and two biases: $HE + H^2 + 2H$ parameters. An `nn.GRU` layer has three of
# each, one per block ($r$, $z$, $n$): $3(HE + H^2 + 2H)$. The embedding and the read-out are
# the same, so the GRU model has $2(HE + H^2 + 2H)$ more parameters; with $E = 64$, $H = 128$
# that is $2(8192 + 16384 + 256) = 49{,}664$, the difference of the two printed counts. For a
# comparison at equal parameter count, widen the RNN to $H'$ such that its total matches:
# $H'^2 + H'(E + 2 + V) + V(E + 1) = N_{\text{GRU}}$, where the $H' V$ term is the wider
# read-out. With the `cpu` profile's sizes ($V = 292$) that is $H' \approx 200$: the chapter's
# cell solves this quadratic and trains that RNN over the same seeds (section 5's third model;
# read its rows and verdict lines there). Equal parameters is not equal time: the GRU is slower
# per step than the RNN of its width, and the timing cell prints its ratio to the widened RNN
# too. A comparison at equal time gives every model the same wall-clock budget on the same
# machine (`fit`'s `time_budget_s`, which stops each run after that much training time) and
# compares the perplexity each reaches, over the same seeds. Against the chapter's equal
# number of steps it favours whichever model is faster per step: where the GRU is the slower
# one it gets fewer steps than the RNNs, so its lead can shrink or reverse, and
# because time per step depends on the device (the chapter's GPU note), the answer belongs to a
# machine, not to the two architectures. Equal FLOPs is the device-free version of the same
# question.
#
# One reading at equal time is already in the chapter's output. The learning rate is constant
# (Adam, no schedule), so a model's perplexity after epoch $k$ of the four-epoch run is that of
# a run stopped there. The timing cell prints how many RNN steps fit in one GRU step (about two
# for the narrow RNN, one and a half for the widened one in the committed run), so at equal
# time the GRU has reached about its second epoch when the RNNs finish their fourth: compare the
# GRU's epoch-2 line with each RNN's last one, seed by seed, in the epoch lines of section 5. In
# the committed `cpu` run the GRU is still lower for every seed, but its lead over the narrow RNN
# shrinks from over half a point to about a tenth in two of the three seeds, which is within the
# run-to-run float noise the chapter describes: at equal time on that CPU the comparison is
# close to a tie with the narrow RNN and still a win against the widened one. A further
# experiment the chapter leaves open: the widened RNN's training loss ends *above* the narrow
# one's, a sign that the learning rate chosen for all three models does not suit it; train both
# RNNs at 1e-3 as well and compare each at its better rate.
#
# **7. Padding in the loss.** Padding positions are not words of the sentence: their "targets"
# are `PAD`, which the model would learn to predict trivially after `EOS`. Counting them would
# add many near-zero losses to the average and report a perplexity that is better than the
# model really is (and that changes with how batches are padded). `ignore_index=PAD_ID` drops
# them, and `lm_loss` returns the number of real targets so that epoch averages weight each
# batch by its real tokens.
#
# ## References
#
# * R. Jozefowicz, W. Zaremba, I. Sutskever (2015). *An empirical exploration of recurrent
#   network architectures.* ICML. Among other findings, that a forget-gate bias of 1 closes
#   most of the gap between the LSTM and the GRU.
# * F. A. Gers, J. Schmidhuber (2001). *LSTM recurrent networks learn simple context-free and
#   context-sensitive languages.* IEEE Transactions on Neural Networks 12(6), 1333–1340. LSTMs that
#   count with their memory cells.
# * G. Weiss, Y. Goldberg, E. Yahav (2018). *On the practical computational power of finite
#   precision RNNs for language recognition.* ACL. Trained LSTMs count ($a^n b^n$), GRUs do not.
# * The chapter's references, in particular Pascanu, Mikolov & Bengio (2013, §2) for the
#   spectral radius and the norm of $W_{hh}$.
