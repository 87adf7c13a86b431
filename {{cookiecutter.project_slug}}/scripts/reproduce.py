"""Re-create a run: compare its record (run.json) with this checkout, software, machine and
data, one line per difference; then train it again from its config.yaml into a new run folder
and compare the two runs' metrics and final weights.

python scripts/reproduce.py checkpoints/default --check   # what differs from now; exit 1 if any
python scripts/reproduce.py checkpoints/default           # train again into default-repro
"""

from pathlib import Path

try:
    from {{ cookiecutter.package_name }}.tools.cli import hold_signals
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    # Before the tool's imports (torch takes seconds): a stop signal during start-up ends it
    # with exit 75 (Ctrl-C: 130) and one line, nothing written, instead of killing it.
    hold_signals()
    from {{ cookiecutter.package_name }}.tools.reproduce import reproduce_main

    raise SystemExit(reproduce_main(Path(__file__).resolve().parent))
