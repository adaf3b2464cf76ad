"""How the package writes and reads files: a leaf module (it imports nothing of the package's but its errors), so
that every layer (conversion, data preparation, models, runs, the tools, the compat module) writes the same way.

- Every file is written under a temporary name beside it and renamed into place when complete (``atomic_path``):
  an interrupted write never leaves a half-written ``model.pt``, ``dict.txt``, checkpoint or record; a folder is
  made whole beside its place and renamed into it (``staged_folder``), so a failure leaves nothing half-written.
- What the tools read and where they write (scripts/merge_lora.py, import_peft.py, export_checkpoint.py,
  export_peft.py, export_dpt_prompt.py; docs/using.md, "Where the tools write"): a tool never writes over a file it
  reads (the checkpoint, the backbone, the adapter's files), even with ``--overwrite``; an existing output, or a new
  file in another run's folder (one with config.json or results.json), only with ``--overwrite``
  (``check_output_file``, ``check_output_folder``).
- A damaged or wrong input (a truncated checkpoint, a file that is not a fairseq checkpoint, a truncated
  JSON or safetensors file) is one line naming the file and what to do (``read_checkpoint``, ``read_json``,
  ``read_tensors``), a ConfigError like every other refusal.
"""

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager

from fairseq_idpg.errors import ConfigError


# ---------------------------------------------------------------------------------------------- atomic writes
@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_copy(src: str, dst: str) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


RUN_FILES = ("config.json", "results.json")  # what makes a folder a run folder of run.sh
TRAINED = "a checkpoint written by fairseq-train (a run's checkpoint_best.pt)"


def _real(path):
    return os.path.realpath(os.path.abspath(str(path)))


def _inside(path, folder):
    """Whether ``path`` is ``folder`` or lies in it."""
    path, folder = _real(path), _real(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def run_folder(folder):
    """Whether ``folder`` is a run folder (config.json or results.json in it)."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in RUN_FILES)


def check_output_file(out, inputs=(), overwrite=False):
    """One line (a ConfigError) unless the file ``out`` may be written: never one of ``inputs`` (the files the
    tool reads); its folder exists; an existing file, or a new one in another run's folder, only with
    ``overwrite``."""
    out = str(out)
    for source in filter(None, inputs):
        if os.path.exists(source) and _real(out) == _real(source):
            raise ConfigError(
                f"{out}: is a file this command reads; it never writes over its input, even with --overwrite: "
                f"give another output file"
            )
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigError(f"{out}: its folder does not exist")
    if os.path.isdir(out):
        raise ConfigError(f"{out}: is a folder; give the file to write, e.g. {os.path.join(out, 'model.pt')}")
    if overwrite:
        return
    if os.path.exists(out):
        raise ConfigError(f"{out}: exists; give --overwrite to replace it, or another output file")
    if run_folder(folder) and not any(_inside(source, folder) for source in filter(None, inputs)):
        raise ConfigError(
            f"{out}: {folder} is another run's folder; write outside it, or give --overwrite to write there"
        )


def check_output_folder(out, inputs=(), overwrite=False):
    """One line unless the folder ``out`` may be written: it holds none of ``inputs`` (nor is one); it is new or
    empty, or ``overwrite`` (its files of the same names are then replaced)."""
    out = str(out)
    for source in filter(None, inputs):
        if os.path.exists(source) and (_inside(source, out) or _real(source) == _real(out)):
            raise ConfigError(
                f"{out}: holds {source}, which this command reads; it never writes there, even with --overwrite: "
                f"give a new folder"
            )
    if not os.path.exists(out) or overwrite and os.path.isdir(out):
        return
    if not os.path.isdir(out) or os.listdir(out):
        raise ConfigError(f"{out}: exists and is not an empty folder; give a new folder, or --overwrite to replace it")


def _put(source, target):
    """Move ``source`` (a file or a folder) onto ``target``, replacing it; a folder replaced whole."""
    if os.path.isdir(source) and os.path.isdir(target):
        aside = tempfile.mkdtemp(
            prefix="." + os.path.basename(target) + ".", suffix=".old", dir=os.path.dirname(target)
        )
        os.replace(target, os.path.join(aside, "old"))
        os.replace(source, target)
        shutil.rmtree(aside)
    elif os.path.isdir(target):
        shutil.rmtree(target)
        os.replace(source, target)
    else:
        os.replace(source, target)


@contextmanager
def staged_folder(out):
    """Yield a new folder beside ``out`` to write into; when the block succeeds it becomes ``out`` (a new or
    empty ``out``: renamed; an existing one: each of its entries replaced), else it is removed."""
    out = os.path.abspath(str(out))
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".", suffix=".tmp", dir=parent)
    try:
        yield stage
        if os.path.isdir(out) and not os.listdir(out):
            os.rmdir(out)
        if not os.path.exists(out):
            os.chmod(stage, 0o777 & ~_umask())
            os.replace(stage, out)
        else:
            for name in sorted(os.listdir(stage)):
                _put(os.path.join(stage, name), os.path.join(out, name))
    finally:
        if os.path.exists(stage):
            shutil.rmtree(stage)


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextmanager
def writing(path):
    """Yield a temporary path beside ``path`` that replaces it when the block succeeds (``atomic_path``); a
    failed write (a full disk, a read-only folder) is one line naming ``path``, the temporary file removed."""
    try:
        with atomic_path(str(path)) as tmp:
            yield tmp
    except OSError as e:
        why = e.strerror or "the write failed"
        raise ConfigError(f"{path}: could not be written ({why}); free some space or write elsewhere") from e


def save_torch(obj, path):
    """``torch.save`` of ``obj`` to ``path``, atomically."""
    import torch

    with writing(path) as tmp, open(tmp, "wb") as f:
        # through a file object: torch.save(<path>) names the zip's records after the file, here a random
        # temporary name, so two saves of the same tensors had different bytes (and sha256, which
        # identifies a run's backbone); a file object's records are always "archive/"
        try:
            torch.save(obj, f)
        except RuntimeError as e:  # torch's zip writer says a failed write (a full disk) so
            raise OSError(errno.EIO, "the write failed") from e


def write_json(obj, path, indent=1):
    """``obj`` as JSON at ``path`` (a final newline), written whole or not at all (``writing``)."""
    with writing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=indent) + "\n")


def save_safetensors(tensors, path, metadata=None):
    from safetensors.torch import save_file

    with writing(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


# ---------------------------------------------------------------------------------------------- reading
def read_checkpoint(path, what=TRAINED, **load):
    """The fairseq checkpoint at ``path`` (a dict with ``model`` and ``cfg`` or ``args``); one line naming it
    when it cannot be read (truncated or damaged) or is not a fairseq checkpoint."""
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False, **load)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as e:
        raise ConfigError(f"{path}: cannot be read (truncated or damaged); give {what}, or copy it again") from e
    if not isinstance(state, dict) or "model" not in state or not (state.get("cfg") or state.get("args")):
        raise ConfigError(f"{path}: not a fairseq checkpoint (no model and cfg in it); give {what}")
    return state


def read_json(path, what="the folder"):
    """The JSON file ``path``; one line naming it when it is truncated or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON (truncated or damaged); copy {what} again") from e


def read_tensors(path, what="the folder"):
    """The tensors of a safetensors file or a ``torch.save`` of tensors; one line naming it when damaged."""
    import pickle
    import zipfile

    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        if str(path).endswith(".safetensors"):
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except (
        SafetensorError,
        RuntimeError,
        EOFError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
    ) as e:
        raise ConfigError(f"{path}: cannot be read (truncated or damaged); copy {what} again") from e
