"""The formatter owns layout: a `# fmt` skip (or off) comment only where a table's column alignment
carries meaning. A file may hold as many as .fmt-skip-allowed gives it, one line a file:

    path: count: why the alignment matters

Any other fails, named path:line; so does an allowance the file no longer uses (lower it). Run by
pre-commit (hence CI) and by tests/unit/test_fmt_skip.py:

    python3 tests/tools/check_fmt_skip.py [--allowed FILE] [PATH ...]   # default: src tests bench docs
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ROOT / ".fmt-skip-allowed"
FOLDERS = ("src", "tests", "bench", "docs")
PRAGMA = re.compile(r"\bfmt:\s*(skip|off)\b|\byapf:\s*disable\b")  # what ruff format obeys
NAME = "# fmt" + ": skip"  # spelled apart, so that a grep for the pragma finds only real ones


def read_allowed(path: Path) -> dict[str, int]:
    """{path from the root: count}; a line without a count and a reason is an error."""
    allowed = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, count, reason = (part.strip() for part in [*line.split(":", 2), "", ""][:3])
        if not count.isdigit() or not reason:
            raise SystemExit(f"{path}:{number}: expected 'path: count: reason', got {line!r}")
        allowed[name] = int(count)
    return allowed


def pragma_lines(file: Path) -> list[int]:
    """Line numbers of the comments that stop ruff format (not the words inside a string)."""
    tokens = tokenize.generate_tokens(io.StringIO(file.read_text()).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and PRAGMA.search(t.string)]


def name_of(file: Path) -> str:
    resolved = file.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(file)


def problems(paths: list[Path], allowed: dict[str, int]) -> list[str]:
    """One line per pragma beyond its file's allowance, and per allowance its file no longer uses."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py*")))]
    found = {name_of(f): pragma_lines(f) for f in files if f.suffix in (".py", ".pyi")}
    out = []
    for name, lines in sorted(found.items()):
        if len(lines) > allowed.get(name, 0):
            out += [
                f"{name}:{n}: {NAME} not allowed ({len(lines)} in the file, {allowed.get(name, 0)} in "
                ".fmt-skip-allowed): let ruff format lay it out, or list a table whose alignment matters"
                for n in lines
            ]
    for name, count in sorted(allowed.items()):
        if not (ROOT / name).is_file():
            out.append(f".fmt-skip-allowed: {name}: no such file")
        elif name in found and len(found[name]) < count:
            out.append(f".fmt-skip-allowed: {name}: allows {count}, the file has {len(found[name])}: lower it")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allowed", type=Path, default=ALLOWED, help="the allow-list (default: %(default)s)")
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / f for f in FOLDERS])
    args = parser.parse_args(argv)
    found = problems([p for p in args.paths if p.exists()], read_allowed(args.allowed))
    print("\n".join(found), end="\n" if found else "")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
