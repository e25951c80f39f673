"""Step time and memory of the four stages at the configuration's shapes, and whether the
loader keeps the device fed.

    python bench/bench_gpu.py [--config config/models/full.yaml] [--steps 10] [--warmup 3]
                              [--store STORE.zarr --feed-steps 40]
                              [--predict [--predict-size 256 --predict-dates 30 --predict-batch 8]]
                              [--size 256] [--dates 16] [--batch N]   # smaller shapes for a CPU smoke run

Per stage, on "cuda" when there is one (ROCm maps it) else the CPU, with batches made on the
device in the loader's raw layout (samples.finish_batch turns them into model input, as in
training): the median time of one optimizer step (forward, backward, AdamW; bf16 autocast as
configured), samples/s, the peak device memory (torch.cuda.max_memory_allocated, reset per
stage) and the trainable parameters. Stage 2 adds the time of one few-step
DDIM refinement (validation, evaluation) and stage 3 the teacher's time per pseudo-label
(`sampler_seeds` refinements). Stages 2 and 3 run on untrained weights (the speed and memory do
not depend on them).

With --store: stage 1 trained from that store through the DataLoader with the configuration's
workers and the trainer's loader options, the path a LUMI job takes (on a GPU, s2cloudless on the
clouded target runs on the device, stages.detect_on): samples/s and the fraction
of wall time spent waiting for a batch, next to the step rate on device-made batches. The
loader keeps the device fed when that fraction is small and the two rates agree.

With --predict: `vcloud predict` of stage 2 (apply.run.predict, as bench_predict.py runs it)
on a synthetic ROI written and prepared by vcloud's own tools in --workdir: outputs and km2
per second and the peak device memory.

Every stage also prints the memory estimator's figures for the shapes it was timed at
(runtime/stage_memory.py): the training step's simulated peak next to the measured one, and
its largest phase (stage 3's teacher or validation where larger).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402
from vcloud.config import load_model_config  # noqa: E402
from vcloud.constants import CLOUD_CLASSES, S1_BANDS, S2_BANDS  # noqa: E402
from vcloud.models.autoencoder import Autoencoder  # noqa: E402
from vcloud.models.cfdt import CFDT  # noqa: E402
from vcloud.pipeline import DraftUnderRefiner  # noqa: E402
from vcloud.registry import STAGES
from vcloud.train import optim  # noqa: E402
from vcloud.train.stages import RefinerPipeline, cfdt_draft, install_wind_orders  # noqa: E402

SEED_FIELD_RATE = 14.7  # seeds: full CFDT samples/s on one MI250X GCD


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def raw_batch(batch: int, dates: int, size: int, device: str, generator: torch.Generator) -> dict:
    """A batch in CloudySamples(raw=True)'s layout, made on the device (values in range)."""

    def uniform(*shape):
        return torch.rand(*shape, generator=generator, device=device)

    s2 = (uniform(batch, dates, len(S2_BANDS), size, size) * 6000).to(torch.int16)
    s1 = uniform(batch, dates, len(S1_BANDS), size, size) * 25 - 25
    return {
        "s2_raw": s2,
        "s1_raw": s1,
        "s1_valid": torch.ones(batch, dates, dtype=torch.bool, device=device),  # every date has S1
        "prob_raw": (uniform(batch, dates, size, size) * 250).to(torch.uint8),
        "cloud_opacity": uniform(batch, size, size),
        "cloud_shadow": (uniform(batch, size, size) > 0.9).float(),
        "days": torch.arange(dates, device=device, dtype=torch.float32)[None].repeat(batch, 1) * 5 - 40,
        "target_index": torch.full((batch,), dates // 2, device=device),
        "wind": uniform(batch, 2) * 10 - 5,
        "cloud_class": torch.full((batch,), CLOUD_CLASSES.index("thick"), device=device),
    }


def with_wind(cfg, model: CFDT, size: int) -> CFDT:
    if cfg.stage1.model.wind_scan:
        from vcloud.models.grid import token_grid
        from vcloud.wind.scan_orders import compute_cache

        grid = token_grid(cfg.stage1.model.widths, size, size)
        install_wind_orders(model, compute_cache(grid_h=grid[0], grid_w=grid[1], sectors=cfg.stage1.model.wind_sectors))
    return model


def timed_steps(model, loss_fn, params, train_cfg, make_batch, *, device, steps, warmup) -> dict:
    """Median optimizer step of `loss_fn(model, batch)` with the trainer's step; peak memory."""
    from vcloud.data.samples import finish_batch

    optimizer = optim.build_optimizer(params, train_cfg)
    autocast = torch.autocast("cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16, enabled=train_cfg.bf16)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(warmup + steps):
        batch = make_batch()
        sync(device)
        start = time.perf_counter()
        with autocast:
            loss = loss_fn(model, finish_batch(batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if train_cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, train_cfg.grad_clip)
        optimizer.step()
        sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    out = {
        "step_s_median": round(median, 4),
        "step_s_spread": [round(min(times), 4), round(max(times), 4)],
        "trainable_parameters_m": round(sum(p.numel() for p in params) / 1e6, 2),
    }
    if device == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return out


def timed(fn, *, device, repeats) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def stage_figures(cfg, *, device, size, dates, batch_override, steps, warmup) -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    figures = {}

    def batch_of(stage_cfg):
        b = batch_override or stage_cfg.train.batch_size
        return b, (lambda: raw_batch(b, dates, size, device, generator))

    # stage 0: autoencoder on the clear target image
    b, make = batch_of(cfg.stage0)
    ae = Autoencoder(cfg.stage0.model).to(device)
    figures["stage0"] = {
        "batch": b,
        **timed_steps(
            ae,
            lambda m, x: F.l1_loss(m(x["target"]), x["target"]),
            [p for p in ae.parameters()],
            cfg.stage0.train,
            make,
            device=device,
            steps=steps,
            warmup=warmup,
        ),
    }
    # stage 1: the CFDT draft
    b, make = batch_of(cfg.stage1)
    cfdt = with_wind(cfg, CFDT(cfg.stage1.model), size).to(device)
    figures["stage1"] = {
        "batch": b,
        **timed_steps(
            cfdt,
            lambda m, x: F.l1_loss(cfdt_draft(m, x), x["target"]),
            [p for p in cfdt.parameters()],
            cfg.stage1.train,
            make,
            device=device,
            steps=steps,
            warmup=warmup,
        ),
    }
    # stage 2: the pixel-space refiner around the frozen stage 1
    from vcloud.models.refiner import Refiner

    refiner = Refiner(cfg.stage2.model)
    cfdt.requires_grad_(False)
    m2 = cfg.stage2.model
    pipeline = RefinerPipeline(cfdt, refiner, timesteps=m2.timesteps, schedule=m2.schedule, ensemble=m2.ensemble)
    pipeline = pipeline.to(device)

    def refiner_steps(stage_cfg) -> dict:
        """Stages 2 and 3 train the refiner alike (their own batch size and lr)."""
        pipeline.train()
        b, make = batch_of(stage_cfg)
        return {
            "batch": b,
            **timed_steps(
                pipeline,
                lambda m, x: m(x),
                [p for p in refiner.parameters()],
                stage_cfg.train,
                make,
                device=device,
                steps=steps,
                warmup=warmup,
            ),
        }

    figures["stage2"] = refiner_steps(cfg.stage2)
    pipeline.eval()
    from vcloud.data.samples import finish_batch

    one = finish_batch(raw_batch(1, dates, size, device, generator))
    autocast = torch.autocast(
        "cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16, enabled=cfg.stage2.train.bf16
    )
    steps2 = cfg.stage2.model.sample_steps
    with autocast:
        figures["stage2"]["refine_one_sample_s"] = timed(
            lambda: pipeline.sample(one, steps=steps2, seed=0), device=device, repeats=max(2, steps // 2)
        )
        seeds = cfg.stage3.self_training.sampler_seeds
        figures["stage3"] = {
            "pseudo_label_s_per_sample": timed(
                lambda: [pipeline.sample(one, steps=steps2, seed=s) for s in range(seeds)],
                device=device,
                repeats=max(2, steps // 4),
            ),
            "sampler_seeds": seeds,
        }
        with torch.no_grad():
            figures["stage1"]["predict_one_sample_s"] = timed(
                lambda: cfdt_draft(cfdt, one), device=device, repeats=max(2, steps // 2)
            )
    # Every later stage of the registry: its own batch size and lr on the model it trains (its
    # model_section): a refiner as timed above, or a CFDT (stage 3's student is the stage-1 draft
    # model under the frozen refiner, its loss on what stage3.self_training.loss_on says; its
    # refined validation is the pseudo-label timing's single sample per seed).
    cfdt.requires_grad_(True)
    refiner.requires_grad_(False)
    student = DraftUnderRefiner(
        cfdt,
        refiner,
        timesteps=m2.timesteps,
        schedule=m2.schedule,
        ensemble=m2.ensemble,
        keep_seen_max_prob=cfg.data.keep_seen_max_prob,
        loss_on=cfg.stage3.self_training.loss_on,
        grad_steps=cfg.stage3.self_training.grad_steps,
    ).to(device)
    for stage in STAGES:
        section = getattr(cfg, stage.model_section).model
        if stage.number <= 2:
            continue
        if type(section).__name__ == "RefinerConfig":
            figures.setdefault(stage.name, {}).update(refiner_steps(getattr(cfg, stage.name)))
        elif type(section).__name__ == "CFDTConfig":
            b, make = batch_of(getattr(cfg, stage.name))
            student.train()
            figures.setdefault(stage.name, {}).update(
                {
                    "batch": b,
                    "loss_on": student.loss_on,
                    **timed_steps(
                        student,
                        lambda m, x: F.l1_loss(m(x), x["target"]),
                        [p for p in cfdt.parameters()],
                        getattr(cfg, stage.name).train,
                        make,
                        device=device,
                        steps=steps,
                        warmup=warmup,
                    ),
                }
            )
    for fig in figures.values():
        if "step_s_median" in fig:
            fig["samples_per_s"] = round(fig["batch"] / fig["step_s_median"], 2)
    estimated(cfg, figures, dates=dates, size=size)
    return figures


def estimated(cfg, figures: dict, *, dates: int, size: int) -> None:
    """Each stage's estimate (runtime/stage_memory.py, fake tensors) for the shapes it was timed
    at, beside the measured peak: the training step's simulated peak and total, and the total
    of the stage's largest phase (stage 3's teacher, validation) with its name."""
    from vcloud.runtime.stage_memory import estimate_stage

    for stage in STAGES:
        fig = figures[stage.name]
        result = estimate_stage(cfg, stage.number, dates=dates, size=size, batch=fig["batch"], every=False)
        configured = result["scenarios"]["configured"]
        step = configured["phases"]["step"]
        fig["estimated_peak_gib_configured"] = round(step["peak_bytes"] / 2**30, 2)
        fig["estimated_step_total_gib_configured"] = round(step["total_bytes"] / 2**30, 2)
        fig["estimated_largest_phase"] = result["largest_phase"]
        fig["estimated_largest_total_gib"] = round(configured["total_bytes"] / 2**30, 2)
        fig["estimate_s"] = result["seconds"]
        if "peak_memory_gib" in fig:
            fig["measured_over_estimated_peak"] = round(
                fig["peak_memory_gib"] / max(fig["estimated_peak_gib_configured"], 1e-9), 3
            )


def fed_from_store(cfg, store: Path, *, device, size, steps) -> dict:
    """Stage 1 trained from `store` through the configured DataLoader: rate and data wait."""
    from torch.utils.data import DataLoader

    from vcloud.data.samples import CloudySamples, finish_batch
    from vcloud.train.stages import detect_on
    from vcloud.train.trainer import loader_kwargs

    d = cfg.data
    b = cfg.stage1.train.batch_size
    warmup = max(2, d.num_workers * d.prefetch_factor)  # worker start-up is not throughput
    dataset = CloudySamples(
        store,
        dates=d.input_dates,
        length=(warmup + steps) * b,
        seed=0,
        crop=d.crop,
        clear_max_cover=1.01,
        raw=True,
        detect=detect_on(device),
    )
    loader = DataLoader(dataset, sampler=range(len(dataset)), **loader_kwargs(d, batch_size=b))
    cfdt = with_wind(cfg, CFDT(cfg.stage1.model), size).to(device)
    optimizer = optim.build_optimizer(cfdt.parameters(), cfg.stage1.train)
    autocast = torch.autocast(
        "cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16, enabled=cfg.stage1.train.bf16
    )
    wait = 0.0
    done = 0
    it = iter(loader)
    start = fetch = time.perf_counter()
    for step in range(warmup + steps):
        batch = next(it)
        if step == warmup:
            sync(device)
            start = fetch = time.perf_counter()
            wait = 0.0
        wait += time.perf_counter() - fetch
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        with autocast:
            batch = finish_batch(batch)
            loss = F.l1_loss(cfdt_draft(cfdt, batch), batch["target"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # the trainer reads the loss every step: a sync point
        if step >= warmup:
            done += b
        fetch = time.perf_counter()
    sync(device)
    wall = time.perf_counter() - start
    return {
        "workers": d.num_workers,
        "detect": detect_on(device),  # s2cloudless on the target: in the workers (CPU) or the device
        "batch": b,
        "samples_per_s": round(done / wall, 2),
        "data_wait_fraction": round(wait / wall, 3),
        "store": str(store),
    }


def started(config: Path, *, size: int, dates: int) -> tuple[str, dict]:
    """The device ("cuda" where there is one, ROCm's too, else "cpu"), torch seeded, and the
    result's header: config, device name, torch, shapes."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return device, {"config": str(config), "device": name, "torch": torch.__version__, "size": size, "dates": dates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/models/full.yaml"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--size", type=int, help="patch size (default: data.crop, or 256 for whole patches)")
    parser.add_argument("--dates", type=int, help="input dates (default: data.input_dates)")
    parser.add_argument("--batch", type=int, help="one batch size for every stage (default: each stage's)")
    parser.add_argument("--workers", type=int, help="DataLoader workers for --store (default: data.num_workers)")
    parser.add_argument("--store", type=Path, help="a prepared store: also train stage 1 through the DataLoader")
    parser.add_argument("--feed-steps", type=int, default=40)
    parser.add_argument("--predict", action="store_true", help="also `vcloud predict` on a synthetic ROI (stage 2)")
    parser.add_argument("--predict-patches", type=int, default=4, help="locations of the synthetic ROI")
    parser.add_argument("--predict-dates", type=int, default=30, help="dates per location")
    parser.add_argument("--predict-size", type=int, default=256, help="patch size of the synthetic ROI")
    parser.add_argument("--predict-batch", type=int, default=8, help="vcloud predict --batch-size")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vcloud-bench"), help="where the ROI is made")
    parser.add_argument("--skip-stages", action="store_true", help="only --store and --predict (one phase a call)")
    args = parser.parse_args()
    cfg = load_model_config(args.config)
    size = args.size or cfg.data.crop or 256
    dates = args.dates or cfg.data.input_dates
    data = dataclasses.replace(cfg.data, input_dates=dates, crop=None if size == 256 else size)
    if args.workers is not None:
        data = dataclasses.replace(data, num_workers=args.workers)
    cfg = dataclasses.replace(cfg, data=data)
    device, result = started(args.config, size=size, dates=dates)
    result["seed_field_rate_mi250x_gcd"] = SEED_FIELD_RATE
    if not args.skip_stages:
        result["stages"] = stage_figures(
            cfg, device=device, size=size, dates=dates, batch_override=args.batch, steps=args.steps, warmup=args.warmup
        )
    if args.store:
        result["stage1_fed_from_store"] = fed_from_store(
            cfg, args.store, device=device, size=size, steps=args.feed_steps
        )
    if args.predict:
        result["predict"] = predict_figures(args, device=device)
    emit(result)


def predict_figures(args, *, device: str) -> dict:
    """`vcloud predict` (apply.run.predict, bench_predict.py) of stage 2 on a synthetic ROI
    made and prepared by vcloud's own tools: throughput and the peak device memory."""
    from bench_predict import measure_predict

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    figures = measure_predict(
        workdir=args.workdir,
        patches=args.predict_patches,
        times=args.predict_dates,
        size=args.predict_size,
        config_path=args.config,
        stage=2,
        draws=None,
        batch_size=args.predict_batch,
        device=device,
        min_cover=0.0,
    )
    if device == "cuda":
        figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        figures["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return figures


if __name__ == "__main__":
    main()
