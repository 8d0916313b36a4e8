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
# # 08 · Solutions: training the Transformer to translate
#
# Worked solutions to the coding exercises of chapter 08, each followed by its checker with
# `must_pass=True`, so this notebook fails loudly if a solution (or a checker) breaks. Each
# solution is also compared with what the package (or PyTorch) computes. Try the exercises in
# the chapter first.

# %%
import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.data import PAD_ID
from tfmlib.train import transformer_peak_lr, warmup_inverse_sqrt

# %% [markdown]
# ## Coding exercises
#
# **1. The other label smoothing.** Expand $-\sum_k q_k \log p_k$ with the exercise's $q$:
# it is $(1 - \varepsilon)$ times the plain negative log-likelihood $-\log p_y$ plus
# $\varepsilon$ times the mean of $-\log p_k$ over the $V - 2$ tokens that are neither the
# reference nor `<pad>`. That sum is the sum over the whole vocabulary minus the reference's
# and padding's terms; no $(B, T, V)$ target tensor is needed. The average runs over the real
# tokens only: select them with the mask *before* averaging (multiplying the loss by the mask and
# dividing by the number of all positions would shrink it).

# %%
def smoothed_loss(logits: Tensor, targets: Tensor, eps: float) -> Tensor:
    V = logits.shape[-1]
    log_p = F.log_softmax(logits, dim=-1)                            # (B, T, V)
    nll = -log_p.gather(-1, targets[..., None]).squeeze(-1)           # (B, T): -log p(reference)
    others = (-log_p.sum(dim=-1) - nll + log_p[..., PAD_ID]) / (V - 2)  # mean over the V - 2 others
    per_token = (1 - eps) * nll + eps * others
    return per_token[targets != PAD_ID].mean()


exercises.check("08.smoothed_loss", smoothed_loss, must_pass=True)

# %% [markdown]
# Against the explicit target: building $q$ as a `(B, T, V)` tensor gives the same loss. Without
# smoothing it is `F.cross_entropy`; with it, it differs a little from PyTorch's convention
# ($\varepsilon / V$ to every token), less so the larger $V$ is:

# %%
torch.manual_seed(0)
gap = {}                                   # (V, eps) -> |solution - PyTorch's convention|
for V in (30, 400):
    logits, targets = torch.randn(4, 6, V, dtype=torch.double), torch.randint(1, V, (4, 6))
    targets[2, 4:] = PAD_ID
    real = targets != PAD_ID
    for eps in (0.0, 0.1, 0.3):
        q = torch.full((4, 6, V), eps / (V - 2), dtype=torch.double)
        q[..., PAD_ID] = 0.0
        q.scatter_(-1, targets[..., None], 1 - eps)
        explicit = (-(q * F.log_softmax(logits, -1)).sum(-1))[real].mean()
        mine = smoothed_loss(logits, targets, eps)
        pytorch = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD_ID, label_smoothing=eps)
        print(f"V = {V:3d}, eps = {eps}: solution {mine.item():.6f}, explicit q {explicit.item():.6f}, "
              f"PyTorch's convention {pytorch.item():.6f}")
        assert torch.allclose(mine, explicit), "the solution must be -sum_k q_k log p_k with the exercise's q"
        if eps == 0.0:
            assert torch.allclose(mine, pytorch), "without smoothing both are the plain cross-entropy"
        gap[V, eps] = abs(mine.item() - pytorch.item())
for eps in (0.1, 0.3):
    assert gap[400, eps] < gap[30, eps], "the two conventions should differ less on a larger vocabulary"

# %% [markdown]
# **2. The paper's learning rate.** Eq. (3) as written: the smaller of the rising branch
# $s \cdot w^{-1.5}$ and the falling branch $s^{-0.5}$, times $d_{\text{model}}^{-0.5}$. The two
# branches meet at $s = w$.

# %%
def transformer_lr(step: int, d_model: int, warmup: int) -> float:
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


exercises.check("08.transformer_lr", transformer_lr, must_pass=True)

# %% [markdown]
# The package writes the same schedule as a peak times a shape that peaks at 1; the shape is
# called with the number of steps already taken, so step $s$ is `factor(s - 1)`:

# %%
for d_model, warmup in [(512, 4000), (128, 100)]:
    factor, peak = warmup_inverse_sqrt(warmup), transformer_peak_lr(d_model, warmup)
    for s in (1, warmup // 2, warmup, 10 * warmup):
        assert abs(peak * factor(s - 1) - transformer_lr(s, d_model, warmup)) < 1e-15
    print(f"d_model={d_model}, warmup={warmup}: peak {transformer_lr(warmup, d_model, warmup):.3e} at step "
          f"{warmup}, equal to tfmlib's peak {peak:.3e}")

# %% [markdown]
# **3. One step of beam search.** Add each prefix's score to its $V$ extensions, flatten the
# $K \cdot V$ candidates of a sentence into one row, and take the top $K$. A flat index $j$
# came from prefix $j \,/\!/\, V$ and adds token $j \bmod V$. Taking the best token of each
# prefix instead would be wrong: the $K$ best extensions may all come from one prefix.

# %%
def beam_step(beam_scores: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    B, K, V = log_probs.shape
    candidates = (beam_scores[:, :, None] + log_probs).reshape(B, K * V)
    scores, index = candidates.topk(K, dim=1)                        # sorted, best first
    return scores, index // V, index % V


exercises.check("08.beam_step", beam_step, must_pass=True)

# %% [markdown]
# At the first step of a search only one prefix per sentence is live (the others are at
# $-\infty$), so all $K$ extensions come from it, as they should:

# %%
torch.manual_seed(1)
log_probs = torch.log_softmax(torch.randn(2, 3, 6), dim=-1)
beam_scores = torch.tensor([[0.0, float("-inf"), float("-inf")]] * 2)
scores, beams, tokens = beam_step(beam_scores, log_probs)
print("prefixes extended:", beams.tolist(), "\ntokens added:     ", tokens.tolist())
assert (beams == 0).all() and torch.equal(tokens, log_probs[:, 0].topk(3).indices)

# %% [markdown]
# ## Questions
#
# **1. The perplexity floor of a smoothed model.** A model that puts exactly $q$ on every token
# gives the reference $q_y = 1 - \varepsilon + \varepsilon/V$, so its perplexity (measured
# against the reference, not against $q$) is $1/q_y$. With the chapter's data and target
# vocabulary:

# %%
import math  # noqa: E402

from tfmlib.corpora import load_corpus  # noqa: E402
from tfmlib.data import build_vocabs  # noqa: E402

_, tgt_vocab = build_vocabs(load_corpus("synthetic")["train"][:50_000])   # the chapter's cpu run
V, eps = len(tgt_vocab), 0.1
q_ref = 1 - eps + eps / V
q_row = torch.full((1, V), eps / V)
q_row[0, 7] = q_ref                                            # any reference token: 7 here
floor = math.exp(F.cross_entropy(q_row.log(), torch.tensor([7])).item())  # perplexity vs the reference
print(f"V = {V}: q_y = {q_ref:.5f}; a model that outputs q exactly has test perplexity 1/q_y = {floor:.4f}")
assert abs(floor - 1 / q_ref) < 1e-6, "perplexity of outputting q is 1/q_y"

# %% [markdown]
# About 1.11, the floor of any model that has learned the smoothed target exactly. The smoothed
# model of section 4 measured 1.930 over all test tokens: far above the floor, because it is
# not perfect (it is wrong or unsure on many tokens after 385 steps). On the 74% of tokens both
# models were sure of, it measured 1.183, close to the floor, with a median $p(\text{ref})$ of
# 0.886 against the $q_y \approx 0.900$ the smoothed loss aims at; the plain model reached 1.065
# there, *below* the smoothed floor, which no smoothed model can do on average.
#
# **2. Worse probabilities, same argmax.** Perplexity scores the probability given to the
# reference; accuracy and greedy decoding only ask which token is largest. Smoothing caps the
# reference's probability near $q_y$ (section 4's median 0.886 against 0.984 without smoothing):
# on every token the model is sure of it loses a little log-probability, which raised perplexity
# (1.183 against 1.065 on those tokens), but 0.886 is still far above every other token's share,
# so the argmax is unchanged. Here accuracy even rose (+1.2 points) and BLEU too (+6.8 on 400
# sentences), as in Vaswani et al. (2017, §5.4: "hurts perplexity ... but improves accuracy and
# BLEU"); but with seeds 1 and 2 (rerun outside the notebooks, section 4) the differences were
# -1.3 and +0.1 points of accuracy and -0.7 and +3.4 BLEU, so the sign of the gain is not
# established at this budget.
# Smoothing can hurt BLEU when $\varepsilon$ is so large that the capped reference comes close to
# the runner-up alternatives, so argmax and beam choices flip; and when decoding uses the
# probabilities themselves rather than the argmax: beam search sums log-probabilities over a
# sentence, and a flatter distribution at every step (including at `<eos>`) changes which whole
# hypotheses win; sampling draws wrong tokens from the $\varepsilon$ mass; and a smoothed teacher
# is a worse teacher for distillation (Müller et al. 2019, §4).
#
# **3. What a longer warm-up changes.** For $s > w$, eq. (3) is $d^{-0.5} s^{-0.5}$, the same
# curve for every $w$. A longer warm-up changes the first $w$ steps: the rise is slower and the
# peak, $d^{-0.5} w^{-0.5}$, is *lower* and later, so the optimiser spends more steps at small
# rates while Adam's second-moment estimate fills (question 4). (The package instead fixes the
# peak and scales the shape, so there a longer $w$ also raises the tail, $\text{peak} \cdot
# \sqrt{w/s}$.) The retraining is not run here: each run of the chapter's Transformer takes as long
# as its time budget (197.5 s in the chapter's cpu run). What to expect is measured in chapter 07
# (section 9's stability run, a 12-layer model at $d = 64$): post-LN without warm-up ended at
# 4.53, 4.82, 4.54 nats per token over its last 10 steps (three seeds), close to the 4.83 of
# predicting word frequencies only, against 3.10, 3.06, 3.16 with a 50-step warm-up, while pre-LN
# without warm-up reached 2.97, 2.92, 2.98. So post-LN at the chapter's peak of $3 \cdot 10^{-3}$
# from step 1 should stall or train much worse, and post-LN with the warm-up should train. Why:
# in post-LN the gradients at initialisation are largest near the output (Xiong et al. 2020,
# §3.3), and Adam's first updates move every parameter by about the learning rate whatever its
# gradient (chapter 07, question 7), so a full learning rate at step 1 makes large updates exactly where
# they do most damage; pre-LN's gradients are smaller and even across layers, and it trains
# without warm-up (their §4).
#
# **4. How long Adam's second moment averages.** $v_s = \beta_2 v_{s-1} + (1 - \beta_2) g_s^2$
# weights the gradient of $k$ steps ago by $(1 - \beta_2)\beta_2^k$: a time scale of $1/(1 -
# \beta_2)$ steps. Computed:

# %%
for beta2 in (0.999, 0.98):
    window = 1 / (1 - beta2)
    recent = 1 - beta2 ** round(window)
    print(f"beta2 = {beta2}: time scale 1/(1 - beta2) = {window:,.0f} steps; the last {window:,.0f} steps "
          f"carry {recent:.1%} of the weight; after 385 steps the oldest gradient still weighs "
          f"{beta2 ** 384:.2f} of the newest")
assert abs(1 - 0.999 ** 1000 - (1 - 1 / math.e)) < 1e-3, "the window holds 1 - 1/e of the weight"

# %% [markdown]
# About 1,000 steps with $\beta_2 = 0.999$, holding $1 - 1/e$ (63.2%) of the weight. The
# chapter's Transformer trained for 385 steps in all: with $\beta_2 = 0.999$, the bias-corrected
# $\hat v$ would be close to a plain average of *every* gradient since step 1 (the first one
# still weighs 0.68 of the newest at step 385), while with the paper's 0.98 it forgets within
# about 50 steps. At the start of training the gradients change fast (the loss falls from near
# $\ln V$ in a few hundred steps, and post-LN's early gradients are large): $\hat v$ then lags
# behind their real size, too large after the early large gradients (steps too small) or too
# small where gradients grow (steps too large); and in the first steps it is an average of very
# few squares, the unreliable estimate of chapter 07's question 7 (Liu et al. 2020, §3).
#
# **5. Equal seconds, steps, parameters or FLOPs.** *Same steps* (and batch size) gives every
# model the same data, but ignores that a step of RNNsearch cost 934 ms and one of the
# Transformer 513 ms here; it is the comparison of sample efficiency, and it changes the
# winner early on: after the same 150 steps the chapter printed RNNsearch 24.4, Transformer 14.5
# BLEU. *Same parameters* compares architectures at equal memory and storage (the Transformer
# had 751,242 against about 1.37 million), but parameters are not cost: a GRU applies its
# weights once per position sequentially, attention costs grow with $T^2$ and use no
# parameters. *Same FLOPs* measures arithmetic independently of the hardware, but ignores how
# well that arithmetic runs: sequential small matrix products (the GRUs) use a GPU poorly,
# large batched ones (the Transformer) well, and memory traffic is not counted. *Same seconds*
# is what a user pays, but it depends on the machine, the implementation and the load. On a GPU
# only the equal-seconds comparison would change (steps, parameters and FLOPs do not depend on
# the device): the Transformer processes all target positions of a sentence in parallel while
# the GRUs still run position by position, so in the same seconds its lead in steps (385
# against 190 and 325 here) should grow.
#
# **6. One live prefix at the start.** At step 0 every prefix is `<bos>` alone. If all $K$
# were live with the same score, each extension would appear $K$ times among the $K \cdot V$
# candidates, and the top $K$ would be $K$ copies of the single best extension; the copies then
# stay identical at every later step, so the beam is $K$ copies of greedy decoding and returns
# greedy's output. With `beam_step` from the exercises:

# %%
torch.manual_seed(0)
same_log_probs = torch.log_softmax(torch.randn(1, 1, 6), dim=-1).expand(1, 3, 6)  # 3 identical prefixes
scores, beams, tokens = beam_step(torch.zeros(1, 3), same_log_probs)
print(f"three identical live prefixes: tokens added {tokens.tolist()}, greedy's token "
      f"{same_log_probs[0, 0].argmax().item()}")
assert (tokens == same_log_probs[0, 0].argmax()).all(), "identical prefixes all take the greedy token"

# %% [markdown]
# Setting the other $K - 1$ scores to $-\infty$ (as the chapter's beam search does and the
# exercise's last cell shows) makes the first step pick the $K$ best *different* first tokens.
#
# **7. A table on which wider beams lose to greedy.** The chapter's table loses only at $K = 2$.
# For every $K$ from 2 to 10: make greedy's first token `a` win at step 1 (0.19) against nine
# tokens `b1`..`b9` (0.09 each), give `a` no continuation above 0.22 (so `a x` has 0.0418),
# and give each `b` two continuations of 0.5 (prefixes of 0.045, above `a x`) that lead nowhere
# good (at most 0.5 to end). A beam of $K$ keeps `a` and $K - 1$ of the `b`s at step 1; at step 2
# those $K - 1$ `b`s have $2(K - 1) \ge K$ children, all better than any `a` prefix, so `a x` is
# pruned, and the beam ends with a `b` output of $0.045 \times 0.5 = 0.0225$, below greedy's
# 0.0418. The argument holds while $K \le 18$, the number of `b` children (we run 2 to 10; the
# table also defeats 17 and 18 but not 19, where `a x` survives step 2); more `b`s extend it.

# %%
from tfmlib.data import EOS_ID  # noqa: E402
from tfmlib.decoding import beam_search, greedy_decode, sequence_log_probs  # noqa: E402
from tfmlib.seq2seq import EncoderDecoder, EncoderOutput, StepOutput  # noqa: E402

A, X, OTHERS = 4, 5, [6, 7, 8, 9]            # a, its best continuation x, and four runners-up
BS, C, D = list(range(10, 19)), 19, 20         # b1..b9, and the two continuations of every b
NAMES = {A: "a", X: "x", C: "c", D: "d", EOS_ID: "<eos>"} | {b: f"b{i + 1}" for i, b in enumerate(BS)}
TABLE = {(): {A: 0.19} | {b: 0.09 for b in BS},
         (A,): {X: 0.22} | {o: 0.195 for o in OTHERS},
         (A, X): {EOS_ID: 1.0}} | {(b,): {C: 0.5, D: 0.5} for b in BS}
OTHERWISE = {EOS_ID: 0.5, C: 0.25, D: 0.25}


class TableModel(EncoderDecoder):
    """Next-token probabilities looked up from the prefix written so far (the source plays no role)."""

    max_source_len, vocab_size = 10, 21

    def encode(self, src: Tensor, src_mask: Tensor) -> EncoderOutput:
        return EncoderOutput(src[..., None].float(), src_mask, src.new_zeros((src.shape[0], 0)))

    def decode_step(self, prev: Tensor, state: Tensor, enc: EncoderOutput) -> StepOutput:
        prefix = torch.cat([state, prev[:, None]], dim=1)                  # <bos> and the tokens so far
        logits = torch.full((prev.shape[0], self.vocab_size), -1e9)
        for i, row in enumerate(prefix[:, 1:].tolist()):
            for token, p in TABLE.get(tuple(row), OTHERWISE).items():
                logits[i, token] = math.log(p)
        return StepOutput(logits, prefix)


table_model = TableModel()
src, src_mask = torch.tensor([[7, EOS_ID]]), torch.ones(1, 2, dtype=torch.bool)
greedy_out = greedy_decode(table_model, src, src_mask, max_len=6)
greedy_p = math.exp(float(sequence_log_probs(table_model, src, src_mask, greedy_out.tokens, greedy_out.lengths)[0]))
print(f"greedy  : {' '.join(NAMES[t] for t in greedy_out.tokens[0].tolist()):12s} probability {greedy_p:.4f}")
beam_p = {}
for K in range(2, 11):
    out = beam_search(table_model, src, src_mask, beam_size=K, alpha=0.0, max_len=6)
    beam_p[K] = math.exp(float(out.scores[0]))
    print(f"beam {K:2d} : {' '.join(NAMES[t] for t in out.tokens[0].tolist()):12s} probability {beam_p[K]:.4f}")
assert all(p < greedy_p for p in beam_p.values()), "every beam from 2 to 10 should lose to greedy here"

# %% [markdown]
# Every beam from 2 to 10 returns a `b` output at 0.0225 (which `b` and which of `c`/`d` is a
# tie, broken by index), less probable than greedy's `a x <eos>` at 0.0418. Beam search prunes
# by the probability of prefixes; a table that puts many good-looking prefixes beside greedy's
# path, all with poor continuations, defeats any beam narrower than their number.
#
# **8. The empty output.** The model score is $\log p(y \mid x) = \sum_t \log p(y_t \mid
# y_{<t}, x)$, a sum of negative terms, one per token. The empty output has one term,
# $\log p(\texttt{<eos>} \mid \texttt{<bos>}, x)$; a full translation of 15 tokens has 16, and
# even if each is $\log 0.9$ their sum is $16 \log 0.9 = -1.69$, which loses to an empty output
# as soon as $p(\texttt{<eos>})$ at the first step exceeds $0.9^{16} \approx 0.19$. The number of
# terms (the length) is what favours it. With $\mathrm{lp}(y) = ((5 + |y|)/6)^\alpha$ (Wu et al.
# 2016, §7; $|y|$ counts `<eos>`), the score is $\log p(y \mid x)/\mathrm{lp}(y)$: the empty output
# has $|y| = 1$ and $\mathrm{lp} = 1$, its score unchanged, while a 16-token output's
# log-probability is divided by $(21/6)^{0.6} \approx 2.12$ at the paper's $\alpha = 0.6$; the
# full translation now wins unless $p(\texttt{<eos>})$ exceeds $e^{-1.69/2.12} \approx 0.45$.
# The penalty shrinks the advantage of short outputs, but it is a fixed correction: it does not
# remove the model's error of giving the empty output real probability (Stahlberg and Byrne
# 2019), it only hides it from a search that is not exact.
#
# **9. The cost of decoding without a cache.** At step $t$ the decoder re-runs all $t$ prefix
# positions through every layer: the projections and feed-forward networks cost $O(t\, d^2)$,
# self-attention $O(t^2 d)$ and cross-attention $O(t\, S\, d)$ per layer. Summed over $t = 1 ..
# L$: $O(L^2 d^2 + L^3 d + L^2 S d)$ per sentence, quadratic in $L$ for the matrix products and
# cubic for self-attention, against $O(L\, d^2 + L^2 d)$ for computing each position once. What
# can be kept: because of the causal mask, earlier positions' outputs at every layer do not
# change when a token is added, so each layer's self-attention keys and values for the prefix
# can be cached and only the new position computed (chapter 09's KV cache), and cross-attention's
# keys and values from the encoder output can be computed once per sentence. Then step $t$
# costs $O(d^2 + t\, d + S\, d)$ per layer, and the whole translation $O(L\, d^2 + L^2 d + L S d)$.
