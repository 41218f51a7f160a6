"""Tags of a caption: its nouns and verbs, lemmatised (the webly method's tags for clean data, paper 003).

``extract_tags("A black dog is running through the grass .") == ["dog", "run", "grass"]``

Part-of-speech tags come from Matthew Honnibal's greedy averaged-perceptron tagger, the model that ships in
the PyPI package ``textblob-aptagger`` (``trontagger-0.1.0.pickle``, Penn Treebank tags, trained on the WSJ;
MIT licence; its author reports about 97% per-token accuracy on WSJ text). The model file is read with an
unpickler that admits plain containers only, and the tagger's feature templates are re-implemented here
exactly as the model was trained with them (no TextBlob import). Lemmas come from ``lemminflect`` (MIT; the
NIH SPECIALIST lexicon plus rules for unknown words). Both packages are dependencies of CrossView; a broken
install is a clear error naming the package (there is no rule-based fallback any more: issue 12).
Tokens are :func:`crossview.data.text.tokenize`'s tagger view (case kept, punctuation marks and hyphenated
compounds as tokens), with clitics split off as in the Penn Treebank.

Two caption-domain corrections are applied on top of the perceptron (see ``_caption_corrections``).

Measured on real Flickr8k captions hand-labelled in ``tests/test_tags.py`` (micro precision / recall;
the test states the labelling policy). On 30 held-out captions (139 tags), labelled after the code was
written and never used to tune it: 0.98 / 0.99. On the 32 development captions that the corrections
were tuned on: 1.00 / 0.99 (optimistic). Forms of *be*, *have* and *do* are never tags (auxiliaries and
light verbs), nor are words shorter than two letters or without a letter. Tags keep the caption's
order, each once; proper nouns are lower-cased but not lemmatised.
"""

from __future__ import annotations

import importlib.util
import pickle
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from crossview.data.text import tokenize
from crossview.core.errors import CrossViewError

__all__ = ["extract_tags", "caption_tags", "pos_tag", "lemmatize", "release_tagger"]


_SKIP_LEMMAS = frozenset({"be", "have", "do"})


def _tokens(caption: str) -> list[str]:
    """Penn Treebank-like tokens: words (hyphenated kept whole), punctuation, clitics split off."""
    out = []
    for t in tokenize(caption, lower=False, punctuation=True):
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
def _perceptron_model() -> tuple[dict, dict, list]:
    """``(weights, tagdict, classes)`` of the packaged tagger; a clear error when it is missing or broken."""
    spec = importlib.util.find_spec("textblob_aptagger")
    if spec is None or not spec.submodule_search_locations:
        raise CrossViewError("caption tags need the POS tagger model of the package textblob-aptagger (a "
                             "dependency of CrossView): pip install textblob-aptagger")
    path = Path(list(spec.submodule_search_locations)[0]) / "trontagger-0.1.0.pickle"
    try:
        with open(path, "rb") as f:
            weights, tagdict, classes = _SafeUnpickler(f, encoding="latin1").load()
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as e:
        raise CrossViewError(f"POS tagger model {path} is unreadable ({e}): reinstall it with "
                             "pip install --force-reinstall textblob-aptagger") from None
    return weights, tagdict, sorted(classes)


def release_tagger() -> None:
    """Let the POS tagger's model go (~45 MB of dicts) once a set's captions are tagged (webly's 550K training
    captions at COCO size, issue 34: it is not needed by the training after them); the next tag reads it again
    (~0.1 s)."""
    _perceptron_model.cache_clear()


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


# ====================================================================== caption-domain word lists
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
_ING_NOUNS = set("""building clothing ceiling painting railing wedding evening morning something anything
nothing everything thing king ring string spring wing swing sibling pudding icing awning earring
sling lightning ping ding darling duckling seedling dumpling stuffing bedding siding opening""".split())


# ====================================================================== lemmas
class _NoSpacy:
    """A meta-path finder refusing ``spacy`` while lemminflect is imported: lemminflect's package import tries
    ``import spacy`` to register token extensions CrossView never reads, and spaCy (installed for the phrases extra)
    costs 50 MB in a process with torch, 0.5 GB without (issue 34). Where spaCy is already imported, lemminflect
    hooks into it as usual."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "spacy" or name.startswith("spacy."):
            raise ImportError("spacy is not imported for lemminflect's lemmas")
        return None


@lru_cache(maxsize=1)
def _lemminflect() -> Callable[..., Any]:
    import sys

    blocker = _NoSpacy()
    sys.meta_path.insert(0, blocker)   # type: ignore[arg-type]
    try:
        from lemminflect import getLemma
    except Exception as e:  # noqa: BLE001 - missing or broken: one clear line either way
        raise CrossViewError(f"caption tags need the package lemminflect (a dependency of CrossView), which "
                             f"cannot be imported ({type(e).__name__}: {e}): pip install lemminflect") from None
    finally:
        sys.meta_path.remove(blocker)   # type: ignore[arg-type]
    return getLemma


def lemmatize(word: str, pos: str) -> str:
    """Lemma of ``word`` as a ``"NOUN"`` or ``"VERB"`` (lower-cased), from lemminflect; a word it has no
    lemma for (digits, symbols) is returned lower-cased."""
    if pos not in ("NOUN", "VERB"):
        raise ValueError(f"pos must be 'NOUN' or 'VERB', got {pos!r}")
    w = word.lower()
    if w.isalpha():
        lemmas = _lemminflect()(w, upos=pos, lemmatize_oov=True)
        if lemmas:
            return lemmas[0].lower()
    return w


# ====================================================================== public API
def pos_tag(caption: str) -> list[tuple[str, str]]:
    """``(token, Penn Treebank tag)`` pairs of a caption."""
    words = _tokens(caption)
    if not words:
        return []
    return list(zip(words, _caption_corrections(words, _perceptron_tag(words, _perceptron_model()))))


def extract_tags(caption: str) -> list[str]:
    """Lemmatised nouns and verbs of ``caption`` in order of first appearance, each once.

    An empty caption gives ``[]``.
    """
    if not isinstance(caption, str):
        raise CrossViewError(f"extract_tags needs a caption string, got {type(caption).__name__}")
    out: list[str] = []
    seen: set[str] = set()
    for word, tag in pos_tag(caption):
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
            lemma = word.lower() if tag == "NNP" else lemmatize(word, "NOUN")
        else:
            lemma = lemmatize(word, pos)
        if lemma in _SKIP_LEMMAS or lemma in seen:
            continue
        seen.add(lemma)
        out.append(lemma)
    return out


def caption_tags(captions: Iterable[str]) -> list[list[str]]:
    """:func:`extract_tags` of each caption."""
    return [extract_tags(c) for c in captions]
