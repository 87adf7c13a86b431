r"""Train a model.

    python scripts/train.py                                    # defaults (configs/default.yaml)
    python scripts/train.py --config configs/experiments/mlp_large_batch.yaml train.epochs=3
    python scripts/train.py run.name=baseline train.resume=auto    # continue after a stop
    torchrun --standalone --nproc_per_node=4 scripts/train.py       # 4 GPUs, one machine
    # Several machines: this line on each (HEAD: the first one's address; same run id)
    torchrun --nnodes=2 --nproc_per_node=4 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 \
        --rdzv-id=run1 scripts/train.py run.name=run1
    sbatch scripts/slurm_train.sh run.name=run1                    # SLURM: nodes x GPUs, requeue

Exit codes: 0 done, 2 bad input (one line says what to fix), 75 preempted or a first Ctrl-C
(saved; rerun to resume), 130 a second Ctrl-C (the last checkpoint saved stays).
"""

try:
    from {{ cookiecutter.package_name }}.tools.train import train_main
    from {{ cookiecutter.package_name }}.utils.signals import hold_for_process
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    # Before torch is imported, and until the process ends: a SIGTERM during start-up, or a
    # second one while the process exits after its save, still ends the run with 75.
    hold_for_process()
    raise SystemExit(train_main())
