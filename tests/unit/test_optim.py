"""train/optim.py: AdamW and the warmup-cosine schedule, by hand-computed values."""

import io
import math

import pytest
import torch

from vcloud.config import TrainConfig
from vcloud.train.optim import build_optimizer, build_scheduler, warmup_cosine


def test_warmup_cosine_by_hand():
    f = warmup_cosine(100)  # warmup = 100 // 20 = 5 steps
    assert f(0) == pytest.approx(1 / 5 * 0.5 * (1 + math.cos(0)))  # 0.2
    assert f(3) == pytest.approx(4 / 5 * 0.5 * (1 + math.cos(math.pi * 3 / 100)))
    assert f(4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 100)))  # warm from here
    assert f(50) == pytest.approx(0.5)  # half way down the cosine
    assert f(100) == 0.0 and f(150) == 0.0  # stays at 0 past the end
    assert warmup_cosine(10)(0) == pytest.approx(1.0)  # warmup at least one step
    with pytest.raises(ValueError, match="total_steps: 0"):
        warmup_cosine(0)


def test_schedule_drives_the_optimizer_lr_and_its_state_loads_without_pickle():
    model = torch.nn.Linear(2, 1)
    cfg = TrainConfig(epochs=1, batch_size=1, lr=0.1, weight_decay=0.01)
    optimizer = build_optimizer(model.parameters(), cfg)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.01
    scheduler = build_scheduler(optimizer, total_steps=40)  # warmup 2
    factor = warmup_cosine(40)
    lrs = []
    for _ in range(5):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.1 * factor(s) for s in range(5)])
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["lr_lambdas"] == [None]  # the factor is a plain function: nothing pickled
    again = build_scheduler(build_optimizer(model.parameters(), cfg), total_steps=40)
    again.load_state_dict(state)
    assert again.get_last_lr() == scheduler.get_last_lr()
