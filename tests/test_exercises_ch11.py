"""Chapter 11 exercise checkers accept the reference solutions and reject typical wrong answers, each
with the message that names the mistake; nothing tfmlib.bpe already has passes them."""

import inspect
import random
from collections import Counter

import pytest
from test_exercises import _accepts, _hint_gives_no_code, _rejects, _stub

import tfmlib.bpe as bpe_module
from tfmlib import exercises
from tfmlib.bpe import BPE, END_OF_WORD, initial_symbols, learn_merges, merge_pair, split_word
from tfmlib.data import Vocab

NAMES = ["11.bpe_dropout", "11.byte_fallback", "11.wordpiece_merges"]


def _rejects_with(name, fn, *fragments):
    """The checker rejects ``fn`` and its message contains every fragment (the specific diagnosis)."""
    _rejects(name, fn)
    verdict = exercises.check(name, fn)
    for fragment in fragments:
        assert fragment in verdict.message, f"{name}: expected {fragment!r} in {verdict.message!r}"


def test_chapter_11_exercises_are_registered_and_never_raise(capsys):
    assert exercises.names(11) == NAMES
    answers = {"11.byte_fallback": (_stub, _stub), "11.bpe_dropout": _stub, "11.wordpiece_merges": _stub}
    for name in NAMES:
        assert not exercises.check(name, answers[name])
        out = capsys.readouterr().out
        assert "not solved yet" in out and "Hint" in out
        with pytest.raises(exercises.ExerciseFailed, match="not solved yet"):
            exercises.check(name, answers[name], must_pass=True)
        assert not exercises.check(name, lambda *a: 1 / 0)
        assert "raised ZeroDivisionError" in capsys.readouterr().out or name == "11.byte_fallback"


@pytest.mark.parametrize("name", NAMES)
def test_11_hints_point_the_way_without_the_code(name):
    _hint_gives_no_code(name, ("def ", "return ", "lambda", ".encode(", "decode(", "0x{", ":02X", "02x",
                               "random()", "< p", ">= p", "Fraction", "/ (", "in range(", "[i]", "bytes(",
                               "int(", "hex(", "ord(", "append(", "merge_pair(", "=="))


# ----------------------------------------------------------------------------- 11.byte_fallback


def _byte_pieces(text):
    return [f"<0x{b:02X}>" for b in text.encode("utf-8")]


def encode_with_bytes(bpe, vocab, word):
    out = []
    for piece in bpe.encode_word(word):
        if piece in vocab:
            out.append(piece)
        elif piece.endswith(END_OF_WORD):
            out += _byte_pieces(piece[: -len(END_OF_WORD)]) + [END_OF_WORD]
        else:
            out += _byte_pieces(piece)
    return out


def decode_with_bytes(pieces):
    words, current = [], b""
    for piece in pieces:
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            current += bytes([int(piece[3:5], 16)])
            continue
        ends = piece.endswith(END_OF_WORD)
        current += (piece[: -len(END_OF_WORD)] if ends else piece).encode("utf-8")
        if ends:
            words.append(current.decode("utf-8", errors="replace"))
            current = b""
    if current:
        words.append(current.decode("utf-8", errors="replace"))
    return words


def _encode_variant(byte="<0x{:02X}>", as_bytes=lambda t: t.encode("utf-8"), end="own"):
    def encode(bpe, vocab, word):
        out = []
        for piece in bpe.encode_word(word):
            if piece in vocab:
                out.append(piece)
                continue
            ends = piece.endswith(END_OF_WORD) and end != "bytes"
            text = piece[: -len(END_OF_WORD)] if ends else piece
            out += [byte.format(b) for b in as_bytes(text)]
            if ends and end == "own":
                out.append(END_OF_WORD)
            elif ends and end == "glued":
                out[-1] += END_OF_WORD
        return out
    return encode


def decode_each_byte_alone(pieces):
    words, current = [], ""
    for piece in pieces:
        if piece.startswith("<0x"):
            current += bytes([int(piece[3:5], 16)]).decode("latin-1")
            continue
        ends = piece.endswith(END_OF_WORD)
        current += piece[: -len(END_OF_WORD)] if ends else piece
        if ends:
            words.append(current)
            current = ""
    return words + ([current] if current else [])


def decode_strict(pieces):
    words, current = [], b""
    for piece in pieces:
        if piece.startswith("<0x"):
            current += bytes([int(piece[3:5], 16)])
            continue
        ends = piece.endswith(END_OF_WORD)
        current += (piece[: -len(END_OF_WORD)] if ends else piece).encode()
        if ends:
            words.append(current.decode("utf-8"))
            current = b""
    return words + ([current.decode("utf-8")] if current else [])


def test_byte_fallback_accepts_the_solution():
    _accepts("11.byte_fallback", (encode_with_bytes, decode_with_bytes))


def test_byte_fallback_round_trips_what_a_vocab_would_map_to_unk():
    bpe = BPE.learn([["the", "street", "the", "street"]], 20)
    vocab = Vocab.build([bpe.encode(["the", "street"])])
    words = ["straße", "€5", "😀", "東京"]
    pieces = [p for w in words for p in encode_with_bytes(bpe, vocab, w)]
    assert "<0xC3>" in pieces and "<0x9F>" in pieces          # ß is C3 9F in UTF-8
    assert all(p in vocab or p.startswith("<0x") or p == END_OF_WORD for p in pieces)
    assert decode_with_bytes(pieces) == words
    assert vocab.encode(bpe.encode(words)).count(vocab["<unk>"]) > 0      # without the fallback: <unk>


def _encode_per_character(bpe, vocab, word):
    """The libraries' rule (sentencepiece, tokenizers): a missing piece falls back character by
    character, keeping the characters the vocabulary has; not this exercise's rule."""
    out = []
    for piece in bpe.encode_word(word):
        if piece in vocab:
            out.append(piece)
            continue
        ends = piece.endswith(END_OF_WORD)
        for c in piece[: -len(END_OF_WORD)] if ends else piece:
            out += [c] if c in vocab else _byte_pieces(c)
        out += [END_OF_WORD] if ends else []
    return out


@pytest.mark.parametrize("answer, fragments", [
    ((lambda bpe, vocab, word: bpe.encode_word(word), decode_with_bytes), ("left as they are", "<unk>")),
    ((_encode_per_character, decode_with_bytes), ("per *piece*", "per character")),
    ((_encode_variant(byte="<0x{:02x}>"), decode_with_bytes), ("uppercase hex",)),
    ((_encode_variant(byte="<0x{:X}>"), decode_with_bytes), ("two hex digits",)),
    ((_encode_variant(as_bytes=lambda t: [ord(c) for c in t]), decode_with_bytes), ("code points",)),
    ((_encode_variant(end="bytes"), decode_with_bytes), ("marker's own characters",)),
    ((_encode_variant(end="dropped"), decode_with_bytes), ("end-of-word marker is lost",)),
    ((_encode_variant(end="glued"), decode_with_bytes), ("glued",)),
    ((lambda bpe, vocab, word: (encode_with_bytes(bpe, vocab, word)
                                if all(p in vocab for p in bpe.encode_word(word))
                                else _byte_pieces(word) + [END_OF_WORD]), decode_with_bytes),
     ("whole word",)),
    ((encode_with_bytes, decode_each_byte_alone), ("each byte on its own",)),
    ((encode_with_bytes, decode_strict), ("UnicodeDecodeError", "U+FFFD")),
    ((encode_with_bytes, BPE.decode), ("byte pieces must become bytes",)),
    (encode_with_bytes, ("pair of functions",)),
])
def test_byte_fallback_rejects_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("11.byte_fallback", answer, *fragments)


# ----------------------------------------------------------------------------- 11.bpe_dropout


def _candidates(bpe, symbols):
    present = {p for p in zip(symbols, symbols[1:], strict=False) if p in bpe.ranks}
    return sorted(present, key=lambda p: bpe.ranks[p])


def dropout_encode(bpe, word, p, rng):
    symbols = split_word(word)
    while True:
        kept = [pair for pair in _candidates(bpe, symbols) if rng.random() >= p]
        if not kept:
            return symbols
        symbols = merge_pair(symbols, kept[0])


def dropout_keep_with_p(bpe, word, p, rng):          # keeps a merge with probability p
    return dropout_encode(bpe, word, 1 - p, rng)


def dropout_stop_at_first(bpe, word, p, rng):
    symbols = split_word(word)
    while (cands := _candidates(bpe, symbols)) and rng.random() >= p:
        symbols = merge_pair(symbols, cands[0])
    return symbols


def dropout_once_per_word(bpe, word, p, rng):
    dropped, symbols = {}, split_word(word)
    while True:
        for pair in _candidates(bpe, symbols):
            dropped.setdefault(pair, rng.random() < p)
        kept = [c for c in _candidates(bpe, symbols) if not dropped[c]]
        if not kept:
            return symbols
        symbols = merge_pair(symbols, kept[0])


def dropout_only_delays(bpe, word, p, rng):          # a dropped step is retried: always the full merge
    symbols = split_word(word)
    while cands := _candidates(bpe, symbols):
        if rng.random() >= p:
            symbols = merge_pair(symbols, cands[0])
    return symbols


_global = random.Random()


def dropout_global_random(bpe, word, p, rng):        # ignores the generator it is given
    return dropout_encode(bpe, word, p, _global)


def dropout_per_occurrence(bpe, word, p, rng):      # drops and merges one occurrence at a time
    symbols = split_word(word)
    while True:
        found = [(bpe.ranks[pair], i) for i, pair in enumerate(zip(symbols, symbols[1:], strict=False))
                 if pair in bpe.ranks]
        kept = [f for f in found if not rng.random() < p]
        if not kept:
            return symbols
        _, i = min(kept)
        symbols = symbols[:i] + [symbols[i] + symbols[i + 1]] + symbols[i + 2:]


def dropout_loses_end(bpe, word, p, rng):
    pieces = dropout_encode(bpe, word, p, rng)
    return pieces[:-1] if pieces[-1] == END_OF_WORD else pieces


def test_bpe_dropout_accepts_the_solution():
    _accepts("11.bpe_dropout", dropout_encode)


def test_bpe_dropout_accepts_another_use_of_the_generator():
    """Drawing for every merge of the table (not only the present ones) changes which numbers are used,
    not the distribution: the checker's bands accept it."""
    def dropout_draw_whole_table(bpe, word, p, rng):
        symbols = split_word(word)
        while True:
            dropped = {m for m in bpe.merges if rng.random() < p}
            kept = [pair for pair in _candidates(bpe, symbols) if pair not in dropped]
            if not kept:
                return symbols
            symbols = merge_pair(symbols, kept[0])

    _accepts("11.bpe_dropout", dropout_draw_whole_table)


@pytest.mark.parametrize("answer, fragments", [
    (lambda bpe, word, p, rng: bpe.encode_word(word), ("p is ignored",)),
    (lambda bpe, word, p, rng: dropout_encode(bpe, word, p, rng) if p < 1 else bpe.encode_word(word),
     ("at p=1",)),
    (dropout_keep_with_p, ("keep a merge with probability p",)),
    (dropout_stop_at_first, ("stop merging when the best merge is dropped",)),
    (dropout_once_per_word, ("once per word",)),
    (dropout_only_delays, ("only delays",)),
    (dropout_global_random, ("generator passed in",)),
    (dropout_loses_end, ("does not spell",)),
    (dropout_per_occurrence, ("never makes", "each to all its occurrences")),
    (lambda bpe, word, p, rng: [*word, END_OF_WORD], ("at p=0", "single characters")),
])
def test_bpe_dropout_rejects_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("11.bpe_dropout", answer, *fragments)


def test_bpe_dropout_reference_distribution_matches_the_solution():
    """The checker's exact distribution is what the algorithm gives: 20000 samples of the solution
    against it, within 5 standard errors for every segmentation."""
    from tfmlib.exercises.ch11 import _bpe, _dropout_distribution

    bpe = _bpe()
    exact = _dropout_distribution(bpe, "standing", 0.2)
    assert abs(sum(exact.values()) - 1) < 1e-12
    rng, n = random.Random(0), 20000
    seen = Counter(tuple(dropout_encode(bpe, "standing", 0.2, rng)) for _ in range(n))
    for seg, q in exact.items():
        assert abs(seen[seg] / n - q) <= 5 * (q * (1 - q) / n) ** 0.5 + 1e-3, (seg, seen[seg] / n, q)


# ----------------------------------------------------------------------------- 11.wordpiece_merges


def learn_merges_wordpiece(counts, num_merges, min_frequency=2):
    order = {s: i for i, s in enumerate(initial_symbols(counts))}
    words = {tuple(split_word(w)): c for w, c in counts.items()}
    merges = []
    while len(merges) < num_merges:
        pairs, symbols = Counter(), Counter()
        for s, c in words.items():
            for x in s:
                symbols[x] += c
            for pair in zip(s, s[1:], strict=False):
                pairs[pair] += c
        candidates = [pair for pair, c in pairs.items() if c >= min_frequency]
        if not candidates:
            break
        best = max(candidates, key=lambda pr: (pairs[pr] / (symbols[pr[0]] * symbols[pr[1]]),
                                               -order[pr[0]], -order[pr[1]]))
        merges.append(best)
        order.setdefault(best[0] + best[1], len(order))
        words = {tuple(merge_pair(s, best)): c for s, c in words.items()}
    return merges


def _wordpiece_variant(*, tie="order", weighted=True, stale=False, min_freq=True, score="likelihood"):
    def learn(counts, num_merges, min_frequency=2):
        order = {s: i for i, s in enumerate(initial_symbols(counts))}
        words = {tuple(split_word(w)): (c if weighted else 1) for w, c in counts.items()}
        first = Counter()
        for s, c in words.items():
            for x in s:
                first[x] += c
        merges = []
        while len(merges) < num_merges:
            pairs, symbols = Counter(), Counter()
            for s, c in words.items():
                for x in s:
                    symbols[x] += c
                for pair in zip(s, s[1:], strict=False):
                    pairs[pair] += c
            if stale:
                symbols = first
            candidates = [pr for pr, c in pairs.items() if c >= (min_frequency if min_freq else 1)]
            if not candidates:
                break
            if score == "likelihood":
                value = {pr: pairs[pr] / (symbols[pr[0]] * symbols[pr[1]]) for pr in candidates}
            else:   # the probability of the pair over the product of the symbols' probabilities, N / N^2
                total = sum(symbols.values())
                value = {pr: (pairs[pr] / total) / (symbols[pr[0]] / total * symbols[pr[1]] / total)
                         for pr in candidates}
            keys = {"order": lambda pr, v=value: (-v[pr], order[pr[0]], order[pr[1]]),
                    "alphabetical": lambda pr, v=value: (-v[pr], pr),
                    "last": lambda pr, v=value: (-v[pr], -order[pr[0]], -order[pr[1]])}
            best = min(candidates, key=keys[tie])
            merges.append(best)
            new = best[0] + best[1]
            order.setdefault(new, len(order))
            first.setdefault(new, pairs[best])
            words = {tuple(merge_pair(s, best)): c for s, c in words.items()}
        return merges
    return learn


def test_wordpiece_merges_accept_the_solution():
    _accepts("11.wordpiece_merges", learn_merges_wordpiece)


def test_wordpiece_prefers_rare_pairs_of_rare_symbols():
    """On the Hugging Face course's corpus, frequency merges ('u', 'g') first, the likelihood score does
    not (u is in every word, so its pairs score low)."""
    counts = {"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}
    assert learn_merges(counts, 1) == [("u", "g")]
    assert learn_merges_wordpiece(counts, 1) != [("u", "g")]


@pytest.mark.parametrize("answer, fragments", [
    (learn_merges, ("most frequent pair", "BPE's rule")),
    (bpe_module.learn_merges_slowly, ("most frequent pair",)),
    (_wordpiece_variant(tie="alphabetical"), ("tie with score", "entered the vocabulary first")),
    (_wordpiece_variant(tie="last"), ("tie with score",)),
    (_wordpiece_variant(score="probabilities"), ("tie with score",)),   # rounding breaks exact ties
    (_wordpiece_variant(weighted=False), ("counted each word once",)),
    (_wordpiece_variant(stale=True), ("before any merge",)),
    (_wordpiece_variant(min_freq=False), ("fewer than min_frequency",)),
    (lambda c, n, m=2: learn_merges_wordpiece(c, n, m)[:-1], ("stopped after",)),
    (lambda c, n, m=2: ["".join(p) for p in learn_merges_wordpiece(c, n, m)], ("pairs of str",)),
])
def test_wordpiece_merges_reject_wrong_answers_with_specific_messages(answer, fragments):
    _rejects_with("11.wordpiece_merges", answer, *fragments)


# ----------------------------------------------------------------------------- nothing in tfmlib.bpe passes


def _package_callables():
    """Every public function and class of tfmlib.bpe, and every public bound method of a learned BPE and
    SubwordTokenizer (a SubwordTokenizer is absent from older versions of the module)."""
    found = {f"tfmlib.bpe.{n}": obj for n, obj in vars(bpe_module).items()
             if not n.startswith("_") and callable(obj)
             and getattr(obj, "__module__", "") == bpe_module.__name__}
    learned = BPE.learn([["the", "lowest", "newest", "the"]] * 2, 10)
    instances = [learned]
    if hasattr(bpe_module, "SubwordTokenizer"):
        instances.append(bpe_module.SubwordTokenizer(learned))
    for obj in instances:
        for n, member in inspect.getmembers(obj, callable):
            if not n.startswith("_"):
                found[f"{type(obj).__name__}().{n}"] = member
    return found


def _adapters(fn):
    """``fn`` called the ways the three exercises call an answer, and with the BPE or word it expects."""
    return [fn,
            lambda bpe, *rest: fn(*rest),                     # the learned BPE supplied by its own method
            lambda bpe, vocab, word, *rest: fn(word),
            lambda bpe, word, p, rng: fn(bpe, word),
            lambda bpe, word, *rest: fn(word)]


def test_nothing_in_the_package_passes_a_chapter_11_checker(capsys):
    callables = _package_callables()
    assert {"tfmlib.bpe.learn_merges", "tfmlib.bpe.apply_merges", "BPE().encode_word", "BPE().decode"} <= \
        set(callables)
    decoders = [c for n, c in callables.items() if "decode" in n or "text" in n]
    for name, fn in callables.items():
        for adapted in _adapters(fn):
            for exercise in ("11.bpe_dropout", "11.wordpiece_merges"):
                assert not exercises.check(exercise, adapted), f"{name} passes {exercise}"
            for decoder in decoders + [fn]:
                assert not exercises.check("11.byte_fallback", (adapted, decoder)), \
                    f"{name} passes 11.byte_fallback"
    capsys.readouterr()
