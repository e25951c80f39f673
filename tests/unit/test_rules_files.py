"""The workflow's files fit on a screen, one concern each (docs/ARCHITECTURE.md, "The workflow files"):
the Snakefile and every file under workflow/rules/ at most 200 lines, and every rules file included
by the Snakefile, so that a file split off a long one cannot be forgotten."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
RULES = ROOT / "workflow" / "rules"
MAX_LINES = 200


def workflow_files(root: Path = ROOT) -> list[Path]:
    """The Snakefile and every file under workflow/rules/."""
    rules = root / "workflow" / "rules"
    return [root / "Snakefile", *sorted(p for p in rules.rglob("*") if p.is_file() and "__pycache__" not in p.parts)]


def too_long(files: list[Path], root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """'NAME: N lines' of each file over `limit` lines."""
    found = []
    for path in files:
        count = len(path.read_text().splitlines())
        if count > limit:
            found.append(f"{path.relative_to(root).as_posix()}: {count} lines")
    return found


def included(snakefile: Path) -> set[str]:
    """The paths the Snakefile's `include:` lines name (relative to its folder)."""
    return set(re.findall(r"""^include:\s*["']([^"']+)["']""", snakefile.read_text(), flags=re.M))


def not_included(root: Path = ROOT) -> list[str]:
    """The workflow/rules/*.smk files that the Snakefile does not include."""
    names = {p.relative_to(root).as_posix() for p in (root / "workflow" / "rules").glob("*.smk")}
    return sorted(names - included(root / "Snakefile"))


def test_the_snakefile_and_every_rules_file_are_at_most_200_lines():
    found = too_long(workflow_files())
    assert not found, f"over {MAX_LINES} lines (split the file by concern): " + "; ".join(found)


def test_every_rules_file_is_included_by_the_snakefile():
    missing = not_included()
    assert not missing, "not included by the Snakefile (add an include: line): " + ", ".join(missing)


def test_every_include_names_a_rules_file():
    names = included(ROOT / "Snakefile")
    assert names, "the Snakefile includes no rules file"
    assert all((ROOT / name).is_file() for name in names), sorted(n for n in names if not (ROOT / n).is_file())


def test_the_checks_catch_a_long_file_and_a_forgotten_one(tmp_path):
    """The two tests above would pass vacuously if the checks found nothing: a workflow with a rules
    file of 201 lines and one that no include names fails both; 200 lines and an include pass."""
    rules = tmp_path / "workflow" / "rules"
    rules.mkdir(parents=True)
    (tmp_path / "Snakefile").write_text('include: "workflow/rules/common.smk"\n' + "# one line\n" * (MAX_LINES - 1))
    (rules / "common.smk").write_text("# one line\n" * MAX_LINES)
    assert too_long(workflow_files(tmp_path), tmp_path) == [] and not_included(tmp_path) == []
    (rules / "common.smk").write_text("# one line\n" * (MAX_LINES + 1))
    (rules / "forgotten.smk").write_text("# a rules file split off and not included\n")
    assert too_long(workflow_files(tmp_path), tmp_path) == ["workflow/rules/common.smk: 201 lines"]
    assert not_included(tmp_path) == ["workflow/rules/forgotten.smk"]
