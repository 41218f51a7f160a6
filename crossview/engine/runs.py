"""The run store: list, describe, rename and delete run folders, knowing the writer lock.

Every front end goes through here (the app's runs list, ``crossview runs``), so a run that a process is writing
(``crossview train``, the app, a search, an experiment: they hold the run's ``writer.lock``, see
:mod:`crossview.engine.run`) is never renamed or deleted under it: the change is refused in one line naming the
PID. Renaming and deleting take the writer lock themselves for the time of the change, so a writer cannot start
half-way through either. Deleting is refused for a folder that is not a run (no ``config.json``): a mistyped path
never removes anything else.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from crossview.core.errors import CrossViewError
from crossview.core.io import read_json
from crossview.engine.run import resume
from crossview.engine.run_folder import (CHECKPOINT, CONFIG, STATUS, SUMMARY, _holder_info, _new_lock, read_config,
                                         read_status, read_summary, run_is_locked)

__all__ = ["RunInfo", "describe_run", "iter_runs", "list_runs", "rename_run", "delete_run", "run_finished", "ensure_run",
           "drain", "load_fitted", "fused_runs_using"]


def list_runs(root: str | Path | None = None) -> list[Path]:
    """Run folders under ``root`` (default: the user's runs folder), newest first, the trials of searches
    (folders with a ``tune.json``) and of experiments (an ``experiment.json``) included."""
    from crossview.core.settings import get_settings

    base = Path(root) if root is not None else get_settings().runs_dir
    if not base.is_dir():
        return []

    def mtime(p: Path) -> float | None:
        try:
            return (p / CONFIG).stat().st_mtime if (p / CONFIG).is_file() else None
        except OSError:        # unreadable, or removed while listing
            return None

    def children(p: Path) -> list[Path]:
        try:
            return list(p.iterdir())
        except OSError:
            return []

    runs = []
    for p in children(base):
        if (t := mtime(p)) is not None:
            runs.append((t, p))
        else:
            try:
                # a search (crossview tune) or an experiment (crossview experiment): its trials are runs too
                search = (p / "tune.json").is_file() or (p / "experiment.json").is_file()
            except OSError:
                search = False
            if search:
                runs.extend((t, q) for q in children(p) if (t := mtime(q)) is not None)
    return [p for _, p in sorted(runs, key=lambda tp: tp[0], reverse=True)]


@dataclass(frozen=True)
class RunInfo:
    """What the runs list shows of one run."""

    path: Path
    method: str
    data: str
    status: str          # finished, running, cancelled, failed, interrupted (running, but no process writes it), ?
    rsum: float | None
    split: str | None
    created: str
    writer_pid: int | None     # the process writing it now, if any
    #: the scoring ``rsum`` is under (``"plain"``, ``"csls k=10"``; crossview.engine.scoring) and the plain rsum
    #: beside it (None when the run is plain or unfinished)
    scoring: str = "plain"
    rsum_plain: float | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "name": self.name, "method": self.method, "data": self.data,
                "status": self.status, "rsum": self.rsum, "split": self.split, "created": self.created,
                "writer_pid": self.writer_pid, "scoring": self.scoring, "rsum_plain": self.rsum_plain}


def describe_run(path: str | Path) -> RunInfo:
    """:class:`RunInfo` of the run in ``path``; damaged files show as ``?`` rather than raising."""
    folder = Path(path)
    try:
        cfg = read_config(folder)
    except CrossViewError:
        cfg = {}
    try:
        status = str(read_status(folder).get("status", "?"))
    except CrossViewError:
        status = "?"
    pid = run_is_locked(folder)
    if status == "running" and pid is None:
        status = "interrupted"          # says running, but no process holds its lock: it was killed
    rsum = rsum_plain = None
    from crossview.engine.scoring import run_scoring
    sc = run_scoring(cfg)
    scoring = sc["scoring"] + (f" {sc.get('param_name')}={sc['param']:g}" if sc.get("param") is not None else "")
    if status == "finished":
        try:
            summary = read_summary(folder)
            value = summary.get("rsum")
            rsum = float(value) if isinstance(value, (int, float)) else None
            plain = (summary.get("metrics_plain") or {}).get("rsum") if isinstance(
                summary.get("metrics_plain"), dict) else None
            rsum_plain = float(plain) if isinstance(plain, (int, float)) else None
        except CrossViewError:
            pass
    data = cfg.get("data") or cfg.get("dataset") or "?"
    return RunInfo(path=folder, method=str(cfg.get("method", "?")), data=str(data), status=status, rsum=rsum,
                   split=cfg.get("split") if isinstance(cfg.get("split"), str) else None,
                   created=str(cfg.get("created", "")), writer_pid=pid, scoring=scoring, rsum_plain=rsum_plain)


def iter_runs(root: str | Path | None = None) -> Iterator[RunInfo]:
    for path in list_runs(root):
        yield describe_run(path)


def _check_is_run(folder: Path, todo: str) -> None:
    if not folder.is_dir():
        raise CrossViewError(f"{folder}: no such run folder")
    if not (folder / CONFIG).is_file():
        raise CrossViewError(f"{folder}: not a run folder (no {CONFIG}); nothing was {todo}")


class _Held:
    """The run's writer lock for the time of a rename / delete; refused in one line when a process holds it."""

    def __init__(self, folder: Path, todo: str) -> None:
        self.folder, self.todo = folder, todo
        self.lock = _new_lock(folder)

    def __enter__(self) -> "_Held":
        from filelock import Timeout

        try:
            self.lock.acquire(timeout=0.5)
        except Timeout:
            pid = _holder_info(self.folder).get("pid", "?")
            raise CrossViewError(f"{self.folder} is being written by PID {pid} (a training, search or experiment); "
                                 f"it was not {self.todo}: stop that process first (kill {pid}), or wait for it "
                                 "to finish") from None
        except (OSError, ValueError) as e:
            raise CrossViewError(f"{self.folder}: cannot lock the run folder "
                                 f"({getattr(e, 'strerror', None) or e}); it was not {self.todo}") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.lock.release(force=True)
        except OSError:      # the folder (and its lock file) is gone: the descriptor is closed all the same
            pass


def rename_run(path: str | Path, new_name: str) -> Path:
    """Rename the run folder ``path`` to ``new_name`` beside it; returns the new path. Refused (one line) for
    a name with a path separator, an existing target, a folder that is not a run, or a run a process writes."""
    folder = Path(path)
    _check_is_run(folder, "renamed")
    name = new_name.strip()
    if not name or name in (".", "..") or any(ch in name for ch in "/\\\0"):
        raise CrossViewError(f"cannot rename {folder.name!r} to {new_name!r}: give a plain folder name "
                             "(no / or \\)")
    target = folder.with_name(name)
    if target == folder:
        return folder
    if target.exists():
        raise CrossViewError(f"cannot rename {folder.name!r} to {name!r}: {target} exists")
    with _Held(folder, "renamed"):
        folder.rename(target)
    return target


def fused_runs_using(path: str | Path, roots: Sequence[str | Path] = ()) -> list[Path]:
    """The fused runs (beside ``path``, or at the top of ``roots``) whose members include the run ``path``: renaming
    or deleting it leaves them unable to answer queries (they encode through each member's model), so the command and
    the app say so first. Damaged or unreadable folders are skipped."""
    target = Path(path).expanduser().resolve()
    out: list[Path] = []
    for root in {target.parent, *(Path(r).expanduser().resolve() for r in roots)}:
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir()):
            cfg = folder / CONFIG
            if folder == target or not cfg.is_file():
                continue
            try:
                rec = read_json(cfg)
            except (CrossViewError, OSError):
                continue
            members = rec.get("members") if isinstance(rec, dict) and rec.get("method") == "fused" else None
            if isinstance(members, list) and any(isinstance(m, str) and Path(m).expanduser().resolve() == target
                                                 for m in members):
                out.append(folder)
    return out


def delete_run(path: str | Path) -> None:
    """Delete the run folder ``path`` for good. Refused (one line) for a folder that is not a run or a run a
    process writes; the lock is held while the folder is removed."""
    folder = Path(path)
    _check_is_run(folder, "deleted")
    with _Held(folder, "deleted"):
        shutil.rmtree(folder)


# ---------------------------------------------------------------------------- getting a run done
def run_finished(run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` finished (its summary written, its status ``finished``)."""
    folder = Path(run_dir)
    return (folder / SUMMARY).is_file() and (folder / STATUS).is_file() and \
        read_status(folder).get("status") == "finished"


def ensure_run(run_dir: str | Path, start: Callable[[], Iterator[Any]], *, data: Any = None, features: Any = None,
               cache: Any = None) -> tuple[str, Iterator[Any] | None]:
    """Get the run in ``run_dir`` done, the one way every search and experiment does it: ``("finished", None)``
    when it finished earlier (read it back), ``("resumed", events)`` when it started and stopped (its config.json
    is there: it continues from its last checkpoint, with ``data`` / ``features`` given again), else
    ``("started", start())``."""
    folder = Path(run_dir)
    if run_finished(folder):
        return "finished", None
    if (folder / CONFIG).is_file():
        return "resumed", resume(folder, data=data, features=features, cache=cache)
    return "started", start()


def drain(events: Iterator[Any], what: str) -> dict[str, Any]:
    """The result of a run's (or a runner's) events, ``Finished``'s summary; one line when it stopped before."""
    from crossview.core.events import Finished

    result = None
    for ev in events:
        if isinstance(ev, Finished):
            result = ev.summary
    if result is None:
        raise CrossViewError(f"the {what} stopped before it finished; run it again to continue")
    return result


def load_fitted(run_dir: str | Path, checkpoint: dict[str, Any] | None = None) -> Any:
    """The fitted method of a run, from its checkpoint (weights-only: data, never code; ``checkpoint``: one
    already read), on this machine's device (a checkpoint holds no run settings). The one way a run's method is
    loaded (:func:`crossview.engine.session.open_run`, the experiments); a missing, damaged or not-yet-fitted
    state is one line saying what to do."""
    from crossview.core.io import load_checkpoint
    from crossview.methods import create_method

    folder = Path(run_dir)
    path = folder / CHECKPOINT
    from crossview.engine.fuse import is_fused_run
    if is_fused_run(folder):
        raise CrossViewError(f"{folder}: a fused run has no model of its own; open it (crossview.engine.session."
                             "open_run) or use its member runs")
    if checkpoint is None:
        if not path.is_file():
            raise CrossViewError(f"{folder}: the run has no checkpoint yet; let it train (or resume it) first")
        checkpoint = load_checkpoint(path)
    state = checkpoint.get("method_state")
    if not state or not isinstance(state, dict):
        raise CrossViewError(f"{path}: no method state in the checkpoint; it is damaged: resume the run "
                             f"('crossview train --resume {folder}') or train again")
    name = state.get("method")
    if name is None and (folder / CONFIG).is_file():
        name = read_config(folder).get("method")
    if not isinstance(name, str):
        raise CrossViewError(f"{path}: the method name in the checkpoint is {name!r}, not a name; it is damaged: "
                             "train again")
    method = create_method(name)
    try:
        method = method.load_state_dict(state) or method
    except CrossViewError:
        raise
    except Exception as e:  # noqa: BLE001 - anything a malformed state makes the method raise
        raise CrossViewError(f"{path}: the method state does not fit {name!r} ({type(e).__name__}: "
                             f"{str(e)[:160]}); the checkpoint is damaged: train again") from None
    if not method.is_fitted:
        raise CrossViewError(f"{folder}: the checkpoint was written before the method learned anything; "
                             f"resume the run with 'crossview train --resume {folder}'")
    return method
