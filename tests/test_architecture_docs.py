"""docs/architecture.md's worked example is true: its code blocks, applied as the page says in a
temporary copy of the repository, give a method that the page's commands test with the promised
result (among them fairseq-train's parser taking ``--prompt-matrix kronecker``: test_dpt's
per-preset parser test), a regenerated docs/recipes.md, and code that passes ruff.

The page's steps are fenced blocks whose first line is ``# N. what: PATH`` (a new file is written,
an existing one gets the block appended), then one ``sh`` block of commands, each run in the copy;
a ``# K passed`` comment is the pytest result the page promises. When the page and the code drift
apart, this fails.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
EXAMPLE = "### Worked example"
COPIED = ("fairseq_idpg", "tests", "scripts", "docs", "pyproject.toml", "setup.py", "fairseq_idpg_compat.py")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
STEP = re.compile(r"# (\d+)\. [^\n]*?(?:: (\S+))?\n")


def worked_example():
    """([(path, code)] of the edits, [(command, promised pytest result or None)]) of the page's example."""
    text = PAGE.read_text(encoding="utf-8")
    assert EXAMPLE in text, f"{PAGE} has no '{EXAMPLE}' section"
    section = text.split(EXAMPLE, 1)[1].split("\n## ", 1)[0]
    edits, commands, numbers = [], [], []
    for language, body in FENCE.findall(section):
        step = STEP.match(body)
        assert step, f"a block of the worked example does not start with '# N. what: PATH': {body[:60]!r}"
        numbers.append(int(step.group(1)))
        if language == "sh":
            for line in filter(str.strip, body[step.end() :].splitlines()):
                command, _, comment = line.partition("#")
                promised = re.search(r"(\d+ passed)", comment)
                commands.append((command.strip(), promised.group(1) if promised else None))
        else:
            assert step.group(2), f"step {step.group(1)} names no file"
            edits.append((step.group(2), body[step.end() :]))
    assert numbers == list(range(1, len(numbers) + 1)), f"the steps are numbered {numbers}"
    return edits, commands


def copy_repository(target):
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source, target / name)


def apply(edits, root):
    for path, code in edits:
        file = root / path
        if file.exists():
            file.write_text(file.read_text(encoding="utf-8").rstrip("\n") + "\n\n\n" + code, encoding="utf-8")
        else:
            file.write_text(code, encoding="utf-8")


def run(argv, root):
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)


def test_the_worked_example_parses():
    edits, commands = worked_example()
    assert [path for path, _ in edits] == [
        "fairseq_idpg/modules/prompts/kronecker_prompt.py",
        "fairseq_idpg/modules/prompts/__init__.py",
        "fairseq_idpg/methods.py",
        "tests/test_dpt.py",
    ]
    assert any(promised for _, promised in commands), "the page promises no test result"


@pytest.mark.slow  # about 30 s: four interpreter starts with fairseq
def test_the_worked_example_applied_in_a_copy_passes_what_the_page_promises(tmp_path):
    edits, commands = worked_example()
    root = tmp_path / "repo"
    root.mkdir()
    copy_repository(root)
    apply(edits, root)

    for command, promised in commands:
        argv = [sys.executable if word == "python" else word for word in shlex.split(command)]
        out = run(argv, root)
        assert out.returncode == 0, f"{command}:\n{(out.stdout + out.stderr)[-4000:]}"
        if promised:
            summary = out.stdout.strip().splitlines()[-1]
            assert re.search(rf"\b{promised}\b", summary) and "failed" not in summary, f"{command}: {summary}"
    assert "`kronecker-prompt-100`" in (root / "docs" / "recipes.md").read_text(encoding="utf-8")

    pytest.importorskip("ruff", reason="ruff is in the test extras: pip install -e '.[test]'")
    for check in (["check"], ["format", "--check"]):
        out = run([sys.executable, "-m", "ruff", *check, "."], root)
        assert out.returncode == 0, f"the worked example fails ruff {' '.join(check)}:\n{out.stdout[-4000:]}"
