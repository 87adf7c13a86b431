r"""Export a checkpoint's model for serving, checked against the eager model.

    python scripts/export.py --checkpoint checkpoints/default/best.pt --format onnx
    python scripts/export.py --checkpoint checkpoints/default/best.pt --format export   # .pt2
    python scripts/export.py --checkpoint checkpoints/default/best.pt --format torchscript \
        --out model.pt --atol 1e-5

Writes the artifact (beside the checkpoint by default) and <artifact>.json: what goes in (raw
inputs: the training preprocessing is inside the artifact) and comes out (classes, target
names, units), task, format, parity result; only once it passed the parity check, replacing
the previous files by a rename. --out is never a run's checkpoint or record; an existing
file there is replaced only when it is an earlier export (its JSON names it), or with --force.
ONNX needs pip install -e ".[export]". Exit codes: 0 done, 1 the export's outputs differ from
the model's by more than --atol (nothing replaced), 2 bad input, a failed write or a model the
format cannot export, 75 stopped by SIGTERM before the files were put in place (130: Ctrl-C;
nothing written).
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
    from {{ cookiecutter.package_name }}.tools.export import export_main

    raise SystemExit(export_main())
