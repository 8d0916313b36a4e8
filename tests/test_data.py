import gzip
import hashlib
import json
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tfmlib import data
from tfmlib.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Batch,
    BucketBatchSampler,
    TokenBatchSampler,
    TranslationDataset,
    Vocab,
    make_batch,
    make_token_loader,
    pad_sequences,
    padding_fraction,
    split_marks,
    tokenize,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# SHA-256 of the token lists of every sentence of the bundled corpus (train, valid, test; English then
# French, one JSON list per line) as the word tokenizer split them before it learned to keep spacing
# (commit 9ce30e5): the chapters' tokens, vocabularies and outputs must not change.
BUNDLED_TOKENS_SHA256 = "65695135c4e30affd2f55603dea987fa9407d94f03bc806e3a90cefa684012cb"


def test_tokenize_splits_words_punctuation_and_elisions():
    assert tokenize("L'oiseau n'aime pas le chat, qu'il voit.") == [
        "l'", "oiseau", "n'", "aime", "pas", "le", "chat", ",", "qu'", "il", "voit", "."]
    # the hyphen touches both words and "!" has a (narrow no-break) space before it: both marked
    assert tokenize("Va-t'en\u202f!") == ["va", "@-@", "t'", "en", "\u2581!"]
    assert tokenize("Hello", lowercase=False) == ["Hello"]
    with pytest.raises(TypeError, match="str"):
        tokenize(["a", "list"])


@pytest.mark.parametrize("text, tokens", [
    ("a red t-shirt", ["a", "red", "t", "@-@", "shirt"]),           # Moses' @-@
    ("3.50 or 2,000 at 8:30", ["3", ".@", "50", "or", "2", ",@", "000", "at", "8", ":@", "30"]),
    ("qui ?", ["qui", "\u2581?"]),                                  # French spacing
    ('she said "hi."', ["she", "said", '"@', "hi", ".", '@"']),      # opening and closing quotes
    ("wait... and", ["wait", ".", ".", ".", "and"]),                 # default spacing: no mark
    ("wait ... and", ["wait", "\u2581.", ".", ".", "and"]),
    ("wait\u2026 and", ["wait", "\u2026", "and"]),
    ("the boys' club", ["the", "boys", "@'", "club"]),              # no letter after: not an elision
    ("late 80's", ["late", "80", "@'@", "s"]),
    ("it's", ["it'", "s"]),
    ("(2 men) ( x )", ["(", "2", "men", ")", "(\u2581", "x", "\u2581)"]),
    ("l\u2019homme", ["l\u2019", "homme"]),                          # the typographic apostrophe stays
    ("me@x.com @ home", ["me", "@@@", "x", ".@", "com", "@", "home"]),  # "@" itself: both sides marked
    ("a \u2581b", ["a", "\u2581\u2581@", "b"]),
])
def test_tokenize_marks_the_spacing_detokenize_would_not_give(text, tokens):
    assert tokenize(text) == tokens
    assert data.detokenize(tokens) == text


def test_detokenize_inverts_tokenize_on_plain_text():
    for text in ["l'oiseau n'aime pas le chat, qu'il voit.", "the small cat sleeps."]:
        assert data.detokenize(tokenize(text)) == text


def roundtrip_fixture() -> list[str]:
    text = (FIXTURES / "roundtrip_sentences.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("# ")]


def test_round_trip_is_exact_on_hyphens_decimals_apostrophes_quotes_and_ellipses():
    lines = roundtrip_fixture()
    assert len(lines) >= 20
    for line in lines:
        assert data.detokenize(tokenize(line)) == line.lower(), line
        assert data.detokenize(tokenize(line, lowercase=False)) == line, line
    tokens = {t for line in lines for t in tokenize(line)}
    # the fixture exercises every kind of mark (a test of the fixture: it would pass vacuously without)
    assert {"@-@", ".@", ",@", ":@", "@'", '"@', '@"', "@@@"} <= tokens
    assert {"\u2581?", "\u2581.", "\u2581!", "(\u2581"} <= tokens


# Letters, digits, every kind of punctuation the defaults know, the marks themselves, apostrophes, and
# spaces of several kinds.
ROUND_TRIP_ALPHABET = "ab\u00e9Z19_ '\u2019-.,!?;:()[]{}\"\u00ab\u00bb@\u2581\u2026%&/\t\u00a0\u202f\u0307"


@given(st.text(alphabet=ROUND_TRIP_ALPHABET, max_size=40))
def test_round_trip_is_exact_on_any_text(text):
    assert data.detokenize(tokenize(text, lowercase=False)) == " ".join(text.split())
    assert data.detokenize(tokenize(text)) == " ".join(text.lower().split())


def test_split_marks_and_detokenize_read_marks_anywhere():
    assert split_marks("@-@") == ("@", "-", "@")
    assert split_marks("\u2581?") == ("\u2581", "?", "")
    assert split_marks(".@") == ("", ".", "@")
    assert split_marks("@") == ("", "@", "") and split_marks("chat") == ("", "chat", "")
    # what a model may output: marks at either end, on both sides of a place (the later token wins)
    assert data.detokenize(["@-@"]) == "-"
    assert data.detokenize(["a", "@-@", "b", "-", "c"]) == "a-b - c"
    assert data.detokenize(["a", ".@", "\u2581b"]) == "a. b"
    assert data.detokenize([]) == ""


def test_bundled_corpus_tokenizes_exactly_as_before_and_carries_no_mark():
    from tfmlib.synthetic import load_bundled

    digest, n = hashlib.sha256(), 0
    for split in ("train", "valid", "test"):
        for pair in load_bundled(split):
            for sentence in pair:
                tokens = tokenize(sentence)
                digest.update(json.dumps(tokens, ensure_ascii=False).encode("utf-8") + b"\n")
                assert data.detokenize(tokens) == sentence
                n += 1
    assert n == 110_000
    assert digest.hexdigest() == BUNDLED_TOKENS_SHA256


def real_references() -> dict[str, list[str]]:
    """Every sentence of Multi30k (each split and language) and of Tatoeba (each side), as the loaders
    give them; skips when ``../shared/data`` lacks them."""
    from tfmlib.corpora import MULTI30K_LANGS, MULTI30K_SPLITS, load_multi30k, load_tatoeba

    if not (SHARED_DATA / "multi30k").is_dir() or not (SHARED_DATA / "tatoeba-fra-eng").is_dir():
        pytest.skip(f"the real corpora are absent from {SHARED_DATA} (they are optional)")
    out = {}
    for split in MULTI30K_SPLITS:
        for lang in MULTI30K_LANGS:
            other = "en" if lang != "en" else "de"
            out[f"multi30k {split}.{lang}"] = [p[0] for p in load_multi30k(SHARED_DATA / "multi30k", split,
                                                                           lang, other)]
    pairs = load_tatoeba(SHARED_DATA / "tatoeba-fra-eng")
    out["tatoeba en"], out["tatoeba fr"] = [en for en, _ in pairs], [fr for _, fr in pairs]
    return out


@pytest.fixture(scope="module")
def references() -> dict[str, list[str]]:
    return real_references()


def test_round_trip_is_exact_on_every_real_reference(references):
    assert sum(len(v) for v in references.values()) == 3 * 32_014 + 2 * 167_130
    for name, sentences in references.items():
        changed = [s for s in sentences if data.detokenize(tokenize(s)) != s.lower()]
        assert not changed, f"{name}: {len(changed)} sentences change, e.g. {changed[:3]}"


def test_self_bleu_of_the_real_test_sets_is_100(references):
    from tfmlib.metrics import bleu

    for name in ("multi30k test_2016_flickr.en", "multi30k test_2016_flickr.de",
                 "multi30k test_2017_flickr.fr"):
        refs = references[name]
        score = bleu([data.detokenize(tokenize(r)) for r in refs], refs, lowercase=True)
        assert round(score.score, 2) == 100.0, (name, score)
    # the case issue 26 measured: the old pipeline scored 98.42 here ("t-shirt" -> "t - shirt")
    refs = references["multi30k test_2016_flickr.en"]
    assert sum("-" in r for r in refs) > 30 and any("t-shirt" in r.lower() for r in refs)


def test_vocab_build_orders_by_frequency_then_alphabet():
    v = Vocab.build([["b", "a", "c"], ["a", "c"], ["c"]])
    assert v.itos == ["<pad>", "<bos>", "<eos>", "<unk>", "c", "a", "b"]
    assert (v["<pad>"], v["<bos>"], v["<eos>"], v["<unk>"]) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert len(Vocab.build([["a", "b", "b"]], min_freq=2)) == 5
    assert len(Vocab.build([list("abcdefgh")], max_size=6)) == 6


def test_unknown_tokens_map_to_unk_and_round_trip():
    v = Vocab.build([["le", "chat", "dort"]])
    ids = v.encode(["le", "chien", "dort"], bos=True, eos=True)
    assert ids == [BOS_ID, v["le"], UNK_ID, v["dort"], EOS_ID]
    assert v.decode(ids) == ["le", "<unk>", "dort"]
    assert v.decode(ids + [v["chat"]]) == ["le", "<unk>", "dort"], "decode stops at EOS"
    assert v.decode(ids, strip_special=False)[0] == "<bos>"
    assert v.decode(torch.tensor(ids)) == ["le", "<unk>", "dort"]


def test_vocab_bad_input():
    with pytest.raises(TypeError, match="tokenize first"):
        Vocab.build(["a sentence"])
    with pytest.raises(TypeError, match="tokenize first"):
        Vocab.build([["a"]]).encode("a sentence")
    with pytest.raises(ValueError, match="first tokens"):
        Vocab(["a", "b"])
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["<pad>", "<bos>", "<eos>", "<unk>", "a", "a"])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        Vocab.build([["a"]]).decode([99])
    with pytest.raises(ValueError, match="1-D"):
        Vocab.build([["a"]]).decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integers, got dtype torch.float32"):
        Vocab.build([["a"]]).decode(torch.tensor([4.0]))
    with pytest.raises(TypeError, match="token ids must be ints, got 4.0"):
        Vocab.build([["a"]]).decode([4.0])


def test_vocab_save_load(tmp_path):
    v = Vocab.build([tokenize("le chat noir dort. l'oiseau chante.")])
    v.save(tmp_path / "v.json")
    assert Vocab.load(tmp_path / "v.json") == v
    assert Vocab.from_dict(v.to_dict()) == v


def test_pairs_tsv_round_trip_plain_and_gzip(tmp_path):
    pairs = [("the cat sleeps.", "le chat dort."), ("é à ç", "ü ö")]
    for name in ["p.tsv", "p.tsv.gz"]:
        data.write_pairs_tsv(tmp_path / name, pairs)
        assert data.read_pairs_tsv(tmp_path / name) == pairs
    # gzip output is byte-for-byte reproducible (mtime 0), so regenerated data can be compared
    first = (tmp_path / "p.tsv.gz").read_bytes()
    data.write_pairs_tsv(tmp_path / "p.tsv.gz", pairs)
    assert (tmp_path / "p.tsv.gz").read_bytes() == first
    assert gzip.decompress(first).decode() == "the cat sleeps.\tle chat dort.\né à ç\tü ö\n"


def test_pairs_tsv_errors(tmp_path):
    (tmp_path / "bad.tsv").write_text("ok\tfine\nno tab here\n")
    with pytest.raises(ValueError, match="bad.tsv:2"):
        data.read_pairs_tsv(tmp_path / "bad.tsv")
    with pytest.raises(ValueError, match="tab or newline"):
        data.write_pairs_tsv(tmp_path / "x.tsv", [("a\tb", "c")])


def test_pad_sequences_shapes_and_mask():
    ids, mask = pad_sequences([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, PAD_ID, PAD_ID]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    with pytest.raises(ValueError, match="empty batch"):
        pad_sequences([])
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        pad_sequences([[1], []])
    with pytest.raises(TypeError, match="sequence 1 holds non-integer"):
        pad_sequences([[1, 2], [3.7]])
    with pytest.raises(TypeError, match="non-integer"):
        pad_sequences([torch.tensor([0.5, 1.0])])
    ids, _ = pad_sequences([torch.tensor([4, 5]), [6]])
    assert ids.tolist() == [[4, 5], [6, PAD_ID]]
    with pytest.raises(ValueError, match=r"sequence 0 must be a 1-D tensor.*got shape \(2, 2\)"):
        pad_sequences([torch.ones(2, 2, dtype=torch.long)])
    with pytest.raises(TypeError, match="sequence 0 must be a list of token ids, got str"):
        pad_sequences(["abc"])
    with pytest.raises(TypeError, match="non-integer"):
        pad_sequences([[True, False]])


def test_make_batch_shifts_target_and_masks_padding():
    b = make_batch([([10, 11], [20, 21, 22]), ([12], [23])])
    assert b.src.tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 20, 21, 22], [BOS_ID, 23, PAD_ID, PAD_ID]]
    assert b.tgt_out.tolist() == [[20, 21, 22, EOS_ID], [23, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert b.src_lengths.tolist() == [3, 2] and b.num_target_tokens == 6 and len(b) == 2
    assert b.to("cpu").src.equal(b.src)
    with pytest.raises(ValueError, match="empty batch"):
        make_batch([])


def test_make_batch_accepts_tensors_and_rejects_bad_examples():
    as_lists = make_batch([([10, 11], [20, 21, 22]), ([12], [23])])
    as_tensors = make_batch([(torch.tensor([10, 11]), torch.tensor([20, 21, 22])),
                             (torch.tensor([12]), torch.tensor([23]))])
    for f in ("src", "src_mask", "tgt_in", "tgt_out", "tgt_mask"):
        assert torch.equal(getattr(as_tensors, f), getattr(as_lists, f)), f
    with pytest.raises(TypeError, match="target of example 1 holds non-integer"):
        make_batch([([1], [2]), ([3], [0.5])])
    with pytest.raises(TypeError, match=r"example 0 must be a \(source_ids, target_ids\) pair"):
        make_batch([[1, 2, 3]])


def test_translation_dataset_and_loader():
    pairs = [("the cat sleeps.", "le chat dort."), ("the dog sees the cat.", "le chien voit le chat.")]
    src = Vocab.build(tokenize(s) for s, _ in pairs)
    tgt = Vocab.build(tokenize(t) for _, t in pairs)
    ds = TranslationDataset(pairs, src, tgt)
    assert src.decode(ds[1][0]) == tokenize(pairs[1][0])
    batches = list(data.make_loader(ds, batch_size=2, shuffle=False))
    assert len(batches) == 1 and batches[0].src.shape == (2, 7)
    with pytest.raises(ValueError, match="no pairs"):
        TranslationDataset([], src, tgt)


@given(st.lists(st.integers(1, 60), min_size=1, max_size=300), st.integers(1, 17), st.booleans(),
       st.integers(0, 5), st.booleans())
def test_bucket_sampler_yields_every_index_once(lengths, batch_size, shuffle, seed, drop_last):
    sampler = BucketBatchSampler(lengths, batch_size, shuffle=shuffle, seed=seed, pool_factor=4,
                                 drop_last=drop_last)
    batches = list(sampler)
    seen = sorted(i for b in batches for i in b)
    assert len(batches) == len(sampler)
    if drop_last:
        assert all(len(b) == batch_size for b in batches)
        assert len(set(seen)) == len(seen) == len(lengths) // batch_size * batch_size
    else:
        assert seen == list(range(len(lengths)))
        assert all(1 <= len(b) <= batch_size for b in batches)
    if not shuffle:  # evaluation order: sorted by length
        order = [i for b in batches for i in b]
        assert [lengths[i] for i in order] == sorted(lengths[i] for i in order)


def test_bucket_sampler_reduces_padding_and_reshuffles_each_epoch():
    rng = random.Random(0)
    lengths = [rng.randint(3, 45) for _ in range(5000)]
    sampler = BucketBatchSampler(lengths, 32, shuffle=True, seed=0)
    epoch1, epoch2 = list(sampler), list(sampler)
    assert epoch1 != epoch2, "a new order every epoch"
    order = list(range(len(lengths)))
    rng.shuffle(order)
    random_batches = [order[i:i + 32] for i in range(0, len(order), 32)]
    bucketed, unbucketed = padding_fraction(epoch1, lengths), padding_fraction(random_batches, lengths)
    assert bucketed < 0.05 < 0.3 < unbucketed, (bucketed, unbucketed)
    # same seed, same epoch -> same batches: runs are reproducible
    assert list(BucketBatchSampler(lengths, 32, seed=0)) == epoch1


def test_bucket_sampler_bad_input():
    with pytest.raises(ValueError, match="batch_size"):
        BucketBatchSampler([1, 2], 0)
    with pytest.raises(ValueError, match="empty"):
        BucketBatchSampler([], 4)
    with pytest.raises(ValueError, match="pool_factor must be an int >= 1, got 0"):
        BucketBatchSampler([1, 2], 2, pool_factor=0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 2.5"):
        BucketBatchSampler([1, 2], 2.5)
    assert len(BucketBatchSampler([1] * 10, 4, drop_last=True)) == 2


def test_padding_fraction_by_hand_and_bad_input():
    # batch [0, 1]: lengths 3, 1 -> grid 2 x 3 = 6, real 4; batch [2]: grid 2, real 2
    assert padding_fraction([[0, 1], [2]], [3, 1, 2]) == pytest.approx(1 - 6 / 8)
    with pytest.raises(ValueError, match="no batches"):
        padding_fraction([], [1, 2])
    with pytest.raises(ValueError, match="batch 1 is empty"):
        padding_fraction([[0], []], [1, 2])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_make_batch_host_facts_equal_what_the_tensors_say(seed):
    g = torch.Generator().manual_seed(seed)
    examples = [(torch.randint(4, 50, (int(n),), generator=g).tolist(),
                 torch.randint(4, 60, (int(m),), generator=g).tolist())
                for n, m in torch.randint(1, 9, (6, 2), generator=g)]
    b = make_batch(examples)
    facts = b.host_facts
    assert facts is not None, "make_batch must attach the facts it counted on the CPU"
    assert list(facts.src_lengths) == b.src_mask.sum(1).tolist(), "host lengths differ from the mask's"
    assert facts.num_target_tokens == int(b.tgt_mask.sum()), "host token count differs from the mask's"
    assert facts.src_ids == (int(b.src.min()), int(b.src.max())), "host source id range is wrong"
    assert facts.tgt_ids == (int(b.tgt_in.min()), int(b.tgt_in.max())), "host target id range is wrong"
    moved = b.to("cpu")
    assert moved.host_facts == facts, "Batch.to must keep the host facts"


def test_num_target_tokens_reads_no_tensor_when_facts_are_known():
    from torch.overrides import TorchFunctionMode

    class Reads(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name != "__get__":  # reading .shape is free; computing on values is not
                self.names.append(name)
            return func(*args, **(kwargs or {}))

    b = make_batch([([10, 11], [20, 21, 22]), ([12], [23])])
    with Reads() as reads:
        n = b.num_target_tokens
    assert n == 6 and reads.names == [], f"counted from the tensors: {reads.names}"
    by_hand = Batch(b.src, b.src_mask, b.tgt_in, b.tgt_out, b.tgt_mask)
    assert by_hand.host_facts is None and by_hand.num_target_tokens == 6, "a batch by hand counts its mask"
    # facts about other tensors (a replaced field of another shape) are not used
    b.tgt_in = b.tgt_in[:, :-1]
    assert b.host_facts is None, "facts whose shapes no longer match the tensors must be ignored"


@pytest.mark.parametrize("shuffle", [True, False])
def test_token_batches_cover_every_example_once_within_the_budget(shuffle):
    rng = random.Random(5)
    lengths = [rng.randint(1, 40) for _ in range(700)]
    sampler = TokenBatchSampler(lengths, max_tokens=300, shuffle=shuffle, pool_size=128, seed=3)
    batches = list(sampler)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths))), "every example must appear exactly once per epoch"
    padded = [len(b) * (1 + max(lengths[i] for i in b)) for b in batches]
    assert max(padded) <= 300, f"a batch exceeds max_tokens: {max(padded)}"
    # greedy cutting: most batches are nearly full (short sentences come many to a batch)
    assert sorted(padded)[len(padded) // 2] > 300 * 0.75, f"batches far from the budget: {padded}"
    sizes = {len(b) for b in batches}
    assert len(sizes) > 3, f"the batch size should follow the lengths, got sizes {sizes}"
    if shuffle:
        again = TokenBatchSampler(lengths, max_tokens=300, shuffle=True, pool_size=128, seed=3)
        assert list(again) == batches, "the same seed must give the same first epoch"
        assert list(sampler) != batches, "a new epoch must give a new order"
    else:
        assert [lengths[i] for b in batches for i in b] == sorted(lengths), "unshuffled must be sorted"


def test_token_batches_reject_bad_arguments_and_make_loaders():
    with pytest.raises(ValueError, match="example 1 has 11 tokens"):
        TokenBatchSampler([3, 10], max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        TokenBatchSampler([3], max_tokens=0)
    with pytest.raises(ValueError, match="empty dataset"):
        TokenBatchSampler([], max_tokens=10)
    pairs = [(" ".join(["a"] * n), " ".join(["b"] * (n % 5 + 1))) for n in range(1, 30)]
    src_v, tgt_v = Vocab.build([["a"]]), Vocab.build([["b"]])
    loader = make_token_loader(TranslationDataset(pairs, src_v, tgt_v), max_tokens=64, seed=1)
    seen = 0
    for batch in loader:
        assert batch.src.numel() <= 64 and batch.tgt_in.numel() <= 64, "padded batch above max_tokens"
        assert batch.host_facts is not None, "token batches are made by make_batch"
        seen += len(batch)
    assert seen == len(pairs) and len(loader) >= 29 * 8 // 64


def test_vocab_iterates_over_its_tokens_and_ends():
    """Iterating a Vocab gives its tokens in id order and stops (before __iter__ existed, Python fell
    back to vocab[0], vocab[1], ..., token lookups that return UNK_ID for ever: list(vocab) hung)."""
    vocab = Vocab.build([["b", "a", "b"]])
    assert list(vocab) == vocab.itos == ["<pad>", "<bos>", "<eos>", "<unk>", "b", "a"]
    assert [*vocab, "x"][-1] == "x"
