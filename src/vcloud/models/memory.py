"""Memory of one stage-1 (CFDT) training step, per component, without running the model.

How. The CFDT is built and run under FakeTensorMode: fake CPU tensors carry shapes, dtypes
and storage sizes but no data, so the full model at T=16, 256x256 costs seconds and no
memory. bf16 runs under torch.autocast("cpu", bfloat16), which applies to fake CPU tensors
(the meta device has no autocast). CPU and CUDA autocast differ for norms, but the models'
norms keep the activation dtype (vcloud.models.blocks), so both store the same dtypes. A
TorchDispatchMode records every storage that an ATen op allocates and, through a weakref
finalizer, its release; the component running at the time (forward hooks on the change
gate, encoder, TMT, wind mixing and decoder) owns it. One step is forward + L1 loss inside
the autocast region, then backward, as in the trainer.

Rows (bytes; GB = 1e9 bytes):
  parameters        4 per parameter (fp32 master weights, also under bf16 autocast)
  gradients         4 per parameter (fp32)
  optimizer states  8 per parameter (AdamW exp_avg and exp_avg_sq, fp32)
  weight copies     the bf16 copies of the weights that autocast caches for the step
  <component>       activations: storages the component allocated in the forward pass that
                    are still alive when backward starts, i.e. what the step keeps for
                    backward (checkpoint inputs included, the checkpointed insides not)
  batch and loss    the input batch, the target, the loss terms and the glue between parts
  working set       peak of everything else alive at one time: forward temporaries, and in
                    backward the activation gradients and recomputed checkpoint segments
  total             the sum of the rows, an upper bound of `peak_bytes` (a replay of the
                    allocation trace: backward frees activations as it makes gradients; the
                    forward pass runs beside the previous step's gradients, which the trainer
                    sets to None only before backward)

`saved_for_backward_bytes` is measured separately with saved_tensors_hooks (unique
storages, parameters excluded), the same way a test measures a real CPU step.

Not modelled: allocator caching and fragmentation (set expandable_segments), convolution
workspaces (MIOpen/cuDNN), the optimizer step's temporaries (below the backward peak), the
DataLoader's pinned buffers and the GPU context (~0.5 GB). For them a step fits the device when
its total x vcloud.constants.MEMORY_MARGIN does (`fits`): what `vcloud doctor` checks too.
"""

from __future__ import annotations

import dataclasses
import json
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vcloud.constants import MEMORY_MARGIN

GB = 1e9
DEVICE_GB = 64.0  # one MI250X GCD
OPTIMISATIONS = ("bf16", "grad_checkpoint", "gate_resolution", "target_only_pyramid", "gate_chunk")
DEFAULT_GATE_RESOLUTION = 64  # values switched on where the configuration leaves them off
DEFAULT_GATE_CHUNK = 64
COMPONENTS = {  # CFDT attribute -> component name
    "gate": "change_gate",
    "encoder": "encoder",
    "tmt": "tmt",
    "wind": "tmt",
    "decoder": "decoder",
}
GLUE = "batch_and_loss"
REQUIRED = ("configured", "all", "none")
DEFAULT_SCENARIOS = (*REQUIRED, *(f"only_{name}" for name in OPTIMISATIONS))
LEAVE_ONE_OUT = tuple(f"without_{name}" for name in OPTIMISATIONS)
ROWS = (
    "parameters",
    "weight_copies",
    "gradients",
    "optimizer_states",
    "encoder",
    "change_gate",
    "tmt",
    "decoder",
    GLUE,
    "working_set",
)


def fits(gb: float, device_gb: float) -> bool:
    """An estimate fits the device with the margin for what it leaves out (the doctor's test)."""
    return gb * MEMORY_MARGIN <= device_gb


def largest_batch(*, fixed_bytes: float, per_sample_bytes: float, device_gb: float) -> int:
    """The largest batch whose total `fits` the device: activations grow linearly with the batch,
    parameters, gradients, optimizer states and weight copies (`fixed_bytes`) do not."""
    return max(int((device_gb * GB / MEMORY_MARGIN - fixed_bytes) // max(per_sample_bytes, 1.0)), 0)


def margin_words(device_gb: float) -> str:
    """What `fits` holds an estimate against, as the doctor words it: "64 GB with the 20% margin"."""
    return f"{device_gb:g} GB with the {MEMORY_MARGIN - 1:.0%} margin"


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parameter_counts(cfg) -> dict[str, int]:
    """Parameter counts of the three stage models, built on the meta device (no memory)."""
    from vcloud.models.build import build_autoencoder, build_cfdt, build_refiner

    with torch.device("meta"):
        return {
            "autoencoder_params": count_parameters(build_autoencoder(cfg)),
            "cfdt_params": count_parameters(build_cfdt(cfg)),
            "refiner_params": count_parameters(build_refiner(cfg)),
        }


def section_parameters(cfg, section: str) -> int:
    """Parameters of the model of config section `section` (`<section>.model`; a stage trains
    the one its registry entry's model_section names), chosen by its config type, on meta."""
    from vcloud.models.build import build_autoencoder, build_cfdt, build_refiner

    model_cfg = getattr(cfg, section).model
    models = {"AutoencoderConfig": build_autoencoder, "CFDTConfig": build_cfdt, "RefinerConfig": build_refiner}
    kind = type(model_cfg).__name__
    assert kind in models, f"{section}.model: no model for a {kind}"
    with torch.device("meta"):
        return count_parameters(models[kind](cfg, model_cfg))


class _AllocationTrace:
    """TorchDispatchMode recording storage allocations and releases, tagged by component."""

    def __init__(self, existing: list[torch.Tensor], parameters: list[torch.Tensor]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        trace = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is not trace.device_query:
                    trace.record(func, args, out)
                return out

        self.mode = Mode()
        self.existing = {id(t.untyped_storage()) for t in existing}  # not allocated by the step
        self.parameters = {id(p.untyped_storage()) for p in parameters}
        self.live: dict[int, int] = {}  # id(storage) -> key
        self.events: list[tuple] = []  # ("alloc", key, nbytes, component, dtype) | ("free", key) | ("mark",)
        self.component = ["other"]
        self._next = 0
        self._cast = torch.ops.aten._to_copy.default
        try:  # tensor.device on a fake tensor comes through as an op; nothing to record
            self.device_query = torch.ops.prim.device.default
        except (AttributeError, RuntimeError):
            self.device_query = None

    def record(self, func, args, out) -> None:
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        component = self.component[-1]
        if func is self._cast and isinstance(args[0], torch.Tensor):
            if id(args[0].untyped_storage()) in self.parameters:
                component = "weight_copies"
        for t in outputs:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            sid = id(storage)
            if sid in self.live or sid in self.existing:
                continue
            key = self._next
            self._next += 1
            self.live[sid] = key
            self.events.append(("alloc", key, storage.nbytes(), component, t.dtype))
            weakref.finalize(storage, self._release, sid, key)

    def _release(self, sid: int, key: int) -> None:
        if self.live.get(sid) == key:
            del self.live[sid]
        self.events.append(("free", key))

    def mark(self) -> None:
        self.events.append(("mark",))

    def key_of(self, t: torch.Tensor) -> int | None:
        return self.live.get(id(t.untyped_storage()))


def _push(stack: list[str], name: str) -> None:
    stack.append(name)


def _pop(stack: list[str]) -> None:  # a forward hook's return value would replace the output
    stack.pop()


def profile_step(
    model: nn.Module,
    x: torch.Tensor | None = None,
    days: torch.Tensor | None = None,
    target_index: torch.Tensor | None = None,
    target: torch.Tensor | None = None,
    *,
    bf16: bool,
    shape: tuple[int, int, int] | None = None,
) -> dict:
    """Trace one training step of a CFDT (forward, L1 loss, backward) and account its memory.

    Works on real tensors and under FakeTensorMode. Give the batch, or `shape` = (B, T, S)
    to have a batch of that shape made inside the trace (so it is counted as the batch).
    `model.optimisations` says which optimisations are on; bf16 means autocast.
    """
    given = [t for t in (x, days, target_index, target) if t is not None]
    device = next(model.parameters()).device

    def step():
        batch = (x, days, target_index, target)
        if shape is not None:
            b, t, size = shape
            batch = (
                torch.rand(b, t, model.in_channels, size, size, device=device),
                torch.linspace(-150.0, 150.0, t, device=device).expand(b, t).contiguous(),
                torch.full((b,), t // 2, dtype=torch.long, device=device),
                torch.rand(b, model.out_channels, size, size, device=device),
            )
        draft = model(*batch[:3])
        return F.l1_loss(draft.float(), batch[3]), batch

    return trace_step(model, step, bf16=bf16, components=cfdt_components(model), given=given)


def cfdt_components(model: nn.Module) -> dict[nn.Module, str]:
    """The CFDT's parts (COMPONENTS) that own what they allocate: module -> component name."""
    return {getattr(model, a): name for a, name in COMPONENTS.items() if getattr(model, a, None) is not None}


def trace_step(
    model: nn.Module,
    step,
    *,
    bf16: bool,
    components: dict[nn.Module, str],
    given: list[torch.Tensor] = (),
    backward: bool = True,
) -> dict:
    """Trace `step()` on `model` and account its memory (see `_account`).

    `step()` runs inside autocast (bf16) and returns (loss, batch): the batch is held until
    the step ends, as the trainer holds it; what it makes is counted as batch and loss. With
    `backward`, loss.backward() follows and the trainable parameters' gradients are counted;
    without (a phase that only samples), the trace ends where `step` returns. `components`:
    modules whose forward owns what it allocates (others: batch and loss); `given`: tensors
    made before the step (not counted).
    """
    existing = [*model.parameters(), *model.buffers(), *given]  # not allocated by the step
    params = {id(p.untyped_storage()) for p in model.parameters()}
    for p in model.parameters():
        p.grad = None
    trace = _AllocationTrace(existing, list(model.parameters()))
    saved: dict[int, tuple[int, str, torch.dtype]] = {}  # id(storage) -> (bytes, component, dtype)

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if id(storage) not in params and id(storage) not in saved:
            saved[id(storage)] = (storage.nbytes(), trace.component[-1], t.dtype)
        return t

    handles = []
    for module, name in components.items():
        handles.append(module.register_forward_pre_hook(lambda m, a, name=name: _push(trace.component, name)))
        handles.append(module.register_forward_hook(lambda m, a, o: _pop(trace.component)))
    device = next(model.parameters()).device
    try:
        with trace.mode:
            trace.component.append(GLUE)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss, batch = step()
            trace.mark()
            if backward:
                trace.component.append("backward")
                loss.backward()
            del loss, batch
            grads = {trace.key_of(p.grad) for p in model.parameters() if p.grad is not None}
    finally:
        for handle in handles:
            handle.remove()
    result = _account(list(trace.events), grads - {None})
    by_component: dict[str, int] = {}
    for nbytes, component, _ in saved.values():
        by_component[component] = by_component.get(component, 0) + nbytes
    result["saved_for_backward_bytes"] = sum(by_component.values())
    result["saved_for_backward_by_component"] = by_component
    result["saved_for_backward_bf16_fraction"] = sum(n for n, _, d in saved.values() if d == torch.bfloat16) / max(
        1, result["saved_for_backward_bytes"]
    )
    return result


def _account(events: list[tuple], grads: set[int]) -> dict:
    """Replay the trace: activations kept for backward by component, working sets, peak."""
    boundary = next(i for i, e in enumerate(events) if e[0] == "mark")
    info: dict[int, tuple[int, str, torch.dtype]] = {}  # key -> (bytes, component, dtype)
    kept = set()
    for event in events[:boundary]:
        if event[0] == "alloc":
            info[event[1]] = event[2:]
            kept.add(event[1])
        elif event[0] == "free":
            kept.discard(event[1])
    kept_by_component: dict[str, int] = {}
    kept_bf16 = kept_total = 0
    for key in kept:
        nbytes, component, dtype = info[key]
        kept_by_component[component] = kept_by_component.get(component, 0) + nbytes
        if component not in ("weight_copies", GLUE):  # the model's activations
            kept_total += nbytes
            kept_bf16 += nbytes if dtype == torch.bfloat16 else 0

    live = working = forward_peak = backward_peak = forward_ws = backward_ws = 0
    for index, event in enumerate(events):
        if event[0] == "mark":
            continue
        if event[0] == "alloc":
            key, nbytes = event[1], event[2]
            info.setdefault(key, event[2:])
            transient = key not in kept and key not in grads
            live += nbytes
            working += nbytes if transient else 0
        else:
            key = event[1]
            nbytes = info[key][0]
            live -= nbytes
            working -= nbytes if key not in kept and key not in grads else 0
        if index < boundary:
            forward_peak = max(forward_peak, live)
            forward_ws = max(forward_ws, working)
        else:
            backward_peak = max(backward_peak, live)
            backward_ws = max(backward_ws, working)
    # The trainer sets the gradients to None after the forward pass, just before backward: in
    # a step after the first, the forward pass runs beside the previous step's gradients.
    gradient_bytes = sum(info[k][0] for k in grads)
    return {
        "kept_by_component": kept_by_component,
        "kept_bf16_fraction": kept_bf16 / max(1, kept_total),
        "gradient_bytes_traced": gradient_bytes,
        "forward_working_set_bytes": forward_ws,
        "backward_working_set_bytes": backward_ws,
        "peak_live_bytes": max(forward_peak + gradient_bytes, backward_peak),
    }


def scenarios(stage1) -> dict[str, tuple[bool, object]]:
    """name -> (bf16, Optimisations): configured, all, none, each alone, all but each."""
    from vcloud.config import Optimisations

    configured = stage1.model.optimisations
    on = {
        "grad_checkpoint": True,
        "gate_resolution": configured.gate_resolution or DEFAULT_GATE_RESOLUTION,
        "target_only_pyramid": True,
        "gate_chunk": configured.gate_chunk or DEFAULT_GATE_CHUNK,
    }
    off = {
        "grad_checkpoint": False,
        "gate_resolution": None,
        "target_only_pyramid": False,
        "gate_chunk": None,
    }

    def make(enabled: set[str]) -> tuple[bool, Optimisations]:
        return "bf16" in enabled, Optimisations(**{k: on[k] if k in enabled else off[k] for k in on})

    every = set(OPTIMISATIONS)
    result = {
        "configured": (stage1.train.bf16, configured),
        "all": make(every),
        "none": make(set()),
    }
    for name in OPTIMISATIONS:
        result[f"only_{name}"] = make({name})
        result[f"without_{name}"] = make(every - {name})
    return result


def estimate(
    cfg,
    *,
    dates: int | None = None,
    size: int = 256,
    batch: int | None = None,
    names: tuple[str, ...] | None = None,
) -> dict:
    """Estimated memory of one stage-1 training step per component and optimisation setting.

    dates, batch default to the configuration's (data.input_dates, stage1.train.batch_size).
    `names` picks scenarios (see `scenarios`; default DEFAULT_SCENARIOS, which leaves out
    the slower "without_*" ones); configured, all and none are always estimated.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vcloud.models.build import build_cfdt
    from vcloud.models.grid import token_stride

    started = time.perf_counter()
    dates = dates or cfg.data.input_dates
    batch = batch or cfg.stage1.train.batch_size
    stride = token_stride(cfg.stage1.model.widths)
    assert size % stride == 0, f"size must be a multiple of {stride} (the CFDT's coarsest level), got {size}"
    counts = parameter_counts(cfg)
    n = counts["cfdt_params"]
    fixed = {"parameters": 4 * n, "gradients": 4 * n, "optimizer_states": 8 * n}
    results: dict[str, dict] = {}
    done: dict[tuple, dict] = {}
    with FakeTensorMode():
        model = build_cfdt(cfg)
        for name, (bf16, optimisations) in scenarios(cfg.stage1).items():
            if name not in (*(DEFAULT_SCENARIOS if names is None else names), *REQUIRED):
                continue
            key = (bf16, optimisations)
            if key not in done:
                model.optimisations = optimisations
                done[key] = profile_step(model, bf16=bf16, shape=(batch, dates, size))
            results[name] = _scenario(fixed, bf16, optimisations, done[key])
    every = results["all"]
    fixed_all = sum(fixed.values()) + every["bytes"]["weight_copies"]
    per_sample = (every["total_bytes"] - fixed_all) / batch
    return {
        "config": cfg.name,
        "dates": dates,
        "size": size,
        "batch": batch,
        "date_pairs": batch * dates * (dates - 1),
        **counts,
        "cfdt_gb_all_optimisations": results["all"]["total_gb"],
        "cfdt_gb_no_optimisations": results["none"]["total_gb"],
        "cfdt_gb_configured": results["configured"]["total_gb"],
        "device_gb": DEVICE_GB,
        "memory_margin": MEMORY_MARGIN,
        "max_batch_all_optimisations": largest_batch(
            fixed_bytes=fixed_all, per_sample_bytes=per_sample, device_gb=DEVICE_GB
        ),
        "scenarios": results,
        "seconds": round(time.perf_counter() - started, 2),
    }


def estimate_configured(cfg, *, dates: int | None = None, size: int = 256, batch: int | None = None) -> dict:
    """`estimate`'s configured scenario alone (one trace, not three): what the doctor checks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from vcloud.models.build import build_cfdt

    dates = dates or cfg.data.input_dates
    batch = batch or cfg.stage1.train.batch_size
    n = parameter_counts(cfg)["cfdt_params"]
    bf16, optimisations = scenarios(cfg.stage1)["configured"]
    with FakeTensorMode():
        model = build_cfdt(cfg)
        model.optimisations = optimisations
        profile = profile_step(model, bf16=bf16, shape=(batch, dates, size))
    fixed = {"parameters": 4 * n, "gradients": 4 * n, "optimizer_states": 8 * n}
    return _scenario(fixed, bf16, optimisations, profile)


def _scenario(fixed: dict[str, int], bf16: bool, optimisations, profile: dict) -> dict:
    kept = profile["kept_by_component"]
    rows = dict(fixed)
    rows["weight_copies"] = kept.get("weight_copies", 0)
    for component in ("encoder", "change_gate", "tmt", "decoder"):
        rows[component] = kept.get(component, 0)
    rows[GLUE] = sum(v for k, v in kept.items() if k not in rows)
    rows["working_set"] = max(profile["forward_working_set_bytes"], profile["backward_working_set_bytes"])
    rows = {row: int(rows[row]) for row in ROWS}
    total = sum(rows.values())
    peak = fixed["parameters"] + fixed["optimizer_states"] + profile["peak_live_bytes"]
    return {
        "bf16": bf16,
        "optimisations": dataclasses.asdict(optimisations),
        "bytes": rows,
        "total_bytes": total,
        "total_gb": round(total / GB, 2),
        "peak_bytes": peak,
        "peak_gb": round(peak / GB, 2),
        "activation_bf16_fraction": round(profile["kept_bf16_fraction"], 4),
        "forward_working_set_bytes": profile["forward_working_set_bytes"],
        "backward_working_set_bytes": profile["backward_working_set_bytes"],
        "saved_for_backward_bytes": profile["saved_for_backward_bytes"],
        "saved_for_backward_bf16_fraction": round(profile["saved_for_backward_bf16_fraction"], 4),
    }


_LABELS = {
    "parameters": ("Parameters ({params})", "stay fp32"),
    "weight_copies": ("bf16 weight copies", "bf16 autocast cache"),
    "gradients": ("Gradients", "stay fp32"),
    "optimizer_states": ("Optimizer states (AdamW)", "stay fp32"),
    "encoder": (
        "Encoder activations ({dates} dates)",
        "grad checkpoint + target-only pyramid, bf16",
    ),
    "change_gate": ("Change gate ({pairs} pairs)", "reduced resolution + grad checkpoint, bf16"),
    "tmt": ("TMT activations", "bf16"),
    "decoder": ("Draft decoder", "bf16"),
    GLUE: ("Batch, loss, glue", "inputs stay fp32"),
    "working_set": ("Working set (temporaries, recompute)", "gate chunking, target-only pyramid"),
}


def format_table(result: dict) -> str:
    """Markdown tables: per component (none vs all) and each optimisation's effect on the total."""
    none, every = result["scenarios"]["none"], result["scenarios"]["all"]
    names = {
        "params": f"{result['cfdt_params'] / 1e6:.1f}M",
        "dates": result["dates"],
        "pairs": result["date_pairs"],
    }
    lines = [
        f"Memory budget of one stage-1 (CFDT) training step: config {result['config']}, "
        f"T={result['dates']} dates, {result['size']}x{result['size']}, batch {result['batch']} "
        f"(GB = 1e9 bytes; device {result['device_gb']:.0f} GB)",
        "",
        "| Component | No optimisations | All optimisations | Technique |",
        "|-----------|-----------------:|------------------:|-----------|",
    ]
    for row in ROWS:
        label, technique = _LABELS[row]
        lines.append(
            f"| {label.format(**names)} | {none['bytes'][row] / GB:.2f} GB | "
            f"{every['bytes'][row] / GB:.2f} GB | {technique} |"
        )
    device = margin_words(result["device_gb"])
    verdict = "fits" if fits(every["total_gb"], result["device_gb"]) else "does NOT fit"
    lines += [
        f"| **Total** | **{none['total_gb']:.2f} GB** | **{every['total_gb']:.2f} GB** | **{verdict} in {device}** |",
        f"| Simulated peak | {none['peak_gb']:.2f} GB | {every['peak_gb']:.2f} GB | replay of the allocation trace |",
        "",
    ]
    columns = [("only", "Alone (others off)"), ("without", "All but this one")]
    columns = [(p, t) for p, t in columns if any(f"{p}_{n}" in result["scenarios"] for n in OPTIMISATIONS)]
    if columns:
        lines.append("| Optimisation | " + " | ".join(title for _, title in columns) + " |")
        lines.append("|--------------|" + "|".join("-" * (len(title) + 1) + ":" for _, title in columns) + "|")
        for name in OPTIMISATIONS:
            cells = [result["scenarios"].get(f"{prefix}_{name}") for prefix, _ in columns]
            text = [f"{cell['total_gb']:.2f} GB" if cell else "-" for cell in cells]
            lines.append(f"| {name} | " + " | ".join(text) + " |")
    configured = result["scenarios"]["configured"]
    lines += [
        "",
        f"Configured ({'bf16' if configured['bf16'] else 'fp32'}, "
        + ", ".join(f"{k}={v}" for k, v in configured["optimisations"].items())
        + f"): {configured['total_gb']:.2f} GB, "
        + ("fits" if fits(configured["total_gb"], result["device_gb"]) else "does NOT fit")
        + f" in {device} (as `vcloud doctor` checks it on the partition's GPU). With all optimisations a batch of up to "
        f"{result['max_batch_all_optimisations']} fits in {device} (activations linear in the batch).",
        f"Parameters: autoencoder {result['autoencoder_params'] / 1e6:.1f}M, CFDT "
        f"{result['cfdt_params'] / 1e6:.1f}M, refiner {result['refiner_params'] / 1e6:.1f}M. "
        f"Estimated in {result['seconds']:.1f} s.",
    ]
    return "\n".join(lines)


def main(config_path: Path, as_json: bool, *, leave_one_out: bool = False) -> str:
    """Text for `vcloud memory --config FILE [--json]`; leave_one_out adds "all but X"."""
    from vcloud.config import load_model_config

    names = (*DEFAULT_SCENARIOS, *LEAVE_ONE_OUT) if leave_one_out else None
    result = estimate(load_model_config(Path(config_path)), names=names)
    return json.dumps(result, indent=2) if as_json else format_table(result)
