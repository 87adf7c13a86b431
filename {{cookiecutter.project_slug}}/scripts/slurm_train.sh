#!/bin/bash
# Multi-node training on SLURM: one task per node runs torchrun, which starts one process per
# GPU; the nodes meet through torchrun's c10d rendezvous on the first node of the job.
#
#   sbatch scripts/slurm_train.sh run.name=big                  # from the project root
#   sbatch --nodes=4 --time=48:00:00 scripts/slurm_train.sh run.name=big train.epochs=90
#
# Arguments are the usual key=value overrides. train.resume=auto is always added, so give each
# experiment its own run.name: a requeued job then continues from its newest checkpoint.
# train.init_from=PATH (fine-tuning) loads its weights on the first start only; a requeued job
# continues its own checkpoint.
# Activate the project's environment before sbatch; the job inherits it.
#
#   bash scripts/slurm_train.sh --help                          # this text
#   SLURM_JOB_NODELIST=gpu-[3-4] SLURM_NNODES=2 SLURM_GPUS_ON_NODE=8 \
#       bash scripts/slurm_train.sh --dry-run run.name=big      # the command, nothing run
#
# --dry-run prints the srun + torchrun command the job would run, from the SLURM_* variables
# set (defaults: 1 node, 1 process, this host) and without SLURM installed; nothing runs.
#
# Time limit: SLURM sends USR1 to this script 120 s before the limit (--signal=B:USR1@120). The
# trap sends SIGTERM to every process of the job step (torchrun forwards TERM, not USR1, to its
# workers; loader workers ignore it); the ranks agree to stop within ~2 s, save last.pt and exit
# with 75; then the script requeues the job (--requeue), which starts again with
# train.resume=auto. A job that SLURM preempts gets SIGTERM directly and saves the same way,
# within the cluster's grace time.
#
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out

set -euo pipefail

dry_run=0
case "${1:-}" in
-h | --help)
    sed -n '2,/^#SBATCH/{/^#SBATCH/d;s/^# \{0,1\}//;p;}' "$0"
    exit 0
    ;;
--dry-run)
    dry_run=1
    shift
    ;;
esac
if [[ -z ${SLURM_JOB_ID:-} ]] && ((!dry_run)); then
    echo "slurm_train.sh: not inside a SLURM job (SLURM_JOB_ID is unset): submit it with" \
        "sbatch, or see the command it would run with --dry-run (--help: how)" >&2
    exit 2
fi

cd "${SLURM_SUBMIT_DIR:-.}"
if [[ ! -f scripts/train.py ]]; then
    echo "slurm_train.sh: submit from the project root (scripts/train.py not found)" >&2
    exit 2
fi

gpus_per_node=${SLURM_GPUS_ON_NODE:-1}
nodes=${SLURM_NNODES:-1}
job_id=${SLURM_JOB_ID:-dry-run}
node_list=${SLURM_JOB_NODELIST:-${HOSTNAME:-localhost}}
if command -v scontrol >/dev/null; then
    # sed, not head: head would exit early and fail the pipe (SIGPIPE, pipefail) on long lists.
    head_node=$(scontrol show hostnames "$node_list" | sed -n 1p)
else # a dry run away from SLURM: the first name of a plain list (gpu-[3-4] stays as it is)
    head_node=${node_list%%,*}
fi
rdzv_port=${RDZV_PORT:-29500} # set RDZV_PORT if 29500 is taken on the head node
# Seconds torchrun waits for its workers to save after SIGTERM before it kills them (30 s by
# default; older torch versions ignore the variable and keep 30 s).
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-100}

requeue=0
# shellcheck disable=SC2317,SC2329  # (reached through the trap)
stop_and_requeue() {
    echo "slurm_train.sh: USR1 (time limit near): stopping training so that it saves"
    requeue=1
    # SIGTERM to the job step: torchrun and its workers on every node. Not `kill` on srun:
    # srun answers its own SIGTERM by killing the tasks at once, before they can save.
    scancel --signal=TERM "$SLURM_JOB_ID"
}
trap stop_and_requeue USR1

command=(
    srun --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" torchrun
    --nnodes="$nodes"
    --nproc_per_node="$gpus_per_node"
    --rdzv-backend=c10d
    --rdzv-endpoint="$head_node:$rdzv_port"
    --rdzv-id="$job_id"
    scripts/train.py "$@" train.resume=auto
)
if ((dry_run)); then
    printf '%q' "${command[0]}"
    printf ' %q' "${command[@]:1}"
    printf '\n'
    exit 0
fi
echo "slurm_train.sh: job $job_id (restart ${SLURM_RESTART_COUNT:-0}):" \
    "$nodes nodes x $gpus_per_node processes, rendezvous at $head_node:$rdzv_port"
# In the background so that the trap runs at once: bash delays traps until a foreground
# command returns, but `wait` returns on a signal.
"${command[@]}" &
srun_pid=$!

status=0
wait "$srun_pid" || status=$?
if ((requeue)); then
    status=0
    wait "$srun_pid" || status=$? # the trap cut the first wait short: wait for the save
    echo "slurm_train.sh: training stopped (exit $status); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
