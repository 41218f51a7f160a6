"""The demo's "web" set: scenes of their own seed stream with noisy tags (true tags dropped, wrong ones
added; see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from crossview.data.demo.scenes import _rng, make_scene
from crossview.data.demo.spec import Scene, TAG_VOCABULARY, WEB_ADD_RATE, WEB_DROP_RATE, _STREAM_WEB


@dataclass
class WebItem:
    """A web image: its scene, the true tags and the noisy tags the collection shows."""

    scene: Scene
    true_tags: list[str]
    tags: list[str]
    dropped: list[str]
    added: list[str]

    def to_json(self) -> dict:
        return {**self.scene.to_json(), "true_tags": self.true_tags, "noisy_tags": self.tags,
                "dropped": self.dropped, "added": self.added}


def make_web_item(seed: int, index: int, web_drop: float = WEB_DROP_RATE,
                  web_add: float = WEB_ADD_RATE) -> WebItem:
    """Web item ``index``: a scene of the web stream with noisy tags (see the module docstring)."""
    scene = make_scene(seed, index, stream=_STREAM_WEB, captions=False)
    rng = _rng(seed, _STREAM_WEB + 100, index)
    true = scene.tags
    drop_mask = rng.random(len(true)) < web_drop
    kept = [t for t, d in zip(true, drop_mask) if not d]
    dropped = [t for t, d in zip(true, drop_mask) if d]
    wrong_pool = [t for t in TAG_VOCABULARY if t not in true]
    n_add = min(int(rng.binomial(len(true), web_add)), len(wrong_pool))
    added = [wrong_pool[k] for k in sorted(rng.choice(len(wrong_pool), size=n_add, replace=False))]
    tags = kept + added
    if not tags:  # a web image always shows at least one tag
        back = dropped.pop(int(rng.integers(len(dropped))))
        tags = [back]
    order = rng.permutation(len(tags))
    return WebItem(scene, true, [tags[k] for k in order], dropped, added)


def make_web_items(n: int, seed: int = 0, web_drop: float = WEB_DROP_RATE,
                   web_add: float = WEB_ADD_RATE) -> list[WebItem]:
    """The first ``n`` web items (no rendering)."""
    return [make_web_item(seed, i, web_drop, web_add) for i in range(n)]
