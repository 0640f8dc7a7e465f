#!/usr/bin/env python3
"""The developer guide's size rules: no source file over 800 lines, no function over 150 lines
outside CUDA kernels (__global__ functions). Lists every offender; exits 1 when there is one.

    python3 scripts/check_sizes.py              # check the repository this script is in
    python3 scripts/check_sizes.py --self-test  # the detector on made-up sources

C++/CUDA functions are found by matching braces with comments, strings and preprocessor lines
removed: a brace at namespace or class scope whose header has a parameter list opens a function
(its length runs from the header's first line to the closing brace). Python functions come from
the ast module. Run by ctest as source_sizes and source_sizes_self_test.
"""
import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
CPP_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".cc"}
CHECKED_SUFFIXES = CPP_SUFFIXES | {".py", ".sh", ".cmake"}


SOURCE_DIRS = ("src", "include", "tests", "python", "scripts", "cmake", "bench")


def source_files(root):
    """The tracked files (git ls-files), or without git the files under SOURCE_DIRS."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
        names = [Path(name) for name in listed.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        names = [Path("CMakeLists.txt")] + [path.relative_to(root) for folder in SOURCE_DIRS
                                            for path in sorted((root / folder).rglob("*"))]
    for path in names:
        if (path.suffix in CHECKED_SUFFIXES or path.name == "CMakeLists.txt") and (root / path).is_file():
            yield path


def strip_cpp(text):
    """Blanks comments, string and character literals and preprocessor lines, keeping newlines."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            while i < n and text[i] != "\n":  # a directive, continued lines included
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
            continue
        raw = re.match(r'R"([^(\s]*)\(', text[i:i + 20])
        if raw:
            end = text.find(")" + raw.group(1) + '"', i)
            end = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):  # digit separator 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


ATTRIBUTES = {"__launch_bounds__", "__align__", "alignas", "decltype", "noexcept"}
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return|try)\b")
AGGREGATE = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace|class|struct|union|enum|extern\s*\"\")\b", re.S)


def without_template_head(header):
    """The declaration after any leading template<...> parameter lists (which may hold '=')."""
    while True:
        match = re.match(r"\s*template\s*<", header)
        if not match:
            return header
        depth, i = 1, match.end()
        while i < len(header) and depth:
            depth += {"<": 1, ">": -1}.get(header[i], 0)
            i += 1
        header = header[i:]


def cpp_functions(text):
    """(name, first line, last line, is_kernel) of each function defined at namespace or class scope."""
    code = strip_cpp(text)
    scopes = []  # 'scope' (namespace, class, extern block) or 'function' / 'other'
    header_start = 0  # offset where the current declaration's text begins
    functions = []
    function_start = None
    for i, c in enumerate(code):
        if c in ";}":
            if c == "}" and scopes:
                kind, start, header = scopes.pop()
                if kind == "function" and not any(k == "function" for k, _, _ in scopes):
                    functions.append((header, start, code.count("\n", 0, i) + 1))
            header_start = i + 1
        elif c == "{":
            header = code[header_start:i]
            inside_function = any(k == "function" for k, _, _ in scopes)
            if inside_function:
                scopes.append(("other", 0, ""))
            elif AGGREGATE.match(header) and "(" not in header.split("{")[0].split(":")[0]:
                scopes.append(("scope", 0, ""))
            elif ("(" in header and ")" in header and not CONTROL.match(header)
                  and "=" not in without_template_head(header).split("(")[0]):
                first = header_start + len(header) - len(header.lstrip())
                scopes.append(("function", code.count("\n", 0, first) + 1, " ".join(header.split())))
            else:
                scopes.append(("other", 0, ""))
            header_start = i + 1
    result = []
    for header, first, last in functions:
        names = [n for n in re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", header) if n not in ATTRIBUTES]
        result.append((names[0] if names else header[:40], first, last, "__global__" in header))
    return result


def python_functions(text):
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [(node.name, node.lineno, node.end_lineno, False) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def offenders(root):
    found = []
    for path in source_files(root):
        text = (root / path).read_text(errors="replace")
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > MAX_FILE_LINES:
            found.append(f"{path}: {lines} lines (at most {MAX_FILE_LINES})")
        if path.suffix in CPP_SUFFIXES:
            functions = cpp_functions(text)
        elif path.suffix == ".py":
            functions = python_functions(text)
        else:
            continue
        for name, first, last, is_kernel in functions:
            length = last - first + 1
            if length > MAX_FUNCTION_LINES and not is_kernel:
                found.append(f"{path}:{first}: function {name} is {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def self_test():
    """The detector on made-up sources: a check that cannot fail would be no check."""
    lines = lambda n, text: text * n
    cpp = ("// { not a brace\n#define X {\nnamespace a {\nstruct S {\n  int long_member(int v = 1) const {\n"
           + lines(150, '    v += "}";\n') + "    return v;\n  }\n};\ntemplate <int N = 2>\nint short_one() { return N; }\n"
           "__global__ void __launch_bounds__(256) kernel(int* p) {\n" + lines(200, "  p[0] = '{';\n") + "}\n}\n")
    found = {name: (last - first + 1, kernel) for name, first, last, kernel in cpp_functions(cpp)}
    expected = {"long_member": (153, False), "short_one": (2, False), "kernel": (202, True)}
    python = "def f():\n" + lines(151, "    x = 1\n")
    ok = found == expected and [(n, b - a + 1) for n, a, b, _ in python_functions(python)] == [("f", 152)]
    print("self-test", "passed" if ok else f"FAILED: {found}")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--self-test", action="store_true", help="check the detector on made-up sources")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    found = offenders(args.root)
    for message in found:
        print(message)
    print(f"{len(found)} offenders")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
