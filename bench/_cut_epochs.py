"""``python bench/_cut_epochs.py K ARGS...``: the ``crossview`` command line (``crossview ARGS...``) with every training
epoch cut to its first ``K`` batches (``crossview.nn.trainer.EpochSampler``'s length), for ``bench/scale.py``'s
multi-epoch steps: at COCO size a whole epoch is 22-65 minutes on this CPU, and what a run holds from its second
epoch on (the best epoch's weights kept while training goes on, the checkpoints written between epochs, each epoch's
validation) does not depend on how many batches an epoch has. A measurement device, not a way to train: the runs it
makes have seen a sliver of their data."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: python bench/_cut_epochs.py K crossview-arguments... (K: batches an epoch, >= 1)",
              file=sys.stderr)
        return 2
    k = int(argv[0])
    from crossview.nn import trainer

    whole = trainer.EpochSampler.__len__
    trainer.EpochSampler.__len__ = lambda self: min(k, whole(self))   # type: ignore[method-assign]
    from crossview.cli import main as cli

    return int(cli(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
