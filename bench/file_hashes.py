"""What keying image features on the files' contents costs (crossview.features.file_hashes): the image-set
fingerprint of a folder of photos with a cold memo (every file read and hashed), a warm memo (one stat per file,
nothing read), against the old key (path + size + mtime: one stat per file).

    .venv/bin/python bench/file_hashes.py [FOLDER] [--repeat 5]

FOLDER defaults to the Flickr8k sample's images (/work/shared/data/flickr8k-sample/images). "Cold" here is a
cold memo with the files in the OS page cache (the script reads them once first); a first read from a slow disk
costs the disk's read time on top. Prints the medians in seconds and the ratios to the old key.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from crossview.features import image_set_fingerprint  # noqa: E402

SAMPLE = Path("/work/shared/data/flickr8k-sample/images")


def old_key(paths: list[str]) -> str:
    """The key before content hashing: paths, sizes and mtimes."""
    h = hashlib.sha256()
    for p in paths:
        st = os.stat(p)
        h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", default=str(SAMPLE))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"{folder}: no such folder (give a folder of images)", file=sys.stderr)
        return 2
    paths = sorted(str(p) for p in folder.iterdir() if p.is_file())
    size = sum(os.path.getsize(p) for p in paths)
    for p in paths:                      # into the OS page cache: "cold" below is the memo, not the disk
        Path(p).read_bytes()
    cold, warm, old = [], [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as memo:
            t = time.perf_counter()
            image_set_fingerprint(paths, memo)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            image_set_fingerprint(paths, memo)
            warm.append(time.perf_counter() - t)
        t = time.perf_counter()
        old_key(paths)
        old.append(time.perf_counter() - t)
    c, w, o = (statistics.median(x) for x in (cold, warm, old))
    print(f"{len(paths)} files, {size / 2**20:.1f} MiB, median of {args.repeat}")
    print(f"old key (stat only)     {o:8.4f} s")
    print(f"content key, cold memo  {c:8.4f} s  ({c / o:.0f}x the old key; {size / 2**20 / c:.0f} MiB/s)")
    print(f"content key, warm memo  {w:8.4f} s  ({w / o:.1f}x the old key)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
