r"""Predict with a trained checkpoint; the preprocessing comes from the checkpoint.

    python scripts/predict.py --checkpoint checkpoints/default/best.pt data/new.csv --out preds.csv
    python scripts/predict.py --checkpoint checkpoints/default/best.pt photos/ img.png  # feature: images
    python scripts/predict.py --checkpoint checkpoints/default/best.pt x.pt    # {"x": (N, ...)}
    python scripts/predict.py --checkpoint checkpoints/default/best.pt --split val --out val.csv
    python scripts/predict.py --checkpoint checkpoints/lm/best.pt --prompt "Once" --tokens 200  # feature: text

Writes one CSV row per input (id, predicted class and probability, or values; the label when
the input has one), or prints the generated text; under the checkpoint's train.amp, as  # feature: text
the input has one); under the checkpoint's train.amp, as  # feature: !text
evaluate.py (--amp off: fp32). --out is never a run's checkpoint or record nor an input; an
existing file there is replaced only when it is an earlier prediction CSV, or with --force.
Exit codes: 0 done, 2 bad input, 75 stopped by SIGTERM before writing (130: Ctrl-C).
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
    from {{ cookiecutter.package_name }}.tools.predict import predict_main

    raise SystemExit(predict_main())
