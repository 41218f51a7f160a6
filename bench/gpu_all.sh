#!/usr/bin/env bash
# One GPU session (issue 32 item 5): the CUDA tests and every GPU bench, about 8 minutes on an H100, each step
# under its own `timeout` so that one hang cannot eat the session; a failed or timed-out step is reported and
# the next one runs.
#
#   bash bench/gpu_all.sh             # run everything (needs CUDA), from the repository root or anywhere
#   bash bench/gpu_all.sh --dry-run   # print the commands, one per line, run nothing (any machine)
#   bash bench/gpu_all.sh --only tests,epoch,deep   # some of the steps: tests epoch deep e2e topk wsabie train
#   bash bench/gpu_all.sh --only scale              # not in the default set (about 5 more minutes): COCO size
#                                                   # (bench/scale.py --device cuda at L, issue 34) -> scale_gpu.txt;
#                                                   # its limit is $SCALE_LIMIT s (default 420)
#
# Writes, stamped with the command, commit and machine (the GPU's name included):
#   bench/results/vsepp_epoch_gpu.txt, deep_step_gpu.txt, topk_scale_gpu.txt, wsabie_train_cuda.txt, scale_gpu.txt (the entries bench/regenerate.py
#     names, here with shorter runs than the registry's full commands: the file's stamp lists the commands it ran)
#   bench/results/gpu_logs/cuda_tests_gpu.txt, vsepp_e2e_gpu.txt, train_vsepp_f8k_gpu.txt (logs, no registry entry;
#     each starts with the GPU's name)
# Environment: PY (default .venv/bin/python, else python3), WORK (scratch folder outside the repository, default a
# temp dir), F8K (the Flickr8k sample's JSON, default ../shared/data/flickr8k-sample/...; a lent machine gets only
# the repository, so carry a copy and name it here). The repository goes on PYTHONPATH (no install needed).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
PY="${PY:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
DRY=0
ONLY="tests,epoch,deep,e2e,topk,wsabie,train"
NEXT=""
for a in "$@"; do
    if [ "$NEXT" = only ]; then ONLY="$a"; NEXT=""; continue; fi
    case "$a" in
        --dry-run) DRY=1 ;;
        --only) NEXT=only ;;
        --only=*) ONLY="${a#--only=}" ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "gpu_all.sh: unknown argument $a (--dry-run, --only STEPS, --help)" >&2; exit 2 ;;
    esac
done
F8K="${F8K:-../shared/data/flickr8k-sample/dataset_flickr8k_sample.json}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOGS="bench/results/gpu_logs"

# ------------------------------------------------------------------------------------------------ the steps
# the CUDA tests: every test function under a skipif on torch.cuda.is_available(), or named for cuda / gpu
cuda_tests() {
    "$PY" - <<'EOF'
import re
from pathlib import Path
for f in sorted(Path("tests").glob("test_*.py")):
    lines = f.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"def (test_\w+)\(", line)
        if not m:
            continue
        above = "\n".join(lines[max(0, i - 4):i])
        if "cuda.is_available()" in above or "needs_cuda" in above or re.search(r"cuda|gpu", m.group(1)):
            print(f"{f}::{m.group(1)}")
EOF
}

# the quick versions of the registry's GPU entries: entry name, then its commands (bench scripts, --out added)
VSEPP_EPOCH=(
    "bench/vsepp_epoch.py --device cuda --batches 200"
    "bench/vsepp_epoch.py --device cuda --batches 200 --amp"
)
# end to end (image files decoded by CPU workers or on the GPU): a log of its own, so that a slow decode cannot
# cost the epoch numbers above; --phases adds the steps alone (images replayed), decoding alone and decoding's
# parts (nvJPEG, drawing the crops, cropping); the levers, each off by default until measured here:
# --decode-ahead decodes each batch in a thread on its own stream while the step before runs, --graphs captures
# the end-to-end steps, --cudnn-benchmark times cuDNN's algorithms once per shape, --cpu-share has CPU worker
# processes decode that share of each batch while nvJPEG decodes the rest (nvJPEG alone: 3,611 images/s on the
# H200, below the 5,100 captions/s goal whatever the step does)
E="bench/vsepp_e2e.py --device cuda --workers 8 --images 1000 --batches 20"
E2E=(
    "$E --decode cpu"
    "$E --phases"
    "$E --amp --phases"
    "$E --amp --decode-ahead"
    "$E --amp --decode-ahead --graphs"
    "$E --amp --decode-ahead --graphs --cudnn-benchmark"
    "$E --amp --decode-ahead --graphs --cudnn-benchmark --cpu-share 0.4"
    "$E --amp --decode-ahead --cudnn-benchmark --cpu-share 0.4"
)
DEEP_STEP=("bench/deep_step.py --device cuda --images 6000 --steps 30 --warmup 8"
           "bench/deep_step.py --device cuda --images 6000 --steps 30 --warmup 8 --amp")
TOPK=("bench/topk_scale.py --gpu-only --device cuda --repeats 10")
SCALE=("bench/scale.py --device cuda --sizes L --steps vsepp,vquery,timam,timam3")
WSABIE=("bench/wsabie_train.py --device cuda --epochs 5 --max-draws 0,100 --baseline-examples 200 --threads 1")
TRAIN="crossview train vsepp --data $F8K --device cuda --set image_model=cnn --set text_model=gru --set max_epochs=1"
# on the run's frozen image features (its steps captured as CUDA graphs: the log says so)
TRAIN_GRU="crossview train vsepp --data $F8K --device cuda --set text_model=gru --set max_epochs=5"

if [ "$DRY" = 1 ]; then
    echo "python -m pytest -q $(cuda_tests | tr '\n' ' ')"
    for c in "${VSEPP_EPOCH[@]}" "${E2E[@]}" "${DEEP_STEP[@]}" "${TOPK[@]}" "${WSABIE[@]}" "${SCALE[@]}"; do
        echo "python $c"
    done
    echo "$TRAIN --run-dir \$WORK/train_vsepp_cnn_f8k"
    echo "$TRAIN_GRU --run-dir \$WORK/train_vsepp_gru_f8k"
    exit 0
fi

# ------------------------------------------------------------------------------------------------ running
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_all.sh: no CUDA GPU here; nothing run (--dry-run prints the commands)" >&2
    exit 2
fi
GPU="$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")"
WORK="${WORK:-$(mktemp -d)}"
mkdir -p "$LOGS" "$WORK"
FAILED=()
START=$SECONDS

wanted() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

step() {   # step NAME SECONDS COMMAND...: run under timeout, say how it went
    local name="$1" limit="$2"; shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit} s) on $GPU" >&2
    # the steps are shell functions (which timeout(1) cannot run): the step runs in a process group of its own
    # (set -m), which a watcher stops at the limit (TERM, then KILL 10 s later), Python children included
    set -m
    "$@" &
    local pid=$!
    set +m
    ( sleep "$limit"; kill -TERM -- "-$pid" 2>/dev/null && { sleep 10; kill -KILL -- "-$pid" 2>/dev/null; }; exit 0 ) &
    local watcher=$!
    wait "$pid"
    local rc=$?
    kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
    [ $rc -eq 143 ] && rc=124
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "== $name: TIMED OUT after ${limit} s" >&2; FAILED+=("$name (timeout)")
    elif [ $rc -ne 0 ]; then
        echo "== $name: failed (exit $rc)" >&2; FAILED+=("$name (exit $rc)")
    else
        echo "== $name: done in $((SECONDS - t0)) s" >&2
    fi
}

entry() {   # entry NAME COMMAND...: the registry entry NAME remade from these commands (stamped, one file)
    "$PY" - "$WORK" "$@" <<'EOF'
import dataclasses, sys
from pathlib import Path
sys.path.insert(0, "bench")
import regenerate as R
work, name, *cmds = sys.argv[1:]
e = dataclasses.replace(R.BY_NAME[name], steps=tuple(R.S(c) for c in cmds))
print(f"{name}: wrote {R.regenerate(e, Path(work)).relative_to(R.REPO)}")
EOF
}

tests_log() {
    { echo "# GPU: $GPU"; echo "# commit ${CROSSVIEW_BENCH_COMMIT:-$(git log -1 --format='%h %cs' 2>/dev/null)}"; echo "\$ python -m pytest -q <the CUDA tests>";
      # shellcheck disable=SC2046
      "$PY" -m pytest -q -p no:cacheprovider $(cuda_tests) 2>&1; } > "$LOGS/cuda_tests_gpu.txt"
    local rc=$?; tail -3 "$LOGS/cuda_tests_gpu.txt"; return $rc
}

e2e_log() {
    { echo "# GPU: $GPU"; echo "# commit ${CROSSVIEW_BENCH_COMMIT:-$(git log -1 --format='%h %cs' 2>/dev/null)}";
      for c in "${E2E[@]}"; do echo "\$ python $c"; "$PY" $c 2>&1; done; } > "$LOGS/vsepp_e2e_gpu.txt"
    local rc=$?; tail -4 "$LOGS/vsepp_e2e_gpu.txt"; return $rc
}

train_log() {
    { echo "# GPU: $GPU"; echo "# commit ${CROSSVIEW_BENCH_COMMIT:-$(git log -1 --format='%h %cs' 2>/dev/null)}"; echo "\$ $TRAIN";
      # shellcheck disable=SC2086
      "$PY" -m crossview ${TRAIN#crossview } --run-dir "$WORK/train_vsepp_cnn_f8k" 2>&1 &&
      echo "\$ $TRAIN_GRU" &&
      # shellcheck disable=SC2086
      "$PY" -m crossview ${TRAIN_GRU#crossview } --run-dir "$WORK/train_vsepp_gru_f8k" 2>&1; } \
        > "$LOGS/train_vsepp_f8k_gpu.txt"
    local rc=$?; tail -5 "$LOGS/train_vsepp_f8k_gpu.txt"; return $rc
}

wanted tests && step "cuda tests" 100 tests_log
wanted epoch && step "vsepp_epoch_gpu" 110 entry vsepp_epoch_gpu "${VSEPP_EPOCH[@]}"
wanted deep && step "deep_step_gpu" 130 entry deep_step_gpu "${DEEP_STEP[@]}"
wanted e2e && step "vsepp e2e" 360 e2e_log
wanted topk && step "topk_scale_gpu" 60 entry topk_scale_gpu "${TOPK[@]}"
wanted wsabie && step "wsabie_train_cuda" 60 entry wsabie_train_cuda "${WSABIE[@]}"
wanted scale && step "scale_gpu" "${SCALE_LIMIT:-420}" entry scale_gpu "${SCALE[@]}"
if wanted train && [ -f "$F8K" ]; then
    step "train vsepp f8k" 90 train_log
elif wanted train; then
    echo "== train vsepp f8k: skipped ($F8K not here)" >&2
fi
echo "gpu_all.sh: $((SECONDS - START)) s on $GPU; ${#FAILED[@]} failed${FAILED[*]:+: ${FAILED[*]}}" >&2
[ ${#FAILED[@]} -eq 0 ]
