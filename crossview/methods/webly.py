"""Webly supervised two-stage training (Mithun, Panda, Papalexakis & Roy-Chowdhury, ACM MM 2018; paper 003).

Three branches into one space, on the VSE++ model (:mod:`crossview.methods.vsepp`):
image (features -> FC -> L2, or end to end with ``image_model="cnn"``: the backbone over the image files of both
stages, the web set's too), sentence (the vsepp text encoders), tags (the average GloVe 6B 50-d vector of the
tags' words -> FC -> L2).

- Stage I, clean image-caption data: each caption's tags are its nouns and verbs
  (:func:`crossview.features.tags.extract_tags`); ``loss = lambda1 * L_IS + lambda2 * L_IT`` (VSE0 or VSE++
  form, :func:`crossview.nn.losses.contrastive_loss`), ``max_epochs`` epochs.
- Stage II, a web image-tag set (``fit_iter(..., web=MethodData)`` whose "captions" are the tag lists): ``L_IT``
  only (lambda1 = 0) at ``stage2_lr`` for ``stage2_epochs`` epochs, with the curriculum: web images ordered by
  how frequent their tags are in the clean captions (common concepts first), the set growing from the most
  common ``curriculum_start`` fraction to all of it over ``curriculum_epochs`` epochs.

The epoch with the best validation rsum over both stages is kept (Stage II must beat Stage I to count); the
curves and epoch numbers of Stage II continue Stage I's, and a resume lands in the stage it stopped in (``stage_``).
The web set comes from the engine (``web`` = a path, or ``demo``): it reads it as a webtags collection, encodes its
images with the run's image encoder and normalisation, and hands it over (:meth:`Webly.set_auxiliary`); library
callers pass ``fit_iter(..., web=web_method_data(rows, tags))``.

``init_from`` (a run folder): Stage II starts from that finished Stage I run (the engine reads its checkpoint as
data and checks that its features are this run's); the new run's epochs and steps continue that run's.
``tag_branch="sentence"`` (paper 003's ablation): no tag branch; the sentence branch reads the tags as a string
("dog grass run"); over caption features the engine hands the method the run's text encoder
(:meth:`Webly.set_text_encoder`). A :class:`~crossview.core.events.Phase` event marks Stage II on the curves.
``crossview experiment webly-ablation`` (:mod:`crossview.experiments.webly_ablation`) runs the ablations.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crossview.core.errors import CrossViewError
from crossview.data.method_data import MethodData
from crossview.methods import register_method
from crossview.methods.vsepp import Vsepp, VseModel
from crossview.nn.encoders import FeatureImageEncoder
from crossview.nn.losses import contrastive_loss
from crossview.nn.trainer import gather_rows, world

__all__ = ["Webly", "tag_vectors", "caption_tag_vectors", "iter_caption_tag_vectors", "tag_sentences", "caption_tags",
           "clean_tag_counts", "curriculum_order", "web_method_data", "TAG_BRANCHES"]

#: how tags reach the joint space: their own branch (averaged GloVe -> FC) or the sentence branch on the tag string
TAG_BRANCHES = ("glove", "sentence")


def tag_vectors(tag_lists: list[list[str]]) -> np.ndarray:
    """``(n, 50) float32``: the mean GloVe 6B 50-d vector of the words of each tag list (multi-word tags count
    each word; words GloVe lacks are skipped; a list with none left is the zero vector)."""
    return _tag_vectors(tag_lists, len(tag_lists))


def _tag_vectors(tag_lists: Iterable[list[str]], n: int, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`tag_vectors` of ``n`` tag lists, each read once from an iterable (none of them kept), written into
    ``out`` (``(n, 50)`` zeros) when given."""
    from crossview.data.text import tokenize
    from crossview.features.text.glove import _glove_tables

    emb, index, _ = _glove_tables()
    if out is None:
        out = np.zeros((n, emb.shape[1]), dtype=np.float32)
    for r, tags in enumerate(tag_lists):
        ids = [index[w] for t in tags for w in tokenize(t) if w in index]
        if ids:
            out[r] = np.asarray(emb[np.asarray(ids)], dtype=np.float32).mean(axis=0)
    return out


def caption_tag_vectors(captions: Sequence[str], counts: Counter | None = None) -> np.ndarray:
    """``tag_vectors(caption_tags(captions))``, a caption at a time: no caption's tag list is kept (a COCO-size
    set's 600K lists of strings were ~0.5 GB, issue 34). ``counts``, when given, gains every caption's tags (what
    :func:`clean_tag_counts` counts), in the same pass."""
    work = iter_caption_tag_vectors(captions, counts)
    while True:
        try:
            next(work)
        except StopIteration as end:
            return end.value


#: the stage of the run's plan and progress in which the training captions are tagged
TAG_STAGE = "tags"
#: captions tagged between two progress reports (tagging takes ~1 ms a caption: a COCO-size set's 600K, ~10 min)
_TAG_REPORT = 2000


def iter_caption_tag_vectors(captions: Sequence[str], counts: Counter | None = None,
                             sentences: bool = False) -> Iterator[tuple[int, int]]:
    """:func:`caption_tag_vectors` as a generator of ``(done, total)`` every few thousand captions, which returns
    the vectors (``sentences``: the tags as strings for the sentence branch instead, :func:`tag_sentences`)."""
    from crossview.core.io import drop_pages
    from crossview.features.tags import extract_tags, release_tagger
    from crossview.features.text.glove import _glove_tables

    total = len(captions)
    done = [0]

    def lists() -> Iterator[list[str]]:
        for c in captions:
            tags = extract_tags(c)
            if counts is not None:
                counts.update(tags)
            done[0] += 1
            yield tags

    # tag a slice at a time (each slice's vectors written into the one array as it goes), reporting between slices
    texts: list[str] = []
    vectors = None if sentences else np.zeros((total, _glove_tables()[0].shape[1]), dtype=np.float32)
    it = lists()
    yield 0, total
    while done[0] < total:
        start = done[0]
        n = min(_TAG_REPORT, total - start)
        part = itertools.islice(it, n)
        if sentences:
            texts += tag_sentences(list(part))
        else:
            _tag_vectors(part, n, vectors[start:start + n])
        yield done[0], total
    release_tagger()                    # the tagger's model (~45 MB): read again by the next tagging
    if sentences:
        return texts
    drop_pages(_glove_tables()[0])      # the GloVe table's pages read while tagging (76 MB): not needed by training
    return vectors


def tag_sentences(tag_lists: list[list[str]]) -> list[str]:
    """The tags of each list as one string for the sentence branch (``tag_branch="sentence"``): "dog grass run"."""
    return [" ".join(t.replace("_", " ") for t in tags) for tags in tag_lists]


def curriculum_order(web_tags: list[list[str]], clean_counts: Counter) -> np.ndarray:
    """Web items from the most to the least familiar: by the mean count of their tags in the clean captions
    (ties by position); items with no known tag last."""
    score = np.array([np.mean([clean_counts.get(t, 0) for t in tags]) if tags else 0.0 for tags in web_tags])
    return np.argsort(-score, kind="stable")


def caption_tags(captions: list[str], memo: dict[str, list[str]] | None = None) -> list[list[str]]:
    """The tags (nouns and verbs, :func:`crossview.features.tags.extract_tags`) of each caption; ``memo`` keeps
    them between calls (tagging takes ~1 ms a caption)."""
    from crossview.features.tags import extract_tags

    memo = {} if memo is None else memo
    out = []
    for c in captions:
        if c not in memo:
            memo[c] = extract_tags(c)
        out.append(memo[c])
    return out


def clean_tag_counts(tag_lists: list[list[str]]) -> Counter:
    """How often each tag occurs in the clean training captions' tag lists: the curriculum's familiarity."""
    return Counter(t for ts in tag_lists for t in ts)


def web_method_data(image_features: np.ndarray | None, tags: list[list[str]], name: str = "web",
                    image_paths: list[str] | None = None) -> MethodData:
    """A web image-tag set as :class:`MethodData`: one "caption" per image, its tags joined by commas; the image
    files too when given (``image_model="cnn"`` trains on them in Stage II)."""
    n = len(image_paths) if image_features is None and image_paths is not None else \
        len(image_features) if image_features is not None else 0
    if len(tags) != n:
        raise CrossViewError(f"web set: {n} images but {len(tags)} tag lists")
    return MethodData(image_features=None if image_features is None else np.asarray(image_features, np.float32),
                      text_features=None, captions=[",".join(t) for t in tags], caption_image=np.arange(len(tags)),
                      name=name, image_paths=None if image_paths is None else [str(p) for p in image_paths])


class WeblyModel(VseModel):
    """:class:`VseModel` with a tag branch (``tags``: FC over averaged word vectors -> L2; None when the sentence
    branch reads the tags, ``tag_branch="sentence"``)."""

    def __init__(self, image: torch.nn.Module, text: torch.nn.Module, tags: torch.nn.Module | None) -> None:
        super().__init__(image, text)
        self.tags = tags


@register_method("webly")
class Webly(Vsepp):
    """Two-stage webly supervised training (see the module docstring)."""

    second_stage_epochs = "stage2_epochs"
    #: chosen by 3-fold CV on the Flickr8k sample's training photos (bench/results/rich_features_flickr8k.md, Stage I
    #: alone: no web set): both backbones, flip-averaged, and MiniLM + GloVe captions, CV rsum 269.6 -> 288.8 (paired
    #: +19.2, 95% interval +9.4 to +28.5; +7.5 to +30.2 widened for the 2 variants compared); val 369.0 -> 363.2.
    #: A web set's images are encoded as the run's are
    default_image_encoder = "efficientnet_lite0+mobilenet_v2:flip"
    default_text_encoder = "minilm+glove"
    loss_terms = {
        "loss": "the total of the stage: lambda2 L_IT + lambda1 L_IS in Stage I, L_IT alone in Stage II",
        "L_IT": "image - tag ranking loss (the web set's images against their tags)",
        "L_IS": "image - sentence ranking loss (the run's captions)"}

    def __init__(self, *, web: str = "", init_from: str = "", loss: str = "vse0", margin: float = 0.2,
                 lambda1: float = 1.0, lambda2: float = 0.1, tag_branch: str = "glove",
                 stage2_epochs: int = 5, stage2_lr: float = 2e-5, curriculum: str = "frequency",
                 curriculum_start: float = 0.5, curriculum_epochs: int = 3, embed_dim: int = 1024,
                 text_model: str = "features", image_model: str = "features", backbone: str = "efficientnet_lite0",
                 finetune_cnn: bool = False, word_dim: int = 300, min_count: int = 1,
                 max_len: int = 64, bert_path: str = "", train_layers: int = 0, max_epochs: int = 10,
                 batch_size: int = 128, lr: float = 2e-4, lr_decay_epoch: int = 7, lr_decay: float = 0.1,
                 grad_clip: float = 2.0, optimizer: str = "adam", weight_decay: float = 0.0, patience: int = 10,
                 holdout: float = 0.0) -> None:
        super().__init__(loss=loss, margin=margin, embed_dim=embed_dim, text_model=text_model,
                         image_model=image_model, backbone=backbone, finetune_cnn=finetune_cnn,
                         word_dim=word_dim, min_count=min_count, max_len=max_len, bert_path=bert_path,
                         train_layers=train_layers, max_epochs=max_epochs, batch_size=batch_size, lr=lr,
                         lr_decay_epoch=lr_decay_epoch, lr_decay=lr_decay, grad_clip=grad_clip, optimizer=optimizer,
                         weight_decay=weight_decay, patience=patience, holdout=holdout)
        self.web = web
        self.init_from = init_from
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.tag_branch = tag_branch
        self.stage2_epochs = stage2_epochs
        self.stage2_lr = stage2_lr
        self.curriculum = curriculum
        self.curriculum_start = curriculum_start
        self.curriculum_epochs = curriculum_epochs

    def start_message(self, train: MethodData, n_items: int, n_batches: int, device: torch.device) -> str:
        form = "VSE++ hardest negative" if self.loss == "vsepp" else "VSE0 sum of negatives"
        web = getattr(self, "_web", None)
        return (f"webly Stage I ({form}, {self.lambda1} x L_IS + {self.lambda2} x L_IT): {n_items} captions with their "
                f"nouns and verbs as tags, {n_batches} batches per epoch, {self.max_epochs} epochs; text: "
                f"{self._text_description()}; "
                + (f"then Stage II on {web.n_images} web images ({self.stage2_epochs} epochs, lr {self.stage2_lr}, "
                   f"curriculum {self.curriculum})" if web is not None and int(self.stage2_epochs) > 0
                   else "no Stage II (no web set)")
                + f", {self.embed_dim}-d, device {device}{self._amp_note(device)}" + self._image_path_note())

    # ------------------------------------------------------------------ the web set (from the engine)
    #: the reader of each auxiliary dataset (the engine reads the web set as a web image-tag collection)
    auxiliary_format = {"web": "webtags"}

    def auxiliary_datasets(self) -> dict[str, str]:
        """``{"web": path}`` when a web set is named and Stage II runs: the engine loads it, encodes its images with the run's
        image encoder and normalisation, and hands it over (:meth:`set_auxiliary`)."""
        return {"web": str(self.web)} if self.web and int(self.stage2_epochs) > 0 else {}

    def set_auxiliary(self, name: str, dataset: Any, image_rows: np.ndarray) -> None:
        if name != "web":
            raise CrossViewError(f"webly: no auxiliary dataset {name!r}")
        tags = list(dataset.tags) if getattr(dataset, "tags", None) is not None else []
        if len(tags) != len(image_rows) or not any(tags):
            raise CrossViewError(f"webly: the web set {self.web} has no tags for its images; give an image-tag "
                                 "collection (tags.jsonl, or a folder of images with .tags files)")
        paths = getattr(dataset, "image_paths", None)
        self._web = web_method_data(image_rows, [list(t) for t in tags], name=getattr(dataset, "name", "web"),
                                    image_paths=[str(p) for p in paths] if paths is not None else None)

    # ------------------------------------------------------------------ the tag branch as a query
    @property
    def has_tag_branch(self) -> bool:
        """Whether the fitted model has a tag branch of its own, so :meth:`embed_tags` works (a model whose
        tags went through the sentence branch, ``tag_dim`` 0, has none)."""
        return int((getattr(self, "model_spec_", None) or {}).get("tag_dim", 50)) > 0

    @property
    def tags_as_sentences(self) -> bool:
        """Whether the fitted model reads tags through its sentence branch (``tag_branch="sentence"``): a tag query
        is then the sentence query of the tag string (:func:`tag_sentences`), as it was trained."""
        return self.is_fitted and not self.has_tag_branch

    def embed_tags(self, tag_lists: list[list[str]]) -> np.ndarray:
        """``(n, embed_dim) float32`` on the CPU: each tag list through the tag branch (the mean GloVe vector of
        its words, :func:`tag_vectors`, then ``model.tags``), L2-normalised, so ``images @ row`` ranks images
        for a tag query as ``encode_images`` rows are scored. A list with no word GloVe knows is a zero row."""
        from crossview.nn.trainer import unwrap

        self.check_is_fitted()
        branch = getattr(unwrap(self.model()), "tags", None)
        if branch is None or not self.has_tag_branch:
            raise CrossViewError("webly: this run's model has no tag branch (its tags went through the sentence "
                                 "branch), so it cannot embed a tag list; query it with a sentence")
        v = tag_vectors([[str(t) for t in tags] for tags in tag_lists])
        dev = next(branch.parameters()).device
        was = branch.training
        branch.eval()
        try:
            with torch.no_grad():
                out = branch(torch.as_tensor(v).to(dev)).float().cpu().numpy()
        finally:
            branch.train(was)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.where(norms > 0, out / np.maximum(norms, 1e-12), 0.0)
        out[~v.any(axis=1)] = 0.0                   # no known word: no direction, not the branch's bias
        return np.ascontiguousarray(out, dtype=np.float32)

    # ------------------------------------------------------------------ stages
    def _check_params(self) -> None:
        super()._check_params()
        for name in ("lambda1", "lambda2"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise CrossViewError(f"webly: {name} must be a number >= 0, got {v!r}")
        if self.lambda1 == 0 and self.lambda2 == 0:
            raise CrossViewError("webly: lambda1 and lambda2 are both 0; Stage I would learn nothing")
        if self.web and self.web != "demo" and not Path(str(self.web)).expanduser().exists():
            raise CrossViewError(f"webly: web set {self.web}: no such file or folder; give a tags.jsonl / .csv / "
                                 "folder of images with .tags files, 'demo' for the demo's web set, or nothing "
                                 "(no Stage II)")
        if self.tag_branch not in TAG_BRANCHES:
            raise CrossViewError(f"webly: tag_branch {self.tag_branch!r} must be 'glove' (the tag branch: averaged GloVe "
                                 "vectors -> FC) or 'sentence' (the sentence branch reads the tags as a string)")
        if self.init_from and not Path(str(self.init_from)).expanduser().is_dir():
            raise CrossViewError(f"webly: init_from {self.init_from}: no such run folder; give the folder of a "
                                 "finished webly run whose Stage I is done (e.g. one trained with stage2_epochs=0)")
        if self.init_from and not self.web:
            raise CrossViewError("webly: init_from starts Stage II from a finished Stage I run, which needs a web set; "
                                 "give web=PATH (or demo)")
        if self.curriculum not in ("frequency", "none"):
            raise CrossViewError(f"webly: curriculum {self.curriculum!r} must be 'frequency' or 'none'")
        if not 0 < float(self.curriculum_start) <= 1:
            raise CrossViewError(f"webly: curriculum_start must be a fraction in (0, 1], got {self.curriculum_start!r}")

    def model_spec(self, train: MethodData, resume: bool) -> dict[str, Any]:
        if self._stage() == 2:                       # Stage II trains the Stage I model on other data
            return dict(self.model_spec_)
        spec = super().model_spec(train, resume)
        spec["tag_dim"] = 50 if self.tag_branch == "glove" else 0     # 0: the sentence branch reads the tags
        return spec

    def build_model(self, spec: dict[str, Any]) -> torch.nn.Module:
        base = super().build_model(spec)
        dim = int(spec.get("tag_dim", 50))
        return WeblyModel(base.image, base.text, FeatureImageEncoder(dim, int(spec["embed_dim"])) if dim else None)

    def _sentence_tags(self) -> bool:
        """Whether the tags go through the sentence branch (the model has no tag branch of its own)."""
        return int(self.model_spec_.get("tag_dim", 50)) == 0

    # ------------------------------------------------------------------ what the engine hands over
    def set_text_encoder(self, encode: Any) -> None:
        """``encode(strings) -> (n, e) features`` as the run's caption features are (its text encoder and
        normalisation): ``tag_branch="sentence"`` over ``text_model="features"`` encodes the tag strings with it."""
        self._encode_text = encode

    def initial_run(self) -> str:
        """The run folder Stage II starts from (``init_from``), read by the engine (:meth:`set_initial_state`)."""
        return str(self.init_from or "")

    def set_initial_state(self, method_state: Any, source: str) -> str:
        """Take a finished Stage I (a webly run's checkpoint state, read as data by the engine): this run starts
        in Stage II from its weights; its epochs and steps continue that run's. Returns the line to log."""
        st = method_state.get("state") if isinstance(method_state, dict) else None
        if not isinstance(st, dict) or method_state.get("method") != "webly":
            raise CrossViewError(f"init_from {source}: not a webly run (its checkpoint holds "
                                 f"{method_state.get('method') if isinstance(method_state, dict) else 'no method'!r}); "
                                 "give a webly run whose Stage I finished")
        stage, done = st.get("stage_", 1), bool(st.get("done_", False))
        if stage != 1 or not done:
            why = "it went on into Stage II" if stage == 2 else "its Stage I did not finish"
            raise CrossViewError(f"init_from {source}: {why}; give a run whose Stage I finished and stopped there "
                                 "(stage2_epochs=0, or no web set), or resume that run instead")
        spec = st.get("model_spec_")
        if not isinstance(spec, dict) or spec.get("text_model") != self.text_model or \
                int(spec.get("embed_dim", -1)) != int(self.embed_dim) or \
                int(spec.get("tag_dim", 50)) != (50 if self.tag_branch == "glove" else 0):
            raise CrossViewError(f"init_from {source}: that model (text_model {spec.get('text_model') if isinstance(spec, dict) else '?'}, "
                                 f"embed_dim {spec.get('embed_dim') if isinstance(spec, dict) else '?'}, tag branch "
                                 f"{'glove' if not isinstance(spec, dict) or spec.get('tag_dim', 50) else 'sentence'}) is not "
                                 "this run's; set text_model, embed_dim and tag_branch as that run had them")
        self._initial = {k: v for k, v in st.items() if k.endswith("_")}
        hist = st.get("history_") or []
        best = st.get("best_score_")
        return (f"webly: Stage II starts from {source} (Stage I: {len(hist)} epochs, step {st.get('step_')}"
                + (f", best validation rsum {float(best):.1f}" if isinstance(best, (int, float)) and
                   np.isfinite(best) else "") + ")")

    def optimizers(self, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
        opts = super().optimizers(model)
        if self._stage() == 2:
            for o in opts:
                for g in o.param_groups:
                    g["lr"] = g["lr"] / float(self.lr) * float(self.stage2_lr)
        return opts

    def schedulers(self, optimizers: Any) -> list[Any]:
        return [] if self._stage() == 2 else super().schedulers(optimizers)

    def _tagging(self, captions: Sequence[str], counts: Counter | None = None,
                 sentences: bool = False) -> Iterator[Any]:
        """:func:`iter_caption_tag_vectors` of ``captions`` with progress events (stage :data:`TAG_STAGE`); returns
        what it returns."""
        from crossview.core.events import Progress

        work = iter_caption_tag_vectors(captions, counts, sentences)
        while True:
            try:
                done, total = next(work)
            except StopIteration as end:
                return end.value
            if world()[0] == 0:
                yield Progress(done, total, "webly: tagging the training captions (nouns and verbs)", stage=TAG_STAGE)

    def plan_stages(self, n_captions: int) -> list[tuple[str, str, str, float]]:
        """The run's stages before fitting (the engine's plan): Stage I tags its training captions (its tag branch
        reads their nouns and verbs) once, before the first epoch; none for Stage II from a finished Stage I run."""
        if getattr(self, "init_from", None):
            return []
        return [(TAG_STAGE, "tagging the captions", "nouns and verbs", float(n_captions))]

    def before_training(self, train: MethodData, val: MethodData | None, model: torch.nn.Module,
                        device: torch.device) -> Iterator[Any]:
        """Stage I's tag vectors of the training captions, with progress (made here unless fit_iter made them in
        its pass that counts the curriculum's tags); Stage II reads its web set's tags as they are."""
        yield from super().before_training(train, val, model, device)
        if self._stage() != 1:
            return
        if self._sentence_tags():
            self._caption_tagtext = yield from self._tagging(train.captions, sentences=True)
            return
        tagv = getattr(self, "_caption_tagv", None)
        if tagv is None or len(tagv) != train.n_captions:
            self._caption_tagv = yield from self._tagging(train.captions)

    def prepare(self, train: MethodData, device: torch.device) -> None:
        if self._stage() == 1:
            super().prepare(train, device)
            if self._sentence_tags():
                text, self._caption_tagtext = getattr(self, "_caption_tagtext", None), None
                if text is None or len(text) != train.n_captions:
                    text = tag_sentences(caption_tags(train.captions))
                self._t["tagtext"] = self._tag_text(text, device)
            else:
                # the tag vectors fit_iter made with the curriculum's counts (one tagging pass), else made now
                tagv, self._caption_tagv = getattr(self, "_caption_tagv", None), None
                if tagv is None or len(tagv) != train.n_captions:
                    tagv = caption_tag_vectors(train.captions)
                self._t["tagv"] = torch.as_tensor(tagv).to(device)
            return
        # Stage II, the web set: images and their tag lists (its "captions"), no sentences
        self._t = {"ci": torch.as_tensor(train.caption_image, dtype=torch.int64).to(device)}
        if self.model_spec_.get("image_model") == "cnn":     # end to end: the web images' files
            if not train.image_paths:
                raise CrossViewError("webly: image_model=cnn trains Stage II on the web set's image files, but "
                                     "this web set has feature rows only; give a web set of image files")
            self._set_image_files(list(train.image_paths), train.caption_image, device)
        else:
            self._t["img"] = torch.as_tensor(train.require_image_features(self.name)).to(device)
        tags = [[t for t in c.split(",") if t] for c in train.captions]
        if self._sentence_tags():
            self._t["tagtext"] = self._tag_text(tag_sentences(tags), device)
        else:
            self._t["tagv"] = torch.as_tensor(tag_vectors(tags)).to(device)

    def _graph_width_tables(self) -> list[dict[str, Any]]:
        tables = super()._graph_width_tables()
        tag = self._t.get("tagtext")
        return tables + ([tag] if tag is not None and "width_np" in tag else [])

    def _tag_text(self, strings: list[str], device: torch.device) -> dict[str, torch.Tensor]:
        """What the sentence branch reads for the tag strings (``tag_branch="sentence"``), shaped as
        :meth:`Vsepp._text_batch` takes it: the run's caption features of the strings, or their tokens."""
        if self.model_spec_["text_model"] == "features":
            encode = getattr(self, "_encode_text", None)
            if encode is None:
                raise CrossViewError("webly: tag_branch=sentence over text_model=features encodes the tag strings with "
                                     "the run's text encoder; train through the engine (crossview train, the app) or "
                                     "use text_model=gru / transformer")
            uniq, inverse = np.unique(np.asarray(strings, dtype=object).astype(str), return_inverse=True)
            x = np.asarray(encode([str(u) for u in uniq]), dtype=np.float32)[inverse.reshape(-1)]
            return {"txt": torch.as_tensor(x).to(device)}
        inputs = self._text_inputs(strings)
        t = {"width_cpu": (inputs["lengths"] if "lengths" in inputs else inputs["mask"].sum(1)).cpu()}
        t["width_np"] = t["width_cpu"].numpy()
        t.update({k: v.to(device) for k, v in inputs.items()})
        return t

    def training_step(self, model: torch.nn.Module, batch: torch.Tensor,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Stage I: ``lambda1 * L_IS + lambda2 * L_IT`` over a batch of captions, their images and their tags;
        Stage II: ``L_IT`` over a batch of web images and their tags."""
        from crossview.nn.trainer import unwrap

        m = unwrap(model)
        if self._sentence_tags():
            host = self._live[1].batch_host if getattr(self, "_live", None) is not None else None
            tg = m.text(**self._text_batch(self._t["tagtext"], batch,
                                           host if host is not None and len(host) == len(batch) else None))
        else:
            tg = m.tags(self._t["tagv"][batch])
        if self._stage() == 1:
            im, _, s, img_ids = self._embed_batch(model, batch)
        else:
            img_ids = self._t["ci"][batch]
            if "img" in self._t:
                im = m.image(self._t["img"][img_ids])
            else:                                    # end to end: the batch's web images, decoded in workers
                images, rows = self._batch_images(batch)
                im = m.image(images)[rows.to(img_ids.device)]
            s = None
        im, tg, img_ids = gather_rows(im), gather_rows(tg), gather_rows(img_ids)
        hardest = self.loss == "vsepp"
        b = max(1, int(img_ids.numel()))
        it_i2t, it_t2i = contrastive_loss(im, tg, margin=float(self.margin), hardest=hardest, image_ids=img_ids)
        l_it = it_i2t + it_t2i
        out = {"L_IT": l_it.detach() / b}
        # Stage II trains L_IT alone at its own rate (lambda1 = 0); lambda2 weighs it against L_IS in Stage I only,
        # so lambda2=0 (the ablation "no L_IT in Stage I") still has a Stage II
        loss = float(self.lambda2) * l_it if s is not None else l_it
        if s is not None:
            s = gather_rows(s)
            is_i2t, is_t2i = contrastive_loss(im, s, margin=float(self.margin), hardest=hardest, image_ids=img_ids)
            l_is = is_i2t + is_t2i
            loss = loss + float(self.lambda1) * l_is
            out["L_IS"] = l_is.detach() / b
        return {"loss": loss / world()[1], **out}

    # ------------------------------------------------------------------ two stages
    def fit_iter(self, train: MethodData, val: MethodData | None = None, *, resume: bool = False,
                 web: MethodData | None = None) -> Iterator[Any]:
        web = web if web is not None else getattr(self, "_web", None)
        # the curriculum's order: from every training caption's tags, the same on resume; counted only when a
        # Stage II will order its web set by them, in the pass that makes Stage I's tag vectors (prepare)
        self._clean_counts: Counter = Counter()
        self._caption_tagv = None
        if web is not None and int(self.stage2_epochs) > 0 and self.curriculum == "frequency":
            self._caption_tagv = yield from self._tagging(train.captions, self._clean_counts)
        initial, self._initial = getattr(self, "_initial", None), None
        if resume and getattr(self, "model_state_", None) is not None:
            initial = None                           # a resume continues its own state, wherever it began
        if initial is not None:                      # Stage II from a finished Stage I run (init_from)
            self.check_params()
            for k, v in initial.items():
                setattr(self, k, v)
            stage, resume = 2, True
        else:
            stage = int(getattr(self, "stage_", 1)) if resume else 1
        if stage == 1:
            yield from self._train_first_stage(train, val, resume)
            if web is None or int(self.stage2_epochs) <= 0 or getattr(self, "stopped_", False):
                return
            if int(self.epoch_) < int(self.max_epochs) and not self.done_:
                return                               # cancelled inside Stage I: resume continues it
        if web is None:
            raise CrossViewError("webly: this run is in Stage II and needs its web set again (web=PATH or demo)")
        yield from self._train_second_stage(
            self._curriculum_data(web), val, phase="Stage II (web)",
            log=f"webly: Stage II starts at step {self.step_}" + (f" from {self.init_from}" if initial else "")
            + f": {web.n_images} web images, L_IT only, lr {self.stage2_lr}")

    def make_sampler(self, train: MethodData, seed: int, rank: int, world_size: int) -> Any:
        if self._stage() == 2 and self.curriculum == "frequency":
            from crossview.nn.trainer import CurriculumSampler

            return CurriculumSampler(train.n_captions, int(self.batch_size), start=float(self.curriculum_start),
                                     ramp=int(self.curriculum_epochs), seed=seed, rank=rank, world_size=world_size)
        return super().make_sampler(train, seed, rank, world_size)

    def _curriculum_data(self, web: MethodData) -> MethodData:
        """The web set as training data (its "captions" are tag lists, one per image), in curriculum order."""
        tags = [[t.strip() for t in c.split(",") if t.strip()] for c in web.captions]
        if len(tags) != web.n_images or np.any(np.asarray(web.caption_image) != np.arange(web.n_images)):
            raise CrossViewError("webly: the web set must have one tag list per image (web_method_data builds it)")
        if self.curriculum == "frequency":
            order = curriculum_order(tags, getattr(self, "_clean_counts", None) or Counter())
        else:
            order = np.arange(len(tags))
        return MethodData(image_features=None if web.image_features is None else np.asarray(web.image_features)[order],
                          text_features=None, captions=[",".join(tags[i]) for i in order],
                          caption_image=np.arange(len(order)), name="web",
                          image_paths=None if web.image_paths is None else [web.image_paths[i] for i in order])
