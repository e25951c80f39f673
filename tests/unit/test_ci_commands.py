"""The README and docs/contributing.md quote .ci/run's commands as they are: the install, the
pipeline and the test command CI runs (a newcomer copies them, and CI is what they claim)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = ["README.md", "docs/contributing.md"]


def ci_commands() -> list[str]:
    """.ci/run's commands, one per line, with comments and shell plumbing left out."""
    lines = []
    for raw in (ROOT / ".ci/run").read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def ci_command(program: str) -> str:
    """The one .ci/run line that runs `program`, without `python3 -m`."""
    found = [
        line.removeprefix("python3 -m ") for line in ci_commands() if re.match(rf"(python3 -m )?{program}\b", line)
    ]
    assert len(found) == 1, (program, found)
    return found[0]


def words(text: str) -> str:
    """Markdown prose or code as plain words: no backticks, one space between words."""
    return " ".join(text.replace("`", " ").split())


def test_ci_runs_every_tier_in_xdist_groups():
    """What the pages below quote is what CI needs: every tier, the shared fixtures' groups."""
    command = ci_command("pytest").split()
    assert "--tier" in command and command[command.index("--tier") + 1] == "all"
    assert "--dist" in command and command[command.index("--dist") + 1] == "loadgroup"


@pytest.mark.parametrize("page", PAGES)
def test_the_page_quotes_cis_test_command(page):
    """The flags that choose CI's tiers and workers, as .ci/run has them (not a copy that drifts)."""
    command = ci_command("pytest").split(" --durations")[0]
    assert words(command) in words((ROOT / page).read_text()), f"{page} does not quote .ci/run's `{command}`"


@pytest.mark.parametrize("page", PAGES)
def test_the_page_quotes_cis_install_and_run(page):
    text = words((ROOT / page).read_text())
    install = ci_command("pip")
    assert words(install) in text, f"{page} does not quote .ci/run's `{install}`"
    assert words(ci_command("snakemake")) in text
