"""A run's prepared data: prepared with ``scripts/prepare_data.py`` unless its ``task.json`` records
the provenance that would be prepared now (again, saying why, when it differs)."""

import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

from fairseq_idpg.errors import RunError
from fairseq_idpg.layout import (
    REPO,
    SAMPLE_DIR,
    bpe_args,
    bpe_encoding,
    data_folder,
    download_command,
    folder_lock,
    raw_dir,
    raw_places,
)
from fairseq_idpg.run.processes import call, call_here


def prepare_if_needed(
    task, raw, data, bpe, few_shot=None, dev_from_train=None, data_seed=1, split_dev=False, dry=False, log=print
):
    """Prepare ``data`` unless its task.json records the provenance that ``raw`` + ``bpe`` (prepare_data.py's
    BPE flags) and the sampling would give now; again, with the reasons printed, when it differs.
    Returns (TaskInfo or None in a dry run, the reasons to prepare, the provenance now, seconds or None)."""
    from fairseq_idpg.data.task_info import TaskInfo
    from fairseq_idpg.preprocessing import get_task
    from fairseq_idpg.preprocessing.prepare import bpe_files, provenance, provenance_differences, seeded

    spec, data = get_task(task), Path(data)
    encoding = bpe_encoding(bpe)
    wanted = None
    have_bpe = all(f.is_file() for f in bpe_files(**encoding).values())
    if raw is not None and have_bpe and all((Path(raw) / f).is_file() for f in spec.files):
        sampling = {"few_shot": few_shot, "dev_from_train": dev_from_train, "split_dev": split_dev}
        wanted = provenance(spec, raw, **encoding, **sampling, seed=data_seed)
    info = TaskInfo.read(data) if TaskInfo.exists(data) else None
    if info is None:
        if data.exists() and (not data.is_dir() or any(data.iterdir())):
            raise RunError(
                f"{data} exists but holds no task.json (not made by scripts/prepare_data.py); "
                f"move it away or give another --work-dir"
            )
        reasons = ["not prepared yet"]
    elif wanted is None:
        reasons = [] if dry else ["the raw or BPE files are missing"]
    else:
        reasons = provenance_differences(info.provenance, wanted)
    if not reasons:
        return info, reasons, wanted, None
    prepare = [sys.executable, REPO / "scripts" / "prepare_data.py", task, "--raw", raw or f"<{task} raw folder>"]
    prepare += ["--out", data, *bpe]
    prepare += ["--few-shot", few_shot] if few_shot is not None else []
    prepare += ["--dev-from-train", dev_from_train] if dev_from_train is not None else []
    prepare += ["--split-dev"] if split_dev else []
    prepare += ["--seed", data_seed] if seeded(few_shot, dev_from_train, split_dev) else []
    prepare += ["--overwrite"] if info is not None else []
    if dry:
        log(f"data: {data} would be prepared ({'; '.join(reasons)}):")
        log("+ " + shlex.join(str(c) for c in prepare))
        return info, reasons, wanted, None
    if info is not None:
        log(f"data: preparing {data} again: {'; '.join(reasons)}", flush=True)
    seconds = call_here(prepare, _script_main(prepare[1]), log)  # the script's main: an interpreter start fewer
    info = TaskInfo.read(data)
    if info is None:
        raise RunError(f"{data}: prepare_data.py wrote no task.json")
    return info, reasons, wanted, seconds


def _script_main(path):
    """The ``main(argv)`` of a script of this checkout (scripts/prepare_data.py), loaded as a module."""
    import runpy

    return runpy.run_path(str(path), run_name="prepare_data")["main"]


class Data(NamedTuple):
    folder: Path
    info: Any  # its TaskInfo (None: not prepared, or a dry run's stale data)
    provenance: Optional[dict]  # what it is made of: as recorded, or (a dry run) as it would be prepared
    missing: tuple = ()  # what a dry run found absent (the raw folder), one line each
    seconds: Optional[float] = None  # preparing it took, now (None: prepared before)
    ready: bool = True  # a run would use it as it is: its raw folder found, nothing to prepare again


def prepared(folder):
    """The data of a folder prepared before (its task.json), for a plan's ``data`` seam."""
    from fairseq_idpg.data.task_info import TaskInfo

    info = TaskInfo.read(folder)
    if info is None:
        raise RunError(f"{folder}: no task.json (prepare it with scripts/prepare_data.py)")
    return Data(Path(folder), info, info.provenance)


def sample_folder(task):
    """Where the made-up sample of ``task`` goes (the layout of the checkout's data/)."""
    _, downloaded = raw_places(task)[-2]
    return SAMPLE_DIR / downloaded.parent.name / downloaded.name


def fetch_raw(task, model, not_found, log=print):
    """The raw folder of ``task`` that no place holds: downloaded into the checkout's data/ (scripts/download.sh);
    when that fails (offline) and the model is the stand-in, a made-up sample in data/sample/, said as such: the
    job runs end to end, its score means nothing. A real model gets the one-line error instead."""
    _, downloaded = raw_places(task)[-2]
    with folder_lock(downloaded):  # two runs started at once download it once
        if not downloaded.is_dir():
            looked = ", ".join(str(path) for _, path in raw_places(task))
            log(f"data: no {task} raw folder in {looked}: downloading it", flush=True)
            try:
                call([sys.executable, REPO / "scripts" / "download.py", *download_command(task).split()[1:]], log)
            except RunError:
                if model != "standin":
                    raise RunError(f"{not_found}; the download failed (see above)") from None
        if downloaded.is_dir():
            return downloaded
    sample = sample_folder(task)
    with folder_lock(sample):
        if not sample.is_dir():
            from fairseq_idpg.sample_data import write_sample

            write_sample(task, sample)
    print(
        f"run.sh: warning: no {task} data and no download (offline?): training on made-up sample data ({sample}); "
        f"its score says nothing about {task}. For the real data: {download_command(task)}",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    return sample


def find_raw(request, task, log=print):
    """(the raw folder or None, what a dry run found missing): a folder no place holds is fetched (``fetch_raw``);
    a dry run says so and lists only a ``--raw`` folder that does not exist."""
    try:
        return raw_dir(task, request.raw), []
    except RunError as e:
        if request.raw and request.dry_run:
            return None, [str(e)]
        if request.raw:  # a folder the user named: theirs to fix
            raise
        if not request.dry_run:
            return fetch_raw(task, request.model, e, log), []
        looked = ", ".join(str(path) for _, path in raw_places(task))
        offline = f"; offline, it makes a made-up sample in {sample_folder(task)}" if request.model == "standin" else ""
        log(f"data: no {task} raw folder in {looked}: the run downloads it ({download_command(task)}){offline}")
        return None, []


def data_for(request, task, backbone, log=print):
    """The prepared data (prepared again, saying why, when what it was made from differs from what would be
    used now), with the seconds preparing it took."""
    raw, missing = find_raw(request, task, log)
    bpe = bpe_args(backbone.dir, request.bpe_dir, request.model)
    sampling = {"few_shot": request.few_shot, "dev_from_train": request.dev_from_train, "data_seed": request.data_seed,
                "split_dev": request.split_dev}  # fmt: skip
    folder = data_folder(request.work_dir, backbone.name, task, **sampling)
    info, reasons, wanted, seconds = prepare_if_needed(task, raw, folder, bpe, **sampling, dry=request.dry_run, log=log)
    if info is not None and request.dry_run and reasons:
        info = None  # a dry run's stale data: the budget is that of the data it would prepare
    if reasons and not missing and raw is not None and wanted is None:  # the raw folder lacks files, or no BPE
        from fairseq_idpg.preprocessing import get_task
        from fairseq_idpg.preprocessing.prepare import bpe_files

        absent = [Path(raw) / name for name in get_task(task).files if not (Path(raw) / name).is_file()]
        # the stand-in's vocab.txt comes with the stand-in, which a run builds first (check)
        if not (request.model == "standin" and not backbone.present):
            absent += [f for f in bpe_files(**bpe_encoding(bpe)).values() if not Path(f).is_file()]
        if absent:
            missing = [f"{task}: the raw files or BPE files to prepare {folder} are missing: "
                       + ", ".join(map(str, absent))]  # fmt: skip
    ready = raw is not None and not reasons
    provenance = info.provenance if info is not None else wanted
    return Data(folder, info, provenance, missing if reasons else [], seconds, ready)
