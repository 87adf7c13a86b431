"""Where the whole Config goes: the modules whose functions receive it during a run.

    python benchmarks/config_reach.py                  # bakes the default (lean) project
    python benchmarks/config_reach.py --project DIR    # a baked project; ~15 s

Runs the baked `scripts/train.py` twice in one fresh process each (a tiny new run, then the
same run resumed for one epoch more) under `sys.setprofile`, and records every call of a
package function (outside config/) whose arguments hold the run's `Config`, directly or as an
attribute (`self.cfg`, `loop.cfg`). Printed per run: the modules reached, the functions, and
how often the chain of such calls returns to a module it had left. Components that take their
own section (`cfg.train`, `cfg.data`, ...) or values passed by name do not count: that is the
point of the measure. Dynamic, so it counts what a default run executes, not every branch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import _child_env, bake  # noqa: E402

TINY = ["data.train_size=256", "data.val_size=64", "run.loggers=[csv]", "run.threads=1"]

# Runs inside the baked project: argv[1] the package folder, the rest train.py's arguments.
TRACER = r"""
import json, os, runpy, sys
PKG = os.path.abspath(sys.argv[1]) + os.sep
sys.argv = ["scripts/train.py", *sys.argv[2:]]
calls, order = {}, []

def is_config(v):
    t = type(v)
    return t.__name__ == "Config" and t.__module__.endswith(".config.schema")

def holds(v):
    d = getattr(v, "__dict__", None)
    return is_config(v) or (isinstance(d, dict) and any(map(is_config, d.values())))

def profile(frame, event, arg):
    code = frame.f_code
    if event != "call" or not code.co_filename.startswith(PKG) or "/config/" in code.co_filename:
        return
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if any(holds(frame.f_locals.get(n)) for n in names):
        mod = code.co_filename[len(PKG):]
        key = f"{mod}:{code.co_name}"
        calls[key] = calls.get(key, 0) + 1
        if not order or order[-1] != mod:
            order.append(mod)

sys.setprofile(profile)
try:
    runpy.run_path("scripts/train.py", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
finally:
    sys.setprofile(None)
print("CONFIG_REACH " + json.dumps({"calls": calls, "order": order, "exit": code}))
"""


def reach(project: Path, package: str, args: list[str], env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", TRACER, str(project / package), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("CONFIG_REACH ")), None)
    if line is None:
        sys.exit(f"the traced run printed nothing (exit {out.returncode}):\n{out.stderr[-2000:]}")
    found = json.loads(line.removeprefix("CONFIG_REACH "))
    if found["exit"] not in (0, None):
        sys.exit(f"the traced run failed (exit {found['exit']}):\n{out.stderr[-2000:]}")
    modules = sorted({key.split(":")[0] for key in found["calls"]})
    seen, returns = set(), 0
    for mod in found["order"]:
        returns += mod in seen
        seen.add(mod)
    return {
        "modules": modules,
        "functions": len(found["calls"]),
        "returns": returns,
        "calls": found["calls"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--project", help="a baked project instead of baking the default one")
    p.add_argument("--json", help="write the numbers to this file")
    p.add_argument("--verbose", action="store_true", help="list every function")
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="config-reach-") as tmp:
        project, package = bake(Path(tmp), args.project)
        env = _child_env(project, 1)
        out = [f"run.output_dir={Path(tmp) / 'runs'}", "run.name=reach", *TINY]
        runs = {
            "new run": [*out, "train.epochs=1"],
            "resumed run": [*out, "train.epochs=2", "train.resume=auto"],
        }
        for label, run_args in runs.items():
            results[label] = found = reach(project, package, run_args, env)
            print(
                f"{label}: the whole Config reaches {len(found['modules'])} modules "
                f"({', '.join(found['modules'])}); {found['functions']} functions; "
                f"{found['returns']} returns to a module left"
            )
            for key, n in sorted(found["calls"].items()) if args.verbose else ():
                print(f"  {key} x{n}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
