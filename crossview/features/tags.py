"""Tags of a caption: its nouns and verbs, lemmatised (the webly method's tags for clean data, paper 003).

``extract_tags("A black dog is running through the grass .") == ["dog", "run", "grass"]``

Two back ends, chosen automatically (:func:`tagger_backend` says which one is in use):

``"perceptron"`` (used when installed; both packages are dependencies of CrossView)
    Part-of-speech tags from Matthew Honnibal's greedy averaged-perceptron tagger, the model that ships
    in the PyPI package ``textblob-aptagger`` (``trontagger-0.1.0.pickle``, Penn Treebank tags, trained
    on the WSJ; MIT licence; its author reports about 97% per-token accuracy on WSJ text). The model
    file is read with an unpickler that admits plain containers only, and the tagger's feature
    templates are re-implemented here exactly as the model was trained with them (no TextBlob import).
    Lemmas come from ``lemminflect`` (MIT; the NIH SPECIALIST lexicon plus rules for unknown words).
``"rules"`` (the fallback, also selectable with ``backend="rules"``)
    A closed-class word list (determiners, pronouns, prepositions, conjunctions, auxiliaries,
    numerals, adverbs), a small lexicon of caption adjectives and verbs, and context rules (a word
    after a determiner is a noun or adjective; ``-ing`` / ``-ed`` after a noun or auxiliary is a verb;
    anything else open-class is a noun), with a suffix-rule lemmatiser and tables of irregular forms.

Two caption-domain corrections are applied on top of the perceptron (see ``_caption_corrections``).

Measured on real Flickr8k captions hand-labelled in ``tests/test_tags.py`` (micro precision / recall;
the test states the labelling policy). On 30 held-out captions (139 tags), labelled after the code was
written and never used to tune it: perceptron 0.98 / 0.99, rules 0.99 / 0.98. On the 32 development
captions that the rules' lexicon and the corrections were tuned on: 1.00 / 0.99 and 1.00 / 1.00
(optimistic). The rules' lexicon is made for short scene captions; on other prose expect the rules
to fall well behind the perceptron. Forms of *be*, *have* and *do* are never tags (auxiliaries and
light verbs), nor are words shorter than two letters or without a letter. Tags keep the caption's
order, each once; proper nouns are lower-cased but not lemmatised.
"""

from __future__ import annotations

import importlib.util
import logging
import pickle
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

__all__ = ["extract_tags", "caption_tags", "pos_tag", "tagger_backend", "lemmatize", "BACKENDS"]

log = logging.getLogger(__name__)

BACKENDS = ("perceptron", "rules")
_SKIP_LEMMAS = frozenset({"be", "have", "do"})
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*|[^\sA-Za-z0-9]")


def _tokens(caption: str) -> list[str]:
    """Penn Treebank-like tokens: words (hyphenated kept whole), punctuation, clitics split off."""
    out = []
    for t in _TOKEN.findall(caption):
        low = t.lower()
        if low.endswith("n't") and len(t) > 3:
            out += [t[:-3], t[-3:]]
        elif "'" in t and not low.endswith("n't"):
            i = t.index("'")
            out += [t[:i], t[i:]] if i > 0 else [t]
        else:
            out.append(t)
    return [t for t in out if t]


# ====================================================================== averaged perceptron
class _SafeUnpickler(pickle.Unpickler):
    """The model is dicts, strings, floats and a set: refuse anything else (no code runs on load)."""

    _ALLOWED = {("__builtin__", "set"), ("builtins", "set"), ("__builtin__", "frozenset"),
                ("builtins", "frozenset")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a tagger model")


@lru_cache(maxsize=1)
def _perceptron_model() -> tuple[dict, dict, list] | None:
    """``(weights, tagdict, classes)`` of the packaged tagger, or None when it is not installed."""
    spec = importlib.util.find_spec("textblob_aptagger")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "trontagger-0.1.0.pickle"
    try:
        with open(path, "rb") as f:
            weights, tagdict, classes = _SafeUnpickler(f, encoding="latin1").load()
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as e:
        log.warning("POS tagger model %s unreadable (%s); using the rule-based tagger", path, e)
        return None
    return weights, tagdict, sorted(classes)


def _normalize(word: str) -> str:
    if "-" in word and word[0] != "-":
        return "!HYPHEN"
    if word.isdigit() and len(word) == 4:
        return "!YEAR"
    if word[0].isdigit():
        return "!DIGITS"
    return word.lower()


def _perceptron_tag(words: list[str], model: tuple[dict, dict, list]) -> list[str]:
    """Greedy left-to-right tagging with the feature templates the model was trained on."""
    weights, tagdict, classes = model
    context = ["-START-", "-START2-"] + [_normalize(w) for w in words] + ["-END-", "-END2-"]
    prev, prev2 = "-START-", "-START2-"
    tags = []
    for i, word in enumerate(words):
        tag = tagdict.get(word)
        if not tag:
            j = i + 2
            feats = ("bias", "i suffix " + word[-3:], "i pref1 " + word[0], "i-1 tag " + prev,
                     "i-2 tag " + prev2, f"i tag+i-2 tag {prev} {prev2}", "i word " + context[j],
                     f"i-1 tag+i word {prev} {context[j]}", "i-1 word " + context[j - 1],
                     "i-1 suffix " + context[j - 1][-3:], "i-2 word " + context[j - 2],
                     "i+1 word " + context[j + 1], "i+1 suffix " + context[j + 1][-3:],
                     "i+2 word " + context[j + 2])
            scores: dict[str, float] = {}
            for f in feats:
                for label, w in weights.get(f, {}).items():
                    scores[label] = scores.get(label, 0.0) + w
            # ties broken alphabetically, as in the original implementation
            tag = max(classes, key=lambda label: (scores.get(label, 0.0), label))
        tags.append(tag)
        prev2, prev = prev, tag
    return tags


def _caption_corrections(words: list[str], tags: list[str]) -> list[str]:
    """Two fixes for the newswire-trained model on captions (reduced relatives, colour/terrain words).

    - an ``-ing`` word tagged NN right after a noun and before a preposition, determiner, adverb or
      the end ("a bird standing on rocks") is a verb (VBG), unless it is a known -ing noun;
    - a caption adjective of the lexicon below tagged NN before a noun ("a snowy mountain") is JJ.
    """
    out = list(tags)
    n = len(words)
    for i, (w, t) in enumerate(zip(words, tags)):
        low = w.lower()
        nxt = out[i + 1] if i + 1 < n else "END"
        if t == "NN" and low.endswith("ing") and low not in _ING_NOUNS and i > 0 \
                and out[i - 1] in ("NN", "NNS") and (nxt in ("IN", "DT", "RB", "TO", "RP", ".", ",", "END")):
            out[i] = "VBG"
        elif t == "NN" and low in _ADJECTIVES and nxt.startswith("NN"):
            out[i] = "JJ"
    return out


# ====================================================================== rule-based fallback
_DETERMINERS = set("""a an the this that these those some each every another other both all no any either
neither several many few much more most such his her their its my our your whose one two three four five
six seven eight nine ten eleven twelve dozen hundred""".split())
_PRONOUNS = set("""i me you he him she it we us they them myself yourself himself herself itself ourselves
themselves who whom what which someone somebody anyone everyone nobody one's""".split())
_PREPOSITIONS = set("""in on at with through over under above below across along around into onto onward
from to of by for about against among amongst atop behind beside besides between beyond down up
during except inside outside near off out toward towards upon within without underneath beneath past
via like unlike than as while whilst""".split())
_CONJUNCTIONS = set("and or but nor so yet because if though although when where whether then".split())
_AUX = set("""is are was were be been being am 's 're has have had having does do did doing done can could
will would shall should may might must""".split())
_ADVERBS = set("""not n't very too also just only almost away back here there together still again ever
never quite rather really so even now soon already nearly about around forward backwards backward
upward downward upside sideways apart alone instead outdoors indoors overhead nearby""".split())
_CLOSED = _DETERMINERS | _PRONOUNS | _PREPOSITIONS | _CONJUNCTIONS | _AUX | _ADVERBS
_ADJECTIVES = set("""black white brown red blue green yellow orange pink purple gray grey tan golden silver
dark light bright colorful colourful striped spotted plaid big large small little tiny huge giant tall short
long young old older elderly new wet dry snowy grassy rocky sandy muddy dirty dusty sunny cloudy shady
shallow deep steep high low wide narrow open empty full busy crowded asian african american indian
chinese male female happy sad funny cute fluffy furry shaggy curly blond blonde brunette bald naked
shirtless topless first second third last next same different other several various many few hot cold
warm cool frozen icy outdoor indoor fat thin skinny heavy
wooden metal plastic rubber leather colored coloured multicolored multi-colored fancy formal casual
professional blurry distant wild tame lush clear calm rough smooth pretty beautiful ugly quiet loud
fast slow strange unusual traditional local public private giant gray-haired dark-haired""".split())
_VERBS = set("""run jump play sit stand walk ride hold wear look swim climb catch carry throw lie lay pose
smile watch fly dive chase eat drink bite fetch kick hit swing slide skate surf ski snowboard skateboard
race wait talk sing dance read write paint draw cook cut push pull drag lift raise wave
point fight wrestle splash spray wade float paddle row sail hike perform practice compete cross
descend ascend lean rest sleep lick sniff bark smell touch hug kiss shake laugh cry yell scream shout
stare gaze face look peer observe listen hang balance leap roll fall trip tumble crawl kneel squat bend
stretch reach grab use stroll dress travel pick drop pass shoot serve block tackle dribble score bounce toss spin twirl
travel drive stop pause enter exit leave arrive approach follow lead guide pet feed groom bathe
wash clean dry fill pour blow pop build dig plant grow cover open close sell buy chew
examine inspect check work help show give take make get go come move turn stroll jog sprint
march gather herd graze stalk hunt explore browse celebrate cheer clap
""".split())
_IRREGULAR_VERBS = {
    "ran": "run", "sat": "sit", "stood": "stand", "rode": "ride", "ridden": "ride", "held": "hold",
    "wore": "wear", "worn": "wear", "swam": "swim", "swum": "swim", "caught": "catch", "threw": "throw",
    "thrown": "throw", "lay": "lie", "lain": "lie", "lying": "lie", "flew": "fly", "flown": "fly",
    "ate": "eat", "eaten": "eat", "drank": "drink", "drunk": "drink", "fell": "fall", "fallen": "fall",
    "took": "take", "taken": "take", "gave": "give", "given": "give", "made": "make", "saw": "see",
    "seen": "see", "went": "go", "gone": "go", "got": "get", "gotten": "get", "came": "come",
    "began": "begin", "begun": "begin", "sang": "sing", "sung": "sing", "hung": "hang", "led": "lead",
    "left": "leave", "met": "meet", "said": "say", "shot": "shoot", "slid": "slide", "spun": "spin",
    "stuck": "stick", "struck": "strike", "swung": "swing", "thought": "think", "bought": "buy",
    "brought": "bring", "built": "build", "dug": "dig", "drew": "draw", "drawn": "draw", "drove": "drive",
    "driven": "drive", "fought": "fight", "found": "find", "grew": "grow", "grown": "grow", "kept": "keep",
    "knelt": "kneel", "leapt": "leap", "lit": "light", "sent": "send", "sold": "sell", "taught": "teach",
    "tore": "tear", "torn": "tear", "woke": "wake", "won": "win", "wrote": "write", "written": "write",
    "bit": "bite", "bitten": "bite", "blew": "blow", "blown": "blow", "broke": "break", "broken": "break",
    "chose": "choose", "dove": "dive", "froze": "freeze", "hid": "hide", "shook": "shake", "sank": "sink",
    "spat": "spit", "stole": "steal", "swept": "sweep", "strode": "stride", "dying": "die", "tying": "tie",
    "fed": "feed", "is": "be", "are": "be", "was": "be", "were": "be", "am": "be", "been": "be",
    "being": "be", "has": "have", "had": "have", "having": "have", "does": "do", "did": "do", "done": "do",
    "doing": "do", "felt": "feel", "heard": "hear", "lost": "lose", "paid": "pay", "sped": "speed",
}
_ING_NOUNS = set("""building clothing ceiling painting railing wedding evening morning something anything
nothing everything thing king ring string spring wing swing sibling pudding icing awning earring
sling lightning ping ding darling duckling seedling dumpling stuffing bedding siding opening""".split())
_LY_NOUNS = set("family lily ally belly jelly bully fly butterfly dragonfly rally holly".split())
_IRREGULAR_NOUNS = {"men": "man", "women": "woman", "children": "child", "feet": "foot",
                    "teeth": "tooth", "mice": "mouse", "geese": "goose", "oxen": "ox", "knives": "knife",
                    "leaves": "leaf", "wolves": "wolf", "shelves": "shelf", "halves": "half", "lives": "life",
                    "wives": "wife", "calves": "calf", "loaves": "loaf", "scarves": "scarf",
                    "buses": "bus", "dice": "die", "policemen": "policeman", "firemen": "fireman"}
_PLURAL_ONLY = set("""jeans pants shorts trunks trousers glasses sunglasses goggles clothes scissors
overalls tights leggings binoculars pajamas pyjamas swimtrunks people police cattle sheep fish deer news
series species grass glass tennis bus gas dress""".split())
_ADJ_SUFFIXES = ("ful", "ous", "less", "able", "ible", "ive", "ish")
_ADJ_SUFFIX_NOUNS = set("olive detective relative cable table stable fable vegetable".split())
_VOWELS = set("aeiou")


def _restore_stem(stem: str) -> str:
    """Base form from the stem left after cutting -ing / -ed (runn -> run, smil -> smile)."""
    if stem in _VERBS:
        return stem
    if stem + "e" in _VERBS:
        return stem + "e"
    doubled = len(stem) >= 3 and stem[-1] == stem[-2] and stem[-1] not in _VOWELS
    if doubled and (stem[:-1] in _VERBS or stem[-1] not in "lsz" or len(stem) >= 6):
        return stem[:-1]  # runn -> run; travell / modell -> travel / model (British doubling)
    if stem.endswith(("v", "c", "z")) or stem.endswith("us"):
        return stem + "e"
    if (len(stem) <= 4 and len(stem) >= 3 and stem[-1] not in _VOWELS and stem[-1] not in "wxy"
            and stem[-2] in _VOWELS and stem[-3] not in _VOWELS):
        return stem + "e"
    return stem


def _rule_lemma(word: str, pos: str) -> str:
    w = word.lower()
    if pos == "NOUN":
        if w in _IRREGULAR_NOUNS:
            return _IRREGULAR_NOUNS[w]
        if w in _PLURAL_ONLY or len(w) <= 3 or not w.endswith("s"):
            return w
        if w.endswith("ies") and len(w) > 4:
            return w[:-3] + "y"
        if w.endswith(("sses", "xes", "ches", "shes")):
            return w[:-2]
        if w.endswith(("ss", "us", "is")):
            return w
        return w[:-1]
    if w in _IRREGULAR_VERBS:
        return _IRREGULAR_VERBS[w]
    if w.endswith("ing") and len(w) > 4:
        return _restore_stem(w[:-3])
    if w.endswith("ied") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith("ed") and len(w) > 3:
        return w[:-1] if w[:-1] in _VERBS else _restore_stem(w[:-2])
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith(("sses", "xes", "ches", "shes", "zes", "oes")):
        return w[:-2]
    if w.endswith("s") and not w.endswith("ss") and len(w) > 3:
        return w[:-1]
    return w


def _verb_base(w: str) -> str | None:
    """The lexicon verb ``w`` is a form of, or None."""
    if w in _IRREGULAR_VERBS:
        return _IRREGULAR_VERBS[w]
    if w in _VERBS:
        return w
    for cand in (_rule_lemma(w, "VERB"),):
        if cand in _VERBS:
            return cand
    return None


def _rules_tag(words: list[str]) -> list[str]:
    """Coarse Penn-style tags (NN, NNS, VB*, JJ, RB, DT, IN, ...) from lexicons and context rules."""
    low = [w.lower() for w in words]
    tags: list[str] = []
    for i, w in enumerate(low):
        prev = low[i - 1] if i else ""
        prev_tag = tags[i - 1] if i else "START"
        nxt = low[i + 1] if i + 1 < len(low) else ""
        next_open = bool(nxt) and nxt[0].isalpha() and nxt not in _CLOSED
        after_det = prev in _DETERMINERS or prev_tag == "JJ" or prev in ("'s",)
        if not any(c.isalpha() for c in w):
            tags.append("CD" if w[:1].isdigit() else "SYM")
        elif w in _AUX:
            tags.append("VBZ" if w not in ("can", "could", "will", "would", "shall", "should", "may",
                                           "might", "must") else "MD")
        elif w in _DETERMINERS:
            tags.append("DT")
        elif w in _PRONOUNS:
            tags.append("PRP")
        elif w in _PREPOSITIONS:
            tags.append("IN")
        elif w in _CONJUNCTIONS:
            tags.append("CC")
        elif w in _ADVERBS:
            tags.append("RB")
        elif w in _ADJECTIVES:
            tags.append("JJ")
        elif w.endswith("ly") and len(w) > 4 and w not in _LY_NOUNS:
            tags.append("RB")
        elif w in _IRREGULAR_VERBS:
            tags.append("VBD")
        elif w.endswith("ing") and len(w) > 4:
            if w in _ING_NOUNS:
                tags.append("NN")
            elif after_det and next_open:
                tags.append("JJ")  # attributive: "a swimming pool", "the climbing wall"
            elif after_det:
                tags.append("NN")
            else:
                tags.append("VBG")
        elif w.endswith("ed") and len(w) > 4:
            tags.append("JJ" if after_det and next_open else "VBN")
        elif (_verb_base(w) is not None and not after_det and prev not in _PREPOSITIONS
              and (prev_tag.startswith(("NN", "PRP", "RB", "VB", "MD")) or prev == "to")):
            tags.append("VBZ" if w.endswith("s") and w not in _VERBS else "VBP")
        elif w.endswith(_ADJ_SUFFIXES) and w not in _ADJ_SUFFIX_NOUNS and next_open:
            tags.append("JJ")
        else:
            tags.append("NNS" if w.endswith("s") and not w.endswith(("ss", "us", "is")) else "NN")
    return tags


# ====================================================================== lemmas
@lru_cache(maxsize=1)
def _lemminflect() -> Callable[..., Any] | None:
    if importlib.util.find_spec("lemminflect") is None:
        return None
    try:
        from lemminflect import getLemma
    except Exception as e:  # a broken install must not break tagging
        log.warning("lemminflect unusable (%s); using the suffix-rule lemmatiser", e)
        return None
    return getLemma


def lemmatize(word: str, pos: str, *, backend: str | None = None) -> str:
    """Lemma of ``word`` as a ``"NOUN"`` or ``"VERB"`` (lower-cased): lemminflect, else suffix rules."""
    if pos not in ("NOUN", "VERB"):
        raise ValueError(f"pos must be 'NOUN' or 'VERB', got {pos!r}")
    w = word.lower()
    get = _lemminflect() if backend != "rules" else None
    if get is not None and w.isalpha():
        lemmas = get(w, upos=pos, lemmatize_oov=True)
        if lemmas:
            return lemmas[0].lower()
    return _rule_lemma(w, pos)


# ====================================================================== public API
def tagger_backend() -> str:
    """``"perceptron"`` when the packaged POS model is installed, else ``"rules"``."""
    return "perceptron" if _perceptron_model() is not None else "rules"


def _resolve(backend: str | None) -> str:
    if backend is None:
        return tagger_backend()
    if backend not in BACKENDS:
        from crossview.core.errors import CrossViewError
        raise CrossViewError(f"unknown tagger backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "perceptron" and _perceptron_model() is None:
        from crossview.core.errors import CrossViewError
        raise CrossViewError("the perceptron POS tagger needs the package textblob-aptagger: "
                             "pip install textblob-aptagger (or use backend='rules')")
    return backend


def pos_tag(caption: str, *, backend: str | None = None) -> list[tuple[str, str]]:
    """``(token, Penn Treebank tag)`` pairs of a caption (the rules back end gives coarser tags)."""
    words = _tokens(caption)
    if not words:
        return []
    b = _resolve(backend)
    if b == "perceptron":
        tags = _caption_corrections(words, _perceptron_tag(words, _perceptron_model()))
    else:
        tags = _rules_tag(words)
    return list(zip(words, tags))


def extract_tags(caption: str, *, backend: str | None = None) -> list[str]:
    """Lemmatised nouns and verbs of ``caption`` in order of first appearance, each once.

    ``backend``: ``"perceptron"`` or ``"rules"`` (default: the best installed, see module docs).
    An empty caption gives ``[]``.
    """
    if not isinstance(caption, str):
        from crossview.core.errors import CrossViewError
        raise CrossViewError(f"extract_tags needs a caption string, got {type(caption).__name__}")
    b = _resolve(backend)
    out: list[str] = []
    seen: set[str] = set()
    for word, tag in pos_tag(caption, backend=b):
        if tag in ("NNP", "NNPS"):  # names: "Toyota" is not the plural of "toyotum"
            pos = "PROPN"
        elif tag.startswith("NN"):
            pos = "NOUN"
        elif tag.startswith("VB"):
            pos = "VERB"
        else:
            continue
        if len(word) < 2 or not any(c.isalpha() for c in word):
            continue
        if pos == "PROPN":
            lemma = word.lower() if tag == "NNP" else _rule_lemma(word, "NOUN")
        else:
            lemma = lemmatize(word, pos, backend="rules" if b == "rules" else None)
        if lemma in _SKIP_LEMMAS or lemma in seen:
            continue
        seen.add(lemma)
        out.append(lemma)
    return out


def caption_tags(captions: Iterable[str], *, backend: str | None = None) -> list[list[str]]:
    """:func:`extract_tags` of each caption."""
    return [extract_tags(c, backend=backend) for c in captions]
