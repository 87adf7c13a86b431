"""Evaluate a checkpoint on the validation split and print its metrics.

python scripts/evaluate.py --checkpoint checkpoints/default/best.pt
python scripts/evaluate.py --checkpoint checkpoints/default/best.pt run.device=cpu
"""

try:
    from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    raise SystemExit(evaluate_main())
