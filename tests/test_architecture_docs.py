"""The worked examples of docs/architecture.md (and of docs/blocks.md, should it get any) are true: each,
applied as the page says in its own temporary copy of the repository, gives a method that the page's
commands test with the promised result, a regenerated docs/recipes.md, and code that passes ruff; and it
touches only the files the checklist allows ("Adding a method: the checklist": the block file, its import
line in its package's ``__init__.py``, the record in ``fairseq_idpg/methods.py``, a ``roberta_prompt``
method's count formula in tests/test_dpt.py, a ``roberta_blocks`` block's formula in
tests/test_block_placement.py, docs/recipes.md). There is one for every architecture of the frozen-backbone
records; those of ``roberta_prompt`` and ``roberta_blocks`` add a new block.

An example is a section ``### Worked example: TITLE (`ARCH`)`` whose steps are fenced blocks whose first
line is ``# N. what: PATH`` (a new file is written; an existing one gets the block appended, except a
block whose ``what`` says "added to the import line": its names join the file's last import line of that
module, and one whose ``what`` says "an entry of NAME": its lines go at the end of the dict literal
``NAME = {...}``), then one ``sh`` block of commands, each run in the copy; a ``# K passed`` comment is the pytest
result the page promises. When a page and the code drift apart, this fails.
"""

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = (REPO / "docs" / "architecture.md", REPO / "docs" / "blocks.md")
EXAMPLE = re.compile(r"^### Worked example: (.*?) \(`(\w+)`\)\n(.*?)(?=^##)", re.M | re.S)
COPIED = ("fairseq_idpg", "tests", "scripts", "docs", "pyproject.toml", "setup.py", "fairseq_idpg_compat.py")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
STEP = re.compile(r"# (\d+)\. ([^\n]*?)(?:: (\S+))?\n")
IMPORT = re.compile(r"^from (\S+) import ([\w, ]+?)(\s*#.*)?$", re.M)
ADD_TO_IMPORT = "added to the import line"
ADD_TO_DICT = re.compile(r"an entry of (\w+)")
# what a method may touch (the checklist's table): a new block file in a block package, that package's
# __init__.py (import lines only), the records, a roberta_prompt method's count formulas, a roberta_blocks block's
# independent formula, the generated docs
BLOCK_PACKAGES = ("fairseq_idpg/blocks", "fairseq_idpg/modules/prompts")
RECORDS, FORMULAS, GENERATED = "fairseq_idpg/methods.py", "tests/test_dpt.py", "docs/recipes.md"
PLACEMENT = "tests/test_block_placement.py"  # FORMULAS, the independent formula of every roberta_blocks block
SCRATCH = ("__pycache__", ".pytest_cache", ".ruff_cache")


class Edit(NamedTuple):
    path: str
    code: str
    into_import_line: bool
    into_dict: str = ""  # the dict literal the code's entries go into, at its end


class Example(NamedTuple):
    title: str
    arch: str
    edits: List[Edit]
    commands: List[Tuple[str, Optional[str]]]  # (command, the pytest result it promises or None)

    @property
    def record(self):
        """The name of the method the example registers: the first string of its record."""
        (code,) = [e.code for e in self.edits if e.path == RECORDS]
        return re.search(r'"([\w.-]+)"', code).group(1)


def parse(title, arch, section):
    edits, commands, numbers = [], [], []
    for language, body in FENCE.findall(section):
        step = STEP.match(body)
        assert step, f"{title}: a block does not start with '# N. what: PATH': {body[:60]!r}"
        numbers.append(int(step.group(1)))
        if language == "sh":
            for line in filter(str.strip, body[step.end() :].splitlines()):
                command, _, comment = line.partition("#")
                promised = re.search(r"(\d+ passed)", comment)
                commands.append((command.strip(), promised.group(1) if promised else None))
        else:
            assert step.group(3), f"{title}: step {step.group(1)} names no file"
            what, into_dict = step.group(2), ADD_TO_DICT.search(step.group(2))
            into_dict = into_dict[1] if into_dict else ""
            edits.append(Edit(step.group(3), body[step.end() :], ADD_TO_IMPORT in what, into_dict))
    assert numbers == list(range(1, len(numbers) + 1)), f"{title}: the steps are numbered {numbers}"
    return Example(title, arch, edits, commands)


def worked_examples():
    """{title: Example} of every worked example of the pages."""
    found = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8") + "\n## end\n"
        for title, arch, section in EXAMPLE.findall(text):
            assert title not in found, f"two worked examples are called {title!r}"
            found[title] = parse(title, arch, section)
    return found


def copy_repository(target):
    """The repository's sources in ``target``, with their compiled bytecode (``__pycache__``): the copy's interpreters
    compile only the files an example edits (Python checks each .pyc against its source's size and mtime, which
    the copy keeps), not all of fairseq_idpg and the tests again in each copy."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns(".pytest_cache", ".ruff_cache"))
        else:
            shutil.copy(source, target / name)


def add_to_import_line(text, line):
    """``text`` with the names imported by ``line`` (``from M import a, b``) added to its last import line
    from M, sorted; the comment of that line stays."""
    new = IMPORT.match(line.strip())
    assert new, f"not one import line: {line!r}"
    old = [m for m in IMPORT.finditer(text) if m.group(1) == new.group(1)][-1]
    names = sorted({n.strip() for m in (old, new) for n in m.group(2).split(",")})
    return f"{text[: old.start()]}from {old.group(1)} import {', '.join(names)}{old.group(3) or ''}{text[old.end() :]}"


def add_to_dict(text, name, entries):
    """``text`` with ``entries`` (lines of ``key: value,``) at the end of its dict literal ``NAME = {...}``, before
    the ``}`` that closes it at the start of a line."""
    start = re.search(rf"^{name} = \{{\n", text, re.M)
    assert start, f"no dict literal {name} = {{...}}"
    end = text.index("\n}", start.end()) + 1
    return text[:end] + entries.rstrip("\n") + "\n" + text[end:]


def apply(edits, root):
    for edit in edits:
        file = root / edit.path
        if edit.into_dict:
            file.write_text(add_to_dict(file.read_text(encoding="utf-8"), edit.into_dict, edit.code), encoding="utf-8")
        elif edit.into_import_line:
            file.write_text(add_to_import_line(file.read_text(encoding="utf-8"), edit.code), encoding="utf-8")
        elif file.exists():
            file.write_text(file.read_text(encoding="utf-8").rstrip("\n") + "\n\n\n" + edit.code, encoding="utf-8")
        else:
            file.write_text(edit.code, encoding="utf-8")


def snapshot(root):
    """{path: sha256} of the copy's files (caches left out)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and not set(p.relative_to(root).parts) & set(SCRATCH) and p.suffix != ".pyc"
    }


def allowed(example):
    """The files ``example`` may touch: its new block file, its package's __init__.py, the records, the count
    formulas (a roberta_prompt method) or the blocks' formulas (a roberta_blocks method), the generated docs."""
    new = [e.path for e in example.edits if not (REPO / e.path).exists()]
    assert len(new) <= 1 and all(p.rsplit("/", 1)[0] in BLOCK_PACKAGES for p in new), (
        f"{example.title}: new files {new}; a method adds at most its block, in {' or '.join(BLOCK_PACKAGES)}"
    )
    files = {*new, *(p.rsplit("/", 1)[0] + "/__init__.py" for p in new), RECORDS, GENERATED}
    formulas = {"roberta_prompt": {FORMULAS}, "roberta_blocks": {PLACEMENT}}.get(example.arch, set())
    return files | formulas


def changed_lines(before, after):
    """The lines of ``after`` not in ``before`` and of ``before`` not in ``after``."""
    old, new = before.splitlines(), after.splitlines()
    return [line for line in new if line not in old] + [line for line in old if line not in new]


def run(argv, root):
    """``argv`` run in the copy. A pytest it starts runs in one process (``-p no:xdist``), as it does whenever this
    test runs on a pytest-xdist worker (tests/conftest.py gives workers' pytests no workers of their own): the same
    tests and result line, without two worker interpreters per command when this test runs in one process."""
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:xdist",
    }
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)


EXAMPLES = worked_examples()


def test_every_architecture_has_a_worked_example_that_parses():
    from fairseq_idpg.methods import METHODS

    architectures = sorted({m.arch for m in METHODS.values() if m.frozen_backbone})
    assert sorted(e.arch for e in EXAMPLES.values()) == architectures, list(EXAMPLES)
    for example in EXAMPLES.values():
        touched = {e.path for e in example.edits}
        assert RECORDS in touched, f"{example.title}: no method record"
        assert touched <= allowed(example), f"{example.title}: edits {sorted(touched - allowed(example))}"
        assert example.record not in METHODS, f"{example.title}: {example.record} is a record already"
        chosen = [k for command, _ in example.commands for k in re.findall(r"-k (\S+)", command)]
        assert any(k in example.record for k in chosen), f"{example.title}: no pytest -k that picks its record"
        assert any(promised for _, promised in example.commands), f"{example.title}: it promises no test result"
    (prompt,) = [e for e in EXAMPLES.values() if e.arch == "roberta_prompt"]
    assert [e.path for e in prompt.edits] == [
        "fairseq_idpg/modules/prompts/kronecker_prompt.py",
        "fairseq_idpg/modules/prompts/__init__.py",
        RECORDS,
        FORMULAS,
    ]
    (blocks,) = [e for e in EXAMPLES.values() if e.arch == "roberta_blocks"]  # a new block, as blocks.md says
    assert [(e.path, e.into_dict) for e in blocks.edits] == [
        (f"fairseq_idpg/blocks/{blocks.record}.py", ""),
        ("fairseq_idpg/blocks/__init__.py", ""),
        (RECORDS, ""),
        (PLACEMENT, "FORMULAS"),
    ]


@pytest.mark.slow  # about 40 s each: interpreter starts with fairseq, ruff over the copy
@pytest.mark.parametrize("title", EXAMPLES)
def test_the_worked_example_applied_in_a_copy_passes_what_the_page_promises(tmp_path, title):
    example = EXAMPLES[title]
    root = tmp_path / "repo"
    root.mkdir()
    copy_repository(root)
    before = snapshot(root)
    texts = {path: (root / path).read_text(encoding="utf-8") for path in before if path.endswith("__init__.py")}
    apply(example.edits, root)

    for command, promised in example.commands:
        argv = [sys.executable if word == "python" else word for word in shlex.split(command)]
        out = run(argv, root)
        assert out.returncode == 0, f"{command}:\n{(out.stdout + out.stderr)[-4000:]}"
        if promised:
            summary = out.stdout.strip().splitlines()[-1]
            assert re.search(rf"\b{promised}\b", summary) and "failed" not in summary, f"{command}: {summary}"
    # the record, registered under the example's architecture: recipe_table.py, run in the copy, writes each
    # method's row from the copy's METHODS as "| `NAME` | `METHODS[NAME].arch` |" (no interpreter more to read it)
    assert f"| `{example.record}` | `{example.arch}` |" in (root / GENERATED).read_text(encoding="utf-8")

    after = snapshot(root)
    touched = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert touched <= allowed(example), f"{title} touched {sorted(touched - allowed(example))}"
    for path in touched & texts.keys():
        lines = changed_lines(texts[path], (root / path).read_text(encoding="utf-8"))
        assert all(line.startswith(("from . import", "#")) for line in filter(str.strip, lines)), (path, lines)

    pytest.importorskip("ruff", reason="ruff is in the test extras: pip install -e '.[test]'")
    for check in (["check"], ["format", "--check"]):
        out = run([sys.executable, "-m", "ruff", *check, "."], root)
        assert out.returncode == 0, f"{title} fails ruff {' '.join(check)}:\n{out.stdout[-4000:]}"
