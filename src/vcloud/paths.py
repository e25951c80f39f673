"""Where a run's files go: every path under paths.prepared and paths.results, named once.

The workflow's rules ask one RunPaths object (workflow/rules/common.smk: RUN) instead of
formatting paths themselves; a stage's folder comes from its registry entry. Nothing here
reads or writes a file, and nothing heavy is imported (snakemake reads it while parsing).
"""

from __future__ import annotations

from dataclasses import dataclass

from vcloud.registry import STAGE_NUMBERS, get_stage

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class RunPaths:
    prepared: str
    results: str
    # Files this run reads from another run's folder, because that run makes them with the same
    # identity (research runs, vcloud.config.identities.run_paths): (key, that run's results folder), the
    # keys "stage<n>" (training), "eval<n>" (evaluation), "fixed_protocol" and "wind".
    homes: tuple[tuple[str, str], ...] = ()

    def home(self, key: str) -> str:
        """The results folder that holds the file `key`: another run's, or this run's own."""
        return dict(self.homes).get(key, self.results)

    # --- prepared data
    def split_store(self, split: str) -> str:
        return f"{self.prepared}/{split}.zarr"

    def roi_store(self, roi: str) -> str:
        return f"{self.prepared}/rois/{roi}.zarr"

    # --- a stage's training
    def stage_dir(self, stage: int) -> str:
        """results/<folder>/ of the stage (its registry entry's `folder`)."""
        return f"{self.home(f'stage{stage}')}/{get_stage(stage).folder}"

    def checkpoint(self, stage: int) -> str:
        return f"{self.stage_dir(stage)}/best.pt"

    def metrics_log(self, stage: int) -> str:
        """Written by train_stage<n> (a declared output), read by report_curves."""
        return f"{self.stage_dir(stage)}/metrics.jsonl"

    def wind_cache(self) -> str:
        return f"{self.home('wind')}/wind/scan_orders.npz"

    # --- evaluation
    @staticmethod
    def split_suffix(split: str) -> str:
        """What names an evaluation file's split: nothing for test (eval/stage<n>.json), the
        split's name otherwise (eval/stage<n>.val.json: research runs choose on val)."""
        return "" if split == "test" else f".{split}"

    def eval_report(self, stage: int, split: str = "test") -> str:
        return f"{self.home(f'eval{stage}')}/eval/stage{stage}{self.split_suffix(split)}.json"

    def stage_comparison(self, suffix: str = "json") -> str:
        """Each stage against the one before it on every protocol (vcloud compare-stages)."""
        return f"{self.results}/eval/stages.{suffix}"

    def fixed_protocol(self, split: str = "test") -> str:
        """The fixed protocol's detection: written once, read by every evaluation and the viewer."""
        return f"{self.home('fixed_protocol')}/eval/fixed_protocol{self.split_suffix(split)}.npz"

    # --- viewer, report, bundle, predict, rehearsal
    def viewer_page(self) -> str:
        return f"{self.results}/viewer/index.html"

    def report_file(self, name: str) -> str:
        """Figures and tables made for `snakemake --report` (results/report/...)."""
        return f"{self.results}/report/{name}"

    def curves(self, stage: int) -> str:
        return self.report_file(f"curves/stage{stage}.png")

    def bundle(self, model_set_name: str) -> str:
        """The run's model as one file (vcloud bundle)."""
        return f"{self.results}/bundle/{model_set_name}.tar"

    def predict_manifest(self, stage: int, roi: str) -> str:
        """Written last by vcloud predict: it exists only when every output of the ROI is made."""
        return f"{self.results}/predict/stage{stage}/{roi}/manifest.json"

    def transport_report(self) -> str:
        return f"{self.results}/rehearsal/transport.json"

    # --- a research run (experiments x seeds)
    def run_model_config(self) -> str:
        """Its model config: the experiment's and the seed's changes applied (vcloud run-config)."""
        return f"{self.results}/model.yaml"

    def run_outputs(self) -> list[str]:
        """What `all` asks of a research run: its stages (another run's where shared), their
        evaluations on test and on val (where designs are chosen) and its stage table."""
        return (
            [self.checkpoint(stage) for stage in STAGE_NUMBERS]
            + [self.eval_report(stage, split) for split in ("val", "test") for stage in STAGE_NUMBERS]
            + [self.stage_comparison()]
        )

    def comparison(self, suffix: str = "json") -> str:
        """The research runs compared, experiment against baseline over seeds (vcloud compare)."""
        return f"{self.results}/compare.{suffix}"

    # --- what the run makes
    def accounting_inputs(self) -> list[str]:
        """Everything the run makes but the accounting itself: it runs last and counts them all."""
        return (
            [self.split_store(split) for split in SPLITS]
            + [self.checkpoint(stage) for stage in STAGE_NUMBERS]
            + [self.fixed_protocol()]
            + [self.eval_report(stage) for stage in STAGE_NUMBERS]
            + [self.viewer_page()]
            + [self.curves(stage) for stage in STAGE_NUMBERS]
            + [self.report_file("evaluation.html"), self.stage_comparison()]
        )

    def final_outputs(self, model_set_name: str) -> list[str]:
        return [*self.accounting_inputs(), self.report_file("accounting.tsv"), self.bundle(model_set_name)]
