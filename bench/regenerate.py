"""Remake any or all of bench/results/ with today's code, each file stamped (bench/_stamp.py).

    .venv/bin/python bench/regenerate.py --list                    # every file: what it needs, how long, stale?
    .venv/bin/python bench/regenerate.py --only cca_fit,explain_latency_cpu
    .venv/bin/python bench/regenerate.py --all --dry-run           # the commands, nothing run
    .venv/bin/python bench/regenerate.py --stale [--max-minutes 60]  # every stale (or missing) file, shortest first

:data:`ENTRIES` is the registry: one entry per results file, with the command(s) that make it (bench scripts, which
write their part through ``--out``, and ``crossview experiment ...`` commands, whose Markdown ``--out`` this script
stamps), the data it needs, whether it needs a GPU, a rough time on the 2-core CPU and the source paths whose
changes make it stale. An entry with several commands gets one file: each command's output under its command line.
Run folders, web sets and intermediate outputs go to ``--work DIR/NAME`` (outside the repository; emptied first
unless ``--resume``), never into the repository. Entries whose data is missing (the shared Flickr8k sample beside
the repository) are skipped with one line; GPU entries are skipped on a machine without CUDA and left as they are.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stamp  # noqa: E402  (bench/_stamp.py)
from _stamp import REPO, RESULTS  # noqa: E402

from crossview.core.errors import CrossViewError  # noqa: E402

F8K_DIR = _stamp.FLICKR8K.parent
#: Placeholders in the registry's command lines, as a reader types them from the repository root.
PLACES = {"{F8K}": "../shared/data/flickr8k-sample/dataset_flickr8k_sample.json",
          "{F8K_DIR}": "../shared/data/flickr8k-sample",
          "{CORPUS}": "../shared/data/flickr8k-sample/corpus_captions.txt"}
#: What each kind of data needs on this machine (None: made by the code itself).
DATA_NEEDS = {"flickr8k": _stamp.FLICKR8K, "demo": None, "synthetic": None}


@dataclass(frozen=True)
class Step:
    """One command of an entry. ``argv[0]`` is ``bench/<script>.py`` (run with this Python, ``--out`` appended) or
    ``crossview`` (the console script); ``output=False`` for a preparation (train a run, build a web set)."""

    argv: tuple[str, ...]
    output: bool = True

    @property
    def is_script(self) -> bool:
        return self.argv[0].startswith("bench/")

    @property
    def is_experiment(self) -> bool:
        return self.argv[:2] == ("crossview", "experiment")


@dataclass(frozen=True)
class Entry:
    """One file of bench/results/ and how to make it."""

    name: str
    file: str                       # its name in bench/results/
    steps: tuple[Step, ...]
    data: tuple[str, ...]           # keys of DATA_NEEDS
    minutes: float                  # rough time on the 2-core CPU (GPU entries: on the lent GPU machine); --list
    #                                 shows the time the file's stamp records instead (``took:``) when it has one
    deps: tuple[str, ...]           # source paths whose changes make the file stale (the steps' scripts are added)
    gpu: bool = False
    title: str = ""                 # the Markdown heading of a file assembled from several commands

    @property
    def path(self) -> Path:
        return RESULTS / self.file

    def scripts(self) -> list[str]:
        return sorted({s.argv[0] for s in self.steps if s.is_script})

    def all_deps(self) -> list[str]:
        return sorted(set(self.deps) | set(self.scripts()))


def S(cmd: str, output: bool = True) -> Step:  # noqa: N802 - reads as a table below
    """A step from a command line (shell words)."""
    return Step(tuple(shlex.split(cmd)), output)


def methods(*names: str) -> tuple[str, ...]:
    """The sources of methods ``names``: their module, their card (which holds the defaults) and private helpers."""
    extra = {"bitr": ("crossview/methods/_bitr_losses.py", "crossview/methods/_bitr_trainer.py",
                      "crossview/methods/_qp.py", "crossview/methods/_cgrid.py"),
             "svm": ("crossview/methods/_labels.py", "crossview/methods/_cgrid.py"),
             "wknn": ("crossview/methods/_labels.py",),
             "wsabie": ("crossview/nn/warp.py", "crossview/nn/trainer.py", "crossview/nn/sparse_rows.py",
                        "crossview/methods/torch_method.py"),
             "cca": ("crossview/core/linalg.py",)}
    deep = ("crossview/nn", "crossview/methods/torch_method.py")
    out: list[str] = []
    for n in names:
        out += [f"crossview/methods/{n}.py", f"models/{n}.toml", *extra.get(n, ())]
        if n in ("vsepp", "smoothap", "webly", "timam"):
            out += [*deep, "crossview/methods/vsepp.py", "models/vsepp.toml"]
    return tuple(dict.fromkeys(out))


FEATURES = ("crossview/features",)
#: what every run goes through: engine/run.py and its stages (features, and a second dataset's; the fit and the
#: evaluation)
ENGINE_RUN = ("crossview/engine/run.py", "crossview/engine/feature_stage.py", "crossview/engine/fit_stage.py")
METRICS = ("crossview/eval/metrics.py",)
#: what bench/method_tune.py runs through: crossview tune, every run under its method's default scoring, the paired
#: effects, the fold pooling it shares with bench/method_cv.py
TUNE_BENCH = ("crossview/engine/tune.py", *ENGINE_RUN, "crossview/eval/paired.py", "crossview/engine/scoring.py",
              "crossview/eval/scoring.py", "bench/method_cv.py")
TABLE = ("crossview/experiments/bitr_table.py", "crossview/experiments/_common.py", "crossview/eval/overlap.py",
         "crossview/eval/metrics.py", *ENGINE_RUN, "crossview/engine/splits.py", *FEATURES)
LABELS = ("crossview/experiments/bitr_labels.py", "crossview/experiments/bitr_table.py",
          "crossview/experiments/_common.py", "crossview/eval/protocols.py", "crossview/data/views.py",
          *ENGINE_RUN, *FEATURES)
STUDY = ("crossview/experiments/variants.py", "crossview/experiments/_common.py", "crossview/eval",
         *ENGINE_RUN, *FEATURES)

BITR_TABLE = ("crossview experiment bitr-table --data {F8K} --representation %s "
              "--methods cca,wsabie,bitr-m,bitr-e,bitr-c,random --k 10,50 --split val --corpus {CORPUS} "
              "--param bitr.c_grid=paper --param bitr-m.c_grid=1e-2:1e1 --seeds 0,1,2 --exp-dir {WORK}/exp")


# minutes measured at 0b02a25 / ecf3cdf with features cached (1 thread each, two beside each other), one build:
# default 6.2, modern 1.9, TR 1.5, CTR 3; a first TR / CTR build adds its local descriptors (about 2 min), and each
# seed of TR / CTR its own k-means and LDA (about 3 min); the tables average seeds 0-2 (three builds)
def _bitr_table(rep: str, minutes: float, suffix: str) -> Entry:
    return Entry(f"bitr_table_flickr8k{suffix}", f"bitr_table_flickr8k{suffix}.md", (S(BITR_TABLE % rep),),
                 ("flickr8k",), minutes, TABLE + methods("cca", "wsabie", "bitr") +
                 (("crossview/features/topics.py",) if rep != "default" else ()))


def _sweep(loss: str, rows: list[tuple]) -> tuple[Step, ...]:
    """vsepp_quality.py cross-validation steps, one per (temperature, epochs, decay, batch, lr) row."""
    knob = "tau" if loss == "smoothap" else "temperature"
    out = []
    for t, e, d, b, lr in rows:
        cmd = (f"bench/vsepp_quality.py --protocol cv --no-select --configs {loss}:minilm --seeds 3 "
               f"--set max_epochs={e} --set lr_decay_epoch={d} --set {knob}={t}")
        cmd += f" --set batch_size={b}" if b != 128 else ""
        cmd += f" --set lr={lr}" if lr != 2e-4 else ""
        out.append(S(cmd))
    return tuple(out)


_SMOOTHAP_CV = [(0.01, 30, 20, 128, 2e-4), (0.01, 40, 30, 128, 2e-4), (0.01, 60, 40, 128, 2e-4),
                (0.03, 60, 40, 128, 2e-4), (0.05, 100, 70, 128, 2e-4), (0.1, 30, 20, 128, 2e-4),
                (0.1, 60, 40, 128, 2e-4), (0.1, 60, 40, 128, 1e-3), (0.1, 60, 40, 32, 2e-4),
                (0.1, 100, 70, 128, 2e-4), (0.1, 150, 100, 128, 2e-4), (0.3, 60, 40, 128, 2e-4)]
_INFONCE_CV = [(0.1, 30, 20, 128, 2e-4), (0.1, 40, 30, 128, 2e-4), (0.1, 60, 40, 128, 2e-4),
               (0.1, 100, 70, 128, 2e-4), (0.05, 60, 40, 128, 2e-4), (0.2, 60, 40, 128, 2e-4),
               (0.1, 60, 40, 128, 1e-3), (0.1, 60, 40, 32, 2e-4)]
_VSEPP_CONFIGS = ("vse0:minilm,vsepp:minilm,vse0:gru_glove,vsepp:gru_glove,vse0:gru,vsepp:gru,vse0:minilm_ft,"
                  "vsepp:minilm_ft")
_VSEPP_CV = [(6, 4), (8, 6), (10, 7), (12, 8), (15, 10), (20, 15), (30, 15)]

#: what bench/scale.py measures (scale_cpu.txt, scale_gpu.txt)
SCALE_DEPS = ("crossview/data/readers/precomp.py", "crossview/data/dataset.py", "crossview/data/method_data.py",
              "crossview/features/normalize.py", "crossview/features/text/counts.py", "crossview/features/text/base.py",
              "crossview/features/cache.py", "crossview/features/__init__.py", "crossview/eval/metrics.py",
              "crossview/eval/embeddings.py", "crossview/eval/scoring.py", "crossview/features/vocab.py",
              *ENGINE_RUN, "crossview/engine/retriever.py", "crossview/engine/fit_stage.py",
              "crossview/engine/scoring.py", "crossview/core/io.py", "crossview/nn/sparse_rows.py",
              "crossview/nn/row_optim.py", "crossview/features/tags.py", "crossview/features/text/glove.py",
              "crossview/methods/base.py", "crossview/methods/torch_method.py", "bench/_cut_epochs.py",
              *methods("cca", "bitr", "wsabie", "vsepp", "smoothap", "webly", "timam"))

ENTRIES: tuple[Entry, ...] = (
    Entry("backbone_compare", "backbone_compare.md", (S("bench/backbone_compare.py"),), ("flickr8k",), 2,
          ("crossview/features/image.py", "crossview/features/text", "crossview/features/normalize.py",
           "bench/method_cv.py", "crossview/eval/paired.py", "crossview/eval/bootstrap.py", *methods("cca"),
           *METRICS)),
    # Experiments 2-4 choose BITR's C by 5-fold cross-validation of the training images over the paper's grid, as
    # Experiment 1 (BITR_TABLE) and the paper do (BITR-M over 1e-2..1e1, where its cutting plane converges); with
    # the card's fixed C they measured BITR at a C chosen for image-caption retrieval (10 since 17b5645, 1000 before)
    Entry("bitr_exp2_flickr8k_to_demo", "bitr_exp2_flickr8k_to_demo.md",
          (S("crossview experiment bitr-table --data {F8K} --representation modern --methods cca,wsabie,bitr-c,random "
             "--k 50 --test-data demo --index exact --param bitr.c_grid=paper --seeds 0,1,2 --exp-dir {WORK}/exp"),),
          ("flickr8k", "demo"), 36, TABLE + methods("cca", "wsabie", "bitr") + ("crossview/index",
                                                                                 "crossview/features/topics.py")),
    Entry("bitr_exp3_flickr8k", "bitr_exp3_flickr8k.md",
          (S("crossview experiment bitr-labels --data {F8K} --text phrases --min-images 3 --representation modern "
             "--methods cca,wknn,svm,wsabie,bitr-m,bitr-e,bitr-c,random --k 5 --split val "
             "--param bitr.max_iter=100 --param bitr.c_grid=paper --param bitr-m.c_grid=1e-2:1e1 --seeds 0,1,2 "
             "--exp-dir {WORK}/exp"),),
          ("flickr8k",), 15, LABELS + ("crossview/data/phrases.py",)
          + methods("cca", "wknn", "svm", "wsabie", "bitr")),
    Entry("bitr_exp4_demo", "bitr_exp4_demo.md",
          (S("crossview experiment bitr-labels --data demo --text labels --representation modern "
             "--methods cca,wknn,svm,wsabie,bitr-c,random --k 5 --param bitr.max_iter=50 --param bitr.c_grid=paper "
             "--seeds 0,1,2 --exp-dir {WORK}/exp"),),
          ("demo",), 6, LABELS + ("crossview/data/demo",) + methods("cca", "wknn", "svm", "wsabie", "bitr")),
    _bitr_table("default", 20, ""),
    _bitr_table("ctr", 20, "_ctr"),
    _bitr_table("modern", 7, "_modern"),
    _bitr_table("tr", 15, "_tr"),
    Entry("bitr_table_runs", "bitr_table_runs.md",
          (S("crossview experiment bitr-table --data {F8K} --representation default --methods cca,bitr-c,random "
             "--k 10,50 --split val --corpus {CORPUS} --param bitr.c_grid=paper --exp-dir {WORK}/flickr"),
           S("crossview experiment bitr-table --data demo --representation default --text-encoder tfidf "
             "--methods cca,bitr-c,random --k 10,50 --split test --param bitr.c_grid=paper "
             "--exp-dir {WORK}/demo")),
          ("flickr8k", "demo"), 30, TABLE + methods("cca", "bitr"),
          title="The BITR table as engine runs: CCA, BITR-C and chance on the Flickr8k sample and the demo"),
    Entry("bitr_train", "bitr_train.md", (S("bench/bitr_train.py"),), ("synthetic",), 15, methods("bitr")),
    Entry("cca_fit", "cca_fit.txt", (S("bench/cca_fit.py"),), ("synthetic",), 4, methods("cca")),
    Entry("eval_passes_cpu", "eval_passes_cpu.txt", (S("bench/eval_passes.py"),), ("synthetic",), 4,
          ("crossview/eval/metrics.py", "crossview/eval/embeddings.py", "crossview/eval/hubness.py")),
    Entry("fuse_quality_flickr8k", "fuse_quality_flickr8k.md",
          (S("bench/fuse_quality.py --methods cca,bitr,vsepp --work {WORK}"),),
          ("flickr8k",), 20, ("bench/_quality.py", "crossview/engine/fuse.py", *ENGINE_RUN, "crossview/engine/scoring.py",
                              "crossview/eval/paired.py", *FEATURES) + methods("cca", "bitr", "vsepp")),
    Entry("scoring_flickr8k", "scoring_flickr8k.md",
          (S("bench/scoring_quality.py --methods cca,bitr --work {WORK}"),),
          ("flickr8k",), 5, ("bench/_quality.py", "crossview/engine/scoring.py", "crossview/eval/scoring.py",
                             "crossview/engine/cv_runs.py", *ENGINE_RUN, "crossview/eval/paired.py",
                             "crossview/eval/bootstrap.py", *FEATURES) + methods("cca", "bitr")),
    # rich_features_flickr8k chooses under plain scores; this puts CCA's caption features to the scoring it ranks by
    Entry("text_encoder_cv_flickr8k", "text_encoder_cv_flickr8k.md",
          (S("bench/text_encoder_cv.py --method cca --text-encoders minilm+glove,minilm+tfidf --work {WORK}"),),
          ("flickr8k",), 2, ("bench/_quality.py", "crossview/engine/scoring.py", "crossview/eval/scoring.py",
                             "crossview/engine/cv_runs.py", *ENGINE_RUN, "crossview/eval/paired.py",
                             "crossview/eval/bootstrap.py", *FEATURES) + methods("cca")),
    # every method's runs and fold runs stay in $WORK: `--resume` (or bench/quality.py --work DIR) re-evaluates
    # them without training, e.g. after a change of default scorings
    Entry("quality_flickr8k", "quality_flickr8k.md",
          (S("bench/quality.py --methods cca,bitr,vsepp,wsabie,webly,smoothap,timam --fuse cca,bitr,best-deep "
             "--work {WORK}"),),
          ("flickr8k",), 150, ("bench/_quality.py", "bench/results/rich_features_flickr8k.md",
                               "crossview/engine/scoring.py", "crossview/eval/scoring.py", "crossview/engine/cv_runs.py",
                               "crossview/engine/fuse.py", *ENGINE_RUN, "crossview/eval/paired.py",
                               "crossview/eval/bootstrap.py", *FEATURES)
          + methods("cca", "bitr", "vsepp", "wsabie", "webly", "smoothap", "timam")),
    Entry("wsabie_max_norm_flickr8k", "wsabie_max_norm_flickr8k.md",
          (S("bench/method_cv.py --method wsabie --configs 'max_norm=1;max_norm=10' --seeds 3"),),
          ("flickr8k",), 36, methods("wsabie"),
          title="WSABIE's max_norm by 3-fold cross-validation of the Flickr8k sample's training photos only"),
    Entry("tune_wsabie_timam_flickr8k", "tune_wsabie_timam_flickr8k.md",
          # each first stage holds today's defaults (WSABIE lr 0.001, margin 0.3, lr_decay_epoch 12, 20 epochs,
          # 4096-d, max_norm 1; TIMAM id_weight 1, lr 3e-3 for its caption features): a run of stages that did not
          # ended in method_tune's refusal after 45 min. WSABIE's lr and margin moved to the low corner of the
          # grid before (lr 0.001,0.002,0.003 x margin 0.3,1 at commit 153c276), so the grid now reaches below it.
          # At three seeds (both methods are stochastic: one seed's luck chose before); ~4.5 h on the 2-core CPU,
          # resumable across sessions (--resume --work W: finished runs are read back)
          (S("bench/method_tune.py --method wsabie --stage 'lr=0.0005,0.001,0.002 margin=0.1,0.3' "
             "--stage 'max_epochs=20,40' --stage 'max_norm=1,2' --stage 'dim=2048,4096' --seeds 0,1,2 "
             "--work {WORK}/wsabie"),
           S("bench/method_tune.py --method timam --stage 'id_weight=1,0' --stage 'lr=0.001,0.003,0.01' "
             "--stage 'adv_weight=1,0' --seeds 0,1,2 --work {WORK}/timam")),
          ("flickr8k",), 270, (*TUNE_BENCH, *FEATURES) + methods("wsabie", "timam"),
          title="WSABIE and TIMAM re-examined with `crossview tune` on the Flickr8k sample (chosen on train, "
                "reported once on val)"),
    Entry("tune_cca_bitr_flickr8k", "tune_cca_bitr_flickr8k.md",
          # CCA's and BITR's defaults on their default features (EfficientNet-Lite0 + MobileNet-V2 flip-averaged;
          # MiniLM + GloVe / MiniLM + TF-IDF) under their default scoring, as `crossview train` runs them: the first
          # stage of each holds today's defaults. Both are deterministic: one seed. The move of CCA's reg (5 -> 12)
          # and BITR's C (1000 -> 10) came from this file at e4ccff0 (BITR's grid then reached down from C 100 in
          # two more stages, its best at the edge each time); run again from the new defaults, BITR's first stage
          # brackets C 10
          (S("bench/method_tune.py --method cca --stage 'reg=3,5,8,12,20 image_norm=ssr,none' "
             "--stage 'weight_power=0,0.25,0.5,1' --stage 'n_components=128,256,512' --work {WORK}/cca"),
           S("bench/method_tune.py --method bitr --stage 'C=3,10,30,100 image_norm=ssr,none' "
             "--stage 'cca_dim=32,64,128' --work {WORK}/bitr")),
          ("flickr8k",), 20, (*TUNE_BENCH, *FEATURES) + methods("cca", "bitr"),
          title="CCA and BITR re-examined with `crossview tune` on the Flickr8k sample, on their default features and "
                "scoring (chosen on train, reported once on val)"),
    Entry("defaults_flickr8k", "defaults_flickr8k.md",
          (S("bench/defaults_search.py --methods cca,cca:fine,cca:fine2,wsabie,wsabie:lowlr,wsabie:both,wsabie:i2t,"
             "bitr,bitr:fine,bitr:white"),),
          ("flickr8k",), 300, (*methods("cca", "wsabie", "bitr"), *FEATURES, "crossview/features/normalize.py")),
    Entry("tr_seed_spread_flickr8k", "tr_seed_spread_flickr8k.md",
          (S("bench/tr_seed_spread.py --seeds 0,1,2 --work {WORK}"),), ("flickr8k",), 20,
          ("crossview/features/topics.py", "crossview/features/text/counts.py", "crossview/core/linalg.py",
           *METRICS) + methods("cca")),
    Entry("rich_features_flickr8k", "rich_features_flickr8k.md",
          (S("bench/rich_features.py --methods cca,bitr,wsabie,vsepp,smoothap,webly,timam"),), ("flickr8k",), 90,
          (*FEATURES, "bench/method_cv.py", "crossview/eval/bootstrap.py", "crossview/eval/paired.py",
           *methods("cca", "bitr", "wsabie", "vsepp", "smoothap", "webly", "timam"))),
    Entry("explain_latency_cpu", "explain_latency_cpu.txt",
          (S("crossview train cca --data {F8K} --run-dir {WORK}/f8-cca", output=False),
           S("crossview train cca --data demo --run-dir {WORK}/cca-demo", output=False),
           S("bench/explain_latency.py {WORK}/f8-cca {WORK}/cca-demo")),
          ("flickr8k", "demo"), 4, ("crossview/explain", "crossview/engine/retriever.py",
                                    "crossview/engine/session.py", *methods("cca"), *FEATURES)),
    Entry("eta_whole_run_cpu", "eta_whole_run_cpu.txt", (S("bench/eta_whole_run.py"),), ("flickr8k",), 5,
          ("crossview/core/progress.py", "crossview/engine/timings.py", *ENGINE_RUN, *FEATURES)),
    Entry("explain_sentence_cpu", "explain_sentence_cpu.txt",
          (S("crossview train cca --data {F8K} --run-dir {WORK}/f8-cca", output=False),
           S("bench/explain_sentence.py {WORK}/f8-cca"),
           S("bench/explain_sentence.py {WORK}/f8-cca --threads 1")),
          ("flickr8k",), 8, ("crossview/explain", "crossview/core/rownorm.py", "crossview/features/normalize.py",
                             *methods("cca"), *FEATURES)),
    Entry("feature_throughput_cpu", "feature_throughput_cpu.txt",
          (S("bench/feature_throughput.py --limit 320 --encoder efficientnet_lite0,mobilenet_v2 --workers 0,1"),), ("flickr8k",), 3,
          ("crossview/features/image.py", "crossview/data/images.py")),
    Entry("gui_latency_cpu", "gui_latency_cpu.txt", (S("bench/gui_latency.py"),), ("synthetic",), 1,
          ("crossview/gui/panels/data_panel.py", "crossview/gui/panels/train_panel.py", "crossview/gui/workers.py",
           "tests/_latency.py")),
    Entry("inspect_latency_cpu", "inspect_latency_cpu.txt", (S("bench/inspect_latency.py --baseline 866e2b7"),),
          ("synthetic",), 2, ("crossview/gui/panels/inspect_panel.py", "crossview/gui/rank_table.py")),
    Entry("large_collection_cpu", "large_collection_cpu.txt",
          (S("bench/large_collection.py --n 1000000 --dim 128 --queries 1000 "
             "--backends exact,faiss-flat,faiss-sq8,faiss-pq4,faiss-ivf"),),
          ("synthetic",), 4, ("crossview/index", "crossview/eval/metrics.py")),
    Entry("loss_compare_demo", "loss_compare_demo.md",
          (S("crossview experiment loss-compare --data demo --seeds 3 --exp-dir {WORK}/exp"),),
          ("demo",), 6, STUDY + ("crossview/experiments/loss_compare.py",) + methods("vsepp", "smoothap")),
    Entry("loss_compare_flickr8k", "loss_compare_flickr8k.md",
          (S("crossview experiment loss-compare --data {F8K} --seeds 3 --exp-dir {WORK}/exp"),),
          ("flickr8k",), 60, STUDY + ("crossview/experiments/loss_compare.py", "crossview/experiments/budget.py",
                                      "crossview/engine/tune.py") + methods("vsepp", "smoothap"),
          title="Paper 004's loss comparison on the Flickr8k sample: one budget, each loss's own setting chosen by "
                "cross-validation of train"),
    Entry("scale_cpu", "scale_cpu.txt",
          (S("bench/scale.py --sizes L,S,M --cap-seconds 120 --cap-steps wsabie,vsepp,timam"),), ("synthetic",), 55,
          SCALE_DEPS),
    Entry("scale_gpu", "scale_gpu.txt",
          (S("bench/scale.py --device cuda --sizes L --steps vsepp,vquery,timam,timam3"),), ("synthetic",), 6,
          SCALE_DEPS, gpu=True),
    Entry("query_cache_cpu", "query_cache_cpu.txt",
          (S("bench/query_cache.py --baseline 4f330bd --work {WORK}"),), ("flickr8k", "synthetic"), 12,
          ("crossview/engine/gallery_cache.py", "crossview/engine/retriever.py", "crossview/engine/session.py",
           "crossview/commands/query.py", "crossview/commands/serve.py", "crossview/features/cache.py")),
    Entry("query_cache_L_cpu", "query_cache_L_cpu.txt",
          (S("bench/query_cache.py --cases scale,corpus --sizes L --app --repeat 2 --work {WORK}"),),
          ("flickr8k", "synthetic"), 25,
          ("crossview/engine/gallery_cache.py", "crossview/engine/retriever.py", "crossview/engine/session.py",
           "crossview/commands/query.py", "crossview/gui/main_window.py", "crossview/features/cache.py",
           "crossview/cli.py", "crossview/features/photo_cache.py", "crossview/gui/workers.py",
           "crossview/core/io.py")),
    Entry("smoothap_step_cpu", "smoothap_step_cpu.txt", (S("bench/smoothap_step.py --steps 20 --reps 10"),),
          ("synthetic",), 4, ("crossview/nn/losses.py", *methods("vsepp", "smoothap"))),
    Entry("timam_cpu", "timam_cpu.txt", (S("bench/timam_cpu.py --epochs 10 --threads 1"),), ("flickr8k",), 25,
          methods("timam", "vsepp") + ("crossview/features/token_cache.py", "crossview/features/text/transformer.py")),
    Entry("timam_demo", "timam_demo.md",
          (S("crossview experiment timam-ablation --data demo --variants full,no-discriminator,no-identification "
             "--seeds 1 --set labels=identity --exp-dir {WORK}/exp"),),
          ("demo",), 45, STUDY + ("crossview/experiments/timam_ablation.py",) + methods("timam")),
    # the defaults (caption features -> FC) against the paper's text side (text_model=bilstm, 256 and 128 units, at
    # its lr 2e-4), then the discriminator's target and weight at the defaults; written with explicit settings since
    # the defaults moved (a regeneration at 756aefa's configs ran 'lstm_hidden=128' on a model without an LSTM)
    Entry("timam_cv_flickr8k", "timam_cv_flickr8k.md",
          (S("bench/method_cv.py --method timam --configs ';text_model=bilstm;text_model=bilstm,lstm_hidden=128' "
             "--seeds 3"),
           S("bench/method_cv.py --method timam --configs ';adv_target=swapped;adv_weight=0.1;"
             "adv_target=swapped,adv_weight=0.1;adv_weight=0.3;adv_weight=0' --seeds 3")),
          ("flickr8k",), 90, methods("timam"),
          title="TIMAM's defaults on real photos (the Flickr8k sample): cross-validation of the training photos"),
    Entry("timam_cv2_flickr8k", "timam_cv2_flickr8k.md", (S("bench/timam_text_cv.py --work {WORK}"),),
          ("flickr8k",), 60, ("bench/_quality.py", "crossview/engine/cv_runs.py", *ENGINE_RUN,
                              "crossview/eval/scoring.py", "crossview/eval/paired.py", *FEATURES) + methods("timam")),
    Entry("timam_id_optimizer_flickr8k", "timam_id_optimizer_flickr8k.md",
          (S("bench/timam_id_optimizer.py --work {WORK}"),), ("flickr8k",), 6,
          ("bench/_quality.py", "bench/timam_text_cv.py", "crossview/engine/cv_runs.py", "crossview/eval/paired.py",
           "crossview/nn/row_optim.py", *FEATURES) + methods("timam")),
    Entry("timam_flickr8k", "timam_flickr8k.md",
          (S("crossview experiment timam-ablation --data {F8K} --variants full,no-discriminator --seeds 5 "
             "--exp-dir {WORK}/ablation"),),
          ("flickr8k",), 40, STUDY + ("crossview/experiments/timam_ablation.py",) + methods("timam"),
          title="TIMAM on real photos (the Flickr8k sample): does the discriminator help, and can 100 images tell?"),
    Entry("text_length_batches_cpu", "text_length_batches_cpu.txt", (S("bench/text_length_batches.py"),),
          ("flickr8k",), 8, ("crossview/features/text/transformer.py", "crossview/features/text/base.py")),
    Entry("topk_scale", "topk_scale.txt", (S("bench/topk_scale.py"),), ("synthetic",), 12, ("crossview/index",)),
    Entry("topk_scale_gpu", "topk_scale_gpu.txt", (S("bench/topk_scale.py --gpu-only --device cuda --repeats 10"),),
          ("synthetic",), 3, ("crossview/index",), gpu=True),
    Entry("vsepp_epoch", "vsepp_epoch.txt",
          (S("bench/vsepp_epoch.py --device cpu --batches 60 --repeats 3"),
           S("bench/vsepp_epoch.py --device cpu --batches 60 --repeats 3 --amp")),
          ("synthetic",), 15, methods("vsepp") + ("crossview/features/vocab.py",)),
    Entry("vsepp_epoch_gpu", "vsepp_epoch_gpu.txt",
          (S("bench/vsepp_epoch.py --device cuda --batches 0"),
           S("bench/vsepp_epoch.py --device cuda --batches 400 --amp"),
           S("bench/vsepp_e2e.py --device cuda --workers 8 --decode cpu"),
           S("bench/vsepp_e2e.py --device cuda --workers 8 --decode cpu --amp"),
           S("bench/vsepp_e2e.py --device cuda --workers 8"),
           S("bench/vsepp_e2e.py --device cuda --workers 8 --amp")),
          ("synthetic",), 8, methods("vsepp") + ("crossview/features/vocab.py", "crossview/nn/images.py"), gpu=True),
    Entry("deep_step_gpu", "deep_step_gpu.txt",
          (S("bench/deep_step.py --device cuda --images 6000 --steps 30 --warmup 8"),
           S("bench/deep_step.py --device cuda --images 6000 --steps 30 --warmup 8 --amp")),
          ("synthetic",), 4, ("crossview/nn/trainer.py", "crossview/nn/encoders.py",
                              *methods("vsepp", "smoothap", "webly", "timam", "wsabie")), gpu=True),
    Entry("vsepp_flickr8k", "vsepp_flickr8k.md",
          (S(f"bench/vsepp_quality.py --configs {_VSEPP_CONFIGS} --seeds 3 --no-select --cca --cache {{WORK}}/trials"),
           S(f"bench/vsepp_quality.py --configs {_VSEPP_CONFIGS.replace(',vse0:minilm_ft,vsepp:minilm_ft', '')} "
             "--seeds 3 --set max_epochs=30 --set lr_decay_epoch=15 --cache {WORK}/trials"),
           *(S(f"bench/vsepp_quality.py --configs vse0:minilm --seeds 3 --protocol cv --no-select "
               f"--set max_epochs={e} --set lr_decay_epoch={d} --cache {{WORK}}/trials") for e, d in _VSEPP_CV),
           S("bench/vsepp_quality.py --configs vse0:minilm,vsepp:minilm --seeds 3 --no-select "
             "--train-sizes 100,200,400,600 --cache {WORK}/trials"),
           S("bench/vsepp_quality.py --data demo --configs vse0:minilm,vsepp:minilm --seeds 3 --no-select "
             "--train-sizes 150,300,600,1200,100000 --cache {WORK}/trials")),
          ("flickr8k", "demo"), 300, methods("vsepp", "cca") + FEATURES,
          title="VSE0 / VSE++ on real photos (the Flickr8k sample)"),
    Entry("webly_ablation_demo", "webly_ablation_demo.md",
          (S("crossview experiment webly-ablation --data demo --web demo --seeds 3 --exp-dir {WORK}/exp"),),
          ("demo",), 40, STUDY + ("crossview/experiments/webly_ablation.py", "crossview/data/demo/web.py")
          + methods("webly")),
    Entry("webly_ablation_flickr8k", "webly_ablation_flickr8k.md",
          (S("crossview experiment webly-ablation --data {F8K} --held-out auto --seeds 3 --exp-dir {WORK}/exp"),),
          ("flickr8k",), 50, STUDY + ("crossview/experiments/webly_ablation.py", "crossview/features/web_set.py",
                                      "crossview/features/tags.py") + methods("webly"),
          title="Paper 003's ablations on the Flickr8k sample: held-out concepts, a matched Stage II, the oracle "
                "positive control"),
    Entry("webly_flickr8k", "webly_flickr8k.md",
          # the defaults first (loss vse0, lambda2 0.1): every other row is paired against them
          (S("bench/webly_quality.py --configs ';loss=vsepp;stage2_epochs=0;stage2_lr=2e-4;curriculum=none;"
             "lambda2=0;lambda2=0.3;lambda2=1' --seeds 3"),),
          ("flickr8k",), 60, methods("webly") + ("crossview/features/web_set.py", "crossview/features/tags.py")),
    Entry("wsabie_train_cpu", "wsabie_train_cpu.txt",
          (S("bench/wsabie_train.py --epochs 3 --max-draws 0,100 --baseline-examples 300"),), ("synthetic",), 8,
          methods("wsabie")),
    Entry("wsabie_train_cuda", "wsabie_train_cuda.txt",
          (S("bench/wsabie_train.py --device cuda --epochs 20 --max-draws 0,100 --baseline-examples 1000 "
             "--threads 1"),), ("synthetic",), 10, methods("wsabie"), gpu=True),
)
BY_NAME = {e.name: e for e in ENTRIES}


# ------------------------------------------------------------------------------------------------- staleness
def _git(*args: str) -> str | None:
    r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def _card_settings(commit: str, path: str) -> dict | None:
    """A model card's parameters at ``commit`` without their help texts (what a run's defaults depend on), or None
    where the card is missing or unreadable there."""
    import tomllib
    text = _git("show", f"{commit}:{path}")
    if text is None:
        return None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    params = doc.get("params", {})
    return {name: {k: v for k, v in spec.items() if k != "help"} if isinstance(spec, dict) else spec
            for name, spec in params.items()}


def _python_code(commit: str, path: str) -> str | None:
    """A Python file's syntax tree at ``commit`` without comments and docstrings (``ast.dump``; adjacent string
    literals are one constant there, so re-wrapping a long string changes nothing), or None where the file is
    missing or does not parse."""
    import ast

    text = _git("show", f"{commit}:{path}")
    if text is None:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _substantive(commit: str, path: str) -> bool:
    """Whether ``commit``'s change to ``path`` can change a result: a change to code, not to its comments,
    docstrings or line breaks (``.py``: :func:`_python_code`); for a model card (``models/*.toml``) only a change to
    its parameters (a default, a choice, a type), not to its prose."""
    if path.endswith(".py"):
        before = _python_code(f"{commit}^", path)
        return before is None or before != _python_code(commit, path)
    if not (path.startswith("models/") and path.endswith(".toml")):
        return True
    before = _card_settings(f"{commit}^", path)
    return before is None or before != _card_settings(commit, path)


#: commits that change results files' sources but none of their numbers (with why), read by :func:`state`
UNCHANGED = "bench/unchanged_results.toml"


def _unchanged_commits() -> dict[str, str | tuple[str, ...]]:
    """``{commit prefix: scope}`` from :data:`UNCHANGED`: ``"all"`` entries, ``"cpu"`` (those that need no GPU), or
    ``"entries"`` with the names the record lists (``entries = [...]``: a change that moves other entries' files
    but not these), as a tuple of those names. Each record must say why; one without a reason, with another scope,
    or naming an entry the registry does not have, is an error (it would hide a change)."""
    import tomllib

    path = REPO / UNCHANGED
    if not path.is_file():
        return {}
    names = {e.name for e in ENTRIES}
    out: dict[str, str | tuple[str, ...]] = {}
    for rec in tomllib.loads(path.read_text(encoding="utf-8")).get("commit", []):
        cid, scope, why = str(rec.get("id", "")), rec.get("scope"), str(rec.get("why", "")).strip()
        listed = rec.get("entries")
        if len(cid) < 7 or scope not in ("all", "cpu", "entries") or not why or \
                (scope == "entries") != isinstance(listed, list) or \
                (scope == "entries" and (not listed or not set(map(str, listed)) <= names)):
            raise SystemExit(f"{UNCHANGED}: each [[commit]] needs an id (7+ hex digits), scope 'all', 'cpu' or "
                             f"'entries' (with entries = [names of registry entries]) and a why; got {rec!r}")
        out[cid] = tuple(map(str, listed)) if scope == "entries" else scope
    return out


def state(entry: Entry) -> str:
    """``missing``, ``unstamped``, ``fresh`` or ``stale: PATH changed at X after Y`` (the stamped commit against the
    first later commit that changed the entry's sources in a way that can change a result: code, or a model card's
    parameters; a card's prose does not count; nor a commit :data:`UNCHANGED` lists for the entry, with its reason);
    ``never regenerated`` is added for files stamped after the fact."""
    if not entry.path.is_file():
        return "missing"
    header, _ = _stamp.parse_header(entry.path.read_text(encoding="utf-8"), entry.path)
    made = _stamp.stamped_commit(header)
    if made is None:
        return "unstamped"
    old = " (never regenerated)" if "made at commit" in header else ""
    if _git("rev-parse", "--verify", "--quiet", f"{made}^{{commit}}") is None:
        return f"unknown: commit {made} is not in this repository's history" + old
    # the entry's command is part of what the file depends on; not for GPU entries, which bench/gpu_all.sh makes
    # with shorter runs than the registry's commands to fit a lent machine's budget (their stamps list those)
    if not old and not entry.gpu and entry.steps and "command" in header and \
            _command_words(header["command"]) != _command_words(expected_commands(entry)):
        return "stale: its command in regenerate.py differs from the one the file was made with"
    later = _git("log", "--reverse", "--format=%H", f"{made}..HEAD", "--", *entry.all_deps())
    unchanged = _unchanged_commits()
    for commit in (later or "").split():
        scope = next((v for k, v in unchanged.items() if commit.startswith(k)), None)
        if scope == "all" or (scope == "cpu" and not entry.gpu) or (isinstance(scope, tuple) and entry.name in scope):
            continue                      # its change leaves this entry's numbers as they are (UNCHANGED says why)
        changed = _git("show", "--name-only", "--format=", commit, "--", *entry.all_deps()) or ""
        for path in changed.splitlines():
            if path and _substantive(commit, path):
                return f"stale: {path} changed at {commit[:7]} after {made[:7]}" + old
    return "fresh" + old


def expected_commands(entry: Entry) -> list[str]:
    """The commands a regeneration of ``entry`` now would stamp (:func:`regenerate`'s, without running anything)."""
    work = REPO.parent / "__regenerate_work__" / entry.name
    single = sum(s.output for s in entry.steps) == 1
    out = []
    for i, step in enumerate(entry.steps, 1):
        dest = step_out(entry, i, step, work)
        argv = step_argv(step, work, dest)
        out.append(shown(argv[:-2], work) + f" --out {_stamp.display_path(entry.path)}" if single and dest is not None
                   else shown(argv, work))
    return out


def _command_words(commands: Sequence[str]) -> list[list[str]]:
    """Stamped commands compared without the interpreter's path: from ``bench/...`` or ``crossview`` on."""
    out = []
    for c in commands:
        words = c.split()
        at = next((i for i, w in enumerate(words) if w.startswith("bench/") or w.endswith("crossview")), 0)
        out.append(["crossview" if w.endswith("/crossview") else w for w in words[at:]])
    return out


def needs(entry: Entry) -> str:
    return "+".join(entry.data) + (" +GPU" if entry.gpu else "")


def measured_minutes(entry: Entry) -> float | None:
    """The minutes the entry's last regeneration took, as its results file's stamp records (``took:``); none for a
    resumed regeneration (it read back what an earlier invocation had done)."""
    if not entry.path.is_file():
        return None
    header, _ = _stamp.parse_header(entry.path.read_text(encoding="utf-8", errors="replace"), entry.path)
    return _stamp.took_minutes(header)


def entry_minutes(entry: Entry) -> tuple[float, bool]:
    """``(minutes, measured)``: the last regeneration's time when the file records it, else the entry's estimate."""
    took = measured_minutes(entry)
    return (took, True) if took is not None else (entry.minutes, False)


def list_entries(entries: list[Entry]) -> None:
    """Print one line per entry: name, file, data, time (measured, or ``~`` an estimate), state."""
    print(f"{'name':<28}{'file':<32}{'needs':<24}{'time':>9}  state")
    cpu = 0.0
    for e in entries:
        minutes, measured = entry_minutes(e)
        t = ("" if measured else "~") + (f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h")
        print(f"{e.name:<28}{e.file:<32}{needs(e):<24}{t:>9}  {state(e)}")
        cpu += 0 if e.gpu else minutes
    print(f"\n{len(entries)} entries; CPU entries about {cpu / 60:.1f} h on the 2-core CPU (times: what the last "
          f"regeneration took, as its stamp records; ~ an estimate where none is recorded); "
          f"{sum(e.gpu for e in entries)} need a GPU")


# ------------------------------------------------------------------------------------------------- running
def _expand(arg: str, work: Path) -> str:
    for k, v in PLACES.items():
        arg = arg.replace(k, v)
    return arg.replace("{WORK}", str(work))


def shown(argv: list[str], work: Path) -> str:
    """A command as the stamp shows it: from the repository root, the work folder as ``$WORK``."""
    words = []
    for a in argv:
        if a == sys.executable:
            words.append(_python_shown())
        elif a == _crossview_exe():
            words.append(_stamp.display_path(a))
        elif a.startswith(str(work)):
            rest = a[len(str(work)):]
            if shlex.quote(rest) == rest:
                words.append("$WORK" + rest)
            elif not any(c in rest for c in '"$`\\'):
                words.append(f'"$WORK{rest}"')
            else:
                words.append("$WORK" + shlex.quote(rest))
        else:
            words.append(shlex.quote(a.replace(str(work), "$WORK")))
    return " ".join(words)


def _python_shown() -> str:
    exe = Path(sys.executable).absolute()
    return _stamp.display_path(exe) if exe.is_relative_to(REPO) else "python"


def _crossview_exe() -> str:
    exe = Path(sys.executable).absolute().parent / "crossview"
    return str(exe) if exe.exists() else "crossview"


def step_argv(step: Step, work: Path, out: Path | None) -> list[str]:
    """The step's command line to run (``--out`` appended when ``out`` is given)."""
    args = [_expand(a, work) for a in step.argv]
    if step.is_script:
        cmd = [sys.executable, args[0], *args[1:]]
    else:
        cmd = [_crossview_exe(), *args[1:]]
    return cmd + (["--out", str(out)] if out is not None else [])


def _clean(text: str, work: Path, renames: dict[str, str]) -> str:
    """Paths in a body as a reader at the repository root sees them: ``renames`` first (a step's temporary
    ``--out`` -> the results file), then $WORK, ../shared and repository-relative paths."""
    for a, b in (*renames.items(), (str(work), "$WORK"), (str(REPO.parent / "shared"), "../shared"),
                 (str(REPO) + os.sep, "")):
        text = text.replace(a, b)
    return text


def _experiment_data(argv: list[str]) -> list[str]:
    """``data:`` lines for the datasets an experiment command reads (--data, --test-data, --corpus, --web)."""
    out = []
    for flag in ("--data", "--test-data", "--corpus", "--web"):
        if flag in argv:
            value = argv[argv.index(flag) + 1]
            out.append(_stamp.dataset_fingerprint(value if value == "demo" else REPO / value))
    return out


def step_out(entry: Entry, i: int, step: Step, work: Path) -> Path | None:
    """Where step ``i`` writes its part (``--out``), or None for a preparation step."""
    if not step.output or not (step.is_script or step.is_experiment):
        return None
    return work / f"step{i}{'.md' if step.is_experiment else entry.path.suffix}"


def regenerate(entry: Entry, work_root: Path, resume: bool = False) -> Path:
    """Run the entry's steps in ``work_root/NAME`` and write its stamped file; the file's path."""
    import torch  # noqa: F401 - loaded, it gives the stamp's machine line the thread count and GPU the steps see

    work = work_root / entry.name
    resumed = resume and work.is_dir() and any(work.iterdir())    # an earlier invocation's runs are read back
    if work.exists() and not resume:
        left = sum(1 for _ in work.rglob("*"))
        if left:     # say so: an earlier run's finished runs would have been read back with --resume
            print(f"regenerate {entry.name}: emptying {work} ({left:,} files and folders of an earlier run; "
                  "--resume keeps them and reads finished runs back)", flush=True)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CROSSVIEW_HOME": str(work / "home")}   # nothing lands in the user's runs list
    # this tree's crossview, whatever the interpreter's editable install points at: a clone sharing another
    # checkout's .venv would otherwise run that checkout's package under `.venv/bin/crossview` (its sys.path has
    # no working directory) while the stamp names this tree's commit
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    commit = _stamp.commit_info()
    final = _stamp.display_path(entry.path)
    single = sum(s.output for s in entry.steps) == 1
    commands, data, parts, step_notes = [], [], [], []
    started = time.time()
    for i, step in enumerate(entry.steps, 1):
        out = step_out(entry, i, step, work)
        if out is not None:
            out.unlink(missing_ok=True)
        argv = step_argv(step, work, out)
        # one output: show the command as it would write the results file itself
        commands.append(shown(argv[:-2], work) + f" --out {final}" if single and out is not None
                        else shown(argv, work))
        print(f"regenerate {entry.name} [{i}/{len(entry.steps)}]: {commands[-1]}", file=sys.stderr, flush=True)
        t0 = time.time()
        r = subprocess.run(argv, cwd=REPO, env=env)
        if r.returncode != 0:
            raise CrossViewError(f"{entry.name}: step {i} failed (exit {r.returncode}): {commands[-1]}; the file "
                                 f"is left as it was (run folders in {work}; --resume continues them)")
        print(f"regenerate {entry.name} [{i}/{len(entry.steps)}]: {time.time() - t0:.0f} s", file=sys.stderr)
        if out is None:
            continue
        if not out.is_file():
            raise CrossViewError(f"{entry.name}: step {i} wrote no {out}; its command does not support --out")
        header, body = _stamp.parse_header(out.read_text(encoding="utf-8"), out)
        data += [_clean(d, work, {}) for d in (header.get("data", []) if header else _experiment_data(argv))]
        step_notes += [_clean(n, work, {}) for n in (header.get("note", []) if header else [])]   # the script's own
        parts.append((commands[-1], _clean(body, work, {str(out): final} if single else {}).strip("\n")))
    if len(parts) == 1:
        body = parts[0][1]
    elif entry.path.suffix == ".md":
        body = "\n\n".join(f"## `{cmd}`\n\n{text}" for cmd, text in parts)
        body = f"# {entry.title}\n\n{body}" if entry.title else body
    else:
        body = "\n\n".join(f"$ {cmd}\n{text}" for cmd, text in parts)
    notes = list(dict.fromkeys(step_notes))
    now = _stamp.commit_info()
    if now.split(" ")[0] != commit.split(" ")[0]:
        notes.append(f"the tree changed while this ran (at the end: {now})")
    uses_work = any("$WORK" in c for c in commands)
    minutes = (time.time() - started) / 60
    took = (f"{minutes:.1f} min" if minutes < 10 else f"{minutes:.0f} min") + (
        " (resumed: what an earlier invocation finished was read back, so not the whole cost)" if resumed else
        " (every step, by bench/regenerate.py; wall time on the machine below, which other jobs may have shared)")
    text = _stamp.format_header(entry.path, commands=commands, data=list(dict.fromkeys(data)), commit=commit,
                                notes=notes, took=took,
                                regenerate=f"{_python_shown()} bench/regenerate.py --only {entry.name}",
                                work=f"$WORK = {work} (scratch: run folders, intermediate files)" if uses_work
                                else None)
    return _stamp.atomic_write_bytes(entry.path, (text + body + "\n").encode("utf-8"))


def _default_work() -> Path:
    from crossview.core.settings import get_settings

    return get_settings().home / "bench-regenerate"


def stale_entries(max_minutes: float | None = None) -> list[Entry]:
    """The entries :func:`state` calls stale or missing, the shortest first (by :func:`entry_minutes`); with
    ``max_minutes``, only those that take at most that long."""
    picked = [e for e in ENTRIES if state(e).startswith(("stale", "missing"))]
    if max_minutes is not None:
        picked = [e for e in picked if entry_minutes(e)[0] <= max_minutes]
    return sorted(picked, key=lambda e: entry_minutes(e)[0])


def _pick(names: str) -> list[Entry]:
    out = []
    for n in (x.strip() for x in names.split(",") if x.strip()):
        if n not in BY_NAME:
            raise CrossViewError(f"--only {n}: no such entry; known: {', '.join(BY_NAME)}")
        out.append(BY_NAME[n])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Entries: " + ", ".join(BY_NAME))
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="every entry: file, needs, rough time, stale or not")
    what.add_argument("--only", metavar="NAME[,NAME]", help="regenerate these entries")
    what.add_argument("--all", action="store_true", help="regenerate every entry (hours)")
    what.add_argument("--stale", action="store_true",
                      help="regenerate every stale or missing entry (as --list says), the shortest first")
    ap.add_argument("--max-minutes", type=float, metavar="M",
                    help="with --stale: only the entries whose time (--list's) is at most M minutes")
    ap.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    ap.add_argument("--work", type=Path, metavar="DIR",
                    help="scratch folder for run folders and intermediate outputs, outside the repository "
                         "(default: $CROSSVIEW_HOME/bench-regenerate)")
    ap.add_argument("--resume", action="store_true",
                    help="keep an entry's work folder (finished runs are read back) instead of starting afresh")
    args = ap.parse_args(argv)
    try:
        if args.list:
            list_entries(list(ENTRIES))
            return 0
        if args.max_minutes is not None and not args.stale:
            raise CrossViewError("--max-minutes goes with --stale")
        entries = list(ENTRIES) if args.all else stale_entries(args.max_minutes) if args.stale else _pick(args.only)
        if args.stale:
            print(f"stale or missing: {', '.join(e.name for e in entries) or 'none'}"
                  + (f" (at most {args.max_minutes:g} min each)" if args.max_minutes is not None else ""))
        work = (args.work or _default_work()).absolute()
        if work.is_relative_to(REPO):
            raise CrossViewError(f"--work {work}: inside the repository; give a folder outside it "
                                 f"(run folders never go into the repository)")
        cuda = None
        failed = 0
        for e in entries:
            missing = [k for k in e.data if DATA_NEEDS[k] is not None and not DATA_NEEDS[k].exists()]
            if missing:
                print(f"{e.name}: skipped: needs {_stamp.display_path(DATA_NEEDS[missing[0]])} (not on this "
                      "machine)")
                continue
            if e.gpu and not args.dry_run:
                if cuda is None:
                    import torch

                    cuda = torch.cuda.is_available()
                if not cuda:
                    print(f"{e.name}: needs a GPU: run on a GPU machine (bench/results/{e.file} left as it is)")
                    continue
            if args.dry_run:
                minutes, measured = entry_minutes(e)
                print(f"# {e.name} -> bench/results/{e.file} ({needs(e)}, {'' if measured else '~'}{minutes:.0f} min; "
                      f"$WORK = {work / e.name})")
                for i, step in enumerate(e.steps, 1):
                    print(shown(step_argv(step, work / e.name, step_out(e, i, step, work / e.name)), work / e.name))
                continue
            try:
                path = regenerate(e, work, args.resume)
                print(f"{e.name}: wrote {_stamp.display_path(path)}")
            except CrossViewError as err:
                print(f"error: {err}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    except CrossViewError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
