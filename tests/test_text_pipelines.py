"""The text pipelines a translation model reads and writes through: ``tfmlib.data.WordTokenizer``
(words, chapter 00) and ``tfmlib.bpe.SubwordTokenizer`` (BPE pieces, chapter 11), and the
``tokenizer=`` argument of ``TranslationDataset``, ``translate`` and ``evaluate_translator``."""

import pytest
import torch

from tfmlib.bpe import BPE, END_OF_WORD, SubwordTokenizer, learn_merges_tokenizers, learn_shared, word_counts
from tfmlib.data import (
    UNK_ID,
    TranslationDataset,
    Vocab,
    WordTokenizer,
    check_tokenizer,
    detokenize,
    tokenize,
)
from tfmlib.decoding import encode_sources, evaluate_translator, greedy_decode, translate
from tfmlib.transformer import Transformer

PAIRS = [
    ("Ein Mann in einem T-Shirt kauft Äpfel für 3,50 Euro.",
     "A man in a t-shirt buys apples for 3.50 euros."),
    ("Zwei Hunde spielen im Schnee...", "Two dogs play in the snow..."),
    ("Eine Frau sagt \"Hallo\" zu ihrem Freund.", "A woman says \"hello\" to her friend."),
    ("Der Junge, der Fußball spielt, ist müde.", "The boy who's playing soccer is tired."),
    ("Ein Mann in einem roten Hemd.", "A man in a red shirt."),
    ("Zwei Männer spielen Fußball.", "Two men play soccer."),
]
HARD = ["It's a man's t-shirt (size 3.50)...", "Straße: ‘quoted’ – and «guillemets»!", "A  run   of spaces",
        "Ein Boston Terrier läuft über saftig-grünes Gras.", "ÆØÅ 42% €5 $3.99 ... ?!"]


@pytest.fixture(scope="module")
def shared():
    return learn_shared(PAIRS, 60, min_frequency=1)


def test_word_tokenizer_is_tokenize_and_detokenize():
    tok = WordTokenizer()
    for s in HARD:
        assert tok.tokens(s) == tokenize(s)
        assert tok.text(tok.tokens(s)) == detokenize(tokenize(s)) == " ".join(s.lower().split())
    assert WordTokenizer(lowercase=False).tokens("A Man") == ["A", "Man"]


def test_check_tokenizer_names_the_missing_method():
    class OnlyTokens:
        def tokens(self, text):
            return text.split()

    check_tokenizer(WordTokenizer(), "here")
    with pytest.raises(TypeError, match=r"here: .*OnlyTokens has no text\(\)"):
        check_tokenizer(OnlyTokens(), "here")
    with pytest.raises(TypeError, match="TranslationDataset"):
        TranslationDataset(PAIRS, Vocab.build([["a"]]), Vocab.build([["a"]]), tokenizer=OnlyTokens())
    with pytest.raises(TypeError, match="translate"):
        encode_sources(["a b"], Vocab.build([["a"]]), "translate", tokenizer=object())


def test_dataset_encodes_with_the_tokenizer_it_is_given():
    class Characters:
        def tokens(self, text):
            return list(text.replace(" ", "_"))

        def text(self, tokens):
            return "".join(tokens).replace("_", " ")

    chars = Characters()
    vocab = Vocab.build(chars.tokens(s) for pair in PAIRS for s in pair)
    data = TranslationDataset(PAIRS, vocab, vocab, tokenizer=chars)
    for (src, tgt), (s, t) in zip(data.examples, PAIRS, strict=True):
        assert src == vocab.encode(list(s.replace(" ", "_")))
        assert tgt == vocab.encode(list(t.replace(" ", "_")))
    # the default is the word pipeline, lowercased
    words = Vocab.build(tokenize(s) for pair in PAIRS for s in pair)
    assert TranslationDataset(PAIRS, words, words).examples[0][0] == words.encode(tokenize(PAIRS[0][0]))


def test_subword_pipeline_loses_nothing_even_on_unseen_characters(shared):
    tokenizer, vocab = shared
    for s in HARD + [t for pair in PAIRS for t in pair]:
        pieces = tokenizer.tokens(s)
        assert pieces[-1].endswith(END_OF_WORD)
        assert tokenizer.text(pieces) == " ".join(s.lower().split()), s
    # an unseen character stays a piece of its own, which the vocabulary reads as <unk>
    pieces = tokenizer.tokens("ÆØÅ")
    assert "Æ".lower() in "".join(pieces) and UNK_ID in vocab.encode(pieces)
    with pytest.raises(TypeError, match="expected a BPE"):
        SubwordTokenizer(["not", "a", "bpe"])


def test_learn_shared_is_one_bpe_over_both_sides_and_covers_the_training_pieces(shared):
    tokenizer, vocab = shared
    words = [tokenize(s) for pair in PAIRS for s in pair]
    assert tokenizer.bpe == BPE.learn(words, 60, min_frequency=1)
    for pair in PAIRS:
        for s in pair:
            assert UNK_ID not in vocab.encode(tokenizer.tokens(s))
    pieces = {p for w in words for p in tokenizer.bpe.encode(w)}
    assert set(vocab.itos[4:]) == pieces  # every piece used, nothing else
    # a piece shared by both languages ("in", "mann"/"man", punctuation) has one id
    assert vocab["in" + END_OF_WORD] != UNK_ID
    with pytest.raises(ValueError, match="no pairs"):
        learn_shared([], 10)
    assert word_counts(words)["in"] == 5  # 3 German, 2 English: counted over both sides


def test_learn_shared_with_the_library_learner_gives_the_same_tokenizer_and_vocabulary(shared):
    pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed")
    tokenizer, vocab = shared
    library, library_vocab = learn_shared(PAIRS, 60, min_frequency=1, learn=learn_merges_tokenizers)
    assert library.bpe == tokenizer.bpe and library_vocab == vocab


def _tiny_model(vocab):
    torch.manual_seed(0)
    return Transformer(len(vocab), len(vocab), d_model=16, heads=2, encoder_layers=1, decoder_layers=1,
                       d_ff=32, dropout=0.0, max_len=64, share_embeddings=True).eval()


def test_translate_reads_and_writes_through_the_tokenizer(shared):
    tokenizer, vocab = shared
    model = _tiny_model(vocab)
    sources = [s for s, _ in PAIRS]
    out = translate(model, sources, vocab, vocab, tokenizer=tokenizer, max_len=12, batch_size=1)
    for s, got in zip(sources, out, strict=True):
        src = torch.tensor([vocab.encode(tokenizer.tokens(s), eos=True)])
        decoded = greedy_decode(model, src, torch.ones_like(src, dtype=torch.bool), 12)
        n = decoded.lengths[0].item()
        assert got == tokenizer.text(vocab.decode(decoded.tokens[0, :n]))
    # the word pipeline reads the same text otherwise: different ids, so (here) different outputs
    words = translate(model, sources, vocab, vocab, max_len=12, batch_size=1)
    assert words != out


def test_evaluate_translator_passes_the_tokenizer_on(shared):
    tokenizer, vocab = shared
    model = _tiny_model(vocab)
    report = evaluate_translator(model, PAIRS, vocab, vocab, tokenizer=tokenizer, lowercase_bleu=True)
    assert report.hypotheses == translate(model, [s for s, _ in PAIRS], vocab, vocab, tokenizer=tokenizer)
    assert report.examples([0], source_label="de").splitlines()[0].startswith("[0] de : Ein Mann")
