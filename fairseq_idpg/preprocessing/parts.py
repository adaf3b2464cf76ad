"""The finished parts of a preparation (BPE-encoded chunks, binarized columns), kept beside its ``--out`` in
``.OUT.parts`` until the preparation completes, so that an interrupted one (Ctrl-C, a kill, a full disk)
resumes: the same command reuses every part it finds complete and makes only the rest.

A part is written under a temporary name and renamed into place when complete; then its marker
``NAME.sha256`` (the sha256 of each of its files) is written, atomically. A part counts as finished only when
its marker is there and its files still have those digests, so neither a half-written part nor one changed
since is ever taken as complete. The folder records the key of what its parts are made from (the task, the
raw and BPE files' digests, the sampling): parts of other files or options are removed, never reused.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, List

from ..data.digest import file_sha256
from ..files import atomic_path, atomic_write_text, staged_folder

FORMAT = 1  # what a part holds and how it is named; another value makes older parts unusable
MARKER = ".sha256"
KEY_FILE = "key"


def parts_folder(out: Path) -> Path:
    return out.parent / f".{out.name}.parts"


def parts_key(task: str, origin: dict, chunk_lines: int) -> str:
    """What the parts are made from: the task, the provenance less the raw folder's path (the same files
    elsewhere make the same parts), the chunk size and this module's format."""
    made_of = {"format": FORMAT, "task": task, "chunk_lines": chunk_lines}
    made_of["provenance"] = {k: v for k, v in origin.items() if k != "raw"}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()


def _digests(path: Path) -> Dict[str, str]:
    if path.is_file():
        return {path.name: file_sha256(path)}
    return {str(p.relative_to(path)): file_sha256(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class Parts:
    """``.OUT.parts``: ``finished(name)``, ``make(name, build)``, ``link(name, dest)``."""

    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def open(cls, out: Path, key: str, log: Callable[[str], None]) -> "Parts":
        """The parts folder of ``out`` for ``key``; one holding another key's parts is emptied first."""
        folder = parts_folder(out)
        try:
            recorded = (folder / KEY_FILE).read_text().strip()
        except OSError:
            recorded = None
        if folder.exists() and recorded != key:
            _remove(folder)
            log(f"removed {folder}: the parts of a preparation from other files or options")
        folder.mkdir(exist_ok=True)
        if recorded != key:
            atomic_write_text(str(folder / KEY_FILE), key)
        return cls(folder)

    def finished(self, name: str) -> bool:
        """Whether part ``name`` is complete: its marker is there and its files have the digests it lists."""
        path = self.folder / name
        try:
            recorded = json.loads((self.folder / (name + MARKER)).read_text())
            return path.exists() and recorded == _digests(path)
        except (OSError, ValueError):
            return False

    def make(self, name: str, build: Callable[[Path], None], folder: bool = False) -> None:
        """``build(tmp)`` writes part ``name`` (a file, or a folder when ``folder``) at a temporary path; it is
        renamed into place, then its marker is written."""
        path, marker = self.folder / name, self.folder / (name + MARKER)
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove(marker)
        _remove(path)
        with staged_folder(path) if folder else atomic_path(str(path)) as tmp:
            build(Path(tmp))
        atomic_write_text(str(marker), json.dumps(_digests(path), sort_keys=True))

    def link(self, name: str, dest: Path) -> None:
        """Folder part ``name`` at ``dest`` too, as hard links (a copy where links are refused)."""

        def link_or_copy(src, dst):
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(self.folder / name, dest, copy_function=link_or_copy)

    def kept(self) -> List[str]:
        """The finished parts' names (those with a marker), for saying what a rerun will reuse."""
        found = self.folder.rglob("*" + MARKER) if self.folder.is_dir() else ()
        return sorted(str(p.relative_to(self.folder))[: -len(MARKER)] for p in found)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def remove_temporaries(self) -> None:
        """Remove what an interrupted ``make`` left under a temporary name (``.NAME.xxxx.tmp``): a signal landing
        between a temporary's creation and its cleanup leaves it, however short that window (on a loaded machine
        it was hit). Called once the preparation has stopped, so no part is being written."""
        if self.folder.is_dir():
            for path in sorted(self.folder.rglob(".*.tmp"), reverse=True):
                _remove(path)


def summary(names: List[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
