"""Every figure the README quotes from a page of the manual is the page's figure: the test and CI
times, the quality table, the baselines, the clear targets, what S1 is worth, the patch edges,
the pipeline time, the Python floor and which stages select on three protocols. Each is parsed
from both sides, so an edit of one side fails here until the other follows (docs/contributing.md,
Refreshing the figures). A pattern that no longer matches fails too: reword both, then it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = "README.md"
NUMBER = r"[+-]?\d+\.\d+"
DIFF = rf"{NUMBER} ± \d+\.\d+"  # a paired difference: mean ± SE
DURATION = r"\d+ min \d+ s"
COMMIT = r"[0-9a-f]{7}"
DATE = r"\d{4}-\d\d-\d\d"


def prose(page: str) -> str:
    """The page as plain words: no backticks or bold, one space between words (lines joined)."""
    return " ".join((ROOT / page).read_text().replace("`", "").replace("**", "").split())


def quote(page: str, pattern: str) -> dict[str, str]:
    """The named groups of the one match of `pattern` in `page`'s prose."""
    found = list(re.finditer(pattern, prose(page)))
    assert len(found) == 1, f"{page}: {len(found)} matches of {pattern!r} (reworded? change both sides and this test)"
    return found[0].groupdict()


def table(page: str, start: str) -> dict[str, list[str]]:
    """The one Markdown table of `page` whose header row starts with `start`: first cell -> the
    other cells (stripped, bold dropped), in the page's order; a repeated first cell keeps its
    first row (the CI table lists newest first, two runs of one day among them)."""
    lines = (ROOT / page).read_text().splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith(start)]
    assert len(starts) == 1, f"{page}: {len(starts)} tables headed {start!r}"
    rows = {}
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        first, *cells = (cell.strip().replace("**", "") for cell in line.strip().strip("|").split("|"))
        rows.setdefault(first, cells)
    return rows


def header(page: str, start: str) -> list[str]:
    """The cells of the one header row of `page` that starts with `start`."""
    found = [line for line in (ROOT / page).read_text().splitlines() if line.startswith(start)]
    assert len(found) == 1, f"{page}: {len(found)} tables headed {start!r}"
    return [cell.strip() for cell in found[0].strip().strip("|").split("|")]


def row(rows: dict[str, list[str]], start: str) -> list[str]:
    """The cells of the one row whose first cell starts with `start` (a word)."""
    found = [cells for first, cells in rows.items() if re.match(rf"{re.escape(start)}\b", first)]
    assert len(found) == 1, f"{len(found)} rows start with {start!r}: {list(rows)}"
    return found[0]


def mean(diff: str) -> str:
    """'+0.23 ± 0.02 (0.01)' -> '+0.23'."""
    return diff.split(" ±")[0]


def paired(diff: str) -> str:
    """'+0.23 ± 0.02 (0.01)' -> '+0.23 ± 0.02': the clustered SE in brackets left out."""
    return re.sub(r"\s*\(.*\)$", "", diff)


def seconds(duration: str) -> int:
    minutes, secs = map(int, re.findall(r"\d+", duration))
    return 60 * minutes + secs


# Both sides word the claim alike; test_what_s1_is_worth_is_the_tables_largest_loss checks it.
S1_WORTH = (
    r"S1 is worth at most (?P<bound>[\d.]+) dB to any stage on any protocol \(stage (?P<stage>\d) on the "
    r"(?P<samples>\d+) (?P<protocol>\w+) samples, ± (?P<se>[\d.]+); at most (?P<natural>[\d.]+) on the natural "
    r"protocols pooled"
)

# Prose the README quotes from a page: (what, README's pattern, the page, the page's pattern).
# Both patterns name the same groups; the values must be equal.
QUOTES = [
    (
        "fast tier time",
        rf"(?P<time>{DURATION}) in (?P<workers>\w+) pytest-xdist workers on the 2-core development machine "
        rf"\((?P<date>{DATE}), commit (?P<commit>{COMMIT})\)",
        "docs/contributing.md",
        rf"Measured on (?P<date>{DATE}) \(idle 2-core development machine, fresh clone of commit (?P<commit>{COMMIT})\): "
        rf"\d+ tests in (?P<time>{DURATION}) in (?P<workers>\w+) workers",
    ),
    (
        "quality run",
        rf"Quality on the synthetic default run \((?P<date>{DATE}), code of commit (?P<commit>{COMMIT}),",
        "docs/evaluation.md",
        rf"On the synthetic default run \((?P<date>{DATE}), code of commit (?P<commit>{COMMIT}),",
    ),
    (
        "quality run (stage 3)",
        rf"Quality on the synthetic default run \((?P<date>{DATE}), code of commit (?P<commit>{COMMIT}),",
        "docs/training.md",
        rf"Measured \((?P<date>{DATE}), 2-core CPU container; the default run of commit (?P<commit>{COMMIT}),",
    ),
    (
        "stage 2 - stage 1 on fixed",
        rf"\| fixed \(simulated clouds on clear dates\) \| \d+ \| {NUMBER} \| {NUMBER} \| {NUMBER} \| (?P<diff>{DIFF})",
        "docs/evaluation.md",
        rf"stage 2 - stage 1 = (?P<diff>{DIFF}) dB on fixed",
    ),
    (
        "clear targets among the inputs",
        r"stage 1 scores (?P<s1>[\d.]+-[\d.]+) dB, stage 2 (?P<s2>[\d.]+-[\d.]+), stage 3 (?P<s3>[\d.]+-[\d.]+)\.",
        "docs/training.md",
        r"stage 3 scores (?P<s3>[\d.]+-[\d.]+) dB against stage 2's (?P<s2>[\d.]+-[\d.]+) \(stage 1: (?P<s1>[\d.]+-[\d.]+)\)",
    ),
    ("what S1 is worth", S1_WORTH, "docs/evaluation.md", S1_WORTH),
    (
        "what S1 is worth: the run",
        rf"natural protocols pooled; test split, commit (?P<commit>{COMMIT})\)",
        "docs/evaluation.md",
        rf"The default run \({DATE}, code of commit (?P<commit>{COMMIT}), a fresh clone,",
    ),
    (
        "patch edges",
        r"err within (?P<bound>[\d.]+)x of the interior on a smooth scene \(worst (?P<worst>[\d.]+);",
        "docs/patch-edges.md",
        r"After the fix every side is within (?P<bound>[\d.]+)x of the interior \(worst: stage \d \w+ (?P<worst>[\d.]+),",
    ),
    (
        "pipeline time",
        rf"the whole default pipeline \(snakemake --cores all, (?P<jobs>\d+) jobs\) in (?P<new>{DURATION}) "
        rf"\((?P<new_s>\d+) s, code of commit (?P<new_commit>{COMMIT})\), against (?P<old>{DURATION}) \((?P<old_s>\d+) s\) "
        rf"for commit (?P<old_commit>{COMMIT}) in the same session, (?P<ratio>[\d.]+)x \((?P<date>{DATE}),",
        "docs/performance.md",
        rf"Whole default pipeline, (?P<date>{DATE}), later \([^)]*\): (?P<old>{DURATION}) \((?P<old_s>\d+) s\) for "
        rf"commit (?P<old_commit>{COMMIT}), (?P<new>{DURATION}) \((?P<new_s>\d+) s, (?P<jobs>\d+) jobs\) for commit "
        rf"(?P<new_commit>{COMMIT}), (?P<ratio>[\d.]+)x",
    ),
]


QUOTE = {what: (ours, page, theirs) for what, ours, page, theirs in QUOTES}


@pytest.mark.parametrize("what, ours, page, theirs", QUOTES, ids=[q[0] for q in QUOTES])
def test_the_readme_quotes_the_page(what, ours, page, theirs):
    readme, source = quote(README, ours), quote(page, theirs)
    assert readme == source, f"{what}: README says {readme}, {page} says {source}"


def test_ci_time_is_the_newest_measurement():
    """The README's time of the whole .ci/run is the first (newest) row of contributing's table."""
    pattern = rf"skipping it\): (?P<time>{DURATION}) on the 2-core development machine \((?P<date>{DATE}), commit (?P<commit>{COMMIT})\)"
    readme = quote(README, pattern)
    rows = table("docs/contributing.md", "| date | commit | workers | whole")
    dates = list(rows)
    assert dates == sorted(dates, reverse=True), f"contributing's CI table is not newest first: {dates}"
    commit, _, whole, *_ = rows[dates[0]]
    source = {"time": re.match(DURATION, whole).group(), "date": dates[0], "commit": commit}
    assert readme == source, f"CI time: README says {readme}, docs/contributing.md says {source}"


PROTOCOLS = ("fixed", "reference", "uncrtaints", "natural")
QUALITY = "| protocol | samples | stage 1 |"  # README: samples, stage 1, 2, 3, stage 2 - 1, stage 3 - 2


def test_quality_table_stages_2_and_3_are_trainings():
    """Samples, stage 2, stage 3 and stage 3 - 2 (mean ± paired SE) per protocol: docs/training.md's
    stage-3 table of the same run."""
    ours = table(README, QUALITY)
    theirs = table("docs/training.md", "| protocol | samples | stage 2 | stage 3 | stage 3 - stage 2 |")
    for protocol in PROTOCOLS:
        samples, _, stage2, stage3, _, diff = row(ours, protocol)
        readme = [samples, stage2, stage3, paired(diff)]
        assert readme == row(theirs, protocol), f"{protocol}: README {readme}, docs/training.md {row(theirs, protocol)}"


def test_quality_table_fixed_row_is_evaluations():
    """The fixed protocol's stage 1-3 PSNR: docs/evaluation.md's table against the baselines."""
    _, *stages, _, _ = row(table(README, QUALITY), "fixed")
    methods = table("docs/evaluation.md", "| method | PSNR |")
    source = [row(methods, f"stage {n}")[0] for n in (1, 2, 3)]
    assert stages == source, f"fixed: README {stages}, docs/evaluation.md {source}"


def test_quality_tables_differences_are_its_columns():
    """Within the README's table (the natural protocols' stage-1 figures have no page of their
    own): a paired difference of means is the difference of the means, up to their rounding; the
    pooled samples are the sum of the two natural protocols'."""
    rows = table(README, QUALITY)
    for protocol in PROTOCOLS:
        _, s1, s2, s3, d21, d32 = row(rows, protocol)
        for diff, new, old in ((d21, s2, s1), (d32, s3, s2)):
            assert abs(float(mean(diff)) - (float(new) - float(old))) <= 0.011, (protocol, diff, new, old)
    assert int(row(rows, "natural")[0]) == int(row(rows, "reference")[0]) + int(row(rows, "uncrtaints")[0])


BASELINES = {"least": "least-cloudy date", "median": "median mosaic", "nearest": "nearest clear date"}


def test_baselines_are_evaluations():
    ours = quote(
        README,
        rf"stage 1 beats the least-cloudy date \((?P<least>{NUMBER})\) by (?P<s1_least>{DIFF}) dB, the median mosaic "
        rf"\((?P<median>{NUMBER})\) by (?P<s1_median>{DIFF}) and the nearest clear date \((?P<nearest>{NUMBER})\) by "
        rf"(?P<s1_nearest>{DIFF}); stage 3 beats them by (?P<s3_least>{NUMBER}), (?P<s3_median>{NUMBER}) and "
        rf"(?P<s3_nearest>{NUMBER})",
    )
    methods = table("docs/evaluation.md", "| method | PSNR |")
    assert header("docs/evaluation.md", "| method | PSNR |")[2:] == [
        "- least-cloudy",
        "- median mosaic",
        "- nearest clear",
    ]
    stage1, stage3 = row(methods, "stage 1"), row(methods, "stage 3")
    theirs = {}
    for n, (name, method) in enumerate(BASELINES.items(), 1):  # the table's columns: PSNR, then these
        theirs[name] = row(methods, method)[0]
        theirs[f"s1_{name}"] = stage1[n]
        theirs[f"s3_{name}"] = mean(stage3[n])
    assert ours == theirs, f"README says {ours}, docs/evaluation.md says {theirs}"


def test_what_s1_is_worth_is_the_tables_largest_loss():
    """evaluation.md's bound (quoted by the README above) is its own table's largest loss without S1."""
    claim = quote("docs/evaluation.md", S1_WORTH)
    rows = table("docs/evaluation.md", "| stage | fixed (")
    columns = [
        re.match(r"(\w+) \((\d+)\)", cell).groups() for cell in header("docs/evaluation.md", "| stage | fixed (")[1:]
    ]
    losses = []  # (worth of S1 = with - without, stage, protocol, samples, SE)
    for stage, cells in rows.items():
        for (protocol, samples), cell in zip(columns, cells):
            diff, se = re.search(rf"\(({NUMBER}) ± (\d+\.\d+)\)", cell).groups()
            losses.append((-float(diff), stage, protocol, samples, se))
    worst = max(losses)
    table_says = {
        "bound": f"{worst[0]:.2f}",
        "stage": worst[1],
        "samples": worst[3],
        "protocol": worst[2],
        "se": worst[4],
        "natural": f"{max(loss[0] for loss in losses if loss[2] == 'natural'):.2f}",
    }
    assert claim == table_says, f"docs/evaluation.md says {claim}, its table {table_says}"


def test_patch_edge_bound_holds_on_the_pages_table():
    edges = quote("docs/patch-edges.md", QUOTE["patch edges"][2])
    assert float(edges["worst"]) <= float(edges["bound"])
    after = table("docs/patch-edges.md", "| stage | before: interior | top 4 rows |")
    assert all(float(cells[-1]) <= float(edges["bound"]) for cells in after.values()), after


def test_pipeline_times_add_up():
    """The README's pipeline time in minutes and seconds, in seconds, and their ratio agree."""
    t = quote(README, QUOTE["pipeline time"][0])
    assert seconds(t["new"]) == int(t["new_s"]) and seconds(t["old"]) == int(t["old_s"]), t
    assert f"{int(t['new_s']) / int(t['old_s']):.2f}" == t["ratio"], t


@pytest.mark.parametrize("page", [README, "docs/index.md"])
def test_the_python_floor_is_pyprojects(page):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = project["project"]["requires-python"].removeprefix(">=")
    said = quote(page, r"Python >= (?P<floor>3\.\d+) \(snakemake 9 and zarr 3 need it\) and pip")["floor"]
    assert said == floor, f"{page} says Python >= {said}, pyproject.toml requires-python >= {floor}"
    assert project["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")


def test_the_stages_that_select_on_three_protocols_are_the_registrys():
    from vcloud.registry import STAGES

    natural = [s.number for s in STAGES if s.validates_natural]
    one = [s.number for s in STAGES if not s.validates_natural]
    readme = quote(
        README,
        r"Stages (?P<first>\d)-(?P<last>\d) choose their best checkpoint on all three protocols of the val split, "
        r"stage (?P<other>\d) \(the autoencoder\) on one",
    )
    training = quote(
        "docs/training.md", r"Three validation protocols\. Stages (?P<first>\d)-(?P<last>\d) validate every"
    )
    for page, said in ((README, readme), ("docs/training.md", training)):
        assert list(range(int(said["first"]), int(said["last"]) + 1)) == natural, (page, said, natural)
    assert [int(readme["other"])] == one, (readme, one)
