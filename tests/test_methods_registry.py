"""The method registry, the Method base class, MethodData, events and method cards."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from crossview.core.events import (CheckpointSaved, Finished, Log, Loss, Progress, Validation,
                                     event_from_dict)
from crossview.core.errors import CrossViewError
from crossview.methods import (METHOD_MODULES, Method, MethodData, create_method, list_methods, method_card,
                               method_class, register_method)
from crossview.methods.cards import coerce_param, list_cards, parse_card


# ---------------------------------------------------------------------------- registry
def test_registry_lists_and_creates_methods():
    names = list_methods()
    assert names[0] == "cca" and len(set(names)) == len(names)
    assert set(n for n in names if n in METHOD_MODULES) <= set(METHOD_MODULES)
    m = create_method("cca", reg=0.5)
    assert type(m) is method_class("cca") and m.name == "cca" and m.reg == 0.5
    assert type(m).__module__ == "crossview.methods.cca"      # registry name == module name


def test_unknown_names_list_the_known_methods():
    for call in (lambda: create_method("vse"), lambda: method_class("vse"), lambda: method_card("vse")):
        with pytest.raises(CrossViewError, match=r"unknown method 'vse'; known methods: cca"):
            call()
    with pytest.raises(CrossViewError, match=r"no parameter 'alpha'; its parameters are: n_components, reg"):
        create_method("cca", alpha=1)


def test_listing_methods_imports_neither_torch_nor_the_method_modules():
    code = textwrap.dedent("""
        import sys
        from crossview.methods import list_methods
        names = list_methods()
        assert "cca" in names, names
        assert "torch" not in sys.modules, "torch imported"
        assert "crossview.methods.cca" not in sys.modules, "method module imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_register_method_checks_its_target():
    with pytest.raises(TypeError, match="Method subclass"):
        register_method("x_not_a_method")(dict)

    @register_method("x_test_dummy")
    class Dummy(Method):
        def __init__(self, a: int = 1) -> None:
            self.a = a

    assert "x_test_dummy" in list_methods() and method_class("x_test_dummy") is Dummy
    with pytest.raises(ValueError, match="already registered"):
        @register_method("x_test_dummy")
        class Other(Method):
            pass


# ---------------------------------------------------------------------------- params and state
def test_params_round_trip():
    m = create_method("cca", n_components=12, weight_power=0.0)
    params = m.get_params()
    assert params == {"n_components": 12, "reg": 12.0, "weight_power": 0.0, "pairs": "captions"}
    clone = create_method("cca", **params)
    assert clone.get_params() == params
    assert clone.set_params(reg=0.2) is clone and clone.reg == 0.2
    with pytest.raises(CrossViewError, match="no parameter 'nope'"):
        clone.set_params(nope=1)
    assert repr(create_method("cca", reg=0.2)) == "CCA(reg=0.2)"
    assert method_class("cca").default_params() == {"n_components": 256, "reg": 12.0, "weight_power": 0.5,
                                                     "pairs": "captions"}
    assert not create_method("cca").is_fitted


def test_state_dict_round_trip_and_wrong_method():
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(40, 5)), rng.normal(size=(40, 3))
    data = MethodData(X, Y, ["c"] * 40, np.arange(40))
    m = create_method("cca", n_components=2).fit(data)
    state = m.state_dict()
    assert state["method"] == "cca" and state["params"] == m.get_params()
    assert set(state["state"]) == {"x_proj_", "y_proj_", "x_mean_", "y_mean_", "correlations_", "n_train_"}
    other = create_method("cca").load_state_dict(state)
    np.testing.assert_array_equal(other.scores(data), m.scores(data))
    with pytest.raises(CrossViewError, match="checkpoint is for method 'bitr'"):
        create_method("cca").load_state_dict({**state, "method": "bitr"})


# ---------------------------------------------------------------------------- MethodData
def test_method_data_validates_its_arrays():
    X = np.zeros((4, 3))
    with pytest.raises(CrossViewError, match="text_features has 2 rows for 3 captions"):
        MethodData(X, np.zeros((2, 5)), ["a", "b", "c"], [0, 1, 2])
    with pytest.raises(CrossViewError, match="refers to image 7 but there are only 4"):
        MethodData(X, None, ["a"], [7])
    with pytest.raises(CrossViewError, match="one entry per caption"):
        MethodData(X, None, ["a", "b"], [0])
    with pytest.raises(CrossViewError, match="labels must have one entry per image"):
        MethodData(X, None, ["a"], [0], labels=[1, 2])
    with pytest.raises(CrossViewError, match="2-D"):
        MethodData(np.zeros(4), None, [], [])
    d = MethodData(X.astype(np.float64), None, ["a"], [0])
    assert d.image_features.dtype == np.float32 and d.caption_image.dtype == np.int64
    with pytest.raises(CrossViewError, match="needs caption features.*--text-encoder"):
        d.require_text_features("cca")


def test_method_data_from_features_takes_the_split_rows():
    from crossview.data.dataset import PairedDataset

    caption_image = np.array([0, 0, 1, 2, 2, 3, 4, 5])
    ds = PairedDataset(name="t", captions=[f"c{i}" for i in range(8)], caption_image=caption_image,
                       image_features=np.zeros((6, 2), np.float32), splits={"train": [0, 2, 4], "test": [1, 3, 5]},
                       label_sets=[["a"], ["b"], [], ["a", "c"], ["c"], ["b"]], format="t")
    image = np.arange(6, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)   # row i = i
    text = np.arange(8, dtype=np.float32)[:, None]                                   # row c = c
    tr = MethodData.from_features(ds, image, text, "train")
    assert tr.image_features[:, 0].tolist() == [0, 2, 4]
    assert tr.text_features[:, 0].tolist() == [0, 1, 3, 4, 6]
    assert tr.captions == ["c0", "c1", "c3", "c4", "c6"] and tr.caption_image.tolist() == [0, 0, 1, 1, 2]
    assert tr.label_set_names == ["a", "b", "c"] and tr.label_sets == [[0], [], [2]]
    te = MethodData.from_features(ds, image, text, "test")
    assert te.image_features[:, 0].tolist() == [1, 3, 5] and te.text_features[:, 0].tolist() == [2, 5, 7]
    assert te.label_sets == [[1], [0, 2], [1]]
    # A view of a split (ids kept from the parent) maps back to the parent's rows too.
    sub = ds.split("test")
    again = MethodData.from_features(sub, image[[1, 3, 5]], text[[2, 5, 7]], "test")
    np.testing.assert_array_equal(again.text_features, te.text_features)
    with pytest.raises(CrossViewError, match="image features have 5 rows for the 6 images"):
        MethodData.from_features(ds, image[:5], text, "train")


# ---------------------------------------------------------------------------- events
def test_events_round_trip_through_dicts():
    events = [Progress(3, 10, "epoch 1/2"), Loss(3, 0, {"loss": np.float32(0.25)}),
              Validation(1, {"rsum": 100.0, "i2t": {"R@1": 10.0}}), CheckpointSaved("/r/checkpoint.pt", 3),
              Log("hello", "warning"), Finished({"method": "cca"})]
    for ev in events:
        d = ev.to_dict()
        assert d["event"] == ev.kind
        assert event_from_dict({**d, "time": 1.0}) == ev
    assert Loss(1, 0, {"l": float("nan")}).to_dict()["terms"] == {"l": None}
    assert Progress(5, 10).fraction == 0.5 and Progress(5, 0).fraction == 0.0
    with pytest.raises(ValueError, match="unknown event kind"):
        event_from_dict({"event": "weird"})


# ---------------------------------------------------------------------------- cards
@pytest.mark.parametrize("name", sorted(set(list_cards()) & set(list_methods())))
def test_card_defaults_equal_the_class_defaults(name):
    card = method_card(name)
    cls = method_class(name)
    assert card.name == name and card.title and card.summary
    assert set(card.params) == set(cls.param_names()), "card params != __init__ params"
    assert card.defaults() == cls.default_params()


@pytest.mark.parametrize("name", list_cards())
def test_no_card_states_a_default(name):
    """Issue 12: defaults were written twice (signature and card); the signature is the one place."""
    import tomllib

    from crossview.methods.cards import card_path

    raw = tomllib.loads(card_path(name).read_text(encoding="utf-8"))
    stated = [p for p, spec in (raw.get("params") or {}).items() if "default" in spec]
    assert not stated, f"models/{name}.toml states defaults for {stated}: delete them (the signature has them)"


def test_a_card_that_states_a_default_is_refused_and_defaults_come_from_the_signature(tmp_path, monkeypatch):
    from crossview.methods import cards

    src = cards.card_path("cca").read_text(encoding="utf-8")
    folder = tmp_path / "models"
    _write_card(folder, "cca", src.replace("[params.reg]\n", "[params.reg]\ndefault = 5.0\n"))
    with pytest.raises(CrossViewError, match=r"cca.toml \[params.reg\]: states a default.*signature"):
        parse_card(folder / "cca.toml")
    from crossview.methods.cca import CCA

    assert CCA.__init__.__defaults__ == (256, 12.0, 0.5, "captions")
    monkeypatch.setattr(CCA.__init__, "__defaults__", (256, 7.5, 0.5, "captions"))   # a new default for reg
    assert cards.load_card("cca").params["reg"].default == 7.5, "the card follows the signature"


def test_cca_card_has_the_papers_numbers():
    card = method_card("cca")
    assert card.paper == "001_637cb05c9b729668.txt"
    t7 = [r for r in card.paper_results if r["table"] == "Table 7" and r["dataset"] == "Pascal sentences"
          and r["direction"] == "i2t"]
    assert t7[0]["metrics"] == {"BLEU-1": 34.69, "ROUGE-1": 14.29, "R@50": 72.80, "MedR": 21.25}
    assert card.params["pairs"].choices == ("captions", "images")


def _write_card(folder, name, text):
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_malformed_cards_name_the_file_and_entry(tmp_path):
    head = '[method]\nname = "m"\ntitle = "M"\ndescription = "D."\n'
    cases = {   # (card text, the method's signature defaults, expected message)
        "not toml [": ({}, "not valid TOML"),
        '[params.a]\n': ({"a": 1}, r"no \[method\] table"),
        head.replace('name = "m"', 'name = "other"'): ({}, "but the file is m.toml"),
        head + '[params.a]\ntype = "int"\n': ({"b": 1}, r"\[params.a\]: the method has no parameter 'a'"),
        head + '[params.a]\ndefault = 1\n': ({"a": 1}, r"\[params.a\]: states a default"),
        head + '[params.a]\ntype = "complex"\n': ({"a": 1}, "type 'complex' is not one of"),
        head + '[params.a]\nmin = 2\n': ({"a": 1}, "below the minimum 2"),
        head + '[params.a]\nchoices = ["y"]\n': ({"a": "x"}, "not one of 'y'"),
        head + '[params.a]\nhelpp = "typo"\n': ({"a": 1}, "unknown key"),
        head + '[[paper_results]]\nsetting = "x"\n': ({}, "needs at least 'dataset'"),
    }
    for text, (defaults, msg) in cases.items():
        path = _write_card(tmp_path, "m", text)
        with pytest.raises(CrossViewError, match=msg) as e:
            parse_card(path, defaults)
        assert str(path) in str(e.value)
    with pytest.raises(CrossViewError, match="no registered method 'm'"):
        parse_card(_write_card(tmp_path, "m", head + '[params.a]\ntype = "int"\n'))
    ok = parse_card(_write_card(tmp_path, "m", head + '[params.a]\ntype = "int"\n[params.b]\nflag = "--bees"\n'),
                    {"a": None, "b": [1, 2]})
    assert ok.params["a"].default is None and ok.params["a"].coerce("none") is None
    assert ok.params["a"].coerce("7") == 7
    assert ok.params["b"].type == "list[int]" and ok.params["b"].flag == "--bees"


def test_param_coercion():
    assert coerce_param("int", "1e3") == 1000
    assert coerce_param("float", "1e-5") == 1e-5
    assert coerce_param("bool", "Yes") is True and coerce_param("bool", "off") is False
    assert coerce_param("list[float]", "1e-5, 1, 1e5") == [1e-5, 1.0, 1e5]
    assert coerce_param("list[int]", "[1, 2]") == [1, 2]
    assert coerce_param("str", 5) == "5"
    for kind, value, msg in (("int", "2.5", "expected an integer"), ("bool", "maybe", "true or false"),
                             ("float", "x", "expected a number"), ("list[int]", "[1,", "cannot read the list")):
        with pytest.raises(CrossViewError, match=msg):
            coerce_param(kind, value, "parameter 'p'")


def test_set_values_are_typed_by_the_card():
    from crossview.commands.train import parse_set_values

    assert parse_set_values("cca", ["n_components=64", "reg=1e-2", "pairs=images", "weight-power=2"]) == \
        {"n_components": 64, "reg": 0.01, "pairs": "images", "weight_power": 2.0}
    with pytest.raises(CrossViewError, match="'n_components': 0 is below the minimum 1"):
        parse_set_values("cca", ["n_components=0"])


def test_evaluate_uses_each_directions_own_model():
    """A method whose i2t and t2i models differ: i2t ranks from the i2t scores, t2i from the t2i scores."""
    from crossview.eval.metrics import evaluate

    rng = np.random.default_rng(5)
    X, Y = rng.normal(size=(12, 4)).astype(np.float32), rng.normal(size=(24, 4)).astype(np.float32)
    data = MethodData(X, Y, ["c"] * 24, np.repeat(np.arange(12), 2))
    W = {"i2t": rng.normal(size=(4, 4)).astype(np.float32), "t2i": rng.normal(size=(4, 4)).astype(np.float32)}

    class TwoModels(Method):
        directions_differ = True

        def encode_images(self, d, direction="i2t"):
            return d.image_features @ W[direction]

        def encode_texts(self, d, direction="i2t"):
            return d.text_features

    res = TwoModels().evaluate(data)
    by_i2t = evaluate(X @ W["i2t"] @ Y.T, data.caption_image)
    by_t2i = evaluate(X @ W["t2i"] @ Y.T, data.caption_image)
    np.testing.assert_array_equal(res["ranks"]["i2t"], by_i2t["ranks"]["i2t"])
    np.testing.assert_array_equal(res["ranks"]["t2i"], by_t2i["ranks"]["t2i"])
    assert res["i2t"] == by_i2t["i2t"] and res["t2i"] == by_t2i["t2i"]
    assert res["rsum"] == pytest.approx(sum(by_i2t["i2t"][f"R@{k}"] + by_t2i["t2i"][f"R@{k}"] for k in (1, 5, 10)))
    assert not np.array_equal(by_i2t["ranks"]["t2i"], by_t2i["ranks"]["t2i"])   # the test can tell them apart


@pytest.mark.parametrize("value, needle", [("inf", "expected a finite number"), ("nan", "expected a finite number"),
                                           ("1e999", "expected a finite number"), ("1e308", "above the maximum")])
def test_a_non_finite_or_absurd_number_is_refused_by_the_card(value, needle):
    """weight_power=inf trained (config.json said null) and gave all-zero embeddings, rsum at chance, exit 0."""
    from crossview.methods.cards import find_card

    spec = find_card("cca").params["weight_power"]
    with pytest.raises(CrossViewError, match=needle):
        spec.coerce(value, "cca")
    assert spec.coerce("0.5", "cca") == 0.5
