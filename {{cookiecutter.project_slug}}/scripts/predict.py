r"""Predict with a trained checkpoint; the preprocessing comes from the checkpoint.

    python scripts/predict.py --checkpoint checkpoints/default/best.pt data/new.csv --out preds.csv
    python scripts/predict.py --checkpoint checkpoints/default/best.pt photos/ img.png
    python scripts/predict.py --checkpoint checkpoints/default/best.pt x.pt    # {"x": (N, ...)}
    python scripts/predict.py --checkpoint checkpoints/default/best.pt --split val --out val.csv
    python scripts/predict.py --checkpoint checkpoints/lm/best.pt --prompt "Once" --tokens 200

Writes one CSV row per input (id, predicted class and probability, or values; the label when
the input has one), or prints the generated text. Exit codes: 0 done, 2 bad input.
"""

try:
    from {{ cookiecutter.package_name }}.tools.predict import predict_main
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    raise SystemExit(predict_main())
