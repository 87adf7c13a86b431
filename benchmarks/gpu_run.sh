#!/usr/bin/env bash
# The GPU check of a baked project on the lent GPU machine, in one prepared step each side.
#
# 1. Here (no GPU):   bash benchmarks/gpu_run.sh prepare [TEMPLATE_DIR] [REPO_DIR]
#    Bakes TEMPLATE_DIR (default: this template) into REPO_DIR/gpu-bake/ (default: TEMPLATE_DIR),
#    ignored through the repository's .git/info/exclude so that `run` carries it, copies this
#    script beside the project, and prints the `run` call to make.
# 2. There, through the run tool (from REPO_DIR, the repository root on the device):
#      run(command="bash gpu-bake/gpu_run.sh device", carry=["gpu-bake"], timeout_s=540)
#    It runs PYTHONPATH=. python3 scripts/gpu_check.py --json $OUT/gpu-check.json --budget 450
#    in the baked project (the machine's own image: torch 2.11, no install, no network), keeps
#    the whole log in $OUT/gpu-check.log and nvidia-smi's in $OUT/nvidia-smi.txt, and prints
#    the result table. Exit code: gpu_check's (0 pass, 1 a check failed, 3 --budget left
#    checks out, 75 stopped by the time limit: GPU_CHECK_TIMEOUT sends SIGTERM and timeout
#    passes the script's own code on; 137 if it had not stopped 20 s later and was killed).
# 3. To continue a run that was cut short: copy its gpu-check.json (from the run's files) to
#    REPO_DIR/gpu-bake/previous.json and make the same run call: it reruns only the checks that
#    did not pass (--resume), the others kept as they were. A whole run is estimated at 10 to 14
#    minutes on one H200 (the baked README), more than one call's budget: expect exit 3 first.
# Environment on the device: GPU_CHECK_BUDGET (s, default 450), GPU_CHECK_TIMEOUT (s, 510),
# GPU_CHECK_ARGS (more options, e.g. "--only ddp,fsdp").
set -uo pipefail

prepare() {
    local here template repo
    here=$(cd "$(dirname "$0")/.." && pwd)
    template=${1:-$here} repo=${2:-${1:-$here}}
    local folder="$repo/gpu-bake"
    local project
    rm -rf "$folder" && mkdir -p "$folder" || return 1
    COOKIECUTTER_PYTORCH_SKIP_SETUP=1 python3 -m cookiecutter --no-input "$template" \
        --output-dir "$folder" env_manager=none run_smoke_test=no init_git=no >/dev/null || return 1
    project=$(ls -d "$folder"/*/)
    cp "$0" "$folder/gpu_run.sh"
    local exclude
    exclude=$(git -C "$repo" rev-parse --path-format=absolute --git-path info/exclude) || return 1
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/gpu-bake/" "$exclude" 2>/dev/null || echo "/gpu-bake/" >>"$exclude"
    git -C "$repo" check-ignore -q gpu-bake || { echo "gpu-bake/ is not ignored in $repo" >&2; return 1; }
    echo "baked $project ($(du -sh "$folder" | cut -f1)); now, from $repo:"
    echo '  run(command="bash gpu-bake/gpu_run.sh device", carry=["gpu-bake"], timeout_s=540)'
}

device() {
    local here out log python
    here=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-$here/out}
    mkdir -p "$out"
    log="$out/gpu-check.log"
    python=$(command -v python3 || command -v python)
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
    local resume=""
    if [ -f "$here/previous.json" ]; then  # a cut-short run to continue
        cp "$here/previous.json" "$out/gpu-check.json" && resume=--resume
    fi
    local script
    script=$(find "$here" -mindepth 3 -maxdepth 3 -path "*/scripts/gpu_check.py" | head -n 1)
    [ -n "$script" ] || { echo "no baked project in $here" >&2; return 2; }
    cd "$(dirname "$script")/.." || return 2
    echo "$(pwd): $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.device_count(), "GPU(s)")' 2>&1)"
    # shellcheck disable=SC2086  # GPU_CHECK_ARGS holds several options
    PYTHONPATH=. PYTHONUNBUFFERED=1 timeout --preserve-status --signal=TERM \
        --kill-after=20 "${GPU_CHECK_TIMEOUT:-510}" \
        "$python" scripts/gpu_check.py --json "$out/gpu-check.json" \
        --budget "${GPU_CHECK_BUDGET:-450}" $resume ${GPU_CHECK_ARGS:-} >"$log" 2>&1
    local code=$?
    if grep -q '^check  ' "$log"; then
        sed -n '/^check  /,$p' "$log"  # the table, the targets and the summary line
    else
        tail -n 60 "$log"  # it ended before its table
    fi
    echo "exit $code; report $out/gpu-check.json, log $log"
    return "$code"
}

case "${1:-}" in
prepare) shift; prepare "$@" ;;
device) shift; device "$@" ;;
*) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
