"""What users see of the command line stays as it was: `vcloud --help`, every subcommand's --help
and the generated reference page equal the golden copies in tests/unit/golden/. A change on
purpose regenerates them, and the diff shows in review:

    python tests/unit/test_cli_golden.py --regenerate

Also the layout of the package src/vcloud/cli/: one module per family of commands, each
subcommand declared in exactly one of them beside the function that runs it, no long functions.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
HELP_FILE = GOLDEN / "cli-help.txt"
REFERENCE_FILE = GOLDEN / "cli-reference.md"
ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "src" / "vcloud" / "cli"
REGENERATE = "python tests/unit/test_cli_golden.py --regenerate"
MAX_FUNCTION_LINES = 80
WIDTH = 100  # as vcloud.reference renders the manual's page: the terminal's width plays no part


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    if hasattr(parser, "color"):  # Python 3.14 colours help on a terminal or under FORCE_COLOR
        parser.color = False
    return parser.format_help()


def render_help() -> str:
    """`vcloud --help`, then `vcloud <command> --help` of every command in the parser's order."""
    from vcloud.cli import build_parser

    parser = build_parser()
    sections = [("vcloud --help", parser)]
    sections += [(f"vcloud {name} --help", sub) for name, sub in _subcommands(parser).items()]
    return "\n".join(f"===== {title} =====\n{_help(p)}" for title, p in sections)


def render_reference() -> str:
    from vcloud.reference import cli_page

    return cli_page()


def _same(path: Path, text: str) -> None:
    golden = path.read_text()
    if text == golden:
        return
    diff = difflib.unified_diff(
        golden.splitlines(keepends=True), text.splitlines(keepends=True), str(path.relative_to(ROOT)), "the parser now"
    )
    shown = "".join(list(diff)[:200])
    raise AssertionError(
        f"{path.name} differs from what the command line prints now; if the change is on purpose, "
        f"regenerate it with `{REGENERATE}` and commit the diff:\n{shown}"
    )


def test_help_of_every_command_is_the_golden_one():
    _same(HELP_FILE, render_help())


def test_generated_reference_page_is_the_golden_one():
    _same(REFERENCE_FILE, render_reference())


def _modules() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(), filename=str(path)) for path in sorted(PACKAGE.glob("*.py"))}


def test_no_function_of_the_package_is_longer_than_80_lines():
    long = [
        f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)


def _declared() -> dict[str, list[str]]:
    """command -> the modules with a literal `.add_parser("command", ...)`."""
    found: dict[str, list[str]] = {}
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_parser"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.setdefault(node.args[0].value, []).append(name)
    return found


def test_every_command_is_declared_in_one_module_beside_its_run_function():
    from vcloud.cli import build_parser

    commands = list(_subcommands(build_parser()))
    declared = _declared()
    assert sorted(declared) == sorted(commands), "commands not declared by a literal add_parser(name)"
    twice = {command: modules for command, modules in declared.items() if len(modules) != 1}
    assert not twice, f"declared in more than one module: {twice}"
    for command, (module,) in declared.items():
        functions = {node.name for node in _modules()[module].body if isinstance(node, ast.FunctionDef)}
        run = "run_" + command.replace("-", "_")
        assert run in functions, f"{module} declares `{command}` but has no {run}()"


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: {REGENERATE}")
    GOLDEN.mkdir(exist_ok=True)
    for path, text in ((HELP_FILE, render_help()), (REFERENCE_FILE, render_reference())):
        path.write_text(text)
        print(f"{path}: written ({len(text.splitlines())} lines)")
