"""Write the full model of a sharded checkpoint (train.strategy=fsdp) to one file.

python scripts/consolidate.py --checkpoint checkpoints/default/best.pt
python scripts/evaluate.py --checkpoint checkpoints/default/best.full.pt
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
    from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main

    raise SystemExit(consolidate_main())
