"""The baked project's pretrained-model tests (tests/test_zoo.py: torchvision and timm;
tests/test_hf.py, test_hf_text.py: transformers) with the real libraries, in an environment of
their own:
torchvision is built for one torch release, and the one that installs here (0.29.1) needs
torch 2.14.1, not the 2.13.0 CPU build the rest of CI uses. REQUIRE_EXTRAS makes a library
that fails to import a failure, never a skip.

Slow: pip takes the 2.14.1 build (a CUDA one, about 5.5 GB with its libraries; it runs on the
CPU) from the machine's local wheel folder in about 90 s, in the background from the start of
the session (tests/conftest.py); the tests take about 2 min (the pairwise cases: torchrun
and export on two cores). Nothing else of the machine's environment is used: the package runs
from the bake through PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The pair that imports together here, and what the zoo tests need beside it.
PAIR = ["torch==2.14.1", "torchvision==0.29.1"]
PACKAGES = ["timm", "numpy", "pyyaml", "tqdm", "tensorboard", "pytest", "pillow"]
PACKAGES += ["safetensors", "onnx", "onnxscript", "onnxruntime", "transformers", "tokenizers"]
PACKAGES += ["pytest-xdist"]
# The zoo's own tests, and the pairwise suite's cases of its two task values (cls-images-timm,
# cls-text-hf: tests/pairwise.py adds them where the libraries are installed), but those that
# compile: inductor takes 80 to 130 s a case on two CPU cores, and compile with a pretrained
# model is the GPU check's `pretrained` check (bf16, channels_last, compile) on the GPU, where
# compiling matters; the full bake's suite compiles the other task families on the CPU.
SELECTION = ["tests/test_zoo.py", "tests/test_hf.py", "tests/test_hf_text.py"]
SELECTION += ["tests/test_combinations.py"]
ZOO_CASES = "not test_combination or (timm or hf) and not compile"


def run(args: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


def clean_env() -> dict:
    # CI's PIP_CONSTRAINT pins torch 2.13.0, which torchvision 0.29 does not import beside.
    return {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT", "VIRTUAL_ENV")}


def start_install(venv: Path) -> subprocess.Popen:
    """The zoo environment made in the background: pip spends its ~90 s unpacking wheels, so
    the slow layer (tests/conftest.py starts this when the test is selected) runs meanwhile."""
    python = venv / "bin" / "python"
    pip = f"{python} -m pip install -q --retries 0 {' '.join(PAIR + PACKAGES)}"
    script = f"{sys.executable} -m venv {venv} && {pip}"
    with (venv.parent / "zoo-install.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(["bash", "-c", script], env=clean_env(), stdout=log, stderr=log)


@pytest.mark.slow
def test_the_pretrained_model_tests_pass_with_the_real_libraries(bake, zoo_install):
    project = bake()
    venv, install = zoo_install
    assert install.wait(timeout=900) == 0, (venv.parent / "zoo-install.log").read_text()[-2000:]
    tests = run(
        [venv / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["-m", "slow or not slow", "-rs", "-n", "2", "-k", ZOO_CASES, *SELECTION],
        cwd=project,
        env={
            **clean_env(),
            "PYTHONPATH": str(project),
            "OMP_NUM_THREADS": "1",
            "REQUIRE_EXTRAS": "torchvision,timm,huggingface_hub,transformers,tokenizers",
        },
        timeout=900,
    )
    tail = "\n".join(tests.stdout.splitlines()[-30:])
    assert tests.returncode == 0, tail + tests.stderr[-2000:]
    assert re.search(r"\d+ passed", tail) and "skipped" not in tail, tail
