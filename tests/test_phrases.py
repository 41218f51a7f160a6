"""Relation phrases of captions (crossview.data.phrases): the rules on hand-made parses (always run), the
plumbing on a stand-in pipeline (always run), and the real spaCy parser (skipped when it is not installed:
pip install 'crossview[phrases]').

Hand-worked expectations. A preposition gives a phrase with the word it is attached to, never with both the
verb and the subject: in "a brown dog runs on the grass" *on* hangs from *runs*, so the phrases are
``dog-run`` (noun-verb: dog is the subject) and ``run-on-grass`` (verb-prep-noun); there is NO
``dog-on-grass``. In "a man in a red shirt" *in* hangs from *man*: ``man-in-shirt`` (noun-prep-noun), and
there is no verb, so nothing else. Passive "a man is pushed by a woman on a bike": man is the (passive)
subject, ``man-push``; the agent is the preposition by, ``push-by-woman``; ``push-on-bike``; never
``woman-push``. Conjunctions propagate as in CoreNLP's collapsed-ccprocessed dependencies: "a dog and a cat
run" -> ``dog-run``, ``cat-run``.

The parses below are gold ClearNLP-style trees (spaCy's label set) written by hand, one token a field:
``text/lemma/UPOS/PTB tag/label>head index``.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from crossview.core.errors import CrossViewError
from crossview.data import phrases as P
from crossview.data.phrases import ParsedToken, Relation, relations_from_parse


def parse(spec: str) -> list[ParsedToken]:
    out = []
    for field in spec.split():
        text, lemma, pos, tag, rest = field.split("/")
        dep, head = rest.split(">")
        out.append(ParsedToken(text, lemma, pos, tag, dep, int(head)))
    return out


def phrases(spec: str) -> list[str]:
    return [r.text for r in relations_from_parse(parse(spec))]


# ====================================================================== the rules, on gold parses
BROWN_DOG = ("a/a/DET/DT/det>2 brown/brown/ADJ/JJ/amod>2 dog/dog/NOUN/NN/nsubj>3 runs/run/VERB/VBZ/ROOT>3 "
             "on/on/ADP/IN/prep>3 the/the/DET/DT/det>6 grass/grass/NOUN/NN/pobj>4")


def test_subject_and_verb_preposition():
    assert phrases(BROWN_DOG) == ["dog-run", "run-on-grass"]
    assert "dog-on-grass" not in phrases(BROWN_DOG)       # "on" is attached to the verb, not to the dog
    kinds = [(r.kind, r.words) for r in relations_from_parse(parse(BROWN_DOG))]
    assert kinds == [("noun-verb", ("dog", "run")), ("verb-prep-noun", ("run", "on", "grass"))]


def test_no_verb_noun_preposition():
    # "a man in a red shirt": man-in-shirt and nothing else
    spec = ("a/a/DET/DT/det>1 man/man/NOUN/NN/ROOT>1 in/in/ADP/IN/prep>1 a/a/DET/DT/det>5 red/red/ADJ/JJ/amod>5 "
            "shirt/shirt/NOUN/NN/pobj>2")
    rels = relations_from_parse(parse(spec))
    assert rels == [Relation("noun-prep-noun", ("man", "in", "shirt"))]
    assert rels[0].text == "man-in-shirt"


def test_conjoined_subjects():
    # "a dog and a cat run": conj(dog, cat) carries nsubj(run, dog) over to cat
    spec = ("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>5 and/and/CCONJ/CC/cc>1 a/a/DET/DT/det>4 "
            "cat/cat/NOUN/NN/conj>1 run/run/VERB/VBP/ROOT>5")
    assert phrases(spec) == ["dog-run", "cat-run"]


def test_conjoined_objects():
    # "a dog runs on the grass and the sand"
    spec = ("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 runs/run/VERB/VBZ/ROOT>2 on/on/ADP/IN/prep>2 "
            "the/the/DET/DT/det>5 grass/grass/NOUN/NN/pobj>3 and/and/CCONJ/CC/cc>5 the/the/DET/DT/det>8 "
            "sand/sand/NOUN/NN/conj>5")
    assert phrases(spec) == ["dog-run", "run-on-grass", "run-on-sand"]


def test_conjoined_verbs_share_the_subject():
    # "two dogs are playing in the snow and jumping over a log"
    spec = ("two/two/NUM/CD/nummod>1 dogs/dog/NOUN/NNS/nsubj>3 are/be/AUX/VBP/aux>3 playing/play/VERB/VBG/ROOT>3 "
            "in/in/ADP/IN/prep>3 the/the/DET/DT/det>6 snow/snow/NOUN/NN/pobj>4 and/and/CCONJ/CC/cc>3 "
            "jumping/jump/VERB/VBG/conj>3 over/over/ADP/IN/prep>8 a/a/DET/DT/det>11 log/log/NOUN/NN/pobj>9")
    assert phrases(spec) == ["dog-play", "play-in-snow", "dog-jump", "jump-over-log"]


def test_conjoined_verbs_with_their_own_subjects():
    # "a dog runs and a cat sleeps": each verb keeps its own subject
    spec = ("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 runs/run/VERB/VBZ/ROOT>2 and/and/CCONJ/CC/cc>2 "
            "a/a/DET/DT/det>5 cat/cat/NOUN/NN/nsubj>6 sleeps/sleep/VERB/VBZ/conj>2")
    assert phrases(spec) == ["dog-run", "cat-sleep"]


def test_passive():
    # "a man is pushed by a woman on a bike"
    spec = ("a/a/DET/DT/det>1 man/man/NOUN/NN/nsubjpass>3 is/be/AUX/VBZ/auxpass>3 pushed/push/VERB/VBN/ROOT>3 "
            "by/by/ADP/IN/agent>3 a/a/DET/DT/det>6 woman/woman/NOUN/NN/pobj>4 on/on/ADP/IN/prep>3 "
            "a/a/DET/DT/det>9 bike/bike/NOUN/NN/pobj>7")
    got = phrases(spec)
    assert got == ["man-push", "push-by-woman", "push-on-bike"]
    assert "woman-push" not in got


def test_participle_modifier_and_its_conjunct():
    # "a girl sitting on a bench and reading": acl(girl, sitting), conj(sitting, reading)
    spec = ("a/a/DET/DT/det>1 girl/girl/NOUN/NN/ROOT>1 sitting/sit/VERB/VBG/acl>1 on/on/ADP/IN/prep>2 "
            "a/a/DET/DT/det>5 bench/bench/NOUN/NN/pobj>3 and/and/CCONJ/CC/cc>2 reading/read/VERB/VBG/conj>2")
    assert phrases(spec) == ["girl-sit", "sit-on-bench", "girl-read"]


def test_relative_clauses():
    # "a dog that runs": the relative pronoun stands for the dog
    assert phrases("a/a/DET/DT/det>1 dog/dog/NOUN/NN/ROOT>1 that/that/PRON/WDT/nsubj>3 "
                   "runs/run/VERB/VBZ/relcl>1") == ["dog-run"]
    # "the ball the dog chases": the dog is the subject, not the ball
    assert phrases("the/the/DET/DT/det>1 ball/ball/NOUN/NN/ROOT>1 the/the/DET/DT/det>3 dog/dog/NOUN/NN/nsubj>4 "
                   "chases/chase/VERB/VBZ/relcl>1") == ["dog-chase"]


def test_controlled_subject():
    # "a dog tries to catch a ball": xcomp(tries, catch) shares the dog
    spec = ("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 tries/try/VERB/VBZ/ROOT>2 to/to/PART/TO/aux>4 "
            "catch/catch/VERB/VB/xcomp>2 a/a/DET/DT/det>6 ball/ball/NOUN/NN/dobj>4")
    assert phrases(spec) == ["dog-try", "dog-catch"]


def test_multiword_prepositions():
    # "a man sits in front of a building"
    assert phrases("a/a/DET/DT/det>1 man/man/NOUN/NN/nsubj>2 sits/sit/VERB/VBZ/ROOT>2 in/in/ADP/IN/prep>2 "
                   "front/front/NOUN/NN/pobj>3 of/of/ADP/IN/prep>4 a/a/DET/DT/det>7 building/building/NOUN/NN/pobj>5"
                   ) == ["man-sit", "sit-in_front_of-building"]
    # "a dog jumps out of the water"
    assert phrases("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 jumps/jump/VERB/VBZ/ROOT>2 out/out/ADP/IN/prep>2 "
                   "of/of/ADP/IN/prep>3 the/the/DET/DT/det>6 water/water/NOUN/NN/pobj>4"
                   ) == ["dog-jump", "jump-out_of-water"]
    # "a man standing next to a car"
    assert phrases("a/a/DET/DT/det>1 man/man/NOUN/NN/ROOT>1 standing/stand/VERB/VBG/acl>1 next/next/ADV/RB/advmod>2 "
                   "to/to/ADP/IN/prep>3 a/a/DET/DT/det>6 car/car/NOUN/NN/pobj>4"
                   ) == ["man-stand", "stand-next_to-car"]
    # "in the front of" has a determiner: not collapsed (as in CoreNLP)
    assert phrases("a/a/DET/DT/det>1 man/man/NOUN/NN/ROOT>1 in/in/ADP/IN/prep>1 the/the/DET/DT/det>4 "
                   "front/front/NOUN/NN/pobj>2 of/of/ADP/IN/prep>4 a/a/DET/DT/det>7 bus/bus/NOUN/NN/pobj>5"
                   ) == ["man-in-front", "front-of-bus"]


def test_copula_and_light_verbs():
    # "the dog is on the grass": be is never the verb; its preposition relates the subject
    assert phrases("the/the/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 is/be/AUX/VBZ/ROOT>2 on/on/ADP/IN/prep>2 "
                   "the/the/DET/DT/det>5 grass/grass/NOUN/NN/pobj>3") == ["dog-on-grass"]
    # "there is a dog on the grass", on attached to is: the noun after it
    assert phrases("there/there/PRON/EX/expl>1 is/be/VERB/VBZ/ROOT>1 a/a/DET/DT/det>3 dog/dog/NOUN/NN/attr>1 "
                   "on/on/ADP/IN/prep>1 the/the/DET/DT/det>6 grass/grass/NOUN/NN/pobj>4") == ["dog-on-grass"]
    # "a man has a dog": nothing
    assert phrases("a/a/DET/DT/det>1 man/man/NOUN/NN/nsubj>2 has/have/VERB/VBZ/ROOT>2 a/a/DET/DT/det>4 "
                   "dog/dog/NOUN/NN/dobj>2") == []


def test_pronouns_are_not_nouns_and_punctuation_is_ignored():
    # "he runs , on the grass ."
    spec = ("he/he/PRON/PRP/nsubj>1 runs/run/VERB/VBZ/ROOT>1 ,/,/PUNCT/,/punct>1 on/on/ADP/IN/prep>1 "
            "the/the/DET/DT/det>5 grass/grass/NOUN/NN/pobj>3 ././PUNCT/./punct>1")
    assert phrases(spec) == ["run-on-grass"]


def test_empty_parse_and_each_phrase_once():
    assert relations_from_parse([]) == []
    # "a dog runs on the grass on the grass": the same tuple twice is kept once
    spec = ("a/a/DET/DT/det>1 dog/dog/NOUN/NN/nsubj>2 runs/run/VERB/VBZ/ROOT>2 on/on/ADP/IN/prep>2 "
            "the/the/DET/DT/det>5 grass/grass/NOUN/NN/pobj>3 on/on/ADP/IN/prep>2 the/the/DET/DT/det>8 "
            "grass/grass/NOUN/NN/pobj>6")
    assert phrases(spec) == ["dog-run", "run-on-grass"]


def test_lemma_words_are_clean():
    assert P._lemma("T-Shirt", "PROPN", "T-Shirt") == "t_shirt"     # no "-" inside a word
    assert P._lemma("shorts", "NOUN", "short") == "shorts"
    assert P._lemma("rides", "VERB", "rid") == "ride"              # spaCy's small model says "rid"
    assert P._lemma("leaves", "NOUN", "leaf") == "leaf"            # lemminflect's first guess is "leave"
    assert P._lemma("dogs", "NOUN", "dog") == "dog"


# ====================================================================== plumbing, on a stand-in pipeline
class _FakeNLP:
    """Looks like a spaCy pipeline to extract_relations: one gold parse per known caption."""

    def __init__(self, parses: dict[str, str]):
        self.parses = parses
        self.seen: list[str] = []

    class _Sent(list):
        start = 0

    def _doc(self, text: str):
        toks = parse(self.parses[text]) if text else []
        objs = [SimpleNamespace(text=t.text, lemma_=t.lemma, pos_=t.pos, tag_=t.tag, dep_=t.dep, i=i)
                for i, t in enumerate(toks)]
        for o, t in zip(objs, toks):
            o.head = objs[t.head]
        return SimpleNamespace(sents=[self._Sent(objs)] if objs else [])

    def pipe(self, texts, batch_size=1):
        for t in texts:
            self.seen.append(t)
            yield self._doc(t)


@pytest.fixture
def fake(monkeypatch):
    nlp = _FakeNLP({"a brown dog runs on the grass": BROWN_DOG})
    monkeypatch.setattr(P, "load_parser", lambda parser="auto": nlp)
    return nlp


def test_extract_phrases_keeps_order_and_empty_captions(fake):
    caps = ["a brown dog runs on the grass", "", "  a  brown dog runs\ton the grass "]
    assert P.extract_phrases(caps) == [["dog-run", "run-on-grass"], [], ["dog-run", "run-on-grass"]]
    assert fake.seen[2] == "a brown dog runs on the grass"        # white space normalised
    assert P.extract_phrases([]) == []


def test_progress_callback(fake):
    calls = []
    P.extract_phrases(["a brown dog runs on the grass"] * 5, batch_size=2, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_bad_input(fake):
    with pytest.raises(CrossViewError, match="list of captions"):
        P.extract_phrases("a dog runs")
    with pytest.raises(CrossViewError, match="caption 1 is a NoneType"):
        P.extract_phrases(["a dog", None])


# ====================================================================== a missing parser
def _one_line_install_error(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "pip install" in msg
    return msg


def test_missing_spacy_is_a_clear_error(monkeypatch):
    P.load_parser.cache_clear()
    monkeypatch.setitem(sys.modules, "spacy", None)      # import spacy -> ImportError
    try:
        with pytest.raises(CrossViewError) as e:
            P.extract_phrases(["a dog runs"])
        assert "crossview[phrases]" in _one_line_install_error(e)
    finally:
        P.load_parser.cache_clear()


def test_missing_model_is_a_clear_error(monkeypatch):
    P.load_parser.cache_clear()
    try:
        with pytest.raises(CrossViewError) as e:
            P.extract_phrases(["a dog runs"], parser="en_core_web_no_such_model")
        msg = _one_line_install_error(e)
        if "spacy" in sys.modules and sys.modules["spacy"] is not None:
            assert "pip install en-core-web-no-such-model" in msg
        # parser="auto" with spaCy but no model package
        real_find_spec = P.importlib.util.find_spec
        monkeypatch.setattr(P.importlib.util, "find_spec",
                            lambda name, *a: None if name in P.PARSER_PACKAGES else real_find_spec(name, *a))
        with pytest.raises(CrossViewError) as e:
            P.extract_phrases(["a dog runs"])
        _one_line_install_error(e)
        with pytest.raises(CrossViewError, match="parser must be"):
            P.load_parser("")
    finally:
        P.load_parser.cache_clear()


# ====================================================================== the real parser (optional)
@pytest.fixture(scope="module")
def real_parser():
    pytest.importorskip("spacy", reason="spaCy is not installed: pip install 'crossview[phrases]'")
    try:
        return P.load_parser("auto")
    except CrossViewError as e:
        pytest.skip(f"no spaCy English parser model: {e}")


def test_real_parser_hand_worked_sentences(real_parser):
    cases = {
        "a brown dog runs on the grass": ["dog-run", "run-on-grass"],
        "A dog and a cat are running .": ["dog-run", "cat-run"],
        "A man is being pushed by a woman on a bike .": ["man-push", "push-by-woman", "push-on-bike"],
        "a man in a red shirt": ["man-in-shirt"],
        "Two dogs are playing in the snow and jumping over a log .":
            ["dog-play", "play-in-snow", "dog-jump", "jump-over-log"],
        "A man sits in front of a building .": ["man-sit", "sit-in_front_of-building"],
        "A man in blue shorts rides a bike .": ["man-in-shorts", "man-ride"],
        "": [], "   ": [], "!!!": [],
    }
    assert P.extract_phrases(list(cases)) == list(cases.values())


def test_real_parser_punctuation_does_not_matter(real_parser):
    caps = ["A black dog is running through the grass .", "A black dog is running through the grass.",
            "a black dog is running through the grass!!", "\"A black dog\" is running through the grass ..."]
    assert P.extract_phrases(caps) == [["dog-run", "run-through-grass"]] * 4


def test_real_parser_relations_and_sentences(real_parser):
    rels = P.extract_relations(["A cat sleeps on a mat. A girl sitting on a bench ."])[0]
    assert [(r.kind, r.text) for r in rels] == [
        ("noun-verb", "cat-sleep"), ("verb-prep-noun", "sleep-on-mat"),
        ("noun-verb", "girl-sit"), ("verb-prep-noun", "sit-on-bench")]
