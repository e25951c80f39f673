"""Training batches are normalised once, on their device, in train/stages.py."""

import dataclasses

import torch
from torch.utils.data import default_collate

from vcloud.data.samples import finish_batch
from vcloud.train import stages


def _cfg(small):
    data = dataclasses.replace(small.data, crop=16, clear_target_max_cover=1.01, samples_per_epoch=4, val_samples=2)
    # Normalisation is what is tested here; wind scanning (on in small.yaml) needs a cache file.
    model = dataclasses.replace(small.stage1.model, wind_scan=False)
    stage1 = dataclasses.replace(small.stage1, model=model)
    return dataclasses.replace(small, data=data, stage1=stage1)


def test_stage_sees_normalised_batches_from_raw_loaders(tiny_store, small, one_thread, monkeypatch):
    seen = []
    real = stages.finish_batch
    monkeypatch.setattr(stages, "finish_batch", lambda batch: seen.append(1) or real(batch))
    task = stages.stage1(_cfg(small), train=tiny_store, val=tiny_store)
    assert task.train_set.raw and task.val_set.raw
    raw = default_collate([task.train_set[i] for i in range(2)])
    torch.manual_seed(0)
    loss = task.loss(task.model, raw)
    assert len(seen) == 1  # exactly one normalisation per batch
    torch.manual_seed(0)
    expected = torch.nn.functional.l1_loss(
        stages.cfdt_draft(task.model, finish_batch(raw)), finish_batch(raw)["target"]
    )
    assert torch.equal(loss, expected)
    task.validate(task.model, default_collate([task.val_set[0]]))
    assert len(seen) == 2


def test_stage0_clear_images_are_normalised_once(tiny_store, small, one_thread):
    task = stages.stage0(_cfg(small), train=tiny_store, val=tiny_store)
    batch = default_collate([task.train_set[i] for i in range(2)])
    assert set(batch) == {"target_raw"}
    assert torch.isfinite(task.loss(task.model, batch))


def test_stages_detect_clouds_where_they_train(tiny_store, small, one_thread):
    """On a GPU the loader workers skip LightGBM (finish_batch detects there); on the CPU they run it."""
    cfg = _cfg(small)
    assert stages.detect_on("cuda") == "device" and stages.detect_on("cuda:1") == "device"
    assert stages.detect_on("cpu") == "worker" and stages.detect_on("cuda", raw=False) == "worker"
    on_gpu = stages.stage1(cfg, train=tiny_store, val=tiny_store, device="cuda")
    assert on_gpu.train_set.detect == on_gpu.val_set.detect == "device"
    on_cpu = stages.stage1(cfg, train=tiny_store, val=tiny_store, device="cpu")
    assert on_cpu.train_set.detect == on_cpu.val_set.detect == "worker"
    batch = default_collate([on_gpu.train_set[i] for i in range(2)])
    assert "detect_target" in batch and torch.isfinite(on_gpu.loss(on_gpu.model, batch))
