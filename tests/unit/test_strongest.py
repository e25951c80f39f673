"""The model against the strongest simple answer: the paired difference, its interval and the wins
(stats.headline_difference, scoring.strongest and headline) on values whose answer is known by
hand; the context settings refused in one line; the fallbacks counted in a scored protocol; and
stage 1's clear prior and its start as the composite of its inputs (models/cfdt.py)."""

import math

import numpy as np
import pytest
import torch
import yaml

from vcloud.evaluation.scoring import headline, strongest
from vcloud.evaluation.stats import headline_difference


def test_the_difference_interval_and_wins_by_hand():
    a, b = [10.0, 12.0, 11.0, 13.0], [9.0, 12.5, 10.0, 12.0]  # d = 1, -0.5, 1, 1
    out = headline_difference(a, b, groups=[0, 1, 2, 3])
    assert out["difference"] == pytest.approx(0.625) and out["wins"] == 3
    se = np.std([1, -0.5, 1, 1], ddof=1) / 2  # one sample per location: the clustered SE is the paired one
    half = 3.182446305284263 * se  # t(0.975, 3 dof)
    assert out["ci"] == pytest.approx([0.625 - half, 0.625 + half])
    assert out["ci_level"] == 0.95


def test_one_location_falls_back_to_the_samples():
    out = headline_difference([2.0, 3.0, 4.0], [1.0, 1.0, 1.0], groups=[7, 7, 7])
    assert out["locations"] == 1 and out["se_location"] is None
    half = 4.302652729911275 * (1.0 / math.sqrt(3))  # t(0.975, 2 dof), sd 1
    assert out["ci"] == pytest.approx([2.0 - half, 2.0 + half]) and out["wins"] == 3


def _result(model, baselines):
    result = {
        "location": list(range(len(model))),
        "model": {"mean": {"psnr": np.mean(model)}, "per_sample": {"psnr": model}},
    }
    for name, values in baselines.items():
        result[name] = {"mean": {"psnr": np.mean(values)}, "per_sample": {"psnr": values}}
    return result


def test_the_strongest_is_the_best_mean_and_the_line_says_plainly_who_wins():
    result = _result([20.0, 21.0, 22.0, 23.0], {"weak": [10.0, 10.0, 10.0, 10.0], "strong": [21.0, 22.0, 23.0, 24.5]})
    result["strongest"] = strongest(result, ["weak", "strong"])
    assert result["strongest"]["baseline"] == "strong" and result["strongest"]["wins"] == 0
    line = headline(result)
    assert line.startswith("model - strong (the strongest simple answer): -1.12 dB PSNR [")
    assert line.endswith("wins 0 of 4: the model loses to it")
    result = _result([30.0, 31.0, 32.0, 33.0], {"strong": [21.0, 22.0, 23.0, 24.5]})
    result["strongest"] = strongest(result, ["strong"])
    assert headline(result).endswith("wins 4 of 4: the model beats it")
    result = _result([21.0, 21.0, 24.0, 24.0], {"strong": [22.0, 22.0, 23.0, 23.0]})
    result["strongest"] = strongest(result, ["strong"])
    assert headline(result).endswith("the model does not beat it (the interval holds zero)")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("window_days", 0, "key data.context.window_days: 0 must be at least 1"),
        ("policy", "latest", "data.context.policy"),
    ],
)
def test_a_context_that_cannot_be_met_is_one_line_naming_the_key(tmp_path, key, value, message):
    from vcloud.config import load_model_config
    from vcloud.errors import ConfigError

    data = yaml.safe_load(open("config/models/small.yaml"))
    data["data"]["context"] = {key: value}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_fallbacks_are_recorded_per_sample_and_counted(tiny_store):
    """tiny_store: 4 dates a location; a model of 6 input dates cannot be met: every sample repeats."""
    from vcloud.evaluation.protocols import ReferenceSamples
    from vcloud.evaluation.scoring import score

    samples = ReferenceSamples(tiny_store, dates=6, truths=2, clear_max_cover=1.01, policy="clearest")
    result = score(samples, lambda b: b["x"][:, 0, :-4])
    context = result["context"]
    assert context["fallbacks"] == {"repeated": result["samples"]} and len(context["dates"]) == result["samples"]
    assert all(len(dates) == 6 for dates in context["dates"])


def _batch(prob_target, prob_other, *, t=3, c=4, size=8):
    x = torch.rand(1, t, c + 4, size, size)
    x[:, :, -1] = prob_other
    x[:, 0, -1] = prob_target
    return x


def test_the_clear_prior_averages_the_other_dates_clear_values():
    from vcloud.models.cfdt import clear_composite

    x = _batch(prob_target=0.0, prob_other=0.0)
    x[0, 0, -1, :4] = 1.0  # the target's top half under cloud
    x[0, 2, -1, :, :4] = 0.8  # date 2's left half cloudy (SCL's cloud: 0.8)
    out = clear_composite(x, out_channels=4, clear_only=torch.tensor([0]))[0]
    torch.testing.assert_close(out[:, :, :4], x[0, 1, :4, :, :4])  # only date 1 is clear there
    torch.testing.assert_close(out[:, :, 4:], (x[0, 1, :4, :, 4:] + x[0, 2, :4, :, 4:]) / 2)  # the target: never
    soft = clear_composite(x, out_channels=4)[0]
    assert not torch.allclose(soft[:, :4, :4], x[0, 1, :4, :4, :4])  # the soft prior lets the cloud in


def test_stage1_starts_as_the_composite_of_its_inputs(small):
    import dataclasses

    from vcloud.models.build import build_cfdt
    from vcloud.models.cfdt import clear_composite

    model_cfg = dataclasses.replace(small.stage1.model, wind_scan=False, prior="clear")
    cfg = dataclasses.replace(small, stage1=dataclasses.replace(small.stage1, model=model_cfg))
    model = build_cfdt(cfg).eval()
    model.start_from_composite()
    x = torch.rand(2, 4, 17, 32, 32)
    days, slot = torch.tensor([[-20.0, -5.0, 0.0, 10.0]] * 2), torch.tensor([2, 2])
    with torch.no_grad():
        draft = model(x, days, slot)
    torch.testing.assert_close(draft, clear_composite(x, out_channels=13, clear_only=slot))
