"""The user's documentation says only what exists: the README, the pages under docs/, the package READMEs and
benchmarks/README.md.

Which names count as a file path of the repository (checked to exist):
- a markdown link to a relative target, `[text](target)`, resolved against the linking file's folder; a `#anchor`
  on it must be a heading of the target page (GitHub's slugs). Links to URLs (`scheme:`) are not checked.
- a backticked token that starts with one of the repository's versioned folders (`audit/`, `src/`, `workspace/`,
  `docs/`, `benchmarks/`, `tests/`, `tools/`, `plan/`) or is one of its top-level files (`README.md`, `Makefile`,
  `cifar10_PM.py`, `requirements.txt`, `pytest.ini`), resolved against the repository root. A backticked span
  that is a command is split on whitespace and each token checked the same way.
- in a package's README, a backticked file name that does not start with a versioned folder (`steps.py`,
  `config/steps.py`) is a file of that package: a bare name anywhere in its folder tree, a path from its folder.
Not checked: tokens with a placeholder or a glob (`<`, `>`, `*`, `{`, `NNNN`, `...`), names quoted inside an error
message (they start with a quote), and paths under the folders a run writes (`reports/`, `runs/`, `save/`, `logs/`,
`cert/`, `data/`, `<log_dir>/...`): they exist only after a run.
A reference to a section, `file.md`, "Heading", must name a heading of that file.

The same for the code, the plan and the build files: every `docs/....md` and `benchmarks/...` path the code of
`src/`, `audit/`, `workspace/`, `tools/` or `cifar10_PM.py` names exists; every path under a versioned folder that a
comment or docstring of any `.py` file (tests and benchmarks too), the plan's `.yaml` files, the Makefile, `.ci/run`
or `pytest.ini` names exists (a module may be named without `.py`, or with a function after it:
`workspace/in_process.run_in_process`; `plan/defaults/...` is OpenFL's, in its installed workspace template); and none
of them points at a section of the README (`README "Section"`) or of a page (`file.md, "Section"`) that is not there.

Every fenced block of the README and docs/ says in its info string whether `make docs-check` runs it
(tools/docs_check.py: shell, python, yaml; text and console are not run), and its markers are well-formed.

Also: the README is a short user's guide (at most 250 lines), its quick start runs Makefile targets that exist, its
flag table lists exactly the flags `cifar10_PM.py` parses, and nothing in these files names a commit or an issue.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import fields as dataclasses_fields
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PACKAGES = ("audit", "audit/membership", "audit/fidel", "audit/deanon", "audit/canary", "audit/received_model",
            "audit/verdict", "audit/reporting", "audit/config", "audit/aggregator_report", "src", "src/data", "src/runner", "src/server",
            "src/plan", "src/process", "workspace")
PACKAGE_READMES = [ROOT / p / "README.md" for p in PACKAGES]
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *PACKAGE_READMES, ROOT / "benchmarks" / "README.md",
         ROOT / "tests" / "README.md"]
VERSIONED = ("audit/", "src/", "workspace/", "docs/", "benchmarks/", "tests/", "tools/", "plan/")
TOP_FILES = ("README.md", "Makefile", "cifar10_PM.py", "requirements.txt", "pytest.ini")
PLACEHOLDER = re.compile(r"[<>*{}]|NNNN|\.\.\.")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")  # an inline code span may wrap onto the next line
SECTION_REF = re.compile(r"`?([\w./-]+\.md)`?,? \"([^\"]+)\"")
CODE_DIRS = ("src", "audit", "workspace", "tools")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _unwrapped(section: str) -> str:
    """A section's name as its heading has it: a reference may wrap onto the next line, of a page, a docstring or a
    comment (whose next line starts with `#`)."""
    return " ".join(re.sub(r"\n\s*#", "\n", section).split())


def _prose(text: str) -> str:
    """The text without fenced code blocks (commands and output, checked on their own where it matters)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _headings(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", _prose(_text(path)), flags=re.M)]


def _path_tokens(span: str) -> list[str]:
    tokens = []
    for token in span.split():
        token = token.rstrip(".,;:)")
        if PLACEHOLDER.search(token) or token[:1] in "'\"(":
            continue
        if token.startswith(VERSIONED) or token in TOP_FILES:
            tokens.append(token)
    return tokens


def _resolved(pointer: str) -> Path | None:
    """The file or folder a pointer names, if it exists: the path itself, a module named without `.py`
    (`src/dataloader`), a module with a function after it (`workspace/in_process.run_in_process`), or one of OpenFL's
    `plan/defaults/` files in its installed workspace template (where OpenFL reads a section's `defaults:` from)."""
    from src.plan.openfl_sections import openfl_defaults_root

    pointer = pointer.rstrip("/")
    candidates = [ROOT / pointer, ROOT / f"{pointer}.py"]
    if "." in Path(pointer).name:
        candidates.append(ROOT / f"{pointer.rsplit('.', 1)[0]}.py")
    openfl = openfl_defaults_root()
    if pointer.startswith("plan/defaults") and openfl is not None:
        candidates.append(openfl / pointer)
    return next((c for c in candidates if c.exists()), None)


def _named_paths(page: Path):
    """(name as written, the path it must be) for every file path the page names (the module docstring's rule)."""
    text = _text(page)
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        yield target, page.parent / target.split("#")[0]
    package = page.parent if page in PACKAGE_READMES else None
    for span in CODE.findall(_prose(text)):
        for token in _path_tokens(span):
            yield token, _resolved(token) or ROOT / token
        name = span.strip()
        in_package = package is not None and not name.startswith(VERSIONED) and name not in TOP_FILES
        if in_package and re.fullmatch(r"[\w./-]+\.(py|html|md)", name):
            found = [p for p in package.rglob(name) if "__pycache__" not in p.parts] if "/" not in name else []
            yield name, found[0] if found else package / name


def test_every_page_and_package_readme_exists():
    missing = [str(p.relative_to(ROOT)) for p in PAGES if not p.is_file()]
    assert not missing, f"missing: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    if not page.is_file():
        pytest.skip("missing; test_every_page_and_package_readme_exists says so")
    missing = sorted({name for name, path in _named_paths(page) if not path.exists()})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.is_file()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_anchor_and_section_a_page_names_exists(page):
    text = _text(page)
    wrong = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        file, anchor = target.split("#", 1)
        linked = page if not file else page.parent / file
        if linked.suffix == ".md" and linked.is_file() and anchor not in {_slug(h) for h in _headings(linked)}:
            wrong.append(target)
    for file, section in SECTION_REF.findall(_prose(text)):
        section = _unwrapped(section)
        linked = ROOT / file if (ROOT / file).is_file() else page.parent / file
        if linked.is_file() and not any(section in h for h in _headings(linked)):
            wrong.append(f'{file}, "{section}"')
    assert not wrong, f"{page.relative_to(ROOT)}: no such heading: {wrong}"


def test_the_readme_is_a_short_guide():
    lines = _text(README).splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the user's guide keeps to 250 (the rest: docs/)"


def _hex_candidates(text: str) -> set[str]:
    return {t for t in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", t) and re.search(r"\d", t)}


def _doc_pages():
    return [README, *sorted((ROOT / "docs").glob("*.md")), *(p for p in PACKAGE_READMES if p.is_file())]


def test_no_issue_is_named():
    found = [f"{page.relative_to(ROOT)}: {m.group(0)!r}" for page in _doc_pages()
             for m in re.finditer(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", _text(page), re.I)]
    assert not found, f"issue references: {found}"


def test_no_commit_is_named():
    candidates: dict[str, list[str]] = {}
    for page in _doc_pages():
        for token in _hex_candidates(_text(page)):
            candidates.setdefault(token, []).append(str(page.relative_to(ROOT)))
    if not candidates or shutil.which("git") is None or not (ROOT / ".git").exists():
        return
    answer = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, input="\n".join(candidates) + "\n",
                            capture_output=True, text=True, check=True).stdout.splitlines()
    commits = [f"{token} in {candidates[token]}" for token, line in zip(candidates, answer)
               if not line.endswith("missing")]
    assert not commits, f"git objects named in the docs: {commits}"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):(?!=)", _text(ROOT / "Makefile"), flags=re.M))


def test_the_quick_start_runs_makefile_targets_that_exist():
    quick = _section(_text(README), "Quick start")
    commands = re.findall(r"^make (\S+)", "\n".join(re.findall(r"^```(?:sh)?\n(.*?)^```", quick, flags=re.S | re.M)),
                          re.M)
    assert {"demo", "test"} <= set(commands), f"the quick start's commands: {commands}"
    targets = _makefile_targets()
    assert set(commands) <= targets, f"not Makefile targets: {set(commands) - targets}"
    mentioned = set(re.findall(r"`make ([\w-]+)`", _text(README)))
    assert mentioned <= targets, f"the README names Makefile targets that do not exist: {mentioned - targets}"


def test_the_flag_table_lists_exactly_the_demos_flags():
    import cifar10_PM

    parser = cifar10_PM.build_parser()
    parsed = {option for action in parser._actions for option in action.option_strings} - {"-h", "--help"}
    table = _section(_text(README), "The demo's flags")
    rows = [line for line in table.splitlines() if line.startswith("| `-")]
    listed = [flag for row in rows for flag in re.findall(r"`(--[\w-]+)`", row.split("|")[1])]
    assert len(listed) == len(set(listed)), f"listed twice: {[f for f in listed if listed.count(f) > 1]}"
    assert set(listed) == parsed, (f"missing from the table: {sorted(parsed - set(listed))}; "
                                   f"not flags of cifar10_PM.py: {sorted(set(listed) - parsed)}")


def _code_files():
    yield ROOT / "cifar10_PM.py"
    for folder in CODE_DIRS:
        yield from (p for p in (ROOT / folder).rglob("*.py") if "shipped" not in p.parts)


def _text_files():
    """Every .py file of the repository (tests and benchmarks too), the plan's .yaml files and the build files."""
    yield ROOT / "cifar10_PM.py"
    for folder in (*CODE_DIRS, "tests", "benchmarks"):
        yield from (p for p in (ROOT / folder).rglob("*.py") if "shipped" not in p.parts and "__pycache__" not in p.parts)
    yield from sorted((ROOT / "plan").rglob("*.yaml"))
    yield from (ROOT / name for name in ("Makefile", ".ci/run", "pytest.ini", "requirements.txt"))


POINTER = re.compile(r"(?<![\w./'\"-])((?:audit|src|workspace|docs|benchmarks|tests|tools|plan)/[\w./-]*\w)")
TRIPLE_QUOTED = re.compile(r"(\"\"\"|\'\'\')(.*?)\1", re.S)


def _pointers(path: Path):
    """(line, pointer, the text around it) for every path under a versioned folder that a file says to its reader:
    in a .py file its comments and triple-quoted strings (docstrings; its other strings are data, e.g. the wrong
    paths a test feeds in), in the others every line. A regular expression, not a parse: the suite reads ~300 files."""
    text = _text(path)
    quoted = [m.span(2) for m in TRIPLE_QUOTED.finditer(text)] if path.suffix == ".py" else None
    for match in POINTER.finditer(text):
        if quoted is not None:
            line_start = text.rfind("\n", 0, match.start()) + 1
            in_comment = "#" in text[line_start:match.start()]
            if not in_comment and not any(a <= match.start() < b for a, b in quoted):
                continue
        yield text.count("\n", 0, match.start()) + 1, match.group(1), text[max(0, match.start() - 1):match.end() + 1]


def test_every_path_the_code_the_plan_and_the_build_files_name_exists():
    wrong = []
    for path in _text_files():
        if not path.is_file():
            continue
        name = str(path.relative_to(ROOT))
        for line, pointer, around in _pointers(path):
            if not PLACEHOLDER.search(around) and _resolved(pointer) is None:
                wrong.append(f"{name}:{line}: {pointer} does not exist")
    assert not wrong, "\n".join(wrong)


def test_the_code_points_at_docs_that_exist():
    readme_headings = _headings(README)
    wrong = []
    code = set(_code_files())
    others = [p for p in _text_files() if p not in code and p.is_file() and p != Path(__file__).resolve()]
    for path in [*code, *others]:  # (this file names the forms it checks)
        text = _text(path)
        name = str(path.relative_to(ROOT))
        for ref in re.findall(r"\b((?:docs|benchmarks)/[\w./-]*\w)", text) if path in code else ():
            if not PLACEHOLDER.search(ref) and not (ROOT / ref).exists():
                wrong.append(f"{name}: {ref} does not exist")
        text = text.replace('\\"', '"')
        for section in re.findall(r'README "([^"]+)"', text):
            section = _unwrapped(section)
            if not any(section in h for h in readme_headings):
                wrong.append(f'{name}: README "{section}" is no section of the README')
        for file, section in SECTION_REF.findall(text):
            section = _unwrapped(section)
            if (ROOT / file).is_file() and not any(section in h for h in _headings(ROOT / file)):
                wrong.append(f'{name}: {file}, "{section}" is no section of {file}')
    assert not wrong, "\n".join(wrong)


# A dotted name in a comment or a string of the code that names a module of the project (audit.config.gate,
# src.runner.models.build_model, "audit.membership.step:run"), and a path of the repository (audit/reporting/party.py).
_DOTTED = re.compile(r"(?<![\w./-])((?:audit|src|workspace|tools)(?:[.:][A-Za-z_]\w*)+)")
_REPO_PATH = re.compile(r"(?<![\w./-])((?:audit|src|workspace|tools|benchmarks|tests|docs)/[\w./-]*\w)")
_FILE_WORDS = (".py", ".md", ".json", ".csv", ".png", ".yaml", ".txt", ".html", ".npz", ".pbuf")


def _modules() -> dict[str, Path]:
    out = {}
    for path in [ROOT / "cifar10_PM.py", *(p for d in (*CODE_DIRS, "benchmarks") for p in (ROOT / d).rglob("*.py"))]:
        if "shipped" in path.parts:
            continue
        name = str(path.relative_to(ROOT))[:-3].replace("/", ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def _names_defined(path: Path) -> dict[str, set[str] | None]:
    """A module's top-level names (definitions, assignments, imports; a lazily exported name of a package's
    __init__), each class with the names its body defines."""
    import ast

    tree = ast.parse(_text(path))
    names: dict[str, set[str] | None] = {k: None for k in re.findall(r'"(\w+)":\s*"audit\.', _text(path))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node in tree.body:
            names[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
                t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.setdefault(node.name, None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update({n.id: names.get(n.id) for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    return names


@pytest.mark.slow  # tokenizes every file of the code
def test_the_code_points_at_modules_and_files_that_exist():
    """Every module, name or file of the project a comment or string of the code names exists (a moved module leaves
    no pointer behind). A plan key written like a module (`audit.sample_size`, `audit.rmia.references`) is not one."""
    import io
    import tokenize

    from audit.config.audit_settings import AuditSettings

    modules, defined = _modules(), {}
    plan_keys = {f.name for f in dataclasses_fields(AuditSettings)} | set(AuditSettings.plan_sections())
    wrong = []

    def resolves(dotted: str) -> bool:
        parts = dotted.replace(":", ".").split(".")
        for i in range(len(parts), 0, -1):
            module = ".".join(parts[:i])
            if module in modules:
                rest = parts[i:]
                if not rest:
                    return True
                names = defined.setdefault(module, _names_defined(modules[module]))
                inner = names.get(rest[0], ...) if rest[0] in names else ...
                return inner is not ... and (len(rest) == 1 or inner is None or rest[1] in inner)
        return False

    for path in [*_code_files(), *(ROOT / "benchmarks").glob("*.py")]:
        name = str(path.relative_to(ROOT))
        for token in tokenize.generate_tokens(io.StringIO(_text(path)).readline):
            if token.type not in (tokenize.COMMENT, tokenize.STRING):
                continue
            for dotted in _DOTTED.findall(token.string):
                parts = dotted.replace(":", ".").split(".")
                if dotted.endswith(_FILE_WORDS) or resolves(dotted):
                    continue
                plan_key = parts[0] == "audit" and parts[1] in plan_keys  # task_runner.settings.audit.<key>
                variable = parts[0] == "src" and not any(m.startswith(f"src.{parts[1]}") for m in modules)
                if not (plan_key or variable):
                    wrong.append(f"{name}:{token.start[0]}: {dotted}")
            for ref in _REPO_PATH.findall(token.string):
                # a path: a file name with its extension, or a folder and what is in it ("audit/train" is a ratio)
                if PLACEHOLDER.search(ref) or ("." not in ref.rsplit("/", 1)[-1] and ref.count("/") < 2):
                    continue
                if not any((ROOT / candidate).exists() for candidate in (ref, ref + ".py")):
                    wrong.append(f"{name}:{token.start[0]}: {ref}")
    assert not wrong, "pointers to nothing:\n" + "\n".join(wrong)


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_says_whether_docs_check_runs_it(page):
    """The fence's info string and the markers are ones `make docs-check` reads (tools/docs_check.py); a python block
    that is a file names one under the workspace; a yaml block is a fragment of the plan (its sections)."""
    import yaml

    from tools.docs_check import PLAN, read_blocks

    sections = set(yaml.safe_load(_text(ROOT / "plan" / "plan.yaml")))
    blocks = read_blocks(page, ROOT)  # DocsError naming the line otherwise
    for block in blocks:
        if block.file is not None:
            assert not Path(block.file).is_absolute() and ".." not in Path(block.file).parts, block.where
        if block.kind == PLAN and block.runs:
            fragment = yaml.safe_load("\n".join(block.body))
            assert isinstance(fragment, dict) and set(fragment) <= sections, f"{block.where}: not a plan fragment"
