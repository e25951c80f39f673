"""mkdocs hook: the reference pages generated at build time, never kept by hand.

- cli.md: every `vcloud` subcommand from the argparse parser (vcloud.reference.cli_page)
- config-reference.md: every workflow config key from workflow/schemas/config.schema.yaml
- configuration.md: config/README.md (the snakemake-workflows catalog keeps it beside the configs)
- errors.md: every one-line error of the package, from its source (vcloud.reference.errors_page)
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]


def on_files(files, config):
    from vcloud.reference import cli_page, config_page, errors_page

    configuration = (REPO / "config" / "README.md").read_text()
    configuration = configuration.replace("(see the main README)", "(see [Using vcloud](usage.md#as-a-module))")
    pages = {
        "cli.md": cli_page(),
        "config-reference.md": config_page(),
        "configuration.md": configuration,
        "errors.md": errors_page(),
    }
    for name, content in pages.items():
        files.append(File.generated(config, name, content=content))
    return files
