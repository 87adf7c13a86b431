#!/usr/bin/env bash
# The GPU check of a baked project on the lent GPU machine, in one prepared step each side.
#
# 1. Here (no GPU):   bash benchmarks/gpu_run.sh prepare [TEMPLATE_DIR] [REPO_DIR]
#    Bakes TEMPLATE_DIR (default: this template) into REPO_DIR/gpu-bake/ (default: TEMPLATE_DIR),
#    ignored through the repository's .git/info/exclude so that `run` carries it, copies this
#    script beside the project, and prints the `run` calls to make.
# 2. There, through the run tool (from REPO_DIR, the repository root on the device), the quick
#    check first: one call, about 4 minutes on one H200 (an estimate until measured):
#      run(command="bash gpu-bake/gpu_run.sh device", carry=["gpu-bake"], timeout_s=330)
#    It runs PYTHONPATH=. python3 scripts/gpu_check.py --quick in the baked project (the
#    machine's own image: torch 2.11, no install, no network), writes its report to
#    $OUT/gpu-check-quick.json and the trace it observed to $OUT/gpu-goldens.json (compared
#    with gpu-bake/goldens.json where one was carried: same GPU, torch and CUDA only), and
#    prints the result table and the block after `---` (checks_passed, seconds, peak_vram_mb,
#    mfu_percent, trainer_vs_loop, device, torch, cuda).
#    Then, in the time left, one group of the default run (`--list` in the bake names them and
#    their estimates; each fits one call):
#      run(command="bash gpu-bake/gpu_run.sh device group 2", carry=["gpu-bake"], timeout_s=540)
#    or `device full` for the whole default run (10 to 14 minutes estimated: more than one
#    call; it stops at --budget with exit 3, to be continued as in 3). Each keeps the whole log
#    in $OUT/gpu-check.log and nvidia-smi's in $OUT/nvidia-smi.txt. Exit code: gpu_check's
#    (0 pass, 1 a check failed, 3 --budget left checks out, 75 stopped by the time limit:
#    GPU_CHECK_TIMEOUT sends SIGTERM and timeout passes the script's own code on; 137 if it
#    had not stopped 20 s later and was killed).
# 3. To continue a group or full run that was cut short: copy its gpu-check.json (from the
#    run's files) to REPO_DIR/gpu-bake/previous.json and make the same run call: it reruns
#    only the checks that did not pass (--resume), the others kept as they were.
# Environment on the device: GPU_CHECK_BUDGET (s, default 450; groups and full),
# GPU_CHECK_TIMEOUT (s, default 300 for the quick check, 510 otherwise), GPU_CHECK_ARGS (more
# options, e.g. "--only ddp,fsdp" with `device full`).
set -uo pipefail

prepare() {
    local here template repo
    here=$(cd "$(dirname "$0")/.." && pwd)
    template=${1:-$here} repo=${2:-${1:-$here}}
    local folder="$repo/gpu-bake"
    local project
    rm -rf "$folder" && mkdir -p "$folder" || return 1
    COOKIECUTTER_PYTORCH_SKIP_SETUP=1 python3 -m cookiecutter --no-input "$template" \
        --output-dir "$folder" env_manager=none run_smoke_test=no init_git=no preset=full >/dev/null || return 1
    project=$(ls -d "$folder"/*/)
    cp "$0" "$folder/gpu_run.sh"
    local exclude
    exclude=$(git -C "$repo" rev-parse --path-format=absolute --git-path info/exclude) || return 1
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/gpu-bake/" "$exclude" 2>/dev/null || echo "/gpu-bake/" >>"$exclude"
    git -C "$repo" check-ignore -q gpu-bake || { echo "gpu-bake/ is not ignored in $repo" >&2; return 1; }
    echo "baked $project ($(du -sh "$folder" | cut -f1)); now, from $repo, the quick check:"
    echo '  run(command="bash gpu-bake/gpu_run.sh device", carry=["gpu-bake"], timeout_s=330)'
    echo "then, in the time left, a group (bash gpu-bake/gpu_run.sh device group N; --list):"
    echo '  run(command="bash gpu-bake/gpu_run.sh device group 2", carry=["gpu-bake"], timeout_s=540)'
}

# The options of gpu_check.py for `device [quick | group N | full]`, one a line.
options() {
    local here=$1 out=$2
    shift 2
    case "${1:-quick}" in
    quick)
        printf '%s\n' --quick --json "$out/gpu-check-quick.json" --export-goldens "$out/gpu-goldens.json"
        [ -f "$here/goldens.json" ] && printf '%s\n' --goldens "$here/goldens.json"
        return 0 ;;
    group) [ -n "${2:-}" ] || { echo "device group N: which group? (--list names them)" >&2; return 2; }
        printf '%s\n' --group "$2" ;;
    full) ;;
    *) echo "device ${1}: expected quick (the default), group N or full" >&2; return 2 ;;
    esac
    printf '%s\n' --json "$out/gpu-check.json" --budget "${GPU_CHECK_BUDGET:-450}"
    if [ -f "$here/previous.json" ]; then  # a cut-short run to continue
        cp "$here/previous.json" "$out/gpu-check.json" && printf '%s\n' --resume
    fi
}

device() {
    local here out log python
    here=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-$here/out}
    mkdir -p "$out"
    log="$out/gpu-check.log"
    python=$(command -v python3 || command -v python)
    local chosen
    chosen=$(options "$here" "$out" "$@") || return 2
    local -a args
    mapfile -t args <<<"$chosen"
    local limit=510
    [ "${1:-quick}" = quick ] && limit=300
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
    local script
    script=$(find "$here" -mindepth 3 -maxdepth 3 -path "*/scripts/gpu_check.py" | head -n 1)
    [ -n "$script" ] || { echo "no baked project in $here" >&2; return 2; }
    cd "$(dirname "$script")/.." || return 2
    echo "$(pwd): $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.device_count(), "GPU(s)")' 2>&1)"
    # --foreground: one SIGTERM, to gpu_check alone (it stops its own processes). Without it
    # timeout signals its process group too, and a second SIGTERM landing while Python exits
    # (its handlers reset) ends gpu_check with 143 instead of its 75.
    # shellcheck disable=SC2086  # GPU_CHECK_ARGS holds several options
    PYTHONPATH=. PYTHONUNBUFFERED=1 timeout --foreground --preserve-status --signal=TERM \
        --kill-after=20 "${GPU_CHECK_TIMEOUT:-$limit}" \
        "$python" scripts/gpu_check.py "${args[@]}" ${GPU_CHECK_ARGS:-} >"$log" 2>&1
    local code=$?
    if grep -q '^check  ' "$log"; then
        sed -n '/^check  /,$p' "$log"  # the table, the targets, the summary and the --- block
    else
        tail -n 60 "$log"  # it ended before its table
    fi
    echo "exit $code; report and log in $out"
    return "$code"
}

case "${1:-}" in
prepare) shift; prepare "$@" ;;
device) shift; device "$@" ;;
*) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
