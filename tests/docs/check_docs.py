#!/usr/bin/env python3
"""Limits and citations of the user-facing docs (issue 55), checked without a build:
README.md fits on a page (at most 200 lines), bench/results keeps at most 60 files, every file
there is described in bench/results/README.md, and every result file README.md or docs/results.md
cites exists (older files are cited from git history with a commit, in the other docs only)."""
import itertools
import pathlib
import re
import sys

MAX_README_LINES = 200
MAX_RESULT_FILES = 60


def expand_braces(pattern):
    """`a-{b,c}.{json,txt}` -> the four names, as the docs abbreviate sibling files."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return list(itertools.chain.from_iterable(
        expand_braces(pattern[:m.start()] + alt + pattern[m.end():]) for alt in m.group(1).split(",")))


def main(root):
    root = pathlib.Path(root)
    results = root / "bench" / "results"
    errors = []

    readme_lines = (root / "README.md").read_text().count("\n")
    if readme_lines > MAX_README_LINES:
        errors.append(f"README.md has {readme_lines} lines, more than {MAX_README_LINES}: "
                      "move detail into docs/")

    files = sorted(p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file())
    if len(files) > MAX_RESULT_FILES:
        errors.append(f"bench/results holds {len(files)} files, more than {MAX_RESULT_FILES}: keep a "
                      "run's summary, leave the rest to git history")

    # Every kept file is described in bench/results/README.md (by its name, braces allowed).
    index = (results / "README.md").read_text()
    named = set()
    for token in re.findall(r"`([^`\s]+)`", index):
        named.update(expand_braces(token))
    for f in files:
        if f != "README.md" and f not in named and f.split("/", 1)[-1] not in named:
            errors.append(f"bench/results/{f} is not described in bench/results/README.md")

    # The current-results documents cite only files that are here.
    cite = re.compile(r"bench/results/[A-Za-z0-9_.{},/*-]+")
    for doc in ("README.md", "docs/results.md"):
        path = root / doc
        if not path.exists():
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for token in cite.findall(line):
                for name in expand_braces(token.rstrip(".,;:")):
                    if not (any(root.glob(name)) if "*" in name else (root / name).exists()):
                        errors.append(f"{doc}:{n}: cites {name}, which is not in the tree")

    for e in errors:
        print(e)
    print(f"README.md {readme_lines} lines, bench/results {len(files)} files: "
          f"{'FAIL' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]))
