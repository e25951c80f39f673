"""Research runs: experiments x seeds as runs, their bad input, and the shared files' homes."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcloud.cli import main
from vcloud.config import load_model_config
from vcloud.config.experiments import plan_runs
from vcloud.config.stage_hash import stage_hash
from vcloud.errors import ConfigError
from vcloud.workflow import makers, prefix_pattern, run_paths

ROOT = Path(__file__).parents[2]
SMALL = ROOT / "config/models/small.yaml"
WORKFLOW_DATA = {"rois": "all", "splits": {"test": 1, "val": 1}, "patch_size": 64}


def plan(**keys):
    return plan_runs({"data": WORKFLOW_DATA, **keys}, SMALL)


def paths_of(runs):
    return run_paths(runs, prepared="results/prepared", results="results", patch_size=64)


def test_without_experiments_or_seeds_one_run_in_results_itself():
    (run,) = plan(experiments=[], seeds=None)
    assert run.prefix == "" and run.changes == {}
    assert run.model_set == load_model_config(SMALL)
    (paths,) = paths_of([run])
    assert paths.checkpoint(2) == "results/stage2/best.pt" and paths.homes == ()
    assert paths.fixed_protocol() == "results/eval/fixed_protocol.npz"


def test_experiments_times_seeds_in_table_order_each_with_its_changes():
    runs = plan(
        experiments=[{"name": "base"}, {"name": "no_s1", "overrides": {"data": {"s1_dropout": 0.0}}}],
        seeds=[0, 7],
    )
    assert [r.prefix for r in runs] == ["/base/seed0", "/base/seed7", "/no_s1/seed0", "/no_s1/seed7"]
    no_s1_seed7 = runs[3].model_set
    assert no_s1_seed7.data.s1_dropout == 0.0 and runs[1].model_set.data.s1_dropout == 0.25
    # A seed is every stage's training seed, and nothing else of the model config.
    assert {no_s1_seed7.stage0.train.seed, no_s1_seed7.stage1.train.seed, no_s1_seed7.stage3.train.seed} == {7}
    assert runs[1].model_set.evaluation == runs[0].model_set.evaluation
    assert runs[1].model_set.data == runs[0].model_set.data


def test_experiments_without_seeds_keep_the_model_configs_own_seeds():
    runs = plan(experiments=[{"name": "a"}, {"name": "b", "overrides": {"stage2": {"clear_share": 0.0}}}])
    assert [(r.prefix, r.seed) for r in runs] == [("/a", None), ("/b", None)]
    assert runs[0].model_set == load_model_config(SMALL) and runs[1].model_set.stage2.clear_share == 0.0


def test_seeds_alone_make_runs_of_the_base_experiment():
    assert [r.prefix for r in plan(seeds=[1, 2])] == ["/base/seed1", "/base/seed2"]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"experiments": [{"name": "a/b"}]}, "experiments[0].name: 'a/b' is not a safe folder name"),
        ({"experiments": [{"name": ".."}]}, "experiments[0].name: '..' is not a safe folder name"),
        ({"experiments": [{"name": "stage1"}]}, "experiments[0].name: 'stage1' is a folder of the results"),
        ({"experiments": [{"name": "a"}, {"name": "a"}]}, "experiments[1].name: 'a' is the name of experiments[0] too"),
        (
            {"experiments": [{"name": "a", "overrides": {"stage1": {"train": {"lrr": 1}}}}]},
            "experiments[0].overrides.stage1.train.lrr: no such key to override",
        ),
        (
            {"experiments": [{"name": "a", "overrides": {"data": {"splits": {"test": 2}}}}]},
            "experiments[0].overrides.data.splits: a workflow setting",
        ),
        (
            {"experiments": [{"name": "a", "overrides": {"evaluation": {"reference_truths": 2}}}]},
            "experiments[0].overrides.evaluation: may not differ between experiments",
        ),
        (
            {"experiments": [{"name": "a", "overrides": {"stage2": {"train": {"seed": 3}}}}]},
            "experiments[0].overrides.stage2.train.seed: the training seeds come from `seeds:`",
        ),
        (
            {"experiments": [{"name": "a", "overrides": {"stage1": {"train": {"lr": -1}}}}]},
            "experiments[0]: key stage1.train.lr: -1.0 must be > 0",
        ),
        ({"seeds": []}, "seeds: empty list"),
        (
            {"experiments": [{"name": "a"}], "rehearsal": {"enabled": True, "experiment": "b"}},
            "rehearsal.experiment: 'b' is not an experiment (a)",
        ),
        ({"rehearsal": {"enabled": True, "experiment": "b"}}, "rehearsal.experiment: 'b' is not an experiment (base)"),
        ({"seeds": [0], "predict": {"enabled": True}}, "predict.enabled: predictions apply"),
        ({"seeds": [0], "compare": {"baseline": "nope"}}, "compare.baseline: 'nope' is not an experiment (base)"),
        ({"seeds": [1, 2, 1]}, "seeds[2]: 1 is listed twice"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(keys, message):
    with pytest.raises(ConfigError) as err:
        plan(**keys)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_a_stage_of_the_same_identity_is_made_once_by_the_first_run_with_it():
    runs = plan(
        experiments=[
            {"name": "base"},
            {"name": "s3_lr", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}},
            {"name": "no_s1", "overrides": {"data": {"s1_dropout": 0.0}}},
        ],
        seeds=[0, 1],
    )
    paths = {run.prefix: p for run, p in zip(runs, paths_of(runs), strict=True)}
    s3_lr = paths["/s3_lr/seed1"]
    # Stages 0-2 are base's (same hash, same seed); stage 3 and its evaluation are its own.
    assert s3_lr.checkpoint(2) == "results/base/seed1/stage2/best.pt"
    assert s3_lr.eval_report(2) == "results/base/seed1/eval/stage2.json"
    assert s3_lr.checkpoint(3) == "results/s3_lr/seed1/stage3/best.pt"
    assert s3_lr.eval_report(3) == "results/s3_lr/seed1/eval/stage3.json"
    # Another seed is another stage: never shared across seeds.
    assert paths["/base/seed1"].checkpoint(0) == "results/base/seed1/stage0/best.pt"
    # A data change reaches every stage (their hashes hold the data section).
    assert paths["/no_s1/seed0"].checkpoint(0) == "results/no_s1/seed0/stage0/best.pt"
    # The fixed protocol and the wind cache do not depend on the seed: made once for all.
    assert {p.fixed_protocol() for p in paths.values()} == {"results/base/seed0/eval/fixed_protocol.npz"}
    assert {p.wind_cache() for p in paths.values()} == {"results/base/seed0/wind/scan_orders.npz"}
    assert stage_hash(runs[2].model_set, 2) == stage_hash(runs[0].model_set, 2)
    assert makers(runs, paths_of(runs), "stage2") == ["/base/seed0", "/base/seed1", "/no_s1/seed0", "/no_s1/seed1"]
    assert makers(runs, paths_of(runs), "stage3") == [r.prefix for r in runs]


def test_a_change_of_the_fixed_samples_gets_its_own_fixed_protocol():
    runs = plan(experiments=[{"name": "a"}, {"name": "t3", "overrides": {"data": {"input_dates": 3}}}], seeds=[0])
    a, t3 = paths_of(runs)
    assert a.fixed_protocol() == "results/a/seed0/eval/fixed_protocol.npz"
    assert t3.fixed_protocol() == "results/t3/seed0/eval/fixed_protocol.npz"


def test_prefix_pattern_matches_exactly_its_runs():
    import re

    assert re.fullmatch(prefix_pattern([""]), "")
    pattern = prefix_pattern(["/a/seed0", "/b.c/seed1"])
    assert (
        re.fullmatch(pattern, "/a/seed0") and not re.fullmatch(pattern, "") and not re.fullmatch(pattern, "/bxc/seed1")
    )
    assert not re.fullmatch(prefix_pattern([]), "")


def test_the_viewer_shows_compares_baseline_under_its_first_seed():
    from vcloud.config.experiments import baseline_run
    from vcloud.workflow import viewer_comparison_flags

    experiments = [{"name": "a"}, {"name": "b", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}}]
    runs = plan(experiments=experiments, seeds=[3, 1])
    assert baseline_run({}, runs).prefix == "/a/seed3"  # the first experiment, the first seed listed
    chosen = baseline_run({"compare": {"baseline": "b"}}, runs)
    assert (chosen.experiment, chosen.seed) == ("b", 3)
    assert viewer_comparison_flags("results/compare.json", experiment="b", seed=3) == (
        " --comparison results/compare.json --run b 3"
    )
    # The model config's own seeds: "-" as vcloud compare's flags write them; a single run: nothing.
    assert viewer_comparison_flags("r/c.json", experiment="a", seed=None).endswith("--run a -")
    assert viewer_comparison_flags(None, experiment="base", seed=None) == ""


def test_run_config_writes_the_resolved_config_and_refuses_an_unknown_key(tmp_path, capsys):
    out = tmp_path / "model.yaml"
    assert (
        main(
            ["run-config", "--config", str(SMALL), "--changes", '{"stage1": {"train": {"seed": 5}}}', "--out", str(out)]
        )
        == 0
    )
    cfg = load_model_config(out)
    assert cfg.stage1.train.seed == 5 and cfg.stage1 != load_model_config(SMALL).stage1
    assert cfg.stage2 == load_model_config(SMALL).stage2
    bad = tmp_path / "bad.yaml"
    assert main(["run-config", "--config", str(SMALL), "--changes", '{"stage9": {}}', "--out", str(bad)]) == 2
    assert "--changes.stage9: no such key to override" in capsys.readouterr().err
    assert not bad.exists()


def test_the_bill_and_the_data_budget_count_every_run_and_say_so():
    import copy

    from vcloud.runtime.bill import rule_jobs
    from vcloud.runtime.budget import CHECKPOINT_FALLBACK_BYTES, data_budget
    from vcloud.runtime.profile import load_workflow_config

    single = load_workflow_config(ROOT / "config/config.yaml")
    grid = copy.deepcopy(single)
    grid["experiments"] = [{"name": "base"}, {"name": "s3_lr", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}}]
    grid["seeds"] = [0, 1, 2]
    jobs = rule_jobs(grid)
    assert jobs["train_stage2"] == (3, "2 experiments x 3 seeds, 3 read from a run of the same identity")
    assert jobs["train_stage3"] == (6, "2 experiments x 3 seeds")
    assert jobs["evaluate_stage3"] == (12, "2 experiments x 3 seeds, on test and val")
    assert jobs["fixed_protocol"][0] == 2 and jobs["wind_cache"][0] == 1
    assert "train_stage3" not in rule_jobs(single)  # one job each, as before

    def checkpoints(config):
        (item,) = [i for i in data_budget(config).items if i.what.startswith("checkpoints")]
        return item

    # Without torch's parameter counts (model_set None) every checkpoint is the fallback size:
    # best.pt and latest.pt of 4 stages, against 3 x 3 + 6 trainings in the grid.
    assert checkpoints(single).bytes == 2 * 4 * CHECKPOINT_FALLBACK_BYTES
    item = checkpoints(grid)
    assert item.bytes == 2 * 15 * CHECKPOINT_FALLBACK_BYTES
    assert "15 stage trainings for 6 runs" in item.what
    # Logs: 6 synthetic ROIs and 3 splits prepared once; 15 trainings, each evaluated on test and
    # val (30), 2 fixed protocols (test, val), 1 wind cache, 6 stage tables, 6 run configs,
    # compare and the accounting: 71 jobs, against the single run's 22.
    (logs,) = [i for i in data_budget(grid).items if i.what.startswith("logs")]
    assert logs.what == "logs and benchmarks (71 jobs of 6 runs)" and logs.files == 3 * 71
    assert [i.files for i in data_budget(single).items if i.what == "logs and benchmarks"] == [3 * 22]


def test_a_rehearsal_of_a_grid_tries_one_run_the_baselines_first_seed_at_the_rehearsals_sizes():
    from vcloud.config.experiments import rehearsal_note

    grid = {
        "experiments": [
            {"name": "a"},
            {
                "name": "long",
                "overrides": {"stage3": {"train": {"epochs": 200, "lr": 1.0e-4}}, "data": {"val_samples": 9}},
            },
        ],
        "seeds": [4, 5],
        "compare": {"baseline": "long"},
    }
    assert len(plan(**grid)) == 4  # not rehearsing: the grid
    (run,) = plan(**grid, rehearsal={"enabled": True})
    # compare's baseline, its first seed, files where a single run's lie (results-rehearsal/stage<n>/)
    assert (run.experiment, run.seed, run.prefix) == ("long", 4, "")
    model = load_model_config(SMALL)
    assert run.model_set.stage3.train.lr == 1.0e-4 and run.model_set.stage3.train.seed == 4  # its settings
    assert run.model_set.stage3.train.epochs == model.stage3.train.epochs  # not its 200 epochs
    assert run.model_set.data.val_samples == model.data.val_samples
    (chosen,) = plan(**grid, rehearsal={"enabled": True, "experiment": "a"})
    assert (chosen.experiment, chosen.seed) == ("a", 4)
    # Not compare's baseline: the one run it tries is the rehearsal's baseline (its viewer's run,
    # compare's pairs), where the grid's baseline would not be found among its runs.
    from vcloud.config.experiments import baseline, baseline_run

    rehearsing = {"data": WORKFLOW_DATA, **grid, "rehearsal": {"enabled": True, "experiment": "a"}}
    assert baseline(rehearsing, [chosen]) == "a" and baseline_run(rehearsing, [chosen]) == chosen
    with pytest.raises(ConfigError, match=r"compare.baseline: 'long' is not an experiment \(a\)"):
        baseline({**rehearsing, "rehearsal": {"enabled": False}}, [chosen])
    note = rehearsal_note({"data": WORKFLOW_DATA, **grid, "rehearsal": {"enabled": True}}, SMALL)
    assert note == (
        "one run of the grid: experiment long (compare's baseline), seed 4, of 2 experiments x 2 seeds; "
        "its data.val_samples, stage3.train.epochs left to the rehearsal's"
    )
    assert rehearsal_note({"data": WORKFLOW_DATA, **grid}, SMALL) is None


def test_a_pairing_file_of_one_split_is_refused_for_research_runs(tmp_path):
    pairs = tmp_path / "pairs.yaml"
    pairs.write_text(f"based_on: {SMALL}\nevaluation: {{uncrtaints: {{pairs: /data/generic_3_test.npy}}}}\n")
    assert plan_runs({"data": WORKFLOW_DATA}, pairs)[0].model_set.evaluation.uncrtaints.pairs  # a single run: fine
    with pytest.raises(ConfigError, match=r"evaluation.uncrtaints.pairs: research runs score the val split too"):
        plan_runs({"data": WORKFLOW_DATA, "seeds": [0, 1]}, pairs)
