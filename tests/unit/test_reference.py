"""The manual's generated reference pages (vcloud.reference, built by docs/hooks.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from vcloud.reference import cli_page, config_page, error_messages, errors_page

ROOT = Path(__file__).parents[2]


def _subcommands_from_help() -> list[str]:
    """The subcommands as `vcloud --help` lists them: {a,b,...} is argparse's usage of the choices."""
    out = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", "--help"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    proc = subprocess.run(
        [sys.executable, "-c", "from vcloud.cli import build_parser; build_parser().parse_args(['no-such-command'])"],
        capture_output=True,
        text=True,
    )
    choices = re.search(r"choose from ([^)]*)\)", proc.stderr)
    assert choices, proc.stderr
    assert "COMMAND" in out
    return [name.strip(" '") for name in choices.group(1).split(",")]


def test_cli_page_has_a_section_with_the_help_of_every_subcommand():
    commands = _subcommands_from_help()
    # The commands the workflow's rules call must be among them (the list is not empty by accident).
    assert {"synth", "prepare", "train", "evaluate", "export-viewer", "doctor", "image"} <= set(commands)
    page = cli_page()
    headings = re.findall(r"^## (\S+)$", page, flags=re.M)
    assert headings == commands
    for name in commands:
        assert f"usage: vcloud {name}" in page, name


def test_config_page_lists_every_key_of_the_schema():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    page = config_page()
    for section, node in schema["properties"].items():
        assert f"| `{section}` |" in page, section
        for key in node.get("properties", {}):
            assert f"| `{section}.{key}` |" in page, f"{section}.{key}"
    for key in schema["$defs"]["rule_resources"]["properties"]:
        assert f"| `{key}` |" in page, key
    # The default shown is the one config/config.yaml sets, not the schema's.
    assert "| `data.patch_size` | integer (>= 8) | yes | `64` |" in page


def test_errors_page_has_every_raise_of_the_package(tmp_path):
    module = tmp_path / "pkg" / "thing.py"
    module.parent.mkdir()
    module.write_text(
        "def f(path, key):\n"
        "    if path:\n"
        "        raise BadInputError(f'{path}: not found; run `vcloud x`')\n"
        "    raise ConfigError('key ' + key + ': wrong')\n"
        "    raise ValueError('not ours')\n"
    )
    found = error_messages(tmp_path / "pkg")
    assert found == [
        ("vcloud.thing", "BadInputError", "{path}: not found; run `vcloud x`"),
        ("vcloud.thing", "ConfigError", "key {...}: wrong"),
    ]
    page = errors_page()
    assert "{path}: checkpoint not found" in page and "## vcloud.train.checkpoint" in page


def test_the_nav_names_each_page_once():
    """A page under two titles in mkdocs.yml's nav shows twice in the site's menu (strict mode
    lets that pass): one title per page."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)\s*$", nav, flags=re.MULTILINE)
    assert len(pages) > 10, pages
    assert sorted({p for p in pages if pages.count(p) > 1}) == []
