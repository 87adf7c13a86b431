"""scripts/reproduce.py: compare a run's record (run.json, utils/provenance.py) with now, one
line per difference, then train the run again from its config.yaml into a new run folder and
compare the two runs' metrics.csv and final weights. Also what the other tools show of a
record: evaluate.py's and predict.py's drift line,
export's trimmed record,  # feature: export
compare_runs.py's columns."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from ..errors import UserError
from ..utils import provenance
from .cli import guard

# metrics.csv columns that measure the machine, not the math: never compared.
TIMED = ("time/", "throughput/", "memory/")
# Differences that make a rerun train on something else: refused without --anyway. Another
# machine (GPU, driver, CPUs) is only reported: the rerun says how far its numbers moved.
REFUSED = ("code:", "data:", "config:", "software:")


def reproduce_main(scripts: Path, argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    def run() -> int:
        run_dir = Path(args.run_dir)
        record, cfg_path = _read_run(run_dir)
        from ..config import load_config, to_dict

        cfg = load_config(str(cfg_path))
        lines = compare_now(record, cfg, to_dict(cfg))
        for line in lines:
            print(line)
        for resume in record.get("resumes", []):  # the run itself changed as it went
            for change in resume.get("changes", []):
                print(f"at its resume of {resume.get('at')}: {change}")
        if args.check:
            if not lines:
                print("same code, software, machine and data as the run's record")
            return 1 if lines else 0
        if any(line.startswith(REFUSED) for line in lines) and not args.anyway:
            raise UserError(
                "the code, data or software differ from the run's record (lines above): check "
                "out its commit (and git apply its diff.patch), restore the data and packages, "
                "or pass --anyway to train regardless"
            )
        name = args.name or _free_name(run_dir)
        code = _train(scripts, cfg_path, name, record, cfg)
        if code != 0:
            print(f"the rerun exited {code}; nothing compared", file=sys.stderr)
            return code
        same_setup = not lines
        return _compare_runs(run_dir, run_dir.parent / name, same_setup)

    return guard(run, args.debug)


def _parser():
    from .cli import make_parser

    parser = make_parser(
        "Compare a run's record (run.json) with now, then train it again into a new run folder "
        "and compare the two. Takes no key=value: the run's own config.yaml is the settings.",
        example="(none)",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder holding run.json")
    parser.add_argument(
        "--check", action="store_true", help="compare with now only; exit 1 if any differs"
    )
    parser.add_argument(
        "--anyway", action="store_true", help="train again although the code or data differ"
    )
    parser.add_argument("--name", help="the new run's name (default: <run>-repro[-N])")
    return parser


def _read_run(run_dir: Path) -> tuple[dict, Path]:
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{str(run_dir)!r} is not a run folder (no config.yaml); give one")
    record = provenance.read(run_dir)
    if record is None:
        raise UserError(
            f"{str(run_dir / provenance.RECORD)!r} is missing or unreadable: the run was "
            "trained before runs recorded what made them; train it again to get one"
        )
    return record, run_dir / "config.yaml"


def compare_now(record: dict, cfg, settings: dict) -> list[str]:
    """The differences between the record and this checkout, software, machine and data."""
    now, _ = provenance.collect(cfg, settings, record.get("launch", {}).get("world_size", 1))
    now["launch"]["threads"] = record.get("launch", {}).get("threads")  # the rerun pins them
    lines = provenance.differences(record, now)
    if record.get("config_sha256") not in (None, now["config_sha256"]):
        lines.append("config: config.yaml is not the config the run started with")
    return lines


def _free_name(run_dir: Path) -> str:
    name, n = f"{run_dir.name}-repro", 1
    while (run_dir.parent / name).exists():
        n += 1
        name = f"{run_dir.name}-repro-{n}"
    return name


def _train(scripts: Path, cfg_path: Path, name: str, record: dict, cfg) -> int:
    """scripts/train.py with the run's config into run.name=`name`, as many ranks as then."""
    ranks = int(record.get("launch", {}).get("world_size", 1))
    launch = [sys.executable]
    if ranks > 1:  # one machine: torchrun's own rendezvous
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    # The threads in force then: CPU float sums depend on how many threads share them.
    threads = record.get("launch", {}).get("threads")
    overrides = [f"run.name={name}", "train.resume="]
    overrides += [f"run.threads={threads}"] if threads and not cfg.run.threads else []
    command = [*launch, str(scripts / "train.py"), "--config", str(cfg_path), *overrides]
    print(f"training again: {' '.join(command[1:])}", flush=True)
    return subprocess.call(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _compare_runs(first: Path, second: Path, same_setup: bool) -> int:
    """The new run's metrics.csv and last weights against the original's: bitwise equal
    where the code, software, machine and data are the same (else the largest difference)."""
    a, b = _rows(first / "metrics.csv"), _rows(second / "metrics.csv")
    worst, where = 0.0, ""
    if set(a) != set(b):
        worst, where = float("inf"), f"steps {sorted(a)} then, {sorted(b)} now"
    for step in sorted(set(a) & set(b)):
        for col in sorted(set(a[step]) & set(b[step])):
            x, y = a[step][col], b[step][col]
            if x != y and not (x == "" == y):
                gap = _gap(x, y)
                if gap >= worst:
                    worst, where = gap, f"{col} at step {step}: {x} then, {y} now"
    weights = _weights_equal(first / "last.pt", second / "last.pt")
    print(
        f"rerun {second}: {len(b)} metrics rows, "
        + ("equal to the original's" if not where else f"largest difference {where}")
        + f"; final weights {weights}"
    )
    if same_setup and (where or weights == "differ"):
        print(
            "not reproduced: same code, software, machine and data, other numbers", file=sys.stderr
        )
        return 1
    return 0


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {
        row["step"]: {k: v for k, v in row.items() if k and not k.startswith(TIMED)}
        for row in rows
    }


def _gap(x: str, y: str) -> float:
    try:
        return abs(float(x) - float(y))
    except ValueError:
        return float("inf")


def _weights_equal(first: Path, second: Path) -> str:
    """Whether they are "bitwise equal", "differ", or why they were not compared."""
    import torch

    from .. import checkpoint

    try:
        a = checkpoint.model_weights(checkpoint.load(first), first)
        b = checkpoint.model_weights(checkpoint.load(second), second)
    except UserError as exc:
        return f"not compared ({exc})"
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return "bitwise equal" if same else "differ"


def drift(record: dict | None, output_dir: str) -> str | None:
    """evaluate.py's and predict.py's one line when the checkpoint was trained on other code
    or data than is here; None when the same or unrecorded."""
    if not record:
        return None
    code, _ = provenance.code_state()
    entries = record.get("data", [])
    content = any("content" in e for e in entries)
    now = {"code": code, "data": provenance.data_now(entries, output_dir, content)}
    lines = [
        line
        for line in provenance.differences({**record, "software": {}, "machine": {}}, now)
        if line.startswith(("code:", "data:"))
    ]
    if not lines:
        return None
    more = f" (+{len(lines) - 2} more)" if len(lines) > 2 else ""
    return f"note: trained on other code or data than is here: {'; '.join(lines[:2])}{more}"


# >>> export
def trimmed(record: dict | None) -> dict | None:
    """What a serving team needs of a record (export's JSON): the code, torch, the config's
    hash, the data's digests."""
    if not record:
        return None
    code = record.get("code", {})
    return {
        "commit": code.get("commit"),
        "dirty": code.get("dirty"),
        "torch": record.get("software", {}).get("torch"),
        "config_sha256": record.get("config_sha256"),
        "data": [{k: v for k, v in d.items() if k != "size"} for d in record.get("data", [])],
    }
# <<< export


def flat(record: dict | None) -> dict:
    """compare_runs.py's columns of a record: {"code.commit": ..., "software.torch": ...,
    "package.numpy": ..., "data.<path>": ...}."""
    if not record:
        return {}
    code, soft = record.get("code", {}), record.get("software", {})
    out = {"code.commit": (code.get("commit") or "")[:12], "code.dirty": code.get("dirty")}
    out.update({f"software.{k}": soft.get(k) for k in ("python", "torch", "cuda")})
    out.update({f"package.{k}": v for k, v in soft.get("packages", {}).items()})
    out["machine.gpus"] = ", ".join(record.get("machine", {}).get("gpus", [])) or "none"
    for entry in record.get("data", []):
        fingerprint = entry.get("sha256") or entry.get("content") or entry.get("listing") or ""
        out[f"data.{entry['path']}"] = fingerprint[:12]
    return out
