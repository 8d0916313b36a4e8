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
corpus is identical on every machine. ``python -m tfmlib.synthetic`` rewrites the bundled files in
``data/synthetic_en_fr/``; ``load_bundled("train")`` reads them back.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
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
        self.level = self.rng.choices([lv for _, lv in LEVELS], weights=self._level_weights)[0]
        n_clauses = self.rng.choices(range(1, len(self.level.clauses) + 1), weights=self.level.clauses)[0]
        en, fr = self.clause()
        for _ in range(n_clauses - 1):
            conj = self.rng.choice(list(CONJUNCTIONS))
            en_c, fr_c = self.clause()
            en += [conj, *en_c]
            fr += [_elide(CONJUNCTIONS[conj], fr_c[0]), *fr_c]
        return en, fr


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
