r"""Hyperparameter sweeps: each trial a named run of scripts/train.py, resumable as a whole.

    python scripts/sweep.py --name lrs train.lr=1e-3,3e-3 model.width=16,32     # a 2x2 grid
    python scripts/sweep.py --name rs --trials 20 train.lr=log:1e-4:1e-2 model.width=choice:16,32
    python scripts/sweep.py --name lrs --seeds 3 train.lr=1e-3,3e-3            # mean ± std
    python scripts/sweep.py --name lrs --parallel 2 train.lr=1e-3,3e-3        # 2 at a time
    python scripts/sweep.py --name lrs --slurm train.lr=1e-3,3e-3             # a SLURM array
    python scripts/sweep.py --name tpe --optuna 30 train.lr=log:1e-4:1e-2     # Optuna, pruned
    python scripts/sweep.py --name lrs --report                               # the table again

Trials run under <run.output_dir>/<name>/; sweep.json holds their state. The same command
again skips done trials and resumes the others (one a killed sweep left running too). Exit
codes: 0 done, 1 a trial failed, 2 bad input (or a trial that could not write, a full disk:
the sweep stops there and the same command retries it), 75 stopped: Ctrl-C or SIGTERM makes
each running trial save and stop (run again to continue; a second Ctrl-C stops them without
saving).
"""

try:
    from {{ cookiecutter.package_name }}.tools.cli import hold_signals
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    # Before the sweep's imports, as the tools do: a stop signal (or SIGHUP) during start-up
    # is noted, and the sweep stops before its first trial (exit 75) instead of dying.
    hold_signals(hangup=True)
    from pathlib import Path

    from {{ cookiecutter.package_name }}.tools.sweep_cli import main

    raise SystemExit(main(Path(__file__).resolve().parents[1]))
