"""train.ema_decay: the weights' exponential moving average, updated after each step, is what
validation scores and what best.pt and the tools read; it resumes bitwise."""

from __future__ import annotations

import pytest
import torch
from conftest import stop_after, tiny_run

from {{ cookiecutter.package_name }} import checkpoint, ema, loop
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.tools.inference import load_trained
from {{ cookiecutter.package_name }}.trainer import fit


def test_the_average_is_the_hand_computed_one_over_three_steps(tiny, monkeypatch):
    """decay 0.5: e1 = w1 (the first update copies), e2 = (e1 + w2) / 2, e3 = (e2 + w3) / 2,
    over every floating tensor of the state, BatchNorm's running statistics included."""
    seen = []
    step = loop.train_step

    def recording(run, *args):
        out = step(run, *args)
        seen.append({k: v.detach().clone() for k, v in run.trainee.model.state_dict().items()})
        return out

    monkeypatch.setattr(loop, "train_step", recording)
    fit(load_config(None, [*tiny, "train.ema_decay=0.5", "train.max_steps=3"]))
    assert len(seen) == 3
    expected = dict(seen[0])
    for weights in seen[1:]:
        for key, value in weights.items():
            if value.is_floating_point():
                expected[key] = 0.5 * expected[key] + 0.5 * value
    saved = checkpoint.load(f"{tiny_run(tiny)}/last.pt")
    average = ema.weights(saved["ema"])
    assert average.keys() == expected.keys()
    for key, value in expected.items():
        if value.is_floating_point():
            torch.testing.assert_close(average[key], value, rtol=0, atol=1e-6, msg=key)
    # "model" stays the weights trained (what a resume continues), not the average.
    assert all(torch.equal(saved["model"][k], seen[-1][k]) for k in seen[-1])
    assert not all(torch.equal(average[k], seen[-1][k]) for k in seen[-1])
    # The tools read the average: best.pt (chosen on the averaged model's validation).
    best = load_trained(f"{tiny_run(tiny)}/best.pt").model.state_dict()
    assert all(torch.equal(best[k], average[k]) for k in average)


@pytest.mark.slow
def test_a_stopped_and_resumed_run_averages_as_one_that_never_stopped(tiny, monkeypatch):
    exact = [*tiny, "run.deterministic=true", "train.epochs=2", "train.ema_decay=0.9"]
    straight = fit(load_config(None, [*exact, "run.name=straight"]))
    stopping = stop_after(monkeypatch, straight["step"] // 2 + 1)  # mid-epoch
    fit(load_config(None, [*exact, *stopping, "run.name=split"]))
    monkeypatch.undo()
    resumed = fit(load_config(None, [*exact, "run.name=split", "train.resume=auto"]))
    assert resumed["metrics"] == straight["metrics"]  # validated on the average
    a = checkpoint.load(f"{tiny_run(tiny, 'straight')}/last.pt")["ema"]
    b = checkpoint.load(f"{tiny_run(tiny, 'split')}/last.pt")["ema"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_validated_model_is_the_average(tiny, monkeypatch):
    scored = []
    evaluate = loop.evaluate

    def recording(model, *args, **kwargs):
        scored.append(model)
        return evaluate(model, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", recording)
    result = fit(load_config(None, [*tiny, "train.ema_decay=0.99", "train.epochs=1"]))
    assert scored and all(m is not result["model"] for m in scored)
    assert all(isinstance(m, torch.nn.Module) and not hasattr(m, "n_averaged") for m in scored)


@pytest.mark.parametrize("value", ["1.0", "-0.1", "nan"])
def test_a_decay_outside_0_1_is_refused(tiny, value):
    with pytest.raises(ConfigError, match="train.ema_decay"):
        load_config(None, [*tiny, f"train.ema_decay={value}"])
