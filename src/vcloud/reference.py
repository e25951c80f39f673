"""The manual's reference pages, generated from the code so they cannot drift: the command line
from the argparse parser (vcloud.cli.build_parser) and the workflow config from its JSON schema
(workflow/schemas/config.schema.yaml) with the values of config/config.yaml.

docs/hooks.py calls these when mkdocs builds the site; nothing here runs on import.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help or "" for choice in action._choices_actions}


def cli_page() -> str:
    """Markdown: one section per `vcloud` subcommand with its one-line help and its --help text."""
    from vcloud.cli import build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    helps = _helps(parser)
    lines = [
        "# Command line reference",
        "",
        "Generated from the argparse parser (`vcloud.cli.build_parser`) when the site is built;",
        "`vcloud <command> --help` prints the same text. Every rule of the workflow calls one of",
        "these commands; they also run by hand.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| [`{name}`](#{name}) | {helps.get(name, '')} |" for name in commands]
    for name, sub in commands.items():
        sub.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        lines += ["", f"## {name}", "", helps.get(name, ""), "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _resolve(node, defs: dict):
    """The schema with every `$ref` replaced by its definition, which keeps its name under `ref`."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return {**_resolve(defs[name], defs), "ref": name}
    return {key: _resolve(value, defs) for key, value in node.items()}


def _type_of(node: dict) -> str:
    if "enum" in node:
        return " or ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "oneOf" in node:
        return " or ".join(_type_of(option) for option in node["oneOf"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(kinds)
    if "array" in kinds and isinstance(node.get("items"), dict):
        text += f" of {_type_of(node['items'])}"
    bounds = [
        f"{symbol} {node[key]}"
        for key, symbol in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
        if key in node
    ]
    if "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(value) -> str:
    if isinstance(value, dict) and value and all(not isinstance(v, dict | list) for v in value.values()):
        return ", ".join(f"{k}: `{json.dumps(v)}`" for k, v in value.items())
    if isinstance(value, dict | list) and len(json.dumps(value)) > 60:
        return "see `config/config.yaml`"
    return f"`{json.dumps(value)}`"


def _rows(node: dict, defaults: dict, prefix: str) -> list[str]:
    """One table row per key under `node`, sections first then their keys, depth first."""
    rows = []
    required = set(node.get("required", []))
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        section = child.get("type") == "object" and "properties" in child and "ref" not in child
        if section:
            kind, shown = "section", ""
        else:
            kind = (
                f"[{child['ref'].replace('_', ' ')}](#{child['ref'].replace('_', '-')})"
                if "ref" in child and "properties" in child
                else _type_of(child)
            )
            if key in defaults:
                shown = _value(defaults[key])
            elif "default" in child:
                shown = _value(child["default"]) + " (schema)"
            else:
                shown = ""
        need = "yes" if key in required else ""
        rows.append(f"| `{path}` | {_cell(kind)} | {need} | {_cell(shown)} | {_cell(child.get('description', ''))} |")
        if section:
            sub_defaults = defaults.get(key) if isinstance(defaults.get(key), dict) else {}
            rows += _rows(child, sub_defaults, f"{path}.")
        elif child.get("type") == "object" and isinstance(child.get("additionalProperties"), dict):
            inner = child["additionalProperties"]
            if "properties" in inner:
                rows += _rows(inner, {}, f"{path}.<name>.")
    return rows


HEADER = ["| key | type | required | default | what |", "| --- | --- | --- | --- | --- |"]


def config_page(schema_path: Path | None = None, default_path: Path | None = None) -> str:
    """Markdown: every key of the workflow config (dotted path, type, required, default, what)."""
    import yaml

    schema_path = schema_path or REPO / "workflow/schemas/config.schema.yaml"
    default_path = default_path or REPO / "config/config.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    defaults = yaml.safe_load(default_path.read_text())
    defs = schema.get("$defs", {})
    lines = [
        "# Config reference",
        "",
        "Every key of the workflow config, generated from `workflow/schemas/config.schema.yaml`",
        "when the site is built. *default* is the value in `config/config.yaml` (the embedded",
        "default), or the schema's own default where that file leaves the key out. An unknown,",
        "missing or mistyped key stops a run with one line naming it. How to override keys, and",
        "the model configs (`config/models/*.yaml`): [Configuration](configuration.md).",
        "",
        *HEADER,
        *_rows(_resolve({k: v for k, v in schema.items() if k != "$defs"}, defs), defaults, ""),
    ]
    for name, definition in defs.items():
        if definition.get("type") == "object" and "properties" in definition:
            lines += ["", f"## {name.replace('_', ' ')}", "", *HEADER, *_rows(_resolve(definition, defs), {}, "")]
    return "\n".join(lines) + "\n"


def _message(node) -> str | None:
    """The text of an error's message argument; `{...}` where the code fills in a value."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}" for v in node.values
        )
    if isinstance(node, ast.BinOp):
        left, right = _message(node.left), _message(node.right)
        return None if left is None and right is None else (left or "{...}") + (right or "{...}")
    return None


def error_messages(package: Path | None = None) -> list[tuple[str, str, str]]:
    """(module, error class, message) of every `raise ConfigError(...)` / `raise BadInputError(...)`."""
    import ast

    package = package or Path(__file__).resolve().parent
    found = []
    for path in sorted(package.rglob("*.py")):
        module = "vcloud." + ".".join(path.relative_to(package).with_suffix("").parts)
        raises = [n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Raise)]
        for node in sorted(raises, key=lambda n: (n.lineno, n.col_offset)):
            call = node.exc
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.args):
                continue
            if call.func.id in ("ConfigError", "BadInputError"):
                text = _message(call.args[0])
                found.append(
                    (module, call.func.id, text if text is not None else "{" + ast.unparse(call.args[0]) + "}")
                )
    return found


def errors_page(intro: str = "") -> str:
    """Markdown: every one-line error of the package, by module, as the code words it."""
    lines = [
        "# Every error message",
        "",
        "Generated from the source when the site is built: each `raise ConfigError(...)` (a config",
        "key or file is wrong: fix the config) and `raise BadInputError(...)` (an input file or flag is",
        "wrong: fix or regenerate the input) of `src/vcloud/`, as the code words it; `{...}` is filled",
        "in with the file, key or value at run time. Each prints as one line and exits with status 2.",
        "What to do for the common ones: [Troubleshooting](troubleshooting.md).",
    ]
    current = None
    for module, kind, message in error_messages():
        if module != current:
            current = module
            lines += ["", f"## {module}", "", "| kind | message |", "| --- | --- |"]
        shown = _cell(message).replace("`", "'")
        lines.append(f"| {'config' if kind == 'ConfigError' else 'input'} | `{shown}` |")
    return "\n".join(lines) + "\n"
