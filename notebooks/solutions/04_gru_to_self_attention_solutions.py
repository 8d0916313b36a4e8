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
# # 04 · Solutions: from the GRU to self-attention
#
# Worked solutions to the coding exercises of chapter 04, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks, and then
# answers to the chapter's seven questions. Each solution says why it works, what the common
# wrong answers get wrong, and then tests itself in a way the checker does not. Try the exercises
# in the chapter first.

# %%
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.config import setup

run = setup(seed=0)      # the profile, the device, the CPU threads and the seeds, before anything else

# %% [markdown]
# ## Coding exercises
#
# **1. XOR with two heads, set by hand.** The closing notes of the experiments give the idea: a
# head that looks for a marked 1 finds one unless both marked bits are 0, so what it reads is the
# OR of the bits; a head that looks for a marked 0 finds one unless both are 1, a NAND. And
# XOR = OR + NAND − 1, which is linear in the two heads' outputs: a read-out $w = (1, 1)$,
# $b = -3/2$ splits it at one half.
#
# Each head needs one coordinate. The query reads the question token (4) and nothing else, so the
# scores of the last position are $\beta$ at the tokens a head looks for and 0 elsewhere; the key
# of head 1 reads token 3 (a marked 1), that of head 2 token 2 (a marked 0), and each value reads
# the same token as its key. When a head finds nothing, its scores are all 0 and its weights are
# uniform, but every value it averages is 0: its output is exactly 0. When it finds one position
# among $L$, that position gets $e^\beta / (e^\beta + L - 1)$.
#
# That is where most wrong answers fail: the weights of a softmax are shared. In the case $(0,1)$
# both heads find exactly one position, and the decision $2 e^\beta / (e^\beta + L - 1) - 3/2 > 0$
# needs $e^\beta > 3(L - 1)$. A fixed $\beta$ (say 4) is right on short sequences and wrong from
# $L = \lfloor e^4 / 3 \rfloor + 2$ positions on (computed and checked below);
# $\beta = \log T_{\max} + 3$ gives $e^\beta = e^3\, T_{\max} \approx 20\,T_{\max}$, enough at
# every length up to $T_{\max}$. The other common wrong answers: two heads that both look for a
# marked 1 (that computes OR, wrong when both bits are 1), keys or values that also match the
# unmarked bits 0 and 1 (the answer then depends on them), and a single head, which section 8
# proves cannot be right on all four cases.

# %%
def xor_heads(T_max: int) -> tuple[Tensor, Tensor, Tensor, Tensor, float]:
    beta = math.log(T_max) + 3                     # the one found position keeps > 3/4 of the weight
    W_Q, W_K, W_V = (torch.zeros(2, 1, 5) for _ in range(3))
    W_Q[:, 0, 4] = beta                            # both heads ask from the question token
    W_K[0, 0, 3] = W_V[0, 0, 3] = 1.0              # head 1: a marked 1 (OR)
    W_K[1, 0, 2] = W_V[1, 0, 2] = 1.0              # head 2: a marked 0 (NAND)
    return W_Q, W_K, W_V, torch.tensor([1.0, 1.0]), -1.5


exercises.check("04.xor_two_heads", xor_heads, must_pass=True)

# %% [markdown]
# A check the checker does not make: the chapter's xor sequences (length 12, drawn like its
# `xor_sample`) through the same two heads, and the smallest margin of the decision over the four
# cases, against the margin the formula above predicts for the worst case, one position found
# among 12. Both heads are computed for every position here, with the causal mask, and the last
# row is read, as the chapter's `SelfAttentionLayer` would. Then the fixed $\beta = 4$ on the case
# $(0, 1)$, at the last length the formula allows and at the first it does not.

# %%
g = torch.Generator().manual_seed(0)
n, T = 4096, 12
ids = torch.randint(0, 2, (n, T), generator=g)
marked = torch.argsort(torch.rand(n, T - 1, generator=g), dim=1)[:, :2]
rows = torch.arange(n)
a, b = ids[rows, marked[:, 0]].clone(), ids[rows, marked[:, 1]].clone()
ids[rows, marked[:, 0]] += 2
ids[rows, marked[:, 1]] += 2
ids[:, -1] = 4
W_Q, W_K, W_V, w, bias = xor_heads(T)
x = F.one_hot(ids, 5).float()
causal = torch.ones(T, T, dtype=torch.bool).tril()
heads = []
for h in range(2):
    scores = (x @ W_Q[h].T) @ (x @ W_K[h].T).transpose(1, 2)
    heads.append(torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ (x @ W_V[h].T))
logit = torch.cat(heads, -1)[:, -1] @ w + bias
accuracy = ((logit > 0).long() == (a ^ b)).float().mean().item()
found_one = math.exp(math.log(T) + 3) / (math.exp(math.log(T) + 3) + T - 1)
print(f"accuracy on {n} sequences of length {T}: {accuracy:.1%}; smallest |margin| {logit.abs().min().item():.3f} "
      f"(the worst case by the formula, one position found in each head: {2 * found_one - 1.5:.3f})")
assert accuracy == 1.0 and logit.abs().min() >= 2 * found_one - 1.5 - 1e-5


def blunt_logit(L: int) -> float:
    """beta = 4, marked bits (0, 1) at positions 0 and 1, unmarked zeros, the question last."""
    x = F.one_hot(torch.tensor([2, 3] + [0] * (L - 3) + [4]), 5).float()
    W_Q, W_K, W_V, w, bias = xor_heads(T_max=1)
    W_Q = W_Q / W_Q.max() * 4.0                                   # the same heads, beta = 4
    heads = [torch.softmax((x[-1] @ W_Q[h].T) @ (x @ W_K[h].T).T, -1) @ (x @ W_V[h].T) for h in range(2)]
    return (torch.cat(heads) @ w + bias).item()


first_wrong = math.floor(math.exp(4) / 3) + 2
print(f"beta = 4, bits (0, 1): logit {blunt_logit(first_wrong - 1):+.4f} at length {first_wrong - 1}, "
      f"{blunt_logit(first_wrong):+.4f} at length {first_wrong} (XOR is 1: the logit must be positive)")
assert blunt_logit(first_wrong - 1) > 0 > blunt_logit(first_wrong)

# %% [markdown]
# **2. Linear attention as a recurrence.** With $\phi(q_t)^\top \phi(k_i)$ in place of
# $\exp(q_t^\top k_i)$ the causal output factors:
#
# $$\text{out}_t = \frac{\sum_{i \le t} \phi(q_t)^\top \phi(k_i)\, v_i^\top}{\sum_{i \le t} \phi(q_t)^\top \phi(k_i)}
#   = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t}, \qquad
#   S_t = \sum_{i \le t} \phi(k_i) v_i^\top, \quad z_t = \sum_{i \le t} \phi(k_i),$$
#
# because $\phi(q_t)$ does not depend on $i$ and comes out of both sums. $S_t$ and $z_t$ are
# running sums, so one step adds position $t$'s terms, $S_t = S_{t-1} + \phi(k_t) v_t^\top$ and
# $z_t = z_{t-1} + \phi(k_t)$, and then reads them with the query. The order matters: reading
# before adding is the strictly causal mask (position $t$ would not see itself; at the first
# position the read is $0/0$). Other wrong answers the checker names: no division by
# $\phi(q_t)^\top z_t$ (the weights would not sum to one), a state that collects the queries'
# features, a state that holds only the current position, and a state that grows by one key per
# step, which is attention again, not a recurrence.

# %%
def linear_attention_step(S: Tensor, z: Tensor, phi_q: Tensor, phi_k: Tensor,
                          v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    S = S + phi_k[:, :, None] * v[:, None, :]          # (B, m, d_v): add phi(k_t) v_t^T
    z = z + phi_k                                       # (B, m)
    out = (phi_q[:, None, :] @ S)[:, 0] / (phi_q * z).sum(-1, keepdim=True)
    return S, z, out


exercises.check("04.linear_attention_recurrence", linear_attention_step, must_pass=True)

# %% [markdown]
# What has come back from the GRU is the fixed-size state and the constant cost per token: the
# state is $m \times d_v + m$ numbers whatever $t$, and generating a token costs the same at
# position 10 and at position 10,000. What has not come back is a non-linear state update: the
# state is a plain sum, nothing is forgotten, and every position's weight is still chosen by the
# query when it reads (the GRU's gates decide what to keep when writing). A check on a longer
# sequence, with $\phi = \text{elu} + 1$ (Katharopoulos et al.'s choice), against the $T \times T$
# form, in float64:

# %%
torch.manual_seed(0)
B, T, d, d_v = 2, 200, 8, 5
q, k, v = torch.randn(B, T, d, dtype=torch.double), torch.randn(B, T, d, dtype=torch.double), \
    torch.randn(B, T, d_v, dtype=torch.double)
phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
S, z, outs = torch.zeros(B, d, d_v, dtype=torch.double), torch.zeros(B, d, dtype=torch.double), []
for t in range(T):
    S, z, out = linear_attention_step(S, z, phi_q[:, t], phi_k[:, t], v[:, t])
    outs.append(out)
A = (phi_q @ phi_k.transpose(1, 2)).tril()
quadratic = A @ v / A.sum(-1, keepdim=True)
print(f"recurrence vs the masked T x T form over {T} positions: max |error| = "
      f"{(torch.stack(outs, 1) - quadratic).abs().max().item():.1e}; state: {S.shape[1:].numel() + z.shape[1]} "
      f"numbers per sequence at every step, the T x T form {T * T} weights")
assert torch.allclose(torch.stack(outs, 1), quadratic, atol=1e-12)

# %% [markdown]
# **3. Order from the causal mask.** The last position of a causal layer without positions sees
# a set, so the order has to be written down somewhere else first, at a position whose mask cuts
# the sequence between A and B. Layer 1 does it at B: its query (from token B) looks for A, its
# value reads "is A". If A came before B, A is visible from B, gets nearly all of B's weight, and
# $h^{(1)}_B \approx 1$; if A comes after, the mask hides it, B's prefix holds no A, and every
# value it averages is 0, so $h^{(1)}_B = 0$ exactly. Layer 2 at the question looks for B (its
# key reads the token part of $u_i$) and reads the record $h^{(1)}$ there; the read-out compares
# it with one half.
#
# Without the concatenated $x_t$ layer 2 could not find B (nothing in $h^{(1)}$ says where B is),
# which is why it reads $[x_t; h^{(1)}_t]$, a residual stream in miniature. Both softmaxes must be
# sharp for $T_{\max}$ positions, as in exercise 1: with $e^\beta = e^4\, T_{\max} \approx 55\, T_{\max}$
# the record at B is above $1 - 1/55$ when A came first, and the other positions' records (none
# above 1) reach layer 2's output with a total weight below $1/54$. The common wrong answers: only layer 2 doing the work
# (its answer cannot change when A and B swap: section 7's check), a record written at A and read
# at B (A, with no query, averages its prefix, and the result depends on where A stands), and a
# fixed sharpness that fails on long sequences.

# %%
def order_layers(T_max: int) -> tuple[Tensor, ...]:
    beta = math.log(T_max) + 4
    W_Q1, W_K1, W_V1 = torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(1, 4)
    W_Q1[0, 2] = beta                              # at B ...
    W_K1[0, 1] = W_V1[0, 1] = 1.0                  # ... look for A, and record whether it was found
    W_Q2, W_K2, W_V2 = torch.zeros(1, 5), torch.zeros(1, 5), torch.zeros(1, 5)
    W_Q2[0, 3] = beta                              # at the question ...
    W_K2[0, 2] = 1.0                               # ... look for B (the token part of u)
    W_V2[0, 4] = 1.0                               # ... and read layer 1's record there
    return W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, torch.tensor([1.0]), -0.5


exercises.check("04.order_from_the_mask", order_layers, must_pass=True)

# %% [markdown]
# The same weights without the causal mask in layer 1 show where the order came from: B then sees
# A wherever it stands, the record is about 1 in both orders, and the answer no longer depends on
# the order. Measured on sequences of length 20, each beside its copy with A and B swapped:

# %%
def order_answers(ids: Tensor, causal: bool) -> Tensor:
    W_Q1, W_K1, W_V1, W_Q2, W_K2, W_V2, w, b = order_layers(ids.shape[1])
    x = F.one_hot(ids, 4).float()
    scores = (x @ W_Q1.T) @ (x @ W_K1.T).transpose(1, 2)
    if causal:
        L = ids.shape[1]
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    u = torch.cat([x, torch.softmax(scores, -1) @ (x @ W_V1.T)], -1)
    alpha = torch.softmax((u[:, -1:] @ W_Q2.T) @ (u @ W_K2.T).transpose(1, 2), -1)   # the question's row
    return ((alpha @ (u @ W_V2.T))[:, 0] @ w + b > 0).long()


g = torch.Generator().manual_seed(1)
L, n = 20, 1000
ids = torch.zeros(n, L, dtype=torch.long)
where = torch.argsort(torch.rand(n, L - 1, generator=g), dim=1)[:, :2]
ids[torch.arange(n), where[:, 0]], ids[torch.arange(n), where[:, 1]] = 1, 2
ids[:, -1] = 3
swapped = torch.where(ids == 1, 2, torch.where(ids == 2, 1, ids))
a_first = (where[:, 0] < where[:, 1]).long()
for causal in (True, False):
    same = (order_answers(ids, causal) == order_answers(swapped, causal)).float().mean().item()
    acc = (order_answers(ids, causal) == a_first).float().mean().item()
    print(f"layer 1 {'causal' if causal else 'not causal'}: accuracy {acc:.1%}; "
          f"same answer after swapping A and B: {same:.1%}")
assert (order_answers(ids, True) == a_first).all()
assert (order_answers(ids, False) == order_answers(swapped, False)).all()

# %% [markdown]
# ## Questions
#
# **1. A late word that re-ranks two earlier ones.** "The trophy did not fit in the suitcase
# because it was too *small*": until the last word, *trophy* and *suitcase* are equally good
# referents for *it*; *small* makes *suitcase* the one that matters (*big* would make it the
# trophy). A GRU's weights keep the proportions fixed once written, so it cannot re-rank the two
# nouns' candidates. It can cope by what the candidates carry: the state after *suitcase* can
# hold features of both nouns in different units (the trophy's in some, the suitcase's in
# others), and the read-out after *small* combines the units differently. The re-ranking is then
# done by the output layer on a state that kept both, which costs units for every pair of things
# that might later matter.
#
# **2. Work and memory.** `FreeWeights` keeps all $t$ candidates at step $t$ and scores each:
# $O(t H)$ work at step $t$, $O(T^2 H)$ for the sequence, and $O(T H)$ memory for the candidates
# ($O(T^2)$ for the weights, if kept for the backward pass), against the GRU's $O(T H^2)$ work and
# $O(H)$ state. It is still a loop of $T$ sequential steps. The parallel layer of step 3 does the
# same $O(T^2 H)$ work for the scores and the weighted sum (plus $O(T H^2)$ for the projections)
# and holds the $T \times T$ weights at once: $O(T^2)$ memory, but one sequential step.
#
# **3. A position-blind bias that expresses recency.** With $b_i = c\, i$ the weights of query $t$
# are $\alpha_{t,i} \propto \exp(s_{t,i} + c\, i)$ over $i \le t$. Dividing numerator and
# denominator by $\exp(c\, t)$ changes nothing (the softmax ignores a constant added to a row),
# so $\alpha_{t,i} \propto \exp(s_{t,i} - c\,(t - i))$: for $c > 0$ every query discounts a key by
# $e^{-c}$ per step back, a geometric decay in $t - i$, the same for every query although $b_i$
# never saw $t$. It is the mask that supplies $t$: the row ends at $i = t$, so "largest $i$
# allowed" means "most recent". Without the mask every row runs to $T$, the bias prefers the
# absolute end of the sequence for every query alike, and no relative preference is left. So "a
# causal model needs no positions" holds in the sense that the mask lets it learn some
# positional information, recency in particular (Haviv et al. 2022); it does not hold in the sense
# of section 7's check: one causal layer's last output is still blind to the order of its prefix.
# Numerically, for a few queries:

# %%
torch.manual_seed(0)
T, c = 8, 0.7
i = torch.arange(T, dtype=torch.float)
s = torch.randn(T, T)                                          # any content scores
for t in (3, 7):
    with_bias = torch.softmax(s[t, : t + 1] + c * i[: t + 1], 0)
    relative = torch.softmax(s[t, : t + 1] - c * (t - i[: t + 1]), 0)
    print(f"query {t}: bias c*i vs decay c*(t - i): max |difference| {(with_bias - relative).abs().max().item():.1e}")
    assert torch.allclose(with_bias, relative, atol=1e-6)

# %% [markdown]
# **4. The order-blindness proof, and two layers.** The last output of one causal layer without
# positions is $h_T = \sum_{i \le T} \alpha_{T,i} W_V x_i$ with
# $\alpha_{T,i} = \exp(q_T^\top W_K x_i) / \sum_{j \le T} \exp(q_T^\top W_K x_j)$ and
# $q_T = W_Q x_T$. Permuting positions $1 \dots T-1$ permutes the terms of both sums and leaves
# $x_T$ in place; sums do not depend on the order of their terms, so $h_T$ does not change. For
# two layers the claim fails: layer 2 at $T$ reads $h^{(1)}_i$, and $h^{(1)}_i$ depends on which
# tokens stand at or before $i$, which a permutation changes. Exercise 3 builds two layers whose
# last output tells whether A came before B, and the check after it shows that the order comes
# from layer 1's mask.
#
# **5. The GRU as $H$ weightings of width 1.** "Head" $u$ is hidden unit $u$. Its weights are
# $w_{t,i} = (1 - z_{i,u}) \prod_{j=i+1}^t z_{j,u}$, and in logarithms
# $\log w_{t,i} = \log(1 - z_{i,u}) - C_{i,u} + C_{t,u}$ with $C_{t,u} = \sum_{j \le t} \log z_{j,u}$.
# So the "key" of position $i$ is $\log(1 - z_{i,u}) - C_{i,u}$ and the "query" of $t$ contributes
# $C_{t,u}$, a constant per row that a softmax would ignore; but the weights are not a softmax:
# they sum to $1 - \prod_{j \le t} z_{j,u}$, the rest belonging to $h_0$. The values are the
# candidates $\tilde h_{i,u}$. The heads cannot run in parallel because the gates $z_i$ and the
# candidates $\tilde h_i$ read $h_{i-1}$, the output of the previous step: the keys and values of
# position $i$ exist only after position $i - 1$ has been computed. Checked on random update
# gates: the form in logarithms gives the products of gates, and the rows sum to $1 - \prod z$.

# %%
torch.manual_seed(0)
T_, H = 6, 3
z = torch.rand(T_, H, dtype=torch.double) * 0.8 + 0.1          # update gates of one sequence
C = torch.log(z).cumsum(0)                                      # C_t = sum_{j <= t} log z_j
key = torch.log(1 - z) - C                                      # per position i and unit u
products = torch.zeros(T_, T_, H, dtype=torch.double)
for t in range(T_):
    for i_ in range(t + 1):
        products[t, i_] = (1 - z[i_]) * z[i_ + 1: t + 1].prod(0)
from_logs = torch.exp(key[None, :, :] + C[:, None, :]) * torch.ones(T_, T_, dtype=torch.double).tril()[:, :, None]
print(f"GRU weights from key_i + C_t vs the products of gates: max |error| = "
      f"{(from_logs - products).abs().max().item():.1e}; rows sum to 1 - prod z: max |error| = "
      f"{(products.sum(1) - (1 - z.cumprod(0))).abs().max().item():.1e}")
assert torch.allclose(from_logs, products, atol=1e-12)
assert torch.allclose(products.sum(1), 1 - z.cumprod(0), atol=1e-12)

# %% [markdown]
# **6. XOR with two heads.** Exercise 1 builds the weights. The bound's argument fails for two
# heads because it used one denominator: with one head the decision is the sign of
# $\sum_i e^{s_i} u_i$, a sum of per-position terms. With two heads the read-out adds
# $\sum_i e^{s_i} u_i / \sum_i e^{s_i}$ and $\sum_i e^{s'_i} u'_i / \sum_i e^{s'_i}$, two ratios
# with different denominators; clearing them multiplies terms of different positions together,
# and the decision is no longer a sum of one term per position. The OR head's output, for one,
# is close to 1 when one or two marked ones are present and 0 otherwise: not additive in the two
# bits.
#
# **7. Linear attention as a recurrence.** Exercise 2 derives and checks it. What came back from
# the GRU: a state of fixed size ($S_t$, $z_t$), updated once per token at constant cost, so
# generation needs no growing cache. What did not: the update is a plain sum with no gates, so
# nothing is ever forgotten and old positions are never down-weighted when written (later models
# add decays or gates to the sum for that reason); the weights are still chosen by the query when
# it reads; and the kernel $\phi(q)^\top \phi(k)$ is not the exponential, so the weights are less
# sharp than a softmax's. Training can still run in parallel over positions (the $T \times T$
# form), which the GRU cannot.
