"""``crossview runs list|show|rename|delete``: the run store (:mod:`crossview.engine.runs`) on the command line.

::

    crossview runs list                      # the runs folder: name, method, data, status, rsum, scoring, when
    crossview runs list --root exps/f8k      # another folder (a search's or an experiment's trials included)
    crossview runs show runs/cca             # one run: its settings, status and metrics
    crossview runs rename runs/cca cca-f8k   # refused while a process writes the run (one line naming the PID)
    crossview runs delete runs/old --yes     # for good; without --yes it asks (and refuses with no terminal)

The same store serves the app's runs list, so both refuse to move or remove a run a process is writing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crossview.core.errors import CrossViewError

__all__ = ["register"]


def _root(args: argparse.Namespace) -> Path:
    from crossview.core.settings import get_settings

    return Path(args.root).expanduser() if args.root else get_settings().runs_dir


def _run_path(text: str) -> Path:
    """A run given as a folder path, or as a name in the runs folder."""
    from crossview.core.settings import get_settings

    p = Path(text).expanduser()
    if p.is_dir() or p.is_absolute() or len(p.parts) > 1:
        return p
    return get_settings().runs_dir / p


def cmd_list(args: argparse.Namespace) -> int:
    from crossview.engine.runs import iter_runs

    root = _root(args)
    if args.root and not root.is_dir():        # the default runs folder may not be made yet; a --root given must be
        what = "a file, not a folder" if root.exists() else "no such folder"
        raise CrossViewError(f"--root {root}: {what}; give the folder that holds the run folders (default: the runs "
                             "folder, $CROSSVIEW_HOME/runs)")
    infos = list(iter_runs(root))
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
        return 0
    if not infos:
        print(f"no runs in {root}" + ("" if root.is_dir() else " (no such folder)"))
        return 0
    rows = [(str(i.path.relative_to(root)) if i.path.is_relative_to(root) else str(i.path), i.method, i.data,
             i.status + (f" (PID {i.writer_pid})" if i.writer_pid else ""),
             f"{i.rsum:.1f}" if i.rsum is not None else "-", i.scoring,
             f"{i.rsum_plain:.1f}" if i.rsum_plain is not None else "-",
             i.created[:16].replace("T", " ")) for i in infos]
    # rsum is under the run's scoring (crossview train's default: the method's); its plain rsum beside
    head = ("run", "method", "data", "status", "rsum", "scoring", "plain rsum", "created")
    rows = [(r[0], r[1], Path(r[2]).name or r[2], *r[3:]) for r in rows]     # a dataset file by its name
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{len(rows)} run(s) in {root}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from crossview.engine.run import read_config, read_summary
    from crossview.engine.runs import describe_run

    path = _run_path(args.run)
    if not (path / "config.json").is_file():
        raise CrossViewError(f"{path}: not a run folder (no config.json); 'crossview runs list' shows the runs")
    info = describe_run(path)
    cfg = read_config(path)
    summary = read_summary(path) if info.status == "finished" else None
    if args.json:
        print(json.dumps({"run": info.as_dict(), "config": cfg, "summary": summary}, indent=2, default=str))
        return 0
    print(f"run       {path}")
    print(f"method    {info.method}")
    print(f"data      {info.data}")
    status = info.status + (f" (being written by PID {info.writer_pid})" if info.writer_pid else "")
    print(f"status    {status}")
    print(f"created   {info.created}")
    print(f"device    {cfg.get('device_selected') or cfg.get('device', '?')}, seed {cfg.get('seed', '?')}")
    params = cfg.get("params") or {}
    if params:
        print("params    " + ", ".join(f"{k}={v}" for k, v in params.items()))
    if summary is not None:
        from crossview.commands.train import format_metric_table
        print(format_metric_table(summary))
    elif info.status in ("cancelled", "interrupted", "failed"):
        print(f"continue with: crossview train --resume {path}")
    return 0


def cmd_rename(args: argparse.Namespace) -> int:
    from crossview.engine.runs import rename_run

    from crossview.engine.runs import fused_runs_using

    path = _run_path(args.run)
    users = fused_runs_using(path)
    target = rename_run(path, args.new_name)
    print(f"renamed to {target}")
    for f in users:
        print(f"warning: fused run {f} lists it as a member under its old name; it cannot answer queries until fused "
              f"again ('crossview fuse ... --run-dir NEW') or the run gets its old name back", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from crossview.engine.runs import delete_run

    from crossview.engine.runs import fused_runs_using

    path = _run_path(args.run)
    users = fused_runs_using(path)
    also = (f"; fused run(s) {', '.join(str(f) for f in users)} use it as a member and could no longer answer queries"
            if users else "")
    if not args.yes:
        if not sys.stdin.isatty():
            raise CrossViewError(f"deleting {path} removes its checkpoint, metrics and annotations for good{also}: "
                                 "add --yes to confirm (no terminal to ask on)")
        answer = input(f"Delete the run folder {path} (checkpoint, metrics, annotations) for good{also}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    delete_run(path)
    print(f"deleted {path}")
    for f in users:
        print(f"warning: fused run {f} used it as a member; it cannot answer queries any more (fuse again)",
              file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``runs`` command to the ``crossview`` parser."""
    p = sub.add_parser("runs", help="list, show, rename or delete run folders",
                       description="The run folders written by 'crossview train', searches and experiments. "
                                   "rename and delete are refused, in one line naming the PID, while a process "
                                   "writes the run (a training, the app, a search).",
                       epilog="A RUN is a run folder, or a run's name in the runs folder "
                              "($CROSSVIEW_HOME/runs or the app's setting).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = actions.add_parser("list", help="every run: name, method, data, status, rsum (under the run's scoring), "
                                        "scoring, plain rsum, when",
                           description="List the runs under the runs folder (or --root), newest first; the "
                                       "trials of searches and experiments there are included. A run that says "
                                       "running but that no process writes shows as interrupted.")
    a.add_argument("--root", metavar="DIR", help="the folder to list (default: the runs folder)")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=cmd_list)
    a = actions.add_parser("show", help="one run: settings, status and metrics")
    a.add_argument("run", metavar="RUN")
    a.add_argument("--json", action="store_true", help="print JSON (the run, its config.json and summary)")
    a.set_defaults(func=cmd_show)
    a = actions.add_parser("rename", help="rename a run folder (refused while a process writes it)")
    a.add_argument("run", metavar="RUN")
    a.add_argument("new_name", metavar="NEW_NAME", help="the new folder name (beside the old one)")
    a.set_defaults(func=cmd_rename)
    a = actions.add_parser("delete", help="delete a run folder for good (refused while a process writes it)")
    a.add_argument("run", metavar="RUN")
    a.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    a.set_defaults(func=cmd_delete)
