"""Smoke test: train -> checkpoint -> resume -> evaluate on tiny data (CUDA + bf16 if present).

python scripts/smoke.py                  # or: make smoke
python scripts/smoke.py run.device=cpu   # any config override applies to every phase
"""

from pathlib import Path

try:
    from {{ cookiecutter.package_name }}.tools.train import smoke_main
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)

if __name__ == "__main__":
    raise SystemExit(smoke_main(Path(__file__).resolve().parents[1]))
