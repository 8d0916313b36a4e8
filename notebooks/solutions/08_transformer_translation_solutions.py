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
# Worked solutions to the coding exercises of chapter 08, each with the reasoning behind it and the
# wrong answers its checker names, followed by the checker with `must_pass=True`, so this notebook
# fails loudly if a solution (or a checker) breaks. Then an experiment that uses exercises 2 and 3
# on two freshly trained Transformers, and an answer to every question; the answers quote the
# chapter's numbers by reading its committed run (`chapter_printed` below), never by copying them.
# Try the exercises in the chapter first.

# %%
import copy
import json
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from tfmlib import exercises
from tfmlib.config import setup
from tfmlib.corpora import load_corpus
from tfmlib.data import PAD_ID, TranslationDataset, build_vocabs, make_loader
from tfmlib.decoding import evaluate_translator
from tfmlib.seeds import over_seeds
from tfmlib.seq2seq import train_translator
from tfmlib.transformer import Transformer

run = setup(seed=0,
            smoke=dict(train_pairs=3_000, test_pairs=100, steps=40, snapshot_every=5, snapshots=4, warmup=30,
                       transformer=dict(d_model=32, heads=4, encoder_layers=2, decoder_layers=2, d_ff=64),
                       post_ln=dict(steps=30, seeds=[0], test_pairs=50)),
            cpu=dict(train_pairs=50_000, test_pairs=500, steps=200, snapshot_every=20, snapshots=4, warmup=100,
                     transformer=dict(d_model=128, heads=4, encoder_layers=2, decoder_layers=2, d_ff=256),
                     post_ln=dict(steps=385, seeds=[0, 1, 2], test_pairs=2_500)),
            gpu=dict(train_pairs=50_000, test_pairs=500, steps=200, snapshot_every=20, snapshots=4, warmup=100,
                     transformer=dict(d_model=128, heads=4, encoder_layers=2, decoder_layers=2, d_ff=256),
                     post_ln=dict(steps=385, seeds=[0, 1, 2, 3, 4], test_pairs=2_500)))

def chapter_printed(notebook: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in the first printed line of the committed ``notebook`` that matches:
    how these answers quote the chapter's numbers (its cpu run), so they follow each refresh."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):  # the checkout: notebooks/ beside tfmlib/ (not a build's copies)
        path = folder / "notebooks" / notebook
        if (folder / "tfmlib").is_dir() and path.exists():
            break
    else:
        raise FileNotFoundError(f"notebooks/{notebook} of the checkout not found above {here}")
    for cell in json.loads(path.read_text())["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            for line in "".join(output.get("text", "")).splitlines():
                if found := re.search(pattern, line):
                    return found.groups()
    raise LookupError(f"no printed line of {notebook} matches {pattern!r}")


CH08 = "08_transformer_translation.ipynb"

# %% [markdown]
# ## Coding exercises
#
# **1. The other label smoothing.** Expand $-\sum_k q_k \log p_k$ with the exercise's $q$:
# it is $(1 - \varepsilon)$ times the plain negative log-likelihood $-\log p_y$ plus
# $\varepsilon$ times the mean of $-\log p_k$ over the $V - 2$ tokens that are neither the
# reference nor `<pad>`. That sum is the sum over the whole vocabulary minus the reference's
# and padding's terms; no $(B, T, V)$ target tensor is needed. The average runs over the real
# tokens only: select them with the mask *before* averaging (multiplying the loss by the mask and
# dividing by the number of all positions would shrink it). Take the log-probabilities from
# `F.log_softmax`, not `torch.log(torch.softmax(...))`: the smoothing term reads every token's
# log-probability, the tiny ones included, and a probability below about $10^{-45}$ is 0 in float32,
# its log $-\infty$ (the cell after the solution measures it). The checker names the conventions
# that come close: PyTorch's ($\varepsilon / V$ to every token, padding included), fairseq's
# ($\varepsilon / (V - 1)$ to every token but the reference), and the Annotated Transformer's
# `KLDivLoss`, which is $\mathrm{KL}(q \,\|\, p)$: our loss minus the entropy of $q$, a constant, so
# it has the same gradients but not the same value.

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

# logits spread as a trained model's are, in float32: log(softmax) underflows, log_softmax does not
logits, targets = torch.randn(2, 3, 9) * 60, torch.randint(1, 9, (2, 3))
log_of_softmax = torch.log(torch.softmax(logits, -1))
q = torch.full_like(logits, 0.1 / 7)
q[..., PAD_ID] = 0.0
q.scatter_(-1, targets[..., None], 0.9)
naive = (-(q * log_of_softmax).sum(-1)).mean()
print(f"logits up to {logits.abs().max().item():.0f} in float32: {int(torch.isinf(log_of_softmax).sum())} of "
      f"{log_of_softmax.numel()} log(softmax) entries are -inf; with them the loss is {naive.item()}, with "
      f"log_softmax {smoothed_loss(logits, targets, 0.1).item():.4f} (float64: "
      f"{smoothed_loss(logits.double(), targets, 0.1).item():.4f})")
assert not torch.isfinite(naive) and torch.isfinite(smoothed_loss(logits, targets, 0.1))

# %% [markdown]
# **2. Averaging the last checkpoints.** Three decisions make the average right. *Which*
# snapshots: the list runs oldest first, so the last $n$ are `snapshots[-n:]`; the first $n$ are
# the early, poor weights, and an off-by-one slice silently averages $n - 1$. *How*: every
# snapshot weighs $1/n$; folding them in pairwise, $(\text{avg} + \text{next})/2$, is an
# exponential average that gives the newest half the weight. *In what*: a float16 state dict
# summed in float16 overflows at 65,504 (large embeddings and LayerNorm gains get there), so each
# tensor is summed in float64 and cast back to its dtype, and integer tensors are counters, whose
# average means nothing (and whose integer division would be wrong anyway): they come from the
# newest snapshot. Finally the result is made of new tensors: starting the sum from the newest
# state dict's own tensors would change the caller's checkpoint in place (and, with
# `model.state_dict()`, the model itself).

# %%
def average_checkpoints(snapshots: list[dict[str, Tensor]], n: int) -> dict[str, Tensor]:
    if not 1 <= n <= len(snapshots):
        raise ValueError(f"average_checkpoints: n must be between 1 and {len(snapshots)} (the number of "
                         f"snapshots), got {n}")
    last = snapshots[-n:]
    averaged = {}
    for name, newest in last[-1].items():
        if newest.is_floating_point():
            total = sum(s[name].to(torch.float64) for s in last)        # no float16 overflow
            averaged[name] = (total / n).to(newest.dtype)
        else:
            averaged[name] = newest.clone()                             # a counter: the newest value
    return averaged


exercises.check("08.average_checkpoints", average_checkpoints, must_pass=True)

# %% [markdown]
# **3. The expected calibration error.** The confidence is the probability of the model's *own*
# prediction, its most probable token, and "right" means that prediction is the target; using the
# reference's probability instead mixes calibration with accuracy (it is what section 4's
# $p(\text{ref})$ measures). Each bin's gap is weighted by its share of the $N$ predictions: a
# plain mean over bins would let a bin of two examples count as much as one of two thousand. The
# gap is absolute, so over- and under-confident bins cannot cancel. The bins are closed on the
# right, $(b/\text{bins}, (b+1)/\text{bins}]$, so a confidence of exactly 1.0 falls in the last bin
# and one of exactly 0.5 (with 2 or 4 bins) in the bin that ends there; `floor(c * bins)` would put
# it in the bin above.

# %%
def calibration_error(probs: Tensor, targets: Tensor, bins: int) -> float:
    confidence, prediction = probs.max(dim=-1)                          # (N,), (N,)
    correct = (prediction == targets).double()
    index = (torch.ceil(confidence * bins).long() - 1).clamp(0, bins - 1)   # bin b: (b/bins, (b+1)/bins]
    ece = 0.0
    for b in range(bins):
        inside = index == b
        if inside.any():
            gap = (correct[inside].mean() - confidence[inside].double().mean()).abs()
            ece += inside.double().mean().item() * gap.item()          # weight: the bin's share of N
    return ece


exercises.check("08.calibration_error", calibration_error, must_pass=True)

# %% [markdown]
# ## An experiment: calibration, label smoothing and checkpoint averaging
#
# Müller et al. (2019, §3) found that label smoothing makes a translation Transformer better
# calibrated, and Vaswani et al. averaged checkpoints to translate. We train the chapter's
# Transformer (the same data, sizes, schedule and optimiser as section 3, for `run.steps` steps)
# twice, with $\varepsilon = 0.1$ and without smoothing, keep a snapshot of the weights every
# `run.snapshot_every` steps, and measure on the first test pairs, teacher-forced: the
# expected calibration error over 15 bins (Guo et al.'s choice), the accuracy of the most
# probable token, the mean confidence and the perplexity, for the last weights and for the
# average of the last `run.snapshots` snapshots.

# %%
corpus = load_corpus("synthetic")
train_pairs, test_pairs = corpus["train"][: run.train_pairs], corpus["test"][: run.test_pairs]
src_vocab, tgt_vocab = build_vocabs(train_pairs)
train_data = TranslationDataset(train_pairs, src_vocab, tgt_vocab)
max_source_len = max(len(src) for src, _ in train_data.examples) + 21          # as in the chapter


@torch.no_grad()
def teacher_forced(model: Transformer) -> tuple[Tensor, Tensor]:
    """Next-token probabilities (N, V) at every real target position of the test pairs, and the targets."""
    model.eval()
    probs, targets = [], []
    for batch in make_loader(TranslationDataset(test_pairs, src_vocab, tgt_vocab), 128, shuffle=False):
        logits = model(batch.src, batch.src_mask, batch.tgt_in).float()
        probs.append(torch.softmax(logits, -1)[batch.tgt_mask])
        targets.append(batch.tgt_out[batch.tgt_mask])
    return torch.cat(probs), torch.cat(targets)


def measure(model: Transformer) -> dict[str, float]:
    probs, targets = teacher_forced(model)
    return dict(ece=calibration_error(probs, targets, 15),
                accuracy=(probs.argmax(-1) == targets).double().mean().item(),
                confidence=probs.max(-1).values.double().mean().item(),
                perplexity=math.exp(-probs.gather(1, targets[:, None]).log().mean().item()))


rows = {}
for eps in (0.1, 0.0):
    torch.manual_seed(run.seed)
    model = Transformer(len(src_vocab), len(tgt_vocab), **run.transformer, dropout=0.0, norm_first=True,
                        max_len=2 * max_source_len + 10)
    snapshots = []

    def snapshot(m: torch.nn.Module, snapshots: list = snapshots) -> dict[str, float]:
        snapshots.append(copy.deepcopy(m.state_dict()))
        return {}
    train_translator(model, train_data, epochs=1_000, max_steps=run.steps, batch_size=64, lr=3e-3,
                     warmup_steps=run.warmup, betas=(0.9, 0.98), adam_eps=1e-9, label_smoothing=eps,
                     eval_fn=snapshot, eval_every=run.snapshot_every, device="cpu", seed=run.seed,
                     desc=f"eps = {eps}", verbose=False)
    rows[f"eps = {eps}, last weights"] = measure(model)
    model.load_state_dict(average_checkpoints(snapshots, run.snapshots))
    rows[f"eps = {eps}, average of last {run.snapshots}"] = measure(model)

print(f"{run.steps} steps, snapshots every {run.snapshot_every}; {len(test_pairs)} test pairs, teacher-forced")
print(f"{'':32s} {'ECE':>7s} {'accuracy':>9s} {'confidence':>11s} {'perplexity':>11s}")
for name, r in rows.items():
    print(f"{name:32s} {r['ece']:7.4f} {r['accuracy']:9.2%} {r['confidence']:11.2%} {r['perplexity']:11.3f}")
smoothed, plain = rows["eps = 0.1, last weights"], rows["eps = 0.0, last weights"]
gap = lambda r: r["confidence"] - r["accuracy"]   # noqa: E731  (positive: over-confident)
print(f"without smoothing the model is {'over' if gap(plain) > 0 else 'under'}-confident by "
      f"{abs(gap(plain)):.1%} on average, with smoothing {'over' if gap(smoothed) > 0 else 'under'}-confident "
      f"by {abs(gap(smoothed)):.1%}; smoothing {'lowers' if smoothed['ece'] < plain['ece'] else 'raises'} "
      f"the ECE from {plain['ece']:.4f} to {smoothed['ece']:.4f}")
for eps in (0.1, 0.0):
    last, avg = rows[f"eps = {eps}, last weights"], rows[f"eps = {eps}, average of last {run.snapshots}"]
    print(f"eps = {eps}: averaging {'lowers' if avg['perplexity'] < last['perplexity'] else 'raises'} the "
          f"perplexity ({last['perplexity']:.3f} -> {avg['perplexity']:.3f}) and "
          f"{'lowers' if avg['ece'] < last['ece'] else 'raises'} the ECE ({last['ece']:.4f} -> {avg['ece']:.4f})")
assert all(0 <= r["ece"] <= 1 and math.isfinite(r["perplexity"]) for r in rows.values())

# %% [markdown]
# Read the lines under the table: they are computed from it. What the two measures say is
# different. The mean confidence against the accuracy is the *overall* bias; the ECE adds up the
# bias bin by bin, so a model can be right on average and still miscalibrated within bins.
# Smoothing pulls every confident prediction towards $1 - \varepsilon + \varepsilon/V$, which
# removes over-confidence on the tokens a trained model is sure of; in a short run, where the
# model is still unsure, the same pull makes it *under*-confident, and the ECE grows instead
# (Müller et al. measured fully trained models). That is what this run printed: after 200 steps
# both models are under-confident (their mean confidence is below their accuracy), the smoothed
# one more so, and smoothing *raises* the ECE. Averaging the last snapshots of a short run mixes
# weights that are still improving: here the average is an older, less confident and less
# accurate model, so it lowers the ECE of both models but raises their perplexity. Vaswani et
# al. averaged checkpoints written ten minutes apart at the end of a run of 100,000 steps, when
# the weights only wander around a minimum. Re-run with more `steps` to see both change.

# %% [markdown]
# ## Questions
#
# **1. The perplexity floor of a smoothed model.** A model that puts exactly $q$ on every token
# gives the reference $q_y = 1 - \varepsilon + \varepsilon/V$, so its perplexity (measured
# against the reference, not against $q$) is $1/q_y$. With the chapter's data and target
# vocabulary:

# %%
_, tgt_vocab_cpu = build_vocabs(load_corpus("synthetic")["train"][:50_000])   # the chapter's cpu run
V, eps = len(tgt_vocab_cpu), 0.1
q_ref = 1 - eps + eps / V
q_row = torch.full((1, V), eps / V)
q_row[0, 7] = q_ref                                            # any reference token: 7 here
floor = math.exp(F.cross_entropy(q_row.log(), torch.tensor([7])).item())  # perplexity vs the reference
print(f"V = {V}: q_y = {q_ref:.5f}; a model that outputs q exactly has test perplexity 1/q_y = {floor:.4f}")
assert abs(floor - 1 / q_ref) < 1e-6, "perplexity of outputting q is 1/q_y"

# %% [markdown]
# That is the floor of any model that has learned the smoothed target exactly. Section 4 measured
# the chapter's models against it; read from the chapter's committed run:

# %%
ppl_smoothed, ppl_plain = map(float, chapter_printed(
    CH08, r"over all test tokens the smoothed model's perplexity is \w+: ([\d.]+) vs ([\d.]+)"))
share, ppl_sure_smoothed, ppl_sure_plain = chapter_printed(
    CH08, r"on the (\d+%) of reference tokens both models give more than 1/2, perplexity ([\d.]+) \(eps = 0.1\) "
          r"and ([\d.]+) \(eps = 0\)")
median_smoothed, median_plain = map(float, chapter_printed(
    CH08, r"their median p\(reference\): ([\d.]+) \(eps = 0.1\) and ([\d.]+) \(eps = 0\)"))
steps_transformer = int(chapter_printed(CH08, r"^Transformer\s+[\d,]+ parameters; ([\d,]+) steps")[0].replace(",", ""))
print(f"all test tokens: smoothed {ppl_smoothed:.3f}, {ppl_smoothed / floor:.2f} times the floor {floor:.3f} "
      f"(after {steps_transformer} steps)")
print(f"the {share} of tokens both models were sure of: smoothed {ppl_sure_smoothed}, "
      f"{float(ppl_sure_smoothed) / floor:.2f} times the floor; plain {ppl_sure_plain}, "
      f"{'below' if float(ppl_sure_plain) < floor else 'above'} the smoothed floor")
print(f"median p(reference) there: smoothed {median_smoothed:.3f} against the q_y = {q_ref:.3f} its loss aims at; "
      f"plain {median_plain:.3f}")

# %% [markdown]
# Over all test tokens the smoothed model is far above the floor, because it is not perfect: it
# is wrong or unsure on many tokens after so short a run. On the tokens both models were sure of
# it comes close to the floor, with a median $p(\text{ref})$ near the $q_y$ its loss aims at;
# the plain model's perplexity there can go *below* the smoothed floor (the line above says
# whether it did), which no smoothed model can do on average.
#
# **2. Worse probabilities, same argmax.** Perplexity scores the probability given to the
# reference; accuracy and greedy decoding only ask which token is largest. Smoothing caps the
# reference's probability near $q_y$ (section 4's medians, printed above under question 1): on
# every token the model is sure of it loses a little log-probability, which raised perplexity on
# those tokens, but a probability near $q_y$ is still far above every other token's share, so the
# argmax is unchanged. What the chapter's run measured for accuracy and BLEU:

# %%
d_accuracy, d_bleu = chapter_printed(CH08, r"smoothed minus plain: accuracy ([+-][\d.]+) points, BLEU ([+-][\d.]+)")
print(f"smoothed minus plain in the chapter's run, seed 0: accuracy {d_accuracy} points, BLEU {d_bleu}")
for what in ("accuracy %", "BLEU"):
    wins, n_seeds, median, lo, hi = chapter_printed(
        CH08, rf"^{re.escape(what)}, smoothed higher than {re.escape(what)}, plain for (\d+) of (\d+) seeds; "
              r".*: ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]")
    print(f"{what:10s}: smoothed ahead for {wins} of {n_seeds} seeds; smoothed minus plain {median} [{lo}, {hi}]")

# %% [markdown]
# Vaswani et al. (2017, §5.4) report that smoothing "hurts perplexity ... but improves accuracy
# and BLEU"; section 4 of the chapter ran the control for every seed, and the lines above say for
# how many of them the smoothed model was ahead: at this budget one run does not establish a gain.
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
# \sqrt{w/s}$.) Chapter 07 measured what to expect on a small language model (section 9's
# stability run, a 12-layer model at $d = 64$), read from its committed run:

# %%
CH07 = "07_transformer_architecture.ipynb"
number = r"\s+([\d.]+)"
stability = {name: [float(x) for x in chapter_printed(CH07, rf"^{re.escape(name)}" + number * 9)[6:]]
             for name in ("post-LN, no warm-up", "post-LN, warm-up 50 steps", "pre-LN, no warm-up")}
unigram = float(chapter_printed(CH07, r"loss of predicting word frequencies only: ([\d.]+)")[0])
for name, last in stability.items():
    print(f"chapter 07, {name:26s}: {', '.join(f'{x:.2f}' for x in last)} nats per token over the last 10 steps "
          f"(three seeds)")
print(f"predicting word frequencies only: {unigram:.2f}")

# %% [markdown]
# There, post-LN without warm-up stayed near the loss of predicting word frequencies only, while
# post-LN with a 50-step warm-up and pre-LN without one trained. Now the retraining the question
# asks for, on the chapter's translation task: the chapter's Transformer, data, recipe and 1x
# steps (385 in the `cpu` profile), with `norm_first=False`, once with the chapter's 100-step
# warm-up and once without (`warmup_steps=1`: the full peak of $3 \cdot 10^{-3}$ from the first
# step), for the chapter's seeds, scored with greedy BLEU on the whole test split. The pre-LN
# numbers are the chapter's own 1x Transformers (the `BLEU, smoothed` row of its section 4), read
# from its committed run. About half a minute per training on a quiet CPU.

# %%
ch_train = load_corpus("synthetic")["train"][:50_000] if run.profile != "smoke" else train_pairs
ch_src, ch_tgt = build_vocabs(ch_train)
ch_data = TranslationDataset(ch_train, ch_src, ch_tgt)
ch_max_source = max(len(src) for src, _ in ch_data.examples) + 21
ch_test = load_corpus("synthetic")["test"][: run.post_ln["test_pairs"]]


def post_ln_run(seed: int) -> dict[str, float]:
    """The chapter's Transformer as post-LN, trained from `seed` with and without warm-up."""
    out = {}
    for label, warmup in (("post-LN, warm-up", run.warmup), ("post-LN, no warm-up", 1)):
        torch.manual_seed(seed)
        model = Transformer(len(ch_src), len(ch_tgt), **run.transformer, dropout=0.0, norm_first=False,
                            max_len=2 * ch_max_source + 10)
        history, _ = train_translator(model, ch_data, epochs=1_000, max_steps=run.post_ln["steps"], batch_size=64,
                                      lr=3e-3, warmup_steps=warmup, betas=(0.9, 0.98), adam_eps=1e-9,
                                      label_smoothing=0.1, device="cpu", seed=seed, desc=label, verbose=False)
        out[f"{label} BLEU"] = evaluate_translator(model, ch_test, ch_src, ch_tgt).bleu.score
        out[f"{label} last loss"] = sum(history.step_loss[-20:]) / 20
    return out


post_ln = over_seeds(post_ln_run, run.post_ln["seeds"])
pre_ln = [float(x) for x in chapter_printed(CH08, r"^BLEU, smoothed\s+[\d.]+ \[[\d.]+, [\d.]+\]" + r"\s+([\d.]+)" * 3)]
print(f"{run.post_ln['steps']} steps, seeds {run.post_ln['seeds']}, greedy BLEU on {len(ch_test):,} test pairs:")
print(post_ln.table(fmt=".2f"))
print(f"pre-LN (the chapter's 1x Transformers, seeds 0, 1, 2): {', '.join(f'{x:.1f}' for x in pre_ln)}")
print(post_ln.verdict("post-LN, warm-up BLEU", "post-LN, no warm-up BLEU", fmt="+.1f"))
if run.profile == "cpu":                        # the chapter's sizes and seeds: comparable with its run
    assert post_ln.holds_for_every_seed("post-LN, warm-up BLEU", "post-LN, no warm-up BLEU"), \
        "post-LN should train better with the warm-up than without it, for every seed"
    assert all(p > w for p, w in zip(pre_ln, post_ln.values["post-LN, warm-up BLEU"], strict=True)), \
        "at this budget pre-LN should beat post-LN with warm-up, for every seed"

# %% [markdown]
# In the committed `cpu` run (the table), post-LN with the warm-up scores 48.9 [39.7, 56.9] BLEU
# and without it 8.1 [6.1, 9.7]: the warm-up is worth 32 to 47 points for every seed (asserted),
# and without it the last training loss stays near 3 nats where the warm-up run reaches about 1.4.
# Pre-LN, from the same seeds and steps, scores 64.8-66.3, above post-LN with the warm-up for
# every seed (asserted). So at this budget the order is pre-LN, then post-LN with warm-up, then
# post-LN without, as in chapter 07's stability runs; post-LN with the warm-up also varies most
# between seeds (a 17-point range).
#
# Why: in post-LN the gradients at initialisation are largest near the output (Xiong et al. 2020,
# §3.3), and Adam's first updates move every parameter by about the learning rate whatever its
# gradient (chapter 07, question 7), so a full learning rate at step 1 makes large updates exactly
# where they do most damage; pre-LN's gradients are smaller and even across layers, and it trains
# without warm-up (their §4). The warm-up changes what happens in the first $w$ steps, and at a
# budget of a few hundred steps that is much of the run. The price of pre-LN's stability shows
# later, on long runs: Nguyen and Salazar (2019) found pre-norm slightly worse than post-norm on
# WMT'14 English-German, and Liu et al. (2020, "Understanding the difficulty of training
# Transformers") argue that post-LN's strong dependence on its residual branches, the cause of its
# instability, is also what lets it reach better models once it trains; 385 steps are too few to
# see that side of the trade.
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
# **5. Equal seconds, steps, parameters or FLOPs.** The chapter's run, read from its printed
# lines: each model's parameters, and its time per step at its largest budget, the median
# training seconds over the seeds divided by the steps (one seed's single timing can be inflated
# by whatever else the machine was doing, as the chapter's first seed was); then the equal-step
# comparisons over its seeds:

# %%
trained = {}
for name in ("seq2seq (ch. 02)", "RNNsearch (ch. 03)", "Transformer"):
    params = chapter_printed(CH08, rf"^{re.escape(name)}\s+([\d,]+) parameters;")[0]
    budget_steps = chapter_printed(CH08, rf"^{re.escape(name)}\s+scored at (.*) steps$")[0]
    median_seconds = chapter_printed(CH08, rf"^\s+{re.escape(name)}\s+(0\.5x .* s)$")[0]
    steps = int(budget_steps.split(" = ")[-1].replace(",", ""))            # the largest budget's steps
    seconds = float(median_seconds.split(", ")[-1].split()[1])             # and its median seconds
    trained[name] = dict(params=int(params.replace(",", "")), steps=steps, ms=1000 * seconds / steps)
    print(f"{name:20s} {trained[name]['params']:>10,} parameters; {steps:>5,} steps in {seconds:.0f} s "
          f"(median over the seeds): {trained[name]['ms']:>4.0f} ms per step")
for equal in (1, 2):     # the chapter's two equal-step comparisons: (192 vs 190) and (385 vs 380) steps in cpu
    t_steps, r_steps, wins, n_seeds, median, lo, hi = chapter_printed(
        CH08, rf"^\s+(\d+) vs (\d+) steps: Transformer {equal / 2:g}x \w+ than RNNsearch {equal:g}x for (\d+) of "
              r"(\d+) seeds; .*: ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]")
    print(f"Transformer after {t_steps} steps against RNNsearch after {r_steps}: Transformer ahead for {wins} of "
          f"{n_seeds} seeds, Transformer minus RNNsearch {median} [{lo}, {hi}] BLEU")

# %% [markdown]
# *Same steps* (and batch size) gives every model the same data, but ignores that a step costs
# each model a different time (the milliseconds above); it is the comparison of sample
# efficiency, and it can change the winner (the BLEU at equal steps, above, against the chapter's
# equal-budget lines).
# *Same parameters* compares architectures at equal memory and storage (the Transformer has
# fewer, above), but parameters are not cost: a GRU applies its
# weights once per position sequentially, attention costs grow with $T^2$ and use no
# parameters. *Same FLOPs* measures arithmetic independently of the hardware, but ignores how
# well that arithmetic runs: sequential small matrix products (the GRUs) use a GPU poorly,
# large batched ones (the Transformer) well, and memory traffic is not counted. *Same seconds*
# is what a user pays, but it depends on the machine, the implementation and the load. On a GPU
# only the equal-seconds comparison would change (steps, parameters and FLOPs do not depend on
# the device): the Transformer processes all target positions of a sentence in parallel while
# the GRUs still run position by position, so in the same seconds its lead in steps (the step
# counts above) should grow.
#
# **6. One live prefix at the start.** At step 0 every prefix is `<bos>` alone. If all $K$
# were live with the same score, each extension would appear $K$ times among the $K \cdot V$
# candidates, and the top $K$ would be $K$ copies of the single best extension; the copies then
# stay identical at every later step, so the beam is $K$ copies of greedy decoding and returns
# greedy's output. With one step of the candidate selection of the chapter's `beam_search` (all
# $K \cdot V$ extensions of a sentence ranked together):

# %%
def beam_step(beam_scores: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    B, K, V = log_probs.shape
    scores, index = (beam_scores[:, :, None] + log_probs).reshape(B, K * V).topk(K, dim=1)
    return scores, index // V, index % V


torch.manual_seed(0)
same_log_probs = torch.log_softmax(torch.randn(1, 1, 6), dim=-1).expand(1, 3, 6)  # 3 identical prefixes
scores, beams, tokens = beam_step(torch.zeros(1, 3), same_log_probs)
print(f"three identical live prefixes: tokens added {tokens.tolist()}, greedy's token "
      f"{same_log_probs[0, 0].argmax().item()}")
assert (tokens == same_log_probs[0, 0].argmax()).all(), "identical prefixes all take the greedy token"

# %% [markdown]
# Setting the other $K - 1$ scores to $-\infty$ (as the chapter's beam search does) makes the
# first step pick the $K$ best *different* first tokens:

# %%
scores, beams, tokens = beam_step(torch.tensor([[0.0, float("-inf"), float("-inf")]]), same_log_probs)
print(f"one live prefix: tokens added {tokens.tolist()}, from prefixes {beams.tolist()}")
assert (beams == 0).all() and torch.equal(tokens[0], same_log_probs[0, 0].topk(3).indices)
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
