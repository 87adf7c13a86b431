"""Compare runs: a table (best metric, epochs, steps, wall time, the settings that differ) and
their validation curves on one plot.

python scripts/compare_runs.py checkpoints/*                       # every run, compare.png
python scripts/compare_runs.py checkpoints/lrs --out lrs.png       # a folder of runs
python scripts/compare_runs.py checkpoints/a checkpoints/b --x epoch
"""

try:
    from {{ cookiecutter.package_name }}.tools.cli import hold_signals
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    # Before the tool's imports (torch takes seconds): a stop signal during start-up ends it
    # with exit 75 (Ctrl-C: 130) and one line, nothing written, instead of killing it.
    hold_signals()
    from {{ cookiecutter.package_name }}.tools.compare import compare_main

    raise SystemExit(compare_main())
