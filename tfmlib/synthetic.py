"""The bundled English -> French-like parallel corpus, generated from a seed.

Introduced in chapter 00 (preface); the translation chapters (02, 03, 08) train on it.

A *synchronous grammar* builds each English sentence and its French translation at the same time,
one phrase after the other, so the translation is always right and is a deterministic function of
the English sentence: every choice that changes the French (a noun's gender, the number of the
subject, ...) is visible in the English words. The grammar has what makes translation more than
word-by-word substitution:

* gender and number: ``the cat / the house / the bird / the birds`` ->
  ``le chat / la maison / l'oiseau / les oiseaux``; ``a`` -> ``un / une``, ``some`` -> ``des``;
* adjectives that agree and mostly *follow* the noun, a few that precede it:
  ``the small black cats`` -> ``les petits chats noirs`` (alignments cross);
* verbs conjugated for the 3rd person: ``sees / see`` -> ``voit / voient``;
* negation around the verb: ``does not like`` -> ``n'aime pas``, ``never sleeps`` -> ``ne dort jamais``;
  an indefinite object of a negated verb becomes ``de``: ``does not open a book`` -> ``n'ouvre pas de livre``
  (verbs of liking, ``aimer`` and ``adorer``, never take an indefinite object: French uses the
  definite article there, ``il aime les pommes``);
* ``without`` drops the indefinite article: ``without a song`` -> ``sans chanson``;
* an adverb that moves: ``the cat often sees the dog`` -> ``le chat voit souvent le chien``;
* object pronouns that move before the verb: ``the cat sees her`` -> ``le chat la voit``;
* nested relative clauses: ``the dog that the cat sees`` -> ``le chien que le chat voit``;
* prepositions that contract with the article: ``near the garden`` -> ``près du jardin``,
  ``to the birds`` -> ``aux oiseaux``;
* clauses joined by ``and / but / because / when`` -> ``et / mais / parce que / quand``.

Everything is drawn from one ``random.Random(seed)``, never from the global random state, so the
corpus is identical on every machine. Because the grammar is known, so is the probability of every
sentence it writes: :func:`sentence_probability` sums the probabilities of all the random choices
that write a given English sentence, and :func:`corpus_log_probs` turns that into the exact
log-probability of each sentence of a split as :func:`generate_pairs` wrote it (the entropy of the
corpus, a floor for any language model of it). ``python -m tfmlib.synthetic`` rewrites the bundled files in
``data/synthetic_en_fr/``; ``load_bundled("train")`` reads them back.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfmlib.data import Pair, read_pairs_tsv, tokenize, write_pairs_tsv

INTRODUCED_IN = 0

# --------------------------------------------------------------------------- the lexicon


ANIMATE = ("animal", "person")
ANY = ("animal", "person", "thing", "food", "place")
FRAMES = ("intr", "tr", "ditr", "motion")


@dataclass(frozen=True)
class Noun:
    """A noun in both languages. ``kind`` is its meaning class: animal, person, thing, food, place."""

    en: str
    en_plural: str
    fr: str
    fr_plural: str
    feminine: bool
    kind: str


@dataclass(frozen=True)
class Adjective:
    """An adjective with its four French forms (masc./fem. x sing./plur.).

    ``before`` adjectives (petit, grand, ...) come before the noun in French, the others after.
    ``fr_ms_vowel`` is the masculine singular form used before a vowel (``vieil``, ``bel``).
    ``describes`` lists the noun kinds it fits (``happy`` fits people and animals, not tables).
    """

    en: str
    fr_ms: str
    fr_fs: str
    fr_mp: str
    fr_fp: str
    before: bool = False
    fr_ms_vowel: str | None = None
    describes: tuple[str, ...] = ("animal", "person", "thing", "food", "place")

    def form(self, feminine: bool, plural: bool, before_vowel: bool = False) -> str:
        """The French form that agrees with a noun of this gender and number."""
        if plural:
            return self.fr_fp if feminine else self.fr_mp
        if feminine:
            return self.fr_fs
        if before_vowel and self.fr_ms_vowel:
            return self.fr_ms_vowel
        return self.fr_ms


@dataclass(frozen=True)
class Verb:
    """A verb in the 3rd person. English forms may be two words (``looks for`` -> ``cherche``).

    ``frame`` is how it is used: ``"intr"`` (sleeps), ``"tr"`` (sees X), ``"ditr"`` (gives X to Y),
    ``"motion"`` (goes to a place). ``objects`` lists the noun kinds its object can be.
    ``liking`` marks verbs of liking (``aimer``, ``adorer``): in French their object takes the definite
    article in generic use (``il aime les pommes``, ``il n'aime pas les pommes``), so the grammar never
    gives them an indefinite object (no ``likes an apple`` / ``n'aime pas de pomme``).
    """

    en_sg: str
    en_base: str
    fr_sg: str
    fr_pl: str
    fr_inf: str
    frame: str
    objects: tuple[str, ...] = ()
    liking: bool = False


# english, english plural, french, french plural, gender, kind
_NOUN_ROWS = """
cat        cats        chat       chats       m animal
dog        dogs        chien      chiens      m animal
bird       birds       oiseau     oiseaux     m animal
horse      horses      cheval     chevaux     m animal
mouse      mice        souris     souris      f animal
wolf       wolves      loup       loups       m animal
fox        foxes       renard     renards     m animal
cow        cows        vache      vaches      f animal
rabbit     rabbits     lapin      lapins      m animal
bear       bears       ours       ours        m animal
elephant   elephants   éléphant   éléphants   m animal
spider     spiders     araignée   araignées   f animal
bee        bees        abeille    abeilles    f animal
duck       ducks       canard     canards     m animal
goat       goats       chèvre     chèvres     f animal
frog       frogs       grenouille grenouilles f animal
owl        owls        hibou      hiboux      m animal
snake      snakes      serpent    serpents    m animal
man        men         homme      hommes      m person
woman      women       femme      femmes      f person
child      children    enfant     enfants     m person
boy        boys        garçon     garçons     m person
girl       girls       fille      filles      f person
king       kings       roi        rois        m person
queen      queens      reine      reines      f person
uncle      uncles      oncle      oncles      m person
aunt       aunts       tante      tantes      f person
doctor     doctors     médecin    médecins    m person
baby       babies      bébé       bébés       m person
farmer     farmers     fermier    fermiers    m person
book       books       livre      livres      m thing
car        cars        voiture    voitures    f thing
table      tables      table      tables      f thing
door       doors       porte      portes      f thing
window     windows     fenêtre    fenêtres    f thing
letter     letters     lettre     lettres     f thing
newspaper  newspapers  journal    journaux    m thing
boat       boats       bateau     bateaux     m thing
hat        hats        chapeau    chapeaux    m thing
box        boxes       boîte      boîtes      f thing
key        keys        clé        clés        f thing
flower     flowers     fleur      fleurs      f thing
chair      chairs      chaise     chaises     f thing
ball       balls       ballon     ballons     m thing
clock      clocks      horloge    horloges    f thing
song       songs       chanson    chansons    f thing
story      stories     histoire   histoires   f thing
star       stars       étoile     étoiles     f thing
plane      planes      avion      avions      m thing
apple      apples      pomme      pommes      f food
cheese     cheeses     fromage    fromages    m food
cake       cakes       gâteau     gâteaux     m food
egg        eggs        œuf        œufs        m food
orange     oranges     orange     oranges     f food
house      houses      maison     maisons     f place
garden     gardens     jardin     jardins     m place
school     schools     école      écoles      f place
church     churches    église     églises     f place
island     islands     île        îles        f place
forest     forests     forêt      forêts      f place
river      rivers      rivière    rivières    f place
city       cities      ville      villes      f place
village    villages    village    villages    m place
hospital   hospitals   hôpital    hôpitaux    m place
hotel      hotels      hôtel      hôtels      m place
bridge     bridges     pont       ponts       m place
market     markets     marché     marchés     m place
tree       trees       arbre      arbres      m place
"""

NOUNS: tuple[Noun, ...] = tuple(
    Noun(en, en_pl, fr, fr_pl, gender == "f", kind)
    for en, en_pl, fr, fr_pl, gender, kind in (line.split() for line in _NOUN_ROWS.strip().splitlines())
)

_NOT_PEOPLE = ("animal", "thing", "food", "place")
_THINGS = ("thing", "food")
ADJECTIVES: tuple[Adjective, ...] = (
    # before the noun in French
    Adjective("small", "petit", "petite", "petits", "petites", before=True),
    Adjective("big", "grand", "grande", "grands", "grandes", before=True),
    Adjective("young", "jeune", "jeune", "jeunes", "jeunes", before=True, describes=ANIMATE),
    Adjective("old", "vieux", "vieille", "vieux", "vieilles", before=True, fr_ms_vowel="vieil"),
    Adjective("beautiful", "beau", "belle", "beaux", "belles", before=True, fr_ms_vowel="bel"),
    Adjective("good", "bon", "bonne", "bons", "bonnes", before=True),
    Adjective("new", "nouveau", "nouvelle", "nouveaux", "nouvelles", before=True, fr_ms_vowel="nouvel"),
    # after the noun in French
    Adjective("black", "noir", "noire", "noirs", "noires", describes=_NOT_PEOPLE),
    Adjective("white", "blanc", "blanche", "blancs", "blanches", describes=_NOT_PEOPLE),
    Adjective("red", "rouge", "rouge", "rouges", "rouges", describes=_NOT_PEOPLE),
    Adjective("green", "vert", "verte", "verts", "vertes", describes=_NOT_PEOPLE),
    Adjective("blue", "bleu", "bleue", "bleus", "bleues", describes=_NOT_PEOPLE),
    Adjective("grey", "gris", "grise", "gris", "grises", describes=_NOT_PEOPLE),
    Adjective("strange", "étrange", "étrange", "étranges", "étranges"),
    Adjective("famous", "célèbre", "célèbre", "célèbres", "célèbres"),
    Adjective("heavy", "lourd", "lourde", "lourds", "lourdes", describes=_THINGS),
    Adjective("round", "rond", "ronde", "ronds", "rondes", describes=_THINGS),
    Adjective("dirty", "sale", "sale", "sales", "sales"),
    Adjective("clean", "propre", "propre", "propres", "propres"),
    Adjective("happy", "heureux", "heureuse", "heureux", "heureuses", describes=ANIMATE),
    Adjective("sad", "triste", "triste", "tristes", "tristes", describes=ANIMATE),
    Adjective("tired", "fatigué", "fatiguée", "fatigués", "fatiguées", describes=ANIMATE),
    Adjective("clever", "intelligent", "intelligente", "intelligents", "intelligentes", describes=ANIMATE),
    Adjective("brave", "courageux", "courageuse", "courageux", "courageuses", describes=ANIMATE),
    Adjective("lazy", "paresseux", "paresseuse", "paresseux", "paresseuses", describes=ANIMATE),
    Adjective("kind", "gentil", "gentille", "gentils", "gentilles", describes=ANIMATE),
    Adjective("angry", "fâché", "fâchée", "fâchés", "fâchées", describes=ANIMATE),
)

VERBS: tuple[Verb, ...] = (
    # intransitive
    Verb("sleeps", "sleep", "dort", "dorment", "dormir", "intr"),
    Verb("runs", "run", "court", "courent", "courir", "intr"),
    Verb("sings", "sing", "chante", "chantent", "chanter", "intr"),
    Verb("dances", "dance", "danse", "dansent", "danser", "intr"),
    Verb("laughs", "laugh", "rit", "rient", "rire", "intr"),
    Verb("swims", "swim", "nage", "nagent", "nager", "intr"),
    Verb("cries", "cry", "pleure", "pleurent", "pleurer", "intr"),
    Verb("plays", "play", "joue", "jouent", "jouer", "intr"),
    Verb("walks", "walk", "marche", "marchent", "marcher", "intr"),
    Verb("falls", "fall", "tombe", "tombent", "tomber", "intr"),
    Verb("arrives", "arrive", "arrive", "arrivent", "arriver", "intr"),
    Verb("works", "work", "travaille", "travaillent", "travailler", "intr"),
    Verb("waits", "wait", "attend", "attendent", "attendre", "intr"),
    # transitive
    Verb("sees", "see", "voit", "voient", "voir", "tr", ANY),
    Verb("likes", "like", "aime", "aiment", "aimer", "tr", ANY, liking=True),
    Verb("loves", "love", "adore", "adorent", "adorer", "tr", ANY, liking=True),
    Verb("eats", "eat", "mange", "mangent", "manger", "tr", ("food",)),
    Verb("finds", "find", "trouve", "trouvent", "trouver", "tr", ("thing", "food", "animal")),
    Verb("watches", "watch", "regarde", "regardent", "regarder", "tr", ANY),
    Verb("hears", "hear", "entend", "entendent", "entendre", "tr", ANIMATE),
    Verb("follows", "follow", "suit", "suivent", "suivre", "tr", ANIMATE),
    Verb("knows", "know", "connaît", "connaissent", "connaître", "tr", ("animal", "person", "place")),
    Verb("carries", "carry", "porte", "portent", "porter", "tr", _THINGS),
    Verb("opens", "open", "ouvre", "ouvrent", "ouvrir", "tr", ("thing",)),
    Verb("buys", "buy", "achète", "achètent", "acheter", "tr", _THINGS),
    Verb("draws", "draw", "dessine", "dessinent", "dessiner", "tr", ANY),
    Verb("chases", "chase", "chasse", "chassent", "chasser", "tr", ANIMATE),
    Verb("helps", "help", "aide", "aident", "aider", "tr", ANIMATE),
    Verb("calls", "call", "appelle", "appellent", "appeler", "tr", ANIMATE),
    Verb("meets", "meet", "rencontre", "rencontrent", "rencontrer", "tr", ("person",)),
    Verb("washes", "wash", "lave", "lavent", "laver", "tr", ("thing", "animal")),
    # two English words, one French word: the object is direct in French
    Verb("looks for", "look for", "cherche", "cherchent", "chercher", "tr", ("thing", "food", *ANIMATE)),
    Verb("listens to", "listen to", "écoute", "écoutent", "écouter", "tr", ("person", "animal")),
    Verb("waits for", "wait for", "attend", "attendent", "attendre", "tr", ("person", "animal")),
    # X ... to Y
    Verb("gives", "give", "donne", "donnent", "donner", "ditr", _THINGS),
    Verb("shows", "show", "montre", "montrent", "montrer", "ditr", _THINGS),
    Verb("sends", "send", "envoie", "envoient", "envoyer", "ditr", ("thing",)),
    Verb("brings", "bring", "apporte", "apportent", "apporter", "ditr", _THINGS),
    # to a place
    Verb("goes", "go", "va", "vont", "aller", "motion", ("place",)),
    Verb("comes", "come", "vient", "viennent", "venir", "motion", ("place",)),
    Verb("returns", "return", "retourne", "retournent", "retourner", "motion", ("place",)),
)

# English adverb -> French adverb. They sit before the English verb and after the French one.
# "never" becomes the second half of the negation: "never sleeps" -> "ne dort jamais".
ADVERBS: dict[str, str] = {
    "often": "souvent", "always": "toujours", "sometimes": "parfois", "rarely": "rarement",
    "never": "jamais",
}

# English preposition -> (French words, the article-contracting preposition or None).
# "near the garden" -> "près" + de + le -> "près du jardin".
# After "without" an indefinite article disappears in French: "without a song" -> "sans chanson",
# "without any uncles" -> "sans oncles" (see NounPhrase.french(bare_indefinite=True)).
PREPOSITIONS: dict[str, tuple[str, str | None]] = {
    "near": ("près", "de"), "far from": ("loin", "de"), "next to": ("à côté", "de"),
    "in": ("dans", None), "on": ("sur", None), "under": ("sous", None), "behind": ("derrière", None),
    "in front of": ("devant", None), "with": ("avec", None), "without": ("sans", None),
}
# Prepositions that fit each noun kind (the object of "in" is a place or a thing, ...).
_PREP_OBJECTS: dict[str, tuple[str, ...]] = {
    "near": ANY, "far from": ("place", "person", "animal"), "next to": ANY,
    "in": ("place",), "on": ("thing",), "under": ("thing", "place"), "behind": ANY,
    "in front of": ANY, "with": ("person", "animal", "thing"), "without": ("person", "animal", "thing"),
}

CONJUNCTIONS: dict[str, str] = {"and": "et", "but": "mais", "because": "parce que", "when": "quand"}

# subject pronouns and object pronouns (which move before the French verb)
SUBJECT_PRONOUNS: dict[str, tuple[str, bool]] = {"he": ("il", False), "she": ("elle", True)}
OBJECT_PRONOUNS: dict[str, str] = {"him": "le", "her": "la", "them": "les"}

_VOWELS = set("aeiouyàâäéèêëîïôöœùûü")
_H_ASPIRE = {"hibou", "hiboux"}  # "le hibou", not "l'hibou"


def starts_with_vowel_sound(french_word: str) -> bool:
    """True when a French word makes the word before it elide (``le`` -> ``l'``): a vowel or a mute h."""
    first = french_word[0]
    return first in _VOWELS or (first == "h" and french_word not in _H_ASPIRE)


def _elide(word: str, next_word: str) -> str:
    """``le/la/de/ne/que`` -> ``l'/d'/n'/qu'`` before a vowel sound; other words are unchanged."""
    if word in ("le", "la", "de", "ne", "que", "parce que") and starts_with_vowel_sound(next_word):
        return word[:-1] + "'"
    return word


def join_words(words: Sequence[str]) -> str:
    """Write words as text, with elided words glued to the next one and a final period.

    ``["l'", "oiseau", "dort"]`` -> ``"l'oiseau dort."``
    """
    text = ""
    for w in words:
        text += w if (not text or text.endswith("'")) else " " + w
    return text + "."


# --------------------------------------------------------------------------- noun phrases


@dataclass
class NounPhrase:
    """A noun phrase, rendered in either language when its context (preposition, negation) is known.

    ``tail_en`` / ``tail_fr`` are the words after the noun that do not depend on the context:
    a prepositional phrase and relative clauses (``near the house that the cat sees``).
    """

    det: str  # "the", "a" (plural: "some"), "this" (plural: "these"), "my"
    noun: Noun
    plural: bool
    pre: Adjective | None = None
    post: Adjective | None = None
    tail_en: tuple[str, ...] = ()
    tail_fr: tuple[str, ...] = ()

    @property
    def feminine(self) -> bool:
        return self.noun.feminine

    def english(self, negated_object: bool = False) -> list[str]:
        """English words; ``negated_object`` (also the object of ``without``) turns ``some`` into ``any``."""
        adjs = [a.en for a in (self.pre, self.post) if a is not None]
        noun = self.noun.en_plural if self.plural else self.noun.en
        first = (adjs + [noun])[0]
        if self.det == "a":
            if self.plural:
                det = "any" if negated_object else "some"
            else:
                det = "an" if first[0] in "aeiou" else "a"
        elif self.det == "this":
            det = "these" if self.plural else "this"
        else:
            det = self.det
        return [det, *adjs, noun, *self.tail_en]

    def french(self, linker: str | None = None, negated_object: bool = False,
               bare_indefinite: bool = False) -> list[str]:
        """French words; ``linker`` is ``"de"`` or ``"à"`` when a preposition contracts with the article.

        ``negated_object``: the direct object of a negated verb, where ``un/une/des`` become ``de``.
        ``bare_indefinite``: the object of ``sans``, where ``un/une/des`` disappear (``sans chanson
        triste``, ``sans oncles``); definite, demonstrative and possessive articles stay.
        """
        fem, pl = self.noun.feminine, self.plural
        noun = self.noun.fr_plural if pl else self.noun.fr
        words: list[str] = []
        if self.pre is not None:
            words.append(self.pre.form(fem, pl, before_vowel=starts_with_vowel_sound(noun)))
        words.append(noun)
        if self.post is not None:
            words.append(self.post.form(fem, pl))
        first = words[0]
        if bare_indefinite and self.det == "a":
            det: list[str] = []  # "sans chanson", "sans petits chats"
        else:
            det = self._french_determiner(first, linker, negated_object)
        return det + words + list(self.tail_fr)

    def _french_determiner(self, first: str, linker: str | None, negated_object: bool) -> list[str]:
        fem, pl = self.noun.feminine, self.plural
        if self.det == "the":
            art = "les" if pl else _elide("la" if fem else "le", first)
            contracted = {("de", "le"): "du", ("de", "les"): "des", ("à", "le"): "au", ("à", "les"): "aux"}
            if (linker, art) in contracted:
                return [contracted[linker, art]]
            return ([linker] if linker else []) + [art]
        if self.det == "a":
            if linker == "de" and pl:
                return [_elide("de", first)]  # de + des -> de: "près de chats"
            if negated_object or (pl and self.pre is not None):
                # "pas de chat", "pas d'oiseaux", "de petits chats"
                return ([linker] if linker else []) + [_elide("de", first)]
            art = "des" if pl else ("une" if fem else "un")
            if linker == "de":
                return ["d'", art]  # "près d'un arbre"
            return ([linker] if linker else []) + [art]
        if self.det == "this":
            if pl:
                art = "ces"
            elif fem:
                art = "cette"
            else:
                art = "cet" if starts_with_vowel_sound(first) else "ce"
        elif self.det == "my":
            art = "mes" if pl else ("ma" if fem and not starts_with_vowel_sound(first) else "mon")
        else:
            raise ValueError(f"unknown determiner {self.det!r}")
        return ([linker] if linker else []) + [art]


# --------------------------------------------------------------------------- the generator


@dataclass(frozen=True)
class Complexity:
    """How elaborate a sentence is: the knobs of one complexity level.

    ``clauses`` gives the weights of 1, 2, 3, ... coordinated clauses; ``p_*`` are the chances of
    each optional part; ``max_depth`` bounds how deeply relative clauses nest.
    """

    clauses: tuple[float, ...]
    p_adj: float
    p_pp: float
    p_rel: float
    max_depth: int


MAX_TOKENS = 60  # the longest English sentence, in tokens (period included)

# The corpus mixes four levels; their weights shape the length distribution (see the data card).
LEVELS: tuple[tuple[float, Complexity], ...] = (
    (0.28, Complexity(clauses=(1.0,), p_adj=0.25, p_pp=0.10, p_rel=0.0, max_depth=0)),
    (0.32, Complexity(clauses=(0.8, 0.2), p_adj=0.35, p_pp=0.25, p_rel=0.20, max_depth=1)),
    (0.25, Complexity(clauses=(0.5, 0.5), p_adj=0.45, p_pp=0.35, p_rel=0.35, max_depth=1)),
    (0.15, Complexity(clauses=(0.2, 0.5, 0.3), p_adj=0.50, p_pp=0.40, p_rel=0.45, max_depth=2)),
)


class SentenceGenerator:
    """Draws (English, French) sentence pairs from one ``random.Random(seed)``.

    >>> SentenceGenerator(seed=2024).sentence()  # the first pair of the bundled train split
    ('a farmer hears my goat.', 'un fermier entend ma chèvre.')
    """

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.level = LEVELS[0][1]
        self._nouns_by_kind = {k: [n for n in NOUNS if n.kind == k] for k in ANY}
        self._verbs_by_frame = {f: [v for v in VERBS if v.frame == f] for f in FRAMES}
        self._adjectives = {k: [a for a in ADJECTIVES if k in a.describes] for k in ANY}
        self._levels = [lv for _, lv in LEVELS]
        self._level_weights = [w for w, _ in LEVELS]

    # ---- small helpers
    def _chance(self, p: float) -> bool:
        return self.rng.random() < p

    def _adverb(self, negated: bool, allow_never: bool = True) -> str:
        """An adverb; a negated verb only takes ``often`` or ``always`` (not "does not never")."""
        if negated:
            return self.rng.choice(("often", "always"))
        return self.rng.choice([a for a in ADVERBS if allow_never or a != "never"])

    def _noun(self, kinds: Sequence[str]) -> Noun:
        kind = self.rng.choice(kinds)
        return self.rng.choice(self._nouns_by_kind[kind])

    # ---- noun phrases
    def noun_phrase(self, kinds: Sequence[str], depth: int, allow_rel: bool = True,
                    allow_indefinite: bool = True) -> NounPhrase:
        """A noun phrase whose noun is of one of ``kinds``, with optional adjectives, PP and relative.

        ``allow_indefinite=False`` (the object of a verb of liking) never draws ``a / some``.
        """
        lv, rng = self.level, self.rng
        noun = self._noun(kinds)
        det = rng.choices(("the", "a", "this", "my"), weights=(6, 3 if allow_indefinite else 0, 1, 1))[0]
        np_ = NounPhrase(det=det, noun=noun, plural=self._chance(0.3))
        pool = self._adjectives[noun.kind]
        if self._chance(lv.p_adj):
            adj = rng.choice(pool)
            if adj.before:
                np_.pre = adj
                if self._chance(0.4):
                    np_.post = rng.choice([a for a in pool if not a.before])
            else:
                np_.post = adj
        tail_en: list[str] = []
        tail_fr: list[str] = []
        if depth < lv.max_depth + 1 and self._chance(lv.p_pp * 0.6):
            en, fr = self.prep_phrase(depth + 1)
            tail_en += en
            tail_fr += fr
        if allow_rel and depth < lv.max_depth and self._chance(lv.p_rel):
            en, fr = self.relative_clause(np_, depth + 1)
            tail_en += en
            tail_fr += fr
        np_.tail_en, np_.tail_fr = tuple(tail_en), tuple(tail_fr)
        return np_

    def prep_phrase(self, depth: int, kinds: Sequence[str] = ANY) -> tuple[list[str], list[str]]:
        """``near the house`` -> ``près de la maison``; the preposition fits the noun's kind."""
        noun_kinds: list[str] = []
        while not noun_kinds:
            prep = self.rng.choice(list(PREPOSITIONS))
            noun_kinds = [k for k in _PREP_OBJECTS[prep] if k in kinds]
        np_ = self.noun_phrase(noun_kinds, depth, allow_rel=False)
        fr_words, linker = PREPOSITIONS[prep]
        without = prep == "without"  # "without a song / any songs" -> "sans chanson / sans chansons"
        return ([*prep.split(), *np_.english(negated_object=without)],
                [*fr_words.split(), *np_.french(linker=linker, bare_indefinite=without)])

    def relative_clause(self, head: NounPhrase, depth: int) -> tuple[list[str], list[str]]:
        """``that sees the dog`` -> ``qui voit le chien`` or ``that the cat sees`` -> ``que le chat voit``."""
        if head.noun.kind in ANIMATE and self._chance(0.5):
            # subject relative: the head does the action
            en, fr = self.predicate(head.plural, head.feminine, head.noun.kind, depth)
            return ["that", *en], ["qui", *fr]
        # object relative: the head is the object of a transitive verb
        verbs = [v for v in self._verbs_by_frame["tr"] if head.noun.kind in v.objects]
        if not verbs:
            return [], []
        verb = self.rng.choice(verbs)
        subj_en, subj_fr, plural, _ = self.subject(depth)
        negated = self._chance(0.15)
        adverb = self._adverb(negated) if self._chance(0.1) else None
        en_v, fr_v = self._verb_group(verb, plural, None, negated, adverb, modal=self._chance(0.05))
        return ["that", *subj_en, *en_v], [_elide("que", subj_fr[0]), *subj_fr, *fr_v]

    # ---- clauses
    def subject(self, depth: int) -> tuple[list[str], list[str], bool, bool]:
        """A subject: English words, French words, plural?, feminine?"""
        if self._chance(0.08):
            pron = self.rng.choice(list(SUBJECT_PRONOUNS))
            fr, fem = SUBJECT_PRONOUNS[pron]
            return [pron], [fr], False, fem
        np_ = self.noun_phrase(ANIMATE, depth)
        return np_.english(), np_.french(), np_.plural, np_.feminine

    def _verb_group(self, verb: Verb, plural: bool, obj_pronoun: str | None,
                    negated: bool = False, adverb: str | None = None, modal: bool = False
                    ) -> tuple[list[str], list[str]]:
        """The verb with its negation, adverb, modal and object pronoun, in both word orders.

        English: ``does not often see her`` / ``can see``;
        French: ``ne la voit pas souvent`` / ``peut voir``.
        """
        en: list[str] = []
        if modal:
            en += ["cannot" if negated else "can"]
            en += [adverb] if adverb else []
            en += verb.en_base.split()
        else:
            if negated:
                en += ["do" if plural else "does", "not"]
            en += [adverb] if adverb else []
            en += (verb.en_base if (plural or negated) else verb.en_sg).split()
        if obj_pronoun:
            en.append(obj_pronoun)

        finite = verb.fr_pl if plural else verb.fr_sg
        clitic = OBJECT_PRONOUNS[obj_pronoun] if obj_pronoun else None
        fr_adverb = ADVERBS[adverb] if adverb else None
        neg_word = "jamais" if adverb == "never" else "pas"
        if adverb == "never":
            negated, fr_adverb = True, None
        if modal:
            head = "peuvent" if plural else "peut"
            infinitive = ([_elide(clitic, verb.fr_inf)] if clitic else []) + [verb.fr_inf]
            fr = [_elide("ne", head), head, neg_word] if negated else [head]
            fr += [fr_adverb] if fr_adverb else []
            return en, fr + infinitive
        core = ([_elide(clitic, finite)] if clitic else []) + [finite]
        fr = [_elide("ne", core[0]), *core, neg_word] if negated else core
        fr += [fr_adverb] if fr_adverb else []
        return en, fr

    def predicate(self, plural: bool, feminine: bool, subject_kind: str, depth: int
                  ) -> tuple[list[str], list[str]]:
        """Everything after the subject: verb group, object(s), prepositional phrase."""
        rng, lv = self.rng, self.level
        if subject_kind not in ANIMATE or self._chance(0.12):
            return self._copula(plural, feminine, subject_kind)
        frame = rng.choices(FRAMES, weights=(3, 6, 1.2, 1.2))[0]
        verb = rng.choice(self._verbs_by_frame[frame])
        negated = self._chance(0.2)
        adverb = self._adverb(negated) if self._chance(0.15) else None
        modal = frame in ("intr", "tr") and self._chance(0.08)
        is_negative = negated or adverb == "never"

        obj_pronoun = None
        if frame == "tr" and self._chance(0.1):
            # "him" and "her" only for verbs whose object can be a person
            obj_pronoun = rng.choice(("him", "her", "them") if "person" in verb.objects else ("them",))
        en, fr = self._verb_group(verb, plural, obj_pronoun, negated, adverb, modal)
        if frame in ("tr", "ditr") and obj_pronoun is None:
            obj = self.noun_phrase(verb.objects, depth, allow_indefinite=not verb.liking)
            en += obj.english(negated_object=is_negative)
            fr += obj.french(negated_object=is_negative)
        if frame == "ditr":
            to = self.noun_phrase(ANIMATE, depth)
            en += ["to", *to.english()]
            fr += to.french(linker="à")
        elif frame == "motion":
            to = self.noun_phrase(("place",), depth)
            en += ["to", *to.english()]
            fr += to.french(linker="à")
        elif depth < lv.max_depth + 1 and self._chance(lv.p_pp):
            pp_en, pp_fr = self.prep_phrase(depth + 1, ("place", "thing", "person", "animal"))
            en += pp_en
            fr += pp_fr
        return en, fr

    def _copula(self, plural: bool, feminine: bool, subject_kind: str) -> tuple[list[str], list[str]]:
        """``is (not) (often) happy`` -> ``est (n'est pas) (souvent) heureux``, agreeing with the subject."""
        adj = self.rng.choice(self._adjectives[subject_kind])
        negated = self._chance(0.2)
        adverb = self._adverb(negated, allow_never=False) if self._chance(0.15) else None
        be_en, be_fr = ("are", "sont") if plural else ("is", "est")
        en = [be_en, *(["not"] if negated else []), *([adverb] if adverb else []), adj.en]
        fr = [_elide("ne", be_fr), be_fr, "pas"] if negated else [be_fr]
        fr += [ADVERBS[adverb]] if adverb else []
        return en, fr + [adj.form(feminine, plural)]

    def clause(self, depth: int = 0) -> tuple[list[str], list[str]]:
        """A subject and its predicate. Subjects of top-level clauses may be any kind of noun."""
        if self._chance(0.1):
            np_ = self.noun_phrase(("thing", "place"), depth)
            en_s, fr_s, plural, fem, kind = np_.english(), np_.french(), np_.plural, np_.feminine, "thing"
        else:
            en_s, fr_s, plural, fem = self.subject(depth)
            kind = "person"
        en_p, fr_p = self.predicate(plural, fem, kind, depth)
        return en_s + en_p, fr_s + fr_p

    def sentence(self) -> Pair:
        """One (English, French) pair of at most ``MAX_TOKENS`` English tokens.

        Draws a complexity level, then up to a few clauses joined by conjunctions; a sentence
        that comes out longer than ``MAX_TOKENS`` is drawn again.
        """
        while True:
            en, fr = self._sentence_words()
            if len(en) + 1 <= MAX_TOKENS:  # English words have no punctuation: tokens = words + "."
                return join_words(en), join_words(fr)

    def _sentence_words(self) -> tuple[list[str], list[str]]:
        self.level = self.rng.choices(self._levels, weights=self._level_weights)[0]
        n_clauses = self.rng.choices(range(1, len(self.level.clauses) + 1), weights=self.level.clauses)[0]
        en, fr = self.clause()
        for _ in range(n_clauses - 1):
            conj = self.rng.choice(list(CONJUNCTIONS))
            en_c, fr_c = self.clause()
            en += [conj, *en_c]
            fr += [_elide(CONJUNCTIONS[conj], fr_c[0]), *fr_c]
        return en, fr


# --------------------------------------------------------------------------- exact probabilities

_PP_KINDS_AFTER_VERB = ("place", "thing", "person", "animal")  # what predicate() passes to prep_phrase
_FRAME_WEIGHTS = (3, 6, 1.2, 1.2)  # predicate()'s weights of FRAMES


@dataclass(frozen=True)
class _VerbGroup:
    """One reading of an English verb group, as ``SentenceGenerator._verb_group`` writes it."""

    verb: Verb
    plural: bool
    negated: bool
    adverb: str | None
    modal: bool
    pronoun: str | None


class _SentenceParser:
    """Sums the probability of every way ``SentenceGenerator`` can write one English word sequence.

    A top-down chart parser that mirrors the generator function by function: each method returns
    ``{end: probability}`` (with the phrase's number where the caller needs it) for the words that
    the corresponding generator method, called with the same arguments, writes from ``start``. The
    probability of each random choice is the one ``random.Random`` gives it: ``_chance(p)`` is true
    with probability ``p``, ``choice`` is uniform, ``choices`` follows its weights. Results are
    memoised per start position, so ambiguous sentences (a prepositional phrase that attaches to the
    object or to the verb) are summed without enumerating their derivations one by one.
    """

    def __init__(self, gen: SentenceGenerator, words: Sequence[str], level: Complexity):
        self.gen, self.words, self.lv = gen, tuple(words), level
        self.memo: dict[tuple, dict] = {}
        self.nouns, self.verb_groups = _parse_tables(gen)

    # ---- helpers
    def _cached(self, key: tuple, compute: Callable[[], dict]) -> dict:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def _match(self, start: int, phrase: Sequence[str]) -> bool:
        return tuple(self.words[start:start + len(phrase)]) == tuple(phrase)

    def _adverb_prob(self, adverb: str, negated: bool, allow_never: bool = True) -> float:
        """P(``SentenceGenerator._adverb(negated, allow_never)`` returns ``adverb``)."""
        options = ("often", "always") if negated else [a for a in ADVERBS if allow_never or a != "never"]
        return options.count(adverb) / len(options)

    def _optional_pp(self, ends: dict[int, float], depth: int, p: float, kinds: Sequence[str]
                     ) -> dict[int, float]:
        """``if depth < max_depth + 1 and _chance(p): prep_phrase(depth + 1, kinds)`` after each end."""
        if not depth < self.lv.max_depth + 1:
            return ends
        out: dict[int, float] = {}
        for end, q in ends.items():
            out[end] = out.get(end, 0.0) + q * (1 - p)
            for end2, q2 in self.prep_phrase(end, depth + 1, tuple(kinds)).items():
                out[end2] = out.get(end2, 0.0) + q * p * q2
        return out

    # ---- noun phrases
    def noun_phrase(self, start: int, kinds: tuple[str, ...], depth: int, allow_rel: bool = True,
                    allow_indefinite: bool = True, negated_object: bool = False
                    ) -> dict[tuple[int, bool], float]:
        """``{(end, plural): probability}`` of ``noun_phrase(kinds, depth, ...).english(negated_object)``."""
        key = ("np", start, kinds, depth, allow_rel, allow_indefinite, negated_object)
        return self._cached(key, lambda: self._noun_phrase(start, kinds, depth, allow_rel,
                                                           allow_indefinite, negated_object))

    def _noun_phrase(self, start, kinds, depth, allow_rel, allow_indefinite, negated_object):
        words, gen = self.words, self.gen
        out: dict[tuple[int, bool], float] = {}
        if start >= len(words):
            return out
        det_weights = {"the": 6, "a": 3 if allow_indefinite else 0, "this": 1, "my": 1}
        readings = {"the": [("the", False), ("the", True)], "my": [("my", False), ("my", True)],
                    "this": [("this", False)], "these": [("this", True)],
                    "a": [("a", False)], "an": [("a", False)],
                    "some": [] if negated_object else [("a", True)],
                    "any": [("a", True)] if negated_object else []}.get(words[start], [])
        for det, plural in readings:
            p_det = det_weights[det] / sum(det_weights.values())
            if p_det == 0:
                continue
            for n_adj in (0, 1, 2):
                k = start + 1 + n_adj  # where the noun must be
                if k >= len(words):
                    break
                for noun, noun_plural in self.nouns.get(words[k], []):
                    if noun_plural != plural or noun.kind not in kinds:
                        continue
                    article = "an" if words[start + 1][0] in "aeiou" else "a"
                    if det == "a" and not plural and words[start] != article:
                        continue
                    p_noun = kinds.count(noun.kind) / len(kinds) / len(gen._nouns_by_kind[noun.kind])
                    p_adj = self._adjectives_prob(words[start + 1:k], gen._adjectives[noun.kind])
                    base = p_det * (0.3 if plural else 0.7) * p_noun * p_adj
                    if base == 0:
                        continue
                    for end, q in self._np_tail(k + 1, noun.kind, plural, depth, allow_rel).items():
                        out[end, plural] = out.get((end, plural), 0.0) + base * q
        return out

    def _adjectives_prob(self, adjs: Sequence[str], pool: list[Adjective]) -> float:
        """P(the adjectives drawn by ``noun_phrase`` for a noun of this pool are written ``adjs``)."""
        p_adj = self.lv.p_adj
        if not adjs:
            return 1 - p_adj
        first = [a for a in pool if a.en == adjs[0]]
        if len(adjs) == 1:  # a "before" adjective alone (0.6), or an "after" adjective
            return sum(p_adj / len(pool) * (0.6 if a.before else 1.0) for a in first)
        after = [a for a in pool if not a.before]
        second = [a for a in after if a.en == adjs[1]]
        return sum(p_adj / len(pool) * 0.4 / len(after) for a in first if a.before) * len(second)

    def _np_tail(self, start: int, kind: str, plural: bool, depth: int, allow_rel: bool) -> dict[int, float]:
        """The words after the noun: an optional prepositional phrase, then an optional relative clause."""
        ends = self._optional_pp({start: 1.0}, depth, self.lv.p_pp * 0.6, ANY)
        if not (allow_rel and depth < self.lv.max_depth):
            return ends
        p_rel = self.lv.p_rel
        out: dict[int, float] = {}
        for end, q in ends.items():
            out[end] = out.get(end, 0.0) + q * (1 - p_rel)
            for end2, q2 in self.relative_clause(end, kind, plural, depth + 1).items():
                out[end2] = out.get(end2, 0.0) + q * p_rel * q2
        return out

    def prep_phrase(self, start: int, depth: int, kinds: tuple[str, ...]) -> dict[int, float]:
        """``{end: probability}`` of ``prep_phrase(depth, kinds)``'s English words."""
        return self._cached(("pp", start, depth, kinds), lambda: self._prep_phrase(start, depth, kinds))

    def _prep_phrase(self, start, depth, kinds):
        fitting = _fitting_prepositions(kinds)
        out: dict[int, float] = {}
        if start >= len(self.words) or self.words[start] not in _PREPOSITION_FIRST_WORDS:
            return out
        for prep, noun_kinds in fitting.items():
            prep_words = _PREPOSITION_WORDS[prep]
            if self.words[start:start + len(prep_words)] != prep_words:
                continue
            nps = self.noun_phrase(start + len(prep_words), noun_kinds, depth, allow_rel=False,
                                   negated_object=prep == "without")
            for (end, _), q in nps.items():
                out[end] = out.get(end, 0.0) + q / len(fitting)
        return out

    def relative_clause(self, start: int, kind: str, plural: bool, depth: int) -> dict[int, float]:
        """``{end: probability}`` of ``relative_clause(head, depth)`` for a head of this kind and number."""
        return self._cached(("rel", start, kind, plural, depth),
                            lambda: self._relative_clause(start, kind, plural, depth))

    def _relative_clause(self, start, kind, plural, depth):
        out: dict[int, float] = {}
        p_object = 1.0
        if kind in ANIMATE:
            p_object = 0.5
            if self._match(start, ["that"]):
                for end, q in self.predicate(start + 1, plural, kind, depth).items():
                    out[end] = out.get(end, 0.0) + 0.5 * q
        verbs = [v for v in self.gen._verbs_by_frame["tr"] if kind in v.objects]
        if not verbs:  # the generator writes nothing
            out[start] = out.get(start, 0.0) + p_object
            return out
        if not self._match(start, ["that"]):
            return out
        for (mid, subj_plural), q in self.subject(start + 1, depth).items():
            for end, group in self._verb_groups_at(mid):
                if group.verb not in verbs or group.plural != subj_plural or group.pronoun is not None:
                    continue
                p = (0.15 if group.negated else 0.85) * (0.05 if group.modal else 0.95)
                p *= (0.1 * self._adverb_prob(group.adverb, group.negated)) if group.adverb else 0.9
                out[end] = out.get(end, 0.0) + p_object * q * p / len(verbs)
        return out

    # ---- clauses
    def subject(self, start: int, depth: int) -> dict[tuple[int, bool], float]:
        """``{(end, plural): probability}`` of ``subject(depth)``'s English words."""
        return self._cached(("subj", start, depth), lambda: self._subject(start, depth))

    def _subject(self, start, depth):
        out: dict[tuple[int, bool], float] = {}
        if start < len(self.words) and self.words[start] in SUBJECT_PRONOUNS:
            out[start + 1, False] = 0.08 / len(SUBJECT_PRONOUNS)
        for key, q in self.noun_phrase(start, ANIMATE, depth).items():
            out[key] = out.get(key, 0.0) + 0.92 * q
        return out

    def _verb_groups_at(self, start: int) -> list[tuple[int, _VerbGroup]]:
        found = []
        for length in range(1, 7):
            for group in self.verb_groups.get(self.words[start:start + length], ()):
                found.append((start + length, group))
        return found

    def predicate(self, start: int, plural: bool, kind: str, depth: int) -> dict[int, float]:
        """``{end: probability}`` of ``predicate(plural, feminine, kind, depth)``'s English words."""
        return self._cached(("pred", start, plural, kind, depth),
                            lambda: self._predicate(start, plural, kind, depth))

    def _predicate(self, start, plural, kind, depth):
        if kind not in ANIMATE:
            return self.copula(start, plural, kind)
        out = {end: 0.12 * q for end, q in self.copula(start, plural, kind).items()}
        for mid, group in self._verb_groups_at(start):
            if group.plural != plural:
                continue
            verb, frame = group.verb, group.verb.frame
            p = 0.88 * _FRAME_WEIGHTS[FRAMES.index(frame)] / sum(_FRAME_WEIGHTS)
            p /= len(self.gen._verbs_by_frame[frame])
            p *= 0.2 if group.negated else 0.8
            p *= (0.15 * self._adverb_prob(group.adverb, group.negated)) if group.adverb else 0.85
            if frame in ("intr", "tr"):
                p *= 0.08 if group.modal else 0.92
            elif group.modal:
                continue
            if frame == "tr":
                options = ("him", "her", "them") if "person" in verb.objects else ("them",)
                p *= 0.1 * options.count(group.pronoun) / len(options) if group.pronoun else 0.9
            elif group.pronoun is not None:
                continue
            if p == 0:
                continue
            negative = group.negated or group.adverb == "never"
            ends = {mid: p}
            if frame in ("tr", "ditr") and group.pronoun is None:
                ends = self._then_np(ends, verb.objects, depth, allow_indefinite=not verb.liking,
                                     negated_object=negative)
            if frame in ("ditr", "motion"):
                ends = {e + 1: q for e, q in ends.items() if self._match(e, ["to"])}
                ends = self._then_np(ends, ANIMATE if frame == "ditr" else ("place",), depth)
            else:
                ends = self._optional_pp(ends, depth, self.lv.p_pp, _PP_KINDS_AFTER_VERB)
            for end, q in ends.items():
                out[end] = out.get(end, 0.0) + q
        return out

    def _then_np(self, ends: dict[int, float], kinds: Sequence[str], depth: int, **kwargs: bool
                 ) -> dict[int, float]:
        out: dict[int, float] = {}
        for end, q in ends.items():
            for (end2, _), q2 in self.noun_phrase(end, tuple(kinds), depth, **kwargs).items():
                out[end2] = out.get(end2, 0.0) + q * q2
        return out

    def copula(self, start: int, plural: bool, kind: str) -> dict[int, float]:
        """``{end: probability}`` of ``_copula(plural, feminine, kind)``: ``is (not) (often) happy``."""
        words, out = self.words, {}
        if not self._match(start, ["are" if plural else "is"]):
            return out
        pool = self.gen._adjectives[kind]
        for negated in (False, True):
            i = start + 1 + negated
            if negated and not self._match(start + 1, ["not"]):
                continue
            p_neg = 0.2 if negated else 0.8
            for adverb in (None, *ADVERBS):
                j = i + (adverb is not None)
                if adverb is not None and not self._match(i, [adverb]):
                    continue
                p_adv = 0.15 * self._adverb_prob(adverb, negated, allow_never=False) if adverb else 0.85
                if j < len(words) and p_adv > 0:
                    n_adj = sum(a.en == words[j] for a in pool)
                    if n_adj:
                        out[j + 1] = out.get(j + 1, 0.0) + p_neg * p_adv * n_adj / len(pool)
        return out

    def clause(self, start: int) -> dict[int, float]:
        """``{end: probability}`` of ``clause()`` (depth 0)."""
        return self._cached(("clause", start), lambda: self._clause(start))

    def _clause(self, start):
        out: dict[int, float] = {}
        for (mid, plural), q in self.noun_phrase(start, ("thing", "place"), 0).items():
            for end, q2 in self.predicate(mid, plural, "thing", 0).items():
                out[end] = out.get(end, 0.0) + 0.1 * q * q2
        for (mid, plural), q in self.subject(start, 0).items():
            for end, q2 in self.predicate(mid, plural, "person", 0).items():
                out[end] = out.get(end, 0.0) + 0.9 * q * q2
        return out

    def sentence_words(self) -> float:
        """P(``_sentence_words()`` writes exactly these English words | this complexity level)."""
        weights = self.lv.clauses
        total, ends = 0.0, self.clause(0)
        for n_clauses, w in enumerate(weights, start=1):
            total += w / sum(weights) * ends.get(len(self.words), 0.0)
            if n_clauses == len(weights):
                break
            more: dict[int, float] = {}
            for end, q in ends.items():
                if end < len(self.words) and self.words[end] in CONJUNCTIONS:
                    for end2, q2 in self.clause(end + 1).items():
                        more[end2] = more.get(end2, 0.0) + q / len(CONJUNCTIONS) * q2
            ends = more
        return total


_PREPOSITION_WORDS = {prep: tuple(prep.split()) for prep in PREPOSITIONS}
_PREPOSITION_FIRST_WORDS = {words[0] for words in _PREPOSITION_WORDS.values()}


@functools.cache
def _fitting_prepositions(kinds: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The prepositions ``prep_phrase(depth, kinds)`` can draw, with their noun kinds (it redraws others)."""
    fitting = {prep: tuple(k for k in _PREP_OBJECTS[prep] if k in kinds) for prep in PREPOSITIONS}
    return {prep: ks for prep, ks in fitting.items() if ks}


_Tables = tuple[dict[str, list[tuple[Noun, bool]]], dict[tuple[str, ...], list[_VerbGroup]]]


def _parse_tables(gen: SentenceGenerator) -> _Tables:
    """English noun forms and every verb group the generator can write, keyed by their words.

    Built once per lexicon and kept on the generator (rebuilt if its lexicon tables are replaced).
    """
    key = (id(gen._nouns_by_kind), id(gen._verbs_by_frame))
    cached = getattr(gen, "_parse_tables_cache", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    nouns: dict[str, list[tuple[Noun, bool]]] = {}
    for kind_nouns in gen._nouns_by_kind.values():
        for noun in kind_nouns:
            nouns.setdefault(noun.en, []).append((noun, False))
            nouns.setdefault(noun.en_plural, []).append((noun, True))
    table: dict[tuple[str, ...], list[_VerbGroup]] = {}
    for verb in (v for f in FRAMES for v in gen._verbs_by_frame[f]):
        for plural in (False, True):
            for negated in (False, True):
                for adverb in (None, *ADVERBS):
                    for modal in (False, True):
                        for pronoun in (None, *OBJECT_PRONOUNS):
                            en, _ = gen._verb_group(verb, plural, pronoun, negated, adverb, modal)
                            table.setdefault(tuple(en), []).append(
                                _VerbGroup(verb, plural, negated, adverb, modal, pronoun))
    gen._parse_tables_cache = (key, (nouns, table))
    return nouns, table


_DEFAULT_GENERATOR: list[SentenceGenerator] = []  # the bundled grammar's lexicon, built on first use


def _default_generator() -> SentenceGenerator:
    if not _DEFAULT_GENERATOR:
        _DEFAULT_GENERATOR.append(SentenceGenerator(0))
    return _DEFAULT_GENERATOR[0]


def sentence_probability(sentence: str | Sequence[str], generator: SentenceGenerator | None = None) -> float:
    """The exact probability that one call of ``SentenceGenerator.sentence()`` writes this English sentence.

    ``sentence`` is the English side of a pair (``"a farmer hears my goat."``) or its tokens
    (``tokenize`` of it, the final ``"."`` included). The result sums over every derivation that
    writes these words (the complexity level, prepositional-phrase attachment, ...), each the product
    of the probabilities of its random choices. It is the probability of *one draw*: the length limit
    of ``sentence()`` (drawing again above ``MAX_TOKENS``) and the deduplication of
    :func:`generate_pairs` renormalise it, see :func:`length_rejection_rate` and
    :func:`corpus_log_probs`. ``generator`` supplies the lexicon (default: the bundled grammar's);
    a sentence the grammar cannot write gets 0.

    >>> round(sentence_probability("he sleeps."), 9)  # see tests/test_synthetic.py for the hand computation
    0.000217949
    """
    gen = generator if generator is not None else _default_generator()
    if isinstance(sentence, str):
        if not sentence.endswith("."):
            raise ValueError(f"sentence_probability: an English sentence ends with '.', got {sentence!r}")
        words = sentence[:-1].split()
    else:
        words = list(sentence)
        if not words or words[-1] != ".":
            raise ValueError(f"sentence_probability: tokens must end with '.', got {words!r}")
        words = words[:-1]
    if not words:
        return 0.0
    total_weight = sum(gen._level_weights)
    return sum(w / total_weight * _SentenceParser(gen, words, lv).sentence_words()
               for w, lv in zip(gen._level_weights, gen._levels, strict=True))


def length_rejection_rate(n_draws: int = 100_000, seed: int = 0) -> tuple[float, float]:
    """Monte Carlo estimate of how often ``sentence()`` draws a sentence over ``MAX_TOKENS`` and redraws.

    Returns ``(rate, standard_error)`` from ``n_draws`` fresh draws of the grammar. The probability
    of a sentence *as written* is ``sentence_probability(s) / (1 - rate)``: the length limit
    renormalises the distribution over the sentences it keeps. (The exact rate would need the
    grammar's whole length distribution; this estimate is what :func:`corpus_log_probs` uses.)
    """
    if not isinstance(n_draws, int) or isinstance(n_draws, bool) or n_draws <= 0:
        raise ValueError(f"length_rejection_rate: n_draws must be a positive int, got {n_draws!r}")
    gen = SentenceGenerator(seed)
    rejected = sum(len(gen._sentence_words()[0]) + 1 > MAX_TOKENS for _ in range(n_draws))
    rate = rejected / n_draws
    return rate, (rate * (1 - rate) / n_draws) ** 0.5


def corpus_log_probs(sentences: Sequence[str], history: Iterable[str] = (), rejection_rate: float = 0.0,
                     generator: SentenceGenerator | None = None) -> list[float]:
    """The natural-log probability of each English sentence as :func:`generate_pairs` wrote it.

    ``generate_pairs`` draws sentences one after the other and skips any English sentence it has
    written before, so the ``k``-th sentence it keeps is a draw from the grammar *conditioned on
    being new*: with ``p = sentence_probability``, ``A = 1 - rejection_rate`` (the length limit)
    and ``M_k`` the summed ``p`` of every distinct sentence written before it,

        ``log P(sentences[k] | everything before) = log p(sentences[k]) - log(A - M_k)``.

    ``history`` holds the sentences written before ``sentences[0]`` (for the validation split of
    the bundled corpus: the whole training split; a partial history gives a smaller ``M`` and so a
    lower bound on each log-probability). The sum of the result over a split, divided by its number
    of predicted tokens, is the cross-entropy of the process that wrote it: no model of these
    sentences can do better on average (chapter 01 shows it beside the language models).
    ``ValueError`` for a sentence the grammar cannot write or a ``rejection_rate`` outside ``[0, 1)``.
    """
    if not 0.0 <= rejection_rate < 1.0:
        raise ValueError(f"corpus_log_probs: rejection_rate must be in [0, 1), got {rejection_rate!r}")
    gen = generator if generator is not None else _default_generator()
    seen: set[str] = set()
    mass = 0.0
    for s in history:
        if s not in seen:
            seen.add(s)
            mass += sentence_probability(s, gen)
    out = []
    for s in sentences:
        p = sentence_probability(s, gen)
        if p == 0.0:
            raise ValueError(f"corpus_log_probs: the grammar cannot write {s!r}")
        if s in seen:
            raise ValueError(f"corpus_log_probs: {s!r} occurs twice, which generate_pairs never writes")
        out.append(math.log(p) - math.log(1.0 - rejection_rate - mass))
        seen.add(s)
        mass += p
    return out


# --------------------------------------------------------------------------- corpus API


def generate_pairs(n: int, seed: int = 0) -> list[Pair]:
    """``n`` distinct (English, French) pairs, the same for the same ``(n, seed)`` on every machine.

    Sentences are drawn one after the other; an English sentence seen before is skipped, so all
    English sentences differ (and splits cut from the list share none).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"generate_pairs: n must be a positive int, got {n!r}")
    gen = SentenceGenerator(seed)
    seen: set[str] = set()
    pairs: list[Pair] = []
    attempts = 0
    while len(pairs) < n:
        attempts += 1
        if attempts > 20 * n + 1000:
            raise RuntimeError(f"generate_pairs: could not find {n} distinct sentences")
        en, fr = gen.sentence()
        if en not in seen:
            seen.add(en)
            pairs.append((en, fr))
    return pairs


BUNDLED_SEED = 2024
BUNDLED_SIZES: dict[str, int] = {"train": 50_000, "valid": 2_500, "test": 2_500}
SPLITS = tuple(BUNDLED_SIZES)
_REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def bundled_dir() -> Path:
    """The corpus folder: ``$TFM_DATA_DIR/synthetic_en_fr``, else ``<repo>/data/synthetic_en_fr``."""
    return Path(os.environ.get("TFM_DATA_DIR") or _REPO_DATA_DIR) / "synthetic_en_fr"


BUNDLED_DIR: Path = bundled_dir()


def bundled_splits(seed: int = BUNDLED_SEED) -> dict[str, list[Pair]]:
    """Generate the bundled corpus and cut it into train / valid / test (sizes in ``BUNDLED_SIZES``)."""
    pairs = generate_pairs(sum(BUNDLED_SIZES.values()), seed)
    splits, start = {}, 0
    for name, size in BUNDLED_SIZES.items():
        splits[name] = pairs[start:start + size]
        start += size
    return splits


def load_bundled(split: str, data_dir: str | Path | None = None) -> list[Pair]:
    """Read one split (``"train"``, ``"valid"`` or ``"test"``) of the bundled corpus.

    ``data_dir`` defaults to :func:`bundled_dir` (``TFM_DATA_DIR`` is read at call time).
    """
    if split not in BUNDLED_SIZES:
        raise ValueError(f"load_bundled: split must be one of {list(SPLITS)}, got {split!r}")
    path = Path(data_dir) if data_dir is not None else bundled_dir()
    path = path / f"{split}.tsv.gz"
    if not path.exists():
        raise FileNotFoundError(
            f"load_bundled: {path} is missing; regenerate the bundled corpus with "
            f"`python -m tfmlib.synthetic --out {path.parent}`"
        )
    return read_pairs_tsv(path)


def write_bundled(out_dir: str | Path | None = None, seed: int = BUNDLED_SEED) -> dict[str, Path]:
    """Generate the corpus and write ``{train,valid,test}.tsv.gz`` into ``out_dir`` (reproducible bytes).

    ``out_dir`` defaults to :func:`bundled_dir`. Returns the path of each split.
    """
    out = Path(out_dir) if out_dir is not None else bundled_dir()
    paths = {}
    for name, pairs in bundled_splits(seed).items():
        paths[name] = out / f"{name}.tsv.gz"
        write_pairs_tsv(paths[name], pairs)
    return paths


# --------------------------------------------------------------------------- describing a corpus


def length_histogram(pairs: Iterable[Pair], side: int = 0) -> dict[int, int]:
    """``{length: count}`` of token lengths (``tokenize``, the period included), sorted by length.

    ``side`` is 0 for the source (English) and 1 for the target (French).
    """
    if side not in (0, 1) or isinstance(side, bool):
        raise ValueError(f"length_histogram: side must be 0 (source) or 1 (target), got {side!r}")
    counts = Counter(len(tokenize(p[side])) for p in pairs)
    return dict(sorted(counts.items()))


def length_buckets(pairs: Sequence[Pair], edges: Sequence[int] = (3, 11, 18, 25, 40), side: int = 0
                   ) -> list[tuple[str, int, float]]:
    """Counts of lengths in ``[edges[i], edges[i+1])`` and ``>= edges[-1]``: ``(label, count, fraction)``.

    ``edges`` must be non-empty and strictly increasing (``ValueError`` otherwise).
    """
    if len(edges) == 0 or any(edges[i] >= edges[i + 1] for i in range(len(edges) - 1)):
        raise ValueError(f"length_buckets: edges must be non-empty and strictly increasing, "
                         f"got {list(edges)}")
    hist = length_histogram(pairs, side)
    total = sum(hist.values())
    rows = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        count = sum(c for n, c in hist.items() if n >= lo and (hi is None or n < hi))
        label = f"{lo}-{hi - 1}" if hi is not None else f">={lo}"
        rows.append((label, count, count / total if total else 0.0))
    return rows


def vocabulary_sizes(pairs: Iterable[Pair]) -> tuple[int, int]:
    """Number of distinct tokens in the English and in the French side."""
    en: set[str] = set()
    fr: set[str] = set()
    for s, t in pairs:
        en.update(tokenize(s))
        fr.update(tokenize(t))
    return len(en), len(fr)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the bundled English->French corpus.")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: {BUNDLED_DIR})")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    paths = write_bundled(args.out)
    seconds = time.perf_counter() - t0
    total = 0
    for name, path in paths.items():
        size = path.stat().st_size
        total += size
        print(f"{name:>5}: {BUNDLED_SIZES[name]:>6} pairs  {size / 1e6:6.2f} MB  {path}")
    print(f"total: {sum(BUNDLED_SIZES.values()):>6} pairs  {total / 1e6:6.2f} MB  in {seconds:.1f} s")


if __name__ == "__main__":
    main()
