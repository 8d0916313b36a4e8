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
# # 06 · Solutions: positional encoding
#
# Worked solutions to the coding exercises of chapter 06, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with the package's implementation, which the chapter used.
# Try the exercises in the chapter first.

# %%
import math

import torch
from torch import Tensor

from tfmlib import exercises
from tfmlib.positional import RotaryEmbedding, relative_offset_matrix, sinusoidal_encoding

# %% [markdown]
# ## Coding exercises
#
# **1. The sinusoidal table.** One frequency per *pair* of columns, $\omega_i = 10000^{-2i/d}$:
# `torch.arange(0, d, 2)` lists exactly the $2i$ of the exponent. Slicing with a step of 2
# writes the sines into the even columns and the cosines into the odd ones; for an odd width
# there is one cosine column fewer than there are frequencies, hence `angles[:, : d // 2]`.
# Computing in float64 and rounding at the end keeps the large angles of long tables accurate.

# %%
def sinusoidal_table(length: int, d_model: int) -> Tensor:
    omega = 10_000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)   # (ceil(d/2),)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]       # (L, ceil(d/2))
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()


exercises.check("06.sinusoidal_table", sinusoidal_table, must_pass=True)
for length, d in [(100, 64), (9, 7)]:
    assert torch.equal(sinusoidal_table(length, d), sinusoidal_encoding(length, d)), \
        "the solution must match tfmlib's sinusoidal_encoding"
print("identical to tfmlib.positional.sinusoidal_encoding")

# %% [markdown]
# **2. The offset map.** For pair $i$ and $a = k\,\omega_i$, the angle-addition formulas
# $\sin(x + a) = \cos a \sin x + \sin a \cos x$ and $\cos(x + a) = -\sin a \sin x + \cos a \cos x$
# are the rows of the block $\begin{pmatrix} \cos a & \sin a \\ -\sin a & \cos a \end{pmatrix}$
# acting on $(\sin x, \cos x)$. `torch.block_diag` puts the blocks on the diagonal. A negative
# offset needs nothing special: the angle is negative and the block rotates the other way.

# %%
def offset_matrix(offset: int, d_model: int) -> Tensor:
    omega = 10_000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    blocks = [torch.tensor([[math.cos(offset * w), math.sin(offset * w)],
                            [-math.sin(offset * w), math.cos(offset * w)]], dtype=torch.float64)
              for w in omega.tolist()]
    return torch.block_diag(*blocks)


exercises.check("06.offset_matrix", offset_matrix, must_pass=True)
table = sinusoidal_table(300, 16).double()
for k in (1, 7, 50, -20):
    lo = max(0, -k)
    err = (table[lo:lo + 200] @ offset_matrix(k, 16).T - table[lo + k:lo + k + 200]).abs().max().item()
    gap = (offset_matrix(k, 16) - relative_offset_matrix(k, 16)).abs().max().item()
    print(f"k = {k:4d}: max |M_k PE[p] - PE[p+k]| over 200 positions = {err:.1e}; "
          f"max |solution - tfmlib| = {gap:.1e}")
    assert err < 1e-6 and gap < 1e-12

# %% [markdown]
# The solution and the package's `relative_offset_matrix` agree to float64 rounding (the printed
# gaps); both keep the angles $k\,\omega_i$ in float64, so the matrix stays exact for large $|k|$.
#
# **3. Rotary rotation in the paper's layout.** The even features are the first coordinates of
# the pairs and the odd ones the second; rotate each pair, then interleave the results again by
# stacking them on a new last axis and flattening it: `(..., d/2, 2)` becomes `(..., d)` in the
# order $x'_0, x'_1, x'_2, \dots$.

# %%
def rotate_pairs(x: Tensor, positions: Tensor) -> Tensor:
    d = x.shape[-1]
    theta = 10_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * theta[None, :]                      # (L, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]                                           # the pairs (x_2i, x_2i+1)
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


exercises.check("06.rotate_pairs", rotate_pairs, must_pass=True)

# %% [markdown]
# Two checks. The property that matters, $\langle R_p q, R_s k\rangle = \langle q, R_{s-p}
# k\rangle$: the score depends on the offset $s - p$ only. And the link with the package, whose
# `RotaryEmbedding` pairs feature $i$ with feature $i + d/2$: reorder the features so that the
# paper's pairs land in the package's places, rotate with the package, and reorder back.

# %%
torch.manual_seed(0)
d = 16
q, k = torch.randn(d, dtype=torch.double), torch.randn(d, dtype=torch.double)
for p, s in [(0, 5), (10, 15), (37, 42), (9, 2), (16, 9)]:
    score = rotate_pairs(q[None], torch.tensor([p])) @ rotate_pairs(k[None], torch.tensor([s])).T
    relative = q[None] @ rotate_pairs(k[None], torch.tensor([s - p])).T
    print(f"p = {p:2d}, s = {s:2d} (offset {s - p:+d}): <R_p q, R_s k> = {score.item():+.6f}, "
          f"<q, R_(s-p) k> = {relative.item():+.6f}")
    assert torch.allclose(score, relative)

x, positions = torch.randn(3, 6, d, dtype=torch.double), torch.tensor([0, 4, 1, 9, 25, 3])
halves = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)          # paper's pair i -> features (i, i + d/2)
rotated = RotaryEmbedding(d).double().rotate(halves, positions)
back = torch.stack([rotated[..., : d // 2], rotated[..., d // 2:]], dim=-1).flatten(-2)
print(f"max |package (reordered) - solution| = {(back - rotate_pairs(x, positions)).abs().max().item():.1e}")
assert torch.allclose(back, rotate_pairs(x, positions)), "the two layouts must agree up to the reordering"
