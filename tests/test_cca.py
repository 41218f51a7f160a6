"""CCA: the closed form against scikit-learn and hand checks, learning on the demo, save/load, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from crossview.core.errors import CrossViewError
from crossview.methods import create_method
from crossview.methods.base import Method, MethodData
from crossview.core.linalg import cca_transform, fit_cca
from crossview.methods.cca import CCA


def _paired(n=400, p=8, q=6, latent=3, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, latent))
    X = Z @ rng.normal(size=(latent, p)) + rng.normal(size=(n, p))
    Y = Z @ rng.normal(size=(latent, q)) + 1.5 * rng.normal(size=(n, q))
    return X, Y


def test_canonical_correlations_match_scikit_learn():
    from sklearn.cross_decomposition import CCA as SkCCA

    X, Y = _paired()
    ours = fit_cca(X, Y, n_components=3, reg=0.0)
    sk = SkCCA(n_components=3, max_iter=5000, tol=1e-12).fit(X, Y)
    xs, ys = sk.transform(X, Y)
    sk_corr = [np.corrcoef(xs[:, k], ys[:, k])[0, 1] for k in range(3)]
    np.testing.assert_allclose(ours.correlations, sk_corr, atol=1e-4)
    # Same directions up to sign and scale: the canonical variates are perfectly (anti-)correlated.
    u = (X - ours.x_mean) @ ours.x_proj
    for k in range(3):
        assert abs(np.corrcoef(u[:, k], xs[:, k])[0, 1]) > 1 - 1e-4


def test_closed_form_conditions_hold_by_hand():
    """A^T (C_xx + r_x I) A = I, B^T (C_yy + r_y I) B = I, A^T C_xy B = diag(corr), with the ridge
    computed by hand from its definition (reg times the average variance)."""
    X, Y = _paired(n=300, p=7, q=5, seed=1)
    reg = 0.3
    r = fit_cca(X, Y, n_components=5, reg=reg)
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    n = len(X)
    Cxx, Cyy, Cxy = Xc.T @ Xc / (n - 1), Yc.T @ Yc / (n - 1), Xc.T @ Yc / (n - 1)
    Cxx_r = Cxx + reg * np.trace(Cxx) / 7 * np.eye(7)
    Cyy_r = Cyy + reg * np.trace(Cyy) / 5 * np.eye(5)
    np.testing.assert_allclose(r.x_proj.T @ Cxx_r @ r.x_proj, np.eye(5), atol=1e-5)
    np.testing.assert_allclose(r.y_proj.T @ Cyy_r @ r.y_proj, np.eye(5), atol=1e-5)
    np.testing.assert_allclose(r.x_proj.T @ Cxy @ r.y_proj, np.diag(r.correlations), atol=1e-5)
    assert np.all(np.diff(r.correlations) <= 1e-12)
    # The correlations are the singular values of the whitened cross-covariance (a naive eigen route).
    def inv_sqrt(C):
        w, V = np.linalg.eigh(C)
        return V @ np.diag(w ** -0.5) @ V.T
    naive = np.linalg.svd(inv_sqrt(Cxx_r) @ Cxy @ inv_sqrt(Cyy_r), compute_uv=False)[:5]
    np.testing.assert_allclose(r.correlations, naive, atol=1e-6)


def test_singular_covariance_without_ridge_uses_the_pseudo_inverse():
    X, Y = _paired(n=200, p=6, q=5, seed=2)
    X = np.hstack([X, X[:, :2]])                 # duplicated columns: C_xx is singular
    r = fit_cca(X, Y, n_components=4, reg=0.0)
    assert np.all(np.isfinite(r.x_proj)) and np.all(r.correlations <= 1.0)
    ref = fit_cca(X[:, :6], Y, n_components=4, reg=0.0)
    np.testing.assert_allclose(r.correlations, ref.correlations, atol=1e-4)


def test_caption_pairs_equal_repeated_image_rows():
    """The grouped covariance (once per image, weighted by caption count) equals plain CCA on the
    image rows repeated once per caption."""
    rng = np.random.default_rng(3)
    n_img = 60
    ci = np.sort(rng.integers(0, n_img, size=200))
    ci[:n_img] = np.arange(n_img)
    ci = np.sort(ci)
    img = rng.normal(size=(n_img, 9)).astype(np.float32)
    txt = (img[ci] @ rng.normal(size=(9, 7)) + rng.normal(size=(len(ci), 7))).astype(np.float32)
    data = MethodData(img, txt, [""] * len(ci), ci)
    m = CCA(n_components=5, reg=0.05).fit(data)
    ref = fit_cca(img[ci].astype(np.float64), txt.astype(np.float64), 5, reg=0.05)
    np.testing.assert_allclose(m.correlations_, ref.correlations, atol=1e-5)
    np.testing.assert_allclose(m.x_mean_, ref.x_mean, atol=1e-5)
    # Same canonical variates (up to sign; the sign convention makes them equal here).
    np.testing.assert_allclose((img[ci] - m.x_mean_) @ m.x_proj_, (img[ci] - ref.x_mean) @ ref.x_proj, atol=1e-4)
    np.testing.assert_allclose((txt - m.y_mean_) @ m.y_proj_, (txt - ref.y_mean) @ ref.y_proj, atol=1e-4)


def test_encodings_are_weighted_normalised_projections():
    X, Y = _paired(n=120, p=6, q=4, seed=4)
    ci = np.arange(120)
    data = MethodData(X, Y, [""] * 120, ci)
    m = CCA(n_components=3, reg=0.1, weight_power=2.0).fit(data)
    img, txt = m.encode_images(data), m.encode_texts(data)
    assert img.shape == (120, 3) and txt.shape == (120, 3) and img.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1.0, atol=1e-5)
    # By hand: centre, project, weight by corr^2, cosine.
    u = (X - m.x_mean_) @ m.x_proj_ * m.correlations_ ** 2
    v = (Y - m.y_mean_) @ m.y_proj_ * m.correlations_ ** 2
    i, j = 5, 17
    cos = u[i] @ v[j] / np.linalg.norm(u[i]) / np.linalg.norm(v[j])
    assert m.scores(data)[i, j] == pytest.approx(cos, abs=1e-5)
    # Unweighted variant: plain normalised correlation.
    m.set_params(weight_power=0.0)
    np.testing.assert_allclose(m.encode_images(data), cca_transform(X, m.x_mean_, m.x_proj_), atol=1e-6)
    assert m.encode_images(data, direction="t2i").shape == (120, 3)


def test_n_components_is_capped_and_kept():
    X, Y = _paired(n=100, p=6, q=4)
    data = MethodData(X, Y, [""] * 100, np.arange(100))
    assert CCA(n_components=2).fit(data).x_proj_.shape == (6, 2)
    assert CCA(n_components=50).fit(data).x_proj_.shape == (6, 4)


def test_save_load_round_trip(tmp_path):
    X, Y = _paired(n=100, p=6, q=4)
    data = MethodData(X, Y, [""] * 100, np.arange(100))
    m = create_method("cca", n_components=3, reg=0.2, pairs="images").fit(data)
    path = m.save(tmp_path / "cca.pt", extra={"note": "x"})
    loaded = Method.load(path)
    assert isinstance(loaded, CCA) and loaded.get_params() == m.get_params()
    np.testing.assert_array_equal(loaded.encode_images(data), m.encode_images(data))
    np.testing.assert_array_equal(loaded.encode_texts(data), m.encode_texts(data))
    again = CCA().load_state_dict(m.state_dict())
    np.testing.assert_array_equal(again.correlations_, m.correlations_)


def test_bad_input_gives_clear_errors():
    X, Y = _paired(n=50, p=6, q=4)
    data = MethodData(X, Y, [""] * 50, np.arange(50))
    with pytest.raises(CrossViewError, match="n_components must be a positive integer"):
        CCA(n_components=0).fit(data)
    with pytest.raises(CrossViewError, match="reg must be a number >= 0"):
        CCA(reg=-1.0).fit(data)
    with pytest.raises(CrossViewError, match="pairs must be 'captions' or 'images'"):
        CCA(pairs="words").fit(data)
    with pytest.raises(CrossViewError, match="not fitted yet"):
        CCA().encode_images(data)
    m = CCA(n_components=2).fit(data)
    with pytest.raises(CrossViewError, match="fitted on 6-d image features but got 5-d"):
        m.encode_images(MethodData(X[:, :5], Y, [""] * 50, np.arange(50)))
    with pytest.raises(CrossViewError, match="needs caption features"):
        m.encode_texts(MethodData(X, None, [""] * 50, np.arange(50)))
    with pytest.raises(CrossViewError, match="direction must be 'i2t'"):
        m.encode_images(data, direction="both")
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(CrossViewError, match="NaN"):
        CCA().fit(MethodData(Xn, Y, [""] * 50, np.arange(50)))
    with pytest.raises(CrossViewError, match="at least 2 training pairs"):
        CCA().fit(MethodData(X[:1], Y[:1], [""], np.arange(1)))
    with pytest.raises(CrossViewError, match="paired rows"):
        fit_cca(X, Y[:10], 2)


@pytest.fixture(scope="module")
def demo_thumbnail_data(demo_dataset):
    """Demo train (first 800 images) / test (200 images): 16x16 RGB thumbnails as image features and
    TF-IDF caption features through the real ``extract_features`` (precomputed-feature route)."""
    from PIL import Image

    from crossview.data.dataset import PairedDataset
    from crossview.features import extract_features

    ds = demo_dataset
    sub = ds.subset(np.concatenate([ds.splits["train"][:800], ds.splits["test"]]))

    def thumb(path):
        im = Image.open(path)
        im.draft("RGB", (64, 64))
        return np.asarray(im.convert("RGB").resize((16, 16), Image.BILINEAR), dtype=np.float32).ravel() / 255

    pre = PairedDataset(name="demo-thumbs", captions=sub.captions, caption_image=sub.caption_image,
                        image_features=np.stack([thumb(p) for p in sub.image_paths]), splits=sub.splits,
                        format="demo-thumbs")
    f = extract_features(pre, text_encoder="tfidf", cache=False)
    return (MethodData.from_features(pre, f.image, f.text, "train"),
            MethodData.from_features(pre, f.image, f.text, "test"))


def test_cca_learns_on_the_demo(demo_thumbnail_data):
    train, test = demo_thumbnail_data
    m = create_method("cca").fit(train)
    res = m.evaluate(test)
    # Chance R@10: i2t 1 - C(995,10)/C(1000,10) ~ 4.9%; t2i 10/200 = 5%.
    assert res["i2t"]["R@10"] > 15.0 and res["t2i"]["R@10"] > 15.0
    assert res["i2t"]["MedR"] < 80 and res["t2i"]["MedR"] < 50   # chance MedR: i2t ~130, t2i ~100
    # Correlation weighting is what makes raw-pixel CCA work (Gong et al.): unweighted is worse.
    plain = create_method("cca", weight_power=0.0).fit(train).evaluate(test)
    assert plain["rsum"] < res["rsum"]
