"""Memory of every training stage's step on fake tensors: `vcloud memory --stage N`, the doctor.

Stage 1 is models/memory.py's estimate (per component, each optimisation on and off). The
other stages run what their training runs (train/stages.py) under FakeTensorMode, traced the
same way (models.memory.trace_step), in phases; a stage needs its largest phase:

- stage 0, step: the autoencoder on the clear target, L1, backward.
- stage 2, step: RefinerPipeline.forward (the frozen CFDT's draft without a graph, the
  refiner's x0 loss at one noise level), backward into the refiner.
- stages 2 and 3, validate: the refined prediction as validation makes it (`ensemble` DDIM
  draws of each sample in one batch, autocast as configured, no graph), beside the
  parameters, the last step's gradients and the optimizer states.
- stage 3, teacher: the stage 1 + 2 teacher labelling a batch of stage3.train.batch_size
  with `sampler_seeds` draws each (stages.pseudo_label: float32, no autocast, no graph);
  only the teacher is on the device then (the student is built after it).
- stage 3, step: the student (DraftUnderRefiner: the trainable CFDT under the frozen refiner)
  with stage 3's loss on what `self_training.loss_on` says; with `refined`, the refiner's
  last `grad_steps` sampler steps keep a graph; backward into the CFDT.

Rows of a phase (bytes): parameters (trainable, fp32), frozen parameters (fp32), bf16 weight
copies, gradients and AdamW states (trainable; none while the teacher labels), activations
kept for backward per component, batch and loss, working set (the largest of the transients
at one time); total = their sum, an upper bound of the peak (a replay of the trace). The wind
mixer runs in grid order: fake tensors cannot pick a wind sector (its memory is the same).
What models/memory.py does not model is not modelled here either (allocator, workspaces, the
GPU context, the optimizer step's temporaries); module buffers (< 1 MB) are left out. A stage
fits the device when its largest phase x vcloud.constants.MEMORY_MARGIN does (memory.fits), as
the doctor checks it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vcloud.constants import MEMORY_MARGIN
from vcloud.models import memory
from vcloud.models.memory import GB, GLUE

STAGE_NUMBERS = (0, 1, 2, 3)
FIXED_ROWS = ("parameters", "frozen_parameters", "weight_copies", "gradients", "optimizer_states")
# Which of models.memory.OPTIMISATIONS act on a stage's largest phase: the CFDT's act where a
# CFDT has a graph (stages 1 and 3's step); bf16 wherever autocast runs.
STAGE_OPTIMISATIONS = {0: ("bf16",), 1: memory.OPTIMISATIONS, 2: ("bf16",), 3: memory.OPTIMISATIONS}


class _GridOrder(nn.Module):
    """The CFDT as cfdt_draft calls it, its wind mixer in grid order (no sector on fake tensors)."""

    wind = None  # cfdt_draft then asks for no sector

    def __init__(self, cfdt: nn.Module) -> None:
        super().__init__()
        self.inner = cfdt

    def forward(self, x, days, target_index, sectors=None):
        return self.inner(x, days, target_index)


def _batch(cfg, b: int, t: int, size: int, device, *, stage3: bool = False) -> dict:
    """A normalised training batch (samples.finish_batch's layout) made inside the trace."""
    from vcloud.bands import model_bands
    from vcloud.constants import EXTRA_CHANNELS, S1_BANDS

    bands = len(model_bands(cfg))
    batch = {
        "x": torch.rand(b, t, bands + EXTRA_CHANNELS, size, size, device=device),  # (B, T, C, H, W)
        "days": torch.linspace(-150.0, 150.0, t, device=device).expand(b, t).contiguous(),
        "target_index": torch.full((b,), t // 2, dtype=torch.long, device=device),
        "target": torch.rand(b, bands, size, size, device=device),
        "target_s1": torch.rand(b, len(S1_BANDS), size, size, device=device),
        "target_prob": torch.rand(b, size, size, device=device),
    }
    if stage3:
        batch["pixel_weight"] = torch.ones(b, size, size, device=device)
    return batch


def _count(params) -> int:
    return sum(p.numel() for p in params)


def _phase(model, step, *, bf16, components, trainable, backward, training_state) -> dict:
    """One phase's rows, total and peak. training_state: the trainable parameters' gradients
    and AdamW states are on the device (a training step, validation)."""
    profile = memory.trace_step(model, step, bf16=bf16, components=components, backward=backward)
    trainable_ids = {id(p) for p in trainable}
    n = _count(trainable)
    frozen = _count(p for p in model.parameters() if id(p) not in trainable_ids)
    kept = dict(profile["kept_by_component"])
    rows = {
        "parameters": 4 * n,
        "frozen_parameters": 4 * frozen,
        "weight_copies": kept.pop("weight_copies", 0),
        "gradients": 4 * n if training_state else 0,
        "optimizer_states": 8 * n if training_state else 0,
    }
    glue = sum(kept.pop(name) for name in list(kept) if name in (GLUE, "other", "backward"))
    rows.update(kept)
    rows[GLUE] = glue
    rows["working_set"] = max(profile["forward_working_set_bytes"], profile["backward_working_set_bytes"])
    total = sum(rows.values())
    # backward's gradients are in the trace's live bytes; a phase without backward holds the
    # last step's (validation) or none (the teacher)
    resident = rows["parameters"] + rows["frozen_parameters"] + rows["optimizer_states"]
    peak = resident + profile["peak_live_bytes"] + (0 if backward else rows["gradients"])
    return {
        "bf16": bf16,
        "bytes": {k: int(v) for k, v in rows.items()},
        "total_bytes": int(total),
        "total_gb": round(total / GB, 2),
        "peak_bytes": int(peak),
        "peak_gb": round(peak / GB, 2),
        "saved_for_backward_bytes": profile["saved_for_backward_bytes"],
        "forward_working_set_bytes": profile["forward_working_set_bytes"],
        "backward_working_set_bytes": profile["backward_working_set_bytes"],
    }


def _trained_refiner(refiner):
    """A trained refiner runs its sampler passes (the untrained one's zero head skips them;
    fake weights cannot say which they are)."""
    refiner.predicts_zero = lambda: False
    return refiner


def _levels_of(cfg):
    """The sampler's noise levels, worked out on real tensors (fake ones hold no values)."""
    from vcloud.models.refiner import DiffusionSchedule

    m = cfg.stage2.model
    levels = {m.sample_steps: DiffusionSchedule(m.timesteps, kind=m.schedule).sampling_timesteps(m.sample_steps)}
    return levels.__getitem__


def _stage_phases(cfg, stage: int, *, dates: int, size: int, batch: int, optimisations) -> dict[str, dict]:
    """{phase: rows} of stage 0, 2 or 3 under FakeTensorMode (the CFDT with `optimisations`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vcloud.models.build import build_autoencoder, build_cfdt, build_refiner
    from vcloud.pipeline import DraftUnderRefiner, RefinerPipeline, sampling_settings

    levels = _levels_of(cfg)

    def pipeline_of(kind, *args, **kwargs):
        pipeline = kind(*args, **kwargs, **sampling_settings(cfg))
        pipeline.schedule.sampling_timesteps = levels
        return pipeline

    bf16 = getattr(cfg, f"stage{stage}").train.bf16
    phases: dict[str, dict] = {}
    with FakeTensorMode():
        device = torch.device("cpu")
        if stage == 0:
            model = build_autoencoder(cfg)

            def step():
                b = {"target": torch.rand(batch, model.in_channels, size, size, device=device)}
                return F.l1_loss(model(b["target"]), b["target"]), b

            parts = {model.encoder: "encoder", model.decoder: "decoder"}
            return {
                "step": _phase(
                    model,
                    step,
                    bf16=bf16,
                    components=parts,
                    trainable=list(model.parameters()),
                    backward=True,
                    training_state=True,
                )
            }
        cfdt = build_cfdt(cfg)
        cfdt.optimisations = optimisations
        refiner = _trained_refiner(build_refiner(cfg))
        steps = cfg.stage2.model.sample_steps
        drafted = {cfdt: "draft_model", refiner: "refiner"}

        def validation(pipeline, trainable):
            def sample():
                b = _batch(cfg, batch, dates, size, device)
                return pipeline.sample(b, steps=steps, seed=0), b

            pipeline.eval()
            return _phase(
                pipeline,
                sample,
                bf16=bf16,
                components=drafted,
                trainable=trainable,
                backward=False,
                training_state=True,
            )

        if stage == 2:
            pipeline = pipeline_of(RefinerPipeline, _GridOrder(cfdt), refiner)
            cfdt.requires_grad_(False)

            def step():
                b = _batch(cfg, batch, dates, size, device)
                return pipeline(b), b

            pipeline.train()
            trainable = list(refiner.parameters())
            phases["step"] = _phase(
                pipeline, step, bf16=bf16, components=drafted, trainable=trainable, backward=True, training_state=True
            )
            phases["validate"] = validation(pipeline, trainable)
            return phases
        assert stage == 3, f"no phases for stage {stage}"
        st = cfg.stage3.self_training
        cfdt.requires_grad_(False)
        refiner.requires_grad_(False)
        teacher = pipeline_of(RefinerPipeline, _GridOrder(cfdt), refiner).eval()

        def label():
            b = _batch(cfg, batch, dates, size, device)
            return teacher.samples(b, steps=steps, seeds=list(range(st.sampler_seeds))), b

        phases["teacher"] = _phase(
            teacher, label, bf16=False, components=drafted, trainable=[], backward=False, training_state=False
        )
        cfdt.requires_grad_(True)
        student = pipeline_of(
            DraftUnderRefiner, _GridOrder(cfdt), refiner, loss_on=st.loss_on, grad_steps=st.grad_steps
        )

        def step():  # stage 3's loss (train/stages.py stage3): L1 over the pixels each truth holds for
            b = _batch(cfg, batch, dates, size, device, stage3=True)
            error = (student(b).float() - b["target"].float()).abs().mean(dim=1)  # (B, H, W)
            weight = b["pixel_weight"].to(error.dtype)
            return (error * weight).sum() / weight.sum().clamp_min(1.0), b

        student.train()
        trainable = list(cfdt.parameters())
        parts = {**memory.cfdt_components(cfdt), refiner: "refiner"}
        phases["step"] = _phase(
            student, step, bf16=bf16, components=parts, trainable=trainable, backward=True, training_state=True
        )
        phases["validate"] = validation(student, trainable)
    return phases


def _largest(phases: dict[str, dict]) -> str:
    return max(phases, key=lambda name: phases[name]["total_bytes"])


def estimate_stage(
    cfg, stage: int, *, dates: int | None = None, size: int = 256, batch: int | None = None, every: bool = True
) -> dict:
    """Estimated memory of stage `stage`'s training, its phases, configured and (every: True)
    with every optimisation on. dates, batch default to the configuration's (data.input_dates,
    stage<n>.train.batch_size); size: the patch side (256: a whole patch, as validation and
    the teacher take it even where training crops). Stage 1: models.memory.estimate."""
    assert stage in STAGE_NUMBERS, f"stage must be one of {STAGE_NUMBERS}, got {stage}"
    section = getattr(cfg, f"stage{stage}")
    dates = dates or cfg.data.input_dates
    batch = batch or section.train.batch_size
    started = time.perf_counter()
    if stage == 1 and every:
        result = memory.estimate(cfg, dates=dates, size=size, batch=batch)
        return {**result, "stage": 1, "gb_configured": result["cfdt_gb_configured"], "largest_phase": "step"}
    if stage == 1:
        configured = memory.estimate_configured(cfg, dates=dates, size=size, batch=batch)
        return {
            "config": cfg.name,
            "stage": 1,
            "dates": dates,
            "size": size,
            "batch": batch,
            "gb_configured": configured["total_gb"],
            "largest_phase": "step",
            "device_gb": memory.DEVICE_GB,
            "memory_margin": MEMORY_MARGIN,
            "scenarios": {"configured": {**configured, "largest_phase": "step", "phases": {"step": configured}}},
            "seconds": round(time.perf_counter() - started, 2),
        }
    configured = (section.train.bf16, cfg.stage1.model.optimisations)
    settings = {"configured": configured}
    if every:
        settings["all"] = memory.scenarios(cfg.stage1)["all"]
    scenarios = {}
    for name, (bf16, optimisations) in settings.items():
        model_set = _with_bf16(cfg, stage, bf16)
        phases = _stage_phases(model_set, stage, dates=dates, size=size, batch=batch, optimisations=optimisations)
        largest = _largest(phases)
        scenarios[name] = {
            "bf16": bf16,
            "optimisations": dataclasses.asdict(optimisations),
            "largest_phase": largest,
            "total_bytes": phases[largest]["total_bytes"],
            "total_gb": phases[largest]["total_gb"],
            "phases": phases,
        }
    configured = scenarios["configured"]
    return {
        "config": cfg.name,
        "stage": stage,
        "dates": dates,
        "size": size,
        "batch": batch,
        "gb_configured": configured["total_gb"],
        "largest_phase": configured["largest_phase"],
        "device_gb": memory.DEVICE_GB,
        "memory_margin": MEMORY_MARGIN,
        "scenarios": scenarios,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _with_bf16(cfg, stage: int, bf16: bool):
    name = f"stage{stage}"
    section = getattr(cfg, name)
    return dataclasses.replace(
        cfg, **{name: dataclasses.replace(section, train=dataclasses.replace(section.train, bf16=bf16))}
    )


_PHASES = {
    "step": "training step",
    "validate": "validation (ensemble draws)",
    "teacher": "teacher's pseudo-labels",
}


def format_stage_table(result: dict) -> str:
    """Markdown: every row of every phase, configured (and with every optimisation on)."""
    names = [n for n in ("configured", "all") if n in result["scenarios"]]
    configured = result["scenarios"]["configured"]
    lines = [
        f"Memory of stage {result['stage']}'s training: config {result['config']}, T={result['dates']} dates, "
        f"{result['size']}x{result['size']}, batch {result['batch']} (GB = 1e9 bytes; device "
        f"{result['device_gb']:.0f} GB)",
        "",
    ]
    for phase in configured["phases"]:
        header = " | ".join(("Configured", "All optimisations")[: len(names)])
        lines += [f"**{_PHASES[phase]}**", "", f"| Row | {header} |", "|-----|" + "---:|" * len(names)]
        rows = configured["phases"][phase]["bytes"]
        for row in rows:
            cells = [result["scenarios"][n]["phases"][phase]["bytes"].get(row, 0) / GB for n in names]
            lines.append(f"| {row.replace('_', ' ')} | " + " | ".join(f"{c:.2f} GB" for c in cells) + " |")
        for key, label in (("total_gb", "**Total**"), ("peak_gb", "Simulated peak")):
            cells = [result["scenarios"][n]["phases"][phase][key] for n in names]
            lines.append(f"| {label} | " + " | ".join(f"{c:.2f} GB" for c in cells) + " |")
        lines.append("")
    verdict = "fits" if memory.fits(configured["total_gb"], result["device_gb"]) else "does NOT fit"
    lines.append(
        f"Configured: {configured['total_gb']:.2f} GB ({_PHASES[configured['largest_phase']]}), {verdict} in "
        f"{memory.margin_words(result['device_gb'])} (as `vcloud doctor` checks it on the partition's GPU). "
        f"Estimated in {result['seconds']:.1f} s."
    )
    return "\n".join(lines)


def main(config_path: Path, as_json: bool, *, stage: int = 1, leave_one_out: bool = False) -> str:
    """Text for `vcloud memory --config FILE [--stage N] [--json]`."""
    from vcloud.config import load_model_config

    if stage == 1:
        return memory.main(config_path, as_json, leave_one_out=leave_one_out)
    result = estimate_stage(load_model_config(Path(config_path)), stage)
    return json.dumps(result, indent=2) if as_json else format_stage_table(result)
