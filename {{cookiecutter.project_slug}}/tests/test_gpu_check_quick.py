"""Tests for scripts/gpu_check.py --quick, its groups and its goldens without a GPU: each
quick check fails on a broken input (a wrong trace, a nondeterministic run, a resume that
differs, an amp run out of tolerance, ranks that differ: the step it reads replaced by a
stand-in), the --- block, the groups' estimates and the goldens' keys; and (slow) the quick
set for real with --allow-cpu."""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, load_script

SCRIPT = "scripts/gpu_check.py"
gpu_check = load_script("gpu_check")
from gpu_checks import common, goldens, numerics, quick, ranks, registry  # noqa: E402

CPU = common.Machine("cpu", 0, None)
H200 = common.Machine("cuda", 1, (9, 0), "NVIDIA H200")
LOSSES = [1.4, 1.2, 1.0, 0.9, 0.8, 0.7, 0.65, 0.6]
QUICK = [spec.name for spec in registry.QUICK]


def run(losses=LOSSES, val=0.5, weights=1.0, grads=0.5, scaler=None) -> dict:
    """What numerics.trace returns, made up: per-step losses, the validation loss, last.pt's
    state and the last step's gradients."""
    model = {"w": torch.full((3, 2), weights), "b": torch.zeros(2)}
    return {
        "losses": list(losses),
        "val": val,
        "state": {"model": model, "scaler": scaler or {}},
        "grads": [torch.full((3, 2), grads), torch.zeros(2)],
    }


def traces(monkeypatch, runs: dict, *modules) -> None:
    """numerics.trace (as `modules` import it) replaced by one returning `runs[name]`."""
    for module in modules:
        monkeypatch.setattr(module, "trace", lambda c, name, *_: copy.deepcopy(runs[name]))


def check(tmp_path, machine=CPU) -> common.Check:
    return common.Check(machine, tmp_path, float("inf"))


def bumped(values: list[float], at: int, by: float) -> list[float]:
    return [v + by if i == at else v for i, v in enumerate(values)]


# ---- each quick check fails on a broken input ----


def test_quick_trace_fails_on_a_wrong_trace(monkeypatch, tmp_path):
    traces(monkeypatch, {"fp32_cpu": run(), "fp32": run()}, numerics)
    assert "max |diff| 0.0e+00 over 8 steps" in quick.check_quick_trace(check(tmp_path))
    broken = {
        "step 5 off by bf16's distance": bumped(LOSSES, 4, 2e-3),
        "a nan": bumped(LOSSES, 2, math.nan),
        "a step missing": LOSSES[:-1],
    }
    for why, losses in broken.items():
        traces(monkeypatch, {"fp32_cpu": run(), "fp32": run(losses)}, numerics)
        with pytest.raises(common.Failed, match="fp32 loss trace CPU vs cpu") as failed:
            quick.check_quick_trace(check(tmp_path))
        assert why != "step 5 off by bf16's distance" or "step 5 " in str(failed.value)
    within = bumped(LOSSES, 4, 0.5 * numerics.TRACE_TOLERANCE)
    traces(monkeypatch, {"fp32_cpu": run(), "fp32": run(within)}, numerics)
    quick.check_quick_trace(check(tmp_path))


def test_quick_twice_fails_on_a_nondeterministic_run(monkeypatch, tmp_path):
    traces(monkeypatch, {"run1": run(), "run2": run()}, quick)
    assert "bitwise equal" in quick.check_quick_twice(check(tmp_path))
    one_bit = bumped(LOSSES, 2, math.ulp(LOSSES[2]))
    broken = {
        "step 3's loss": run(one_bit),
        "final weights differ": run(weights=1 + 2**-23),  # fp32's next value after 1
        "last gradients differ": run(grads=0.25),
    }
    for message, second in broken.items():
        traces(monkeypatch, {"run1": run(), "run2": second}, quick)
        with pytest.raises(common.Failed, match=message):
            quick.check_quick_twice(check(tmp_path))


def test_the_fingerprint_hashes_every_byte_with_dtype_and_shape():
    base = [torch.arange(6.0).view(2, 3)]
    digest = quick.sha256(base)
    assert digest == quick.sha256([t.clone() for t in base])
    assert digest != quick.sha256([base[0].view(3, 2)])  # same bytes, another shape
    assert digest != quick.sha256([base[0].double()])
    assert digest != quick.sha256([torch.arange(6.0).view(2, 3) + 1e-7])


def resumed(monkeypatch, straight: dict, other: dict) -> None:
    """The quick resume check with its runs replaced: last.pt of `straight` and `other`."""
    monkeypatch.setattr(common.Check, "python", lambda self, *args, **kw: "")
    monkeypatch.setattr(quick, "stop_and_resume", lambda c, launch, name, args, total: 9)
    saved = {"straight": straight, "resumed": other}
    monkeypatch.setattr(quick, "load_last", lambda folder: copy.deepcopy(saved[folder.name]))


def checkpoint(step=32, exp_avg=0.1) -> dict:
    state = {0: {"step": torch.tensor(32.0), "exp_avg": torch.full((2,), exp_avg)}}
    optimizer = {"state": state, "param_groups": [{"lr": 1e-3, "params": [0]}]}
    return {"model": run()["state"]["model"], "optimizer": optimizer, "progress": {"step": step}}


def test_quick_resume_fails_on_a_resume_that_differs(monkeypatch, tmp_path):
    resumed(monkeypatch, checkpoint(), checkpoint())
    assert "6 entries bitwise equal" in quick.check_quick_resume(check(tmp_path))
    weights = checkpoint()
    weights["model"]["w"][0, 0] += 1e-6
    lr = checkpoint()
    lr["optimizer"]["param_groups"][0]["lr"] = 2e-3
    broken = {
        "first optimizer.state.0.exp_avg": checkpoint(exp_avg=0.1 + 1e-7),
        "first model.w: max": weights,
        "first optimizer.param_groups.0.lr: 0.001 against 0.002": lr,
        "ended at step 31": checkpoint(step=31),
    }
    for message, other in broken.items():
        resumed(monkeypatch, checkpoint(), other)
        with pytest.raises(common.Failed, match=re.escape(message)):
            quick.check_quick_resume(check(tmp_path))


def test_compare_states_sees_dtypes_shapes_and_missing_entries():
    a = {"model": {"w": torch.ones(2)}}
    assert common.compare_states(a, copy.deepcopy(a), ("model",)) == 1
    for other in ({"w": torch.ones(2).double()}, {"w": torch.ones(1, 2)}, {}, {"v": a["model"]}):
        with pytest.raises(common.Failed, match="differ"):
            common.compare_states(a, {"model": other}, ("model",))


def test_quick_amp_fails_out_of_tolerance_or_not_finite(monkeypatch, tmp_path):
    near = [x + 0.01 for x in LOSSES]
    traces(monkeypatch, {"fp32": run(), "bf16": run(near, val=0.51)}, quick, numerics)
    detail = quick.check_quick_amp(check(tmp_path))
    assert detail.startswith("bf16: final loss 1.0e-02 from fp32's")
    assert detail.endswith("fp16: CUDA only")
    broken = {
        "over 0.05": run([x + 0.1 for x in LOSSES]),
        "not finite": run(bumped(LOSSES, 3, math.inf)),
        "over 0.05 ": run(val=0.6),  # the validation loss alone
    }
    for message, bf16 in broken.items():
        traces(monkeypatch, {"fp32": run(), "bf16": bf16}, quick, numerics)
        with pytest.raises(common.Failed, match=message.strip()):
            quick.check_quick_amp(check(tmp_path))


def test_fp16_must_save_its_grad_scaler_on_cuda(monkeypatch, tmp_path):
    runs = {"fp32": run(), "bf16": run(), "fp16": run(scaler={"scale": 65536.0})}
    traces(monkeypatch, runs, quick, numerics)
    assert "loss scale 65536" in quick.check_quick_amp(check(tmp_path, H200))
    traces(monkeypatch, {**runs, "fp16": run()}, quick, numerics)
    with pytest.raises(common.Failed, match="GradScaler off with train.amp=fp16"):
        quick.check_quick_amp(check(tmp_path, H200))


def ranked(monkeypatch, one: dict, two: dict) -> None:
    """The quick ranks check with its runs replaced: one process and each strategy's 2 ranks."""
    found = {"one": one}
    monkeypatch.setattr(
        ranks, "ranked_run", lambda c, script, name, n, *more: found.get(name, two)
    )


def test_quick_ranks_fails_when_the_ranks_differ_from_one_process(monkeypatch, tmp_path):
    model = run()["state"]["model"]
    one = {"losses": LOSSES, "model": model}
    ranked(monkeypatch, one, copy.deepcopy(one))
    detail = ranks.check_quick_ranks(check(tmp_path))
    assert detail.startswith("2 rank(s) on gloo against one process: ddp step-1 loss 0e+00")
    off = {k: v * (1 + 1e-3) for k, v in model.items()}  # gradients summed, not averaged
    broken = {
        "step 1's loss": {"losses": bumped(LOSSES, 0, 1e-5), "model": model},
        "weights are 1.0e-03 from one process's": {"losses": LOSSES, "model": off},
        "7 steps on 2 ranks, 8 on 1": {"losses": LOSSES[:-1], "model": model},
    }
    for message, two in broken.items():
        ranked(monkeypatch, one, two)
        with pytest.raises(common.Failed, match=re.escape(message)):
            ranks.check_quick_ranks(check(tmp_path))


# ---- choosing the checks: --quick, --group, the estimates ----


def test_quick_groups_and_only_choose_the_checks_one_at_a_time(capsys):
    assert gpu_check.parse(["--quick"]).names == QUICK
    numbers = gpu_check.parse(["--group", "1"]).names
    assert numbers == gpu_check.parse(["--group", "numbers"]).names == registry.group("1")
    assert numbers[0] == "default_run"
    refused = {
        ("--quick", "--only", "smoke"): "--only and --quick both choose the checks",
        ("--group", "9"): "unknown group '9'; the groups: 1 numbers, 2 ranks, 3 compile",
        ("--group", "1", "--quick"): "--quick and --group both choose",
        ("--export-goldens", "g.json"): "goldens hold quick_trace's losses: add --quick",
        ("--quick", "--goldens", "none.json"): "none.json is not a goldens file",
    }
    for argv, message in refused.items():
        with pytest.raises(SystemExit) as exit:
            gpu_check.parse(list(argv))
        assert exit.value.code == 2
        assert message in capsys.readouterr().err


def test_the_groups_hold_the_default_run_each_within_one_call():
    """Each check of the default run is in one group; each group's estimate (its checks'
    expected seconds on one H200 and the script's start) fits a 9-minute call, the quick
    set's 240 s."""
    grouped = [name for i in range(len(registry.GROUPS)) for name in registry.group(str(i + 1))]
    assert sorted(grouped) == sorted(s.name for s in registry.CHECKS if s.default)
    specs = {s.name: s for s in registry.CHECKS}
    for i in range(len(registry.GROUPS)):
        low, high = registry.estimate([specs[n] for n in registry.group(str(i + 1))])
        assert 0 < low < high <= 9 * 60
    assert registry.estimate(registry.QUICK)[1] <= 240
    assert not set(QUICK) & {s.name for s in registry.CHECKS}


def test_list_prints_each_set_with_its_estimate(capsys):
    assert gpu_check.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    titles = [line for line in lines if not line.startswith(" ")]
    assert titles[0].startswith("quick (--quick; make gpu-check-quick): about ")
    assert [t.split(":")[0] for t in titles[1:4]] == [
        f"group {i}, {name} (--group {i})" for i, name in enumerate(registry.GROUPS, 1)
    ]
    low, high = registry.estimate(registry.QUICK)
    assert titles[0].endswith(f"about {low:.0f} to {high:.0f} s on one H200")
    assert titles[4] == "in no group (--only NAME)"
    assert "estimates" in titles[-2] and "until a GPU has run them" in titles[-1] + titles[-2]
    names = [line.split()[0] for line in lines if line.startswith("  ") and line[2] != " "]
    assert sorted(names) == sorted([*QUICK, *(s.name for s in registry.CHECKS)])


def test_the_readme_s_gpu_section_and_the_page_start_with_the_quick_check():
    """Both say what it proves, its estimate as --list prints it (to the nearest 10 s) and the
    keys of its block, before the whole check."""
    low, high = (round(s, -1) for s in registry.estimate(registry.QUICK))
    keys = list(gpu_check.report.block({"checks": []}, CPU, 0.0))
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## GPU check") :].split("\n## ")[0]
    page = (ROOT / "docs" / "gpu-check.md").read_text()
    first = page[page.index("## First: the quick check") : page.index("## Every GPU path")]
    for text in (" ".join(section.split()), " ".join(first.split())):
        assert f"{low:.0f} to {high:.0f} s" in text and "240 s" in text
        assert text.index("gpu-check-quick") < text.index("trace")
        assert all(key in text for key in keys), keys
    assert section.index("make gpu-check-quick") < section.index("make gpu-check`")
    assert page.index("## First: the quick check") < page.index("## Every GPU path")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_check_quick_runs_the_quick_set_into_its_own_report():
    line = subprocess.run(
        ["make", "-s", "-n", "gpu-check-quick", "PYTHON=python"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = shlex.split(line)
    parsed = gpu_check.parse(args[args.index(SCRIPT) + 1 :])
    assert (parsed.names, parsed.json) == (QUICK, "gpu-check-quick.json")


# ---- the block a script greps, and the goldens ----


def test_the_output_ends_with_the_block_a_script_greps(monkeypatch, capsys, tmp_path):
    def measures(c):
        """Notes what the block reads."""
        c.figures.update(peak_vram_mb=812, mfu=0.3417, trainer_vs_loop=0.9871)
        return "measured"

    def skips(c):
        """Skips."""
        raise common.Skipped("not here")

    specs = {f.__name__: registry.Spec(f.__name__, f, ("device",), 30) for f in (measures, skips)}
    monkeypatch.setattr(gpu_check, "SPECS", specs)
    monkeypatch.setattr(gpu_check, "CHECKS", tuple(specs.values()))
    path = tmp_path / "report.json"
    assert gpu_check.main(["--allow-cpu", "--json", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    block = dict(line.split(": ", 1) for line in lines[lines.index("---") + 1 :])
    assert list(block) == [
        *("checks_passed", "seconds", "peak_vram_mb", "mfu_percent", "trainer_vs_loop"),
        *("device", "torch", "cuda"),
    ]
    assert block["checks_passed"] == "2/2"  # measures and no_warnings; a skip is not counted
    assert (block["peak_vram_mb"], block["mfu_percent"], block["trainer_vs_loop"]) == (
        "812",
        "34.2",
        "0.987",
    )
    assert (block["device"], block["torch"], block["cuda"]) == (
        "cpu",
        torch.__version__,
        str(torch.version.cuda),
    )
    assert float(block["seconds"]) > 0
    assert json.loads(path.read_text())["block"] == block


def passed_trace(losses=LOSSES, status="pass") -> list[dict]:
    figures = {"trace_device": list(losses), "trace_settings": ["run.device=cuda"]}
    return [{"check": goldens.SOURCE, "status": status, "figures": figures}]


def test_goldens_are_written_under_their_key_and_compared_on_it_only(tmp_path):
    path = str(tmp_path / "goldens.json")
    assert "quick_trace did not pass" in goldens.save(path, H200, passed_trace(status="FAIL"))
    line = goldens.save(path, H200, passed_trace())
    here = goldens.key(H200)
    assert here == f"NVIDIA H200 | torch {torch.__version__} | CUDA {torch.version.cuda}"
    assert line == f"goldens: 8 losses written to {path} as {here!r}"
    h100 = common.Machine("cuda", 1, (9, 0), "NVIDIA H100 80GB HBM3")
    goldens.save(path, h100, passed_trace(bumped(LOSSES, 0, 0.1)))  # a second key, kept
    stored = goldens.read(path)
    assert stored[here]["losses"] == LOSSES and set(stored) == {here, goldens.key(h100)}

    def judged(machine, results) -> tuple[str, str]:
        row = goldens.compared(path, stored, machine, results)
        return row["status"], row["detail"]

    equal = f"8 losses bitwise equal to the golden of {here!r}"
    assert judged(H200, passed_trace()) == ("pass", equal)
    status, detail = judged(H200, passed_trace(bumped(LOSSES, 5, 1e-5)))
    assert status == "FAIL" and detail.startswith("step 6: ")
    other = common.Machine("cuda", 1, (8, 0), "NVIDIA A100-SXM4-80GB")
    status, detail = judged(other, passed_trace(bumped(LOSSES, 5, 0.3)))
    assert status == "skip" and "not compared" in detail and here in detail  # reported only
    longer = passed_trace()
    longer[0]["figures"]["trace_settings"].append("train.epochs=3")
    status, detail = judged(H200, longer)
    assert status == "skip" and "other settings" in detail
    assert judged(H200, passed_trace(status="FAIL"))[0] == "skip"
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert "is not a goldens file" in goldens.read(str(tmp_path / "bad.json"))


# ---- the quick set for real on the CPU ----


@pytest.mark.slow
def test_the_quick_set_runs_on_cpu_and_its_goldens_compare_on_a_second_run(
    monkeypatch, capsys, tmp_path
):
    """--quick --allow-cpu: every check of the quick set passes at toy sizes (the trace
    compares 1 CPU thread with 2: there is no CUDA to compare), the report and the block say
    so, and --export-goldens writes the trace that --goldens then finds on a second run."""
    monkeypatch.setattr(gpu_check, "find_machine", lambda: "hidden by the test")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    report, stored = tmp_path / "report.json", tmp_path / "goldens.json"
    argv = ["--quick", "--allow-cpu", "--json", str(report), "--export-goldens", str(stored)]
    code = gpu_check.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    found = json.loads(report.read_text())
    assert [r["check"] for r in found["checks"]] == [*QUICK, "no_warnings"]
    assert all(r["status"] == "pass" for r in found["checks"]), out[-4000:]
    assert found["block"]["checks_passed"] == "7/7" and found["block"]["device"] == "cpu"
    assert out.splitlines()[-9] == "---"
    trace = found["checks"][0]["figures"]["trace_device"]
    assert goldens.read(str(stored))[goldens.key(CPU)]["losses"] == trace
    assert "(no GPU: 1 CPU thread against 2)" in found["checks"][0]["detail"]
    argv = ["--only", "quick_trace", "--allow-cpu", "--goldens", str(stored)]
    assert gpu_check.main(argv) == 0
    rows = capsys.readouterr().out
    found = re.search(r"^goldens +pass +0s +(.*)$", rows, re.M)
    assert found and found[1].startswith("16 losses bitwise equal to the golden of 'cpu | torch")
