"""``scripts/gpu_proof.sh`` / ``python -m fairseq_idpg.gpu_proof``: see the package docstring."""

import argparse
import contextlib
import datetime
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from fairseq_idpg import gpu_proof
from fairseq_idpg.errors import ConfigError, one_line_errors, refuse
from fairseq_idpg.gpu_proof import CPU_OUT, DEFAULT_DOC, DEFAULT_OUT, PARTS

PROG = "gpu_proof.sh"
START = time.monotonic()  # the process's start, near enough: the limit counts imports and the backbone's write
FUSED_METHODS = ("prompt-tuning-5", "m-idpg-phm", "lora", "prefix-tuning", "houlsby-adapter")  # one per family
# seconds per part on a GPU, in PARTS' order: with the start (imports, the random roberta.large written: ~40 s)
# they fit LIMIT; each part stops at its own
GPU_BUDGETS = {"fused": 240, "updates": 90, "resume": 40, "serving": 60}
LIMIT = 480  # the whole run's wall time, start included: past it the file is written as it is and the run ends
START_ESTIMATE = 40  # seconds before the first part on a GPU: imports, the random roberta.large written (~1.4 GB)
# the sizes (cli.setting); the CPU's are tiny: a code path, not a device
GPU = dict(size="large", batch=16, length=128, k=20, k_small=4, alone=1, updates=12, steps=8, resume=(2, 6, 3),
           tasks=16, models=2, per_task=8, repeats=5)  # fmt: skip
CPU = dict(size="tiny", batch=4, length=16, k=3, k_small=2, alone=1, updates=6, steps=2, resume=(2, 4, 2),
           tasks=4, models=2, per_task=2, repeats=2)  # fmt: skip
TINY = dict(layers=2, dim=32, heads=4, ffn=64)


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=gpu_proof.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    one_line_errors(p)
    p.add_argument("--out", help=f"the JSON file (default {DEFAULT_OUT.relative_to(gpu_proof.REPO)} on a GPU, "
                   f"{CPU_OUT.relative_to(gpu_proof.REPO)} on the CPU)")  # fmt: skip
    p.add_argument("--doc", help=f"the page whose GPU tables are regenerated between its markers, or none (default "
                   f"{DEFAULT_DOC.relative_to(gpu_proof.REPO)} on a GPU, none on the CPU)")  # fmt: skip
    p.add_argument("--render", metavar="JSON", help="regenerate --doc's tables from this file; measure nothing")
    p.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                   help=f"a part's time budget (parts: {', '.join(PARTS)}; GPU defaults {GPU_BUDGETS})")  # fmt: skip
    p.add_argument("--parts", default=",".join(PARTS), help=f"which parts, of {', '.join(PARTS)} (default: all)")
    p.add_argument("--limit", type=float, default=LIMIT, help=f"seconds for the whole run (default {LIMIT})")
    p.add_argument("--methods", default=",".join(FUSED_METHODS), help="the fused part's method records")
    p.add_argument("--size", help="the backbone's shape: large, base, standin or tiny (default: large on a GPU, tiny "
                   "on the CPU)")  # fmt: skip
    p.add_argument("--work", help="where the backbone, data and runs go (default: a temporary folder)")
    args = p.parse_args(argv)
    budgets = {}
    for given in args.budget:
        part, _, seconds = given.partition("=")
        try:
            budgets[part] = float(seconds)
        except ValueError:
            p.error(f"--budget {given}: expected PART=SECONDS, e.g. fused=300")
        if part not in PARTS or budgets[part] < 0:
            p.error(f"--budget {given}: PART is one of {', '.join(PARTS)} and SECONDS >= 0")
    args.budgets = budgets
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    wrong = [x for x in args.parts if x not in PARTS]
    if wrong or not args.parts:
        p.error(f"--parts {','.join(wrong)}: valid are {', '.join(PARTS)}")
    from fairseq_idpg.methods import METHODS

    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or not args.methods:
        p.error(f"--methods {','.join(unknown)}: unknown method record(s)")
    from fairseq_idpg.launches import SIZES

    if args.size is not None and args.size not in (*SIZES, "tiny"):
        p.error(f"--size {args.size}: valid are {', '.join([*SIZES, 'tiny'])}")
    if args.limit <= 0:
        p.error(f"--limit must be > 0 seconds, got {args.limit:g}")
    if args.render and not Path(args.render).is_file():
        p.error(f"--render {args.render}: no such file")
    return args


def setting(args, cuda, work):
    """The run's ``parts.Setting``: the GPU's sizes or the CPU's, ``--size`` and ``--methods`` applied."""
    import torch

    from fairseq_idpg.launches import SIZES, Shape

    from .parts import Setting

    sizes = GPU if cuda else CPU
    size = args.size or sizes["size"]
    shape = Shape(**SIZES.get(size, TINY), batch=sizes["batch"], length=sizes["length"])
    return Setting(
        device=torch.device("cuda" if cuda else "cpu"), size=size, shape=shape, dtype="bf16", k=sizes["k"],
        k_small=sizes["k_small"], alone=sizes["alone"], updates=sizes["updates"], methods=tuple(args.methods),
        peft_methods=("lora", "prompt-tuning-5"), precisions=("bf16", "fp16"), steps=sizes["steps"],
        resume=sizes["resume"], resume_shape=Shape(**TINY, batch=4, length=16), tasks=sizes["tasks"],
        models=sizes["models"], per_task=sizes["per_task"], repeats=sizes["repeats"], work=Path(work),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- the record
class Proof:
    """The JSON record: written whole (``files.write_json``: atomically) after each measurement, with --doc's
    tables, under a lock (the overall limit's timer writes too)."""

    def __init__(self, out, doc, header):
        self.out, self.doc = Path(out), doc
        self.data = {**header, "parts": {}, "finished": False, "interrupted": None}
        self.lock = threading.RLock()
        self.start = time.monotonic()
        self.failed = False  # a measurement failed (``Part.measuring``)

    def save(self):
        from fairseq_idpg.files import write_json

        from .table import update_doc

        with self.lock:
            self.data["wall_seconds"] = round(time.monotonic() - self.start, 1)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.data, self.out)
            if self.doc is not None:
                update_doc(self.doc, self.data)


class Part:
    """One part's budget and rows (``parts``' functions call ``fits`` before a measurement, ``add`` after)."""

    def __init__(self, proof, name, budget, device):
        self.proof, self.name, self.budget = proof, name, budget
        self.start = time.monotonic()
        self.item_start, self.last = None, None
        self.record = {"device": device, "budget_seconds": budget, "seconds": 0.0, "rows": [], "cut": None}
        with proof.lock:
            proof.data["parts"][name] = self.record

    def left(self):
        return self.budget - (time.monotonic() - self.start)

    def fits(self, what, scale=1.0):
        """Whether ``what`` may start: time is left, and more than the part's last measurement took (times
        ``scale``: what ``what`` costs against it). Else the part is cut, saying so."""
        left = self.left()
        expected = None if self.last is None else self.last * scale
        if left <= 0 or (expected is not None and expected > left):
            self.cut(f"{what} not started: {max(0.0, left):.0f} s of the {self.budget:g} s budget left"
                     + (f", it would take about {expected:.0f} s" if expected is not None else ""))  # fmt: skip
            return False
        self.item_start = time.monotonic()
        print(f"  [{self.name}] {what} ...", flush=True)
        return True

    @contextlib.contextmanager
    def measuring(self, what):
        """One measurement inside: its error (out of memory, a refusal) is the part's finding, said and kept in the
        record's errors (the run's exit status becomes 1); the part goes on with its next measurement."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 (see above)
            from fairseq_idpg.check_gpu.training import describe_error

            self.last = time.monotonic() - self.item_start
            with self.proof.lock:
                self.record.setdefault("errors", []).append(f"{what}: {describe_error(e)}")
                self.proof.failed = True
            print(f"  [{self.name}] {what} failed: {describe_error(e)}", flush=True)
            self.proof.save()

    def add(self, row, line, cut=None):
        self.last = time.monotonic() - self.item_start
        row = {**row, "seconds": round(self.last, 2)}
        with self.proof.lock:
            self.record["rows"].append(row)
            self.record["seconds"] = round(time.monotonic() - self.start, 2)
        print(f"  [{self.name}] {line} ({self.last:.1f} s)", flush=True)
        if cut or row.get("cut"):
            self.cut(cut or f"{line}: stopped by the budget before its last update")
        self.proof.save()

    def cut(self, why):
        with self.proof.lock:
            self.record["cut"] = why if self.record["cut"] is None else f"{self.record['cut']}; {why}"
            self.record["seconds"] = round(time.monotonic() - self.start, 2)
        print(f"  [{self.name}] cut: {why}", flush=True)
        self.proof.save()


# ---------------------------------------------------------------------------------------- the run
def main(argv=None):
    """0: every part ran (a part cut by its budget included); 1: a part failed (its error is in the file);
    2: refused in one line; 124: the overall limit ran out; 130: interrupted (the file holds what was measured)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.argv = argv
    try:
        if args.render:
            return render(args)
        return measure(args)
    except ConfigError as e:
        return refuse(PROG, e)


def render(args):
    import json

    from .table import update_doc

    doc = Path(args.doc or DEFAULT_DOC)
    update_doc(doc, json.loads(Path(args.render).read_text()))
    print(f"{doc}: the GPU tables regenerated from {args.render}")
    return 0


def measure(args):
    import torch

    cuda = torch.cuda.is_available()
    out = Path(args.out or (DEFAULT_OUT if cuda else CPU_OUT))
    doc = None if (args.doc or "").lower() == "none" else Path(args.doc) if args.doc else DEFAULT_DOC if cuda else None
    if doc is not None:
        from .table import check_markers

        check_markers(doc)  # before anything runs
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_proof."))
    work.mkdir(parents=True, exist_ok=True)
    s = setting(args, cuda, work)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    budgets = {part: args.budgets.get(part, GPU_BUDGETS[part]) for part in args.parts}
    proof = Proof(out, doc, header(args, s, device_name, budgets))
    print(f"GPU proof on {device_name}: torch {torch.__version__}, CUDA {torch.version.cuda}; {s.size} "
          f"({s.shape.layers} x {s.shape.dim}), batch {s.shape.batch} x {s.shape.length}; writing {out}"
          + (f" and {doc}" if doc else ""), flush=True)  # fmt: skip
    print(f"  {estimate(budgets, args.limit)}", flush=True)
    if not cuda:
        torch.set_num_threads(1)  # the machine may be shared: spinning idle threads slow tiny operators tenfold
        print("  no CUDA device: every part runs on the CPU at a tiny size, one thread (a code path, not a device)",
              flush=True)  # fmt: skip
    timer = threading.Timer(args.limit - (time.monotonic() - START), _out_of_time, (proof, args.limit))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, _interrupt)
    code = 0
    try:
        from .backbone import write_backbone
        from .parts import PART_FUNCTIONS

        began = time.monotonic()
        write_backbone(work, s.shape)
        with proof.lock:
            proof.data["setup_seconds"] = round(time.monotonic() - START, 1)
            proof.data["backbone_seconds"] = round(time.monotonic() - began, 1)
        for name in args.parts:
            print(f"\n[{name}] budget {budgets[name]:g} s", flush=True)
            part = Part(proof, name, budgets[name], device_name)
            try:
                PART_FUNCTIONS[name](part, s)
            except Exception as e:  # noqa: BLE001 (out of memory, a refusal: the part's finding; the next part runs)
                from fairseq_idpg.check_gpu.training import describe_error

                code = 1
                part.record["error"] = describe_error(e)
                print(f"  [{name}] failed: {part.record['error']}", flush=True)
            part.record["seconds"] = round(time.monotonic() - part.start, 2)
            proof.save()
        with proof.lock:
            proof.data["finished"] = True
        proof.save()
        code = 1 if proof.failed else code
    except KeyboardInterrupt:
        with proof.lock:
            proof.data["interrupted"] = "interrupted (Ctrl-C or SIGTERM)"
        proof.save()
        print(f"\ninterrupted: {out} holds what was measured", flush=True)
        _exit(130)  # member threads of a fused group may still run: they are not waited for
    finally:
        timer.cancel()
    print(f"\nwrote {out}" + (f" and the tables of {doc}" if doc else "") + f" in {time.monotonic() - START:.0f} s")
    return code


def estimate(budgets, limit):
    """The run's expected wall time on a GPU: the parts' budgets and the start (each part stops at its budget; the
    limit stops the whole)."""
    total = sum(budgets.values()) + START_ESTIMATE
    parts = " + ".join(f"{name} {seconds:g}" for name, seconds in budgets.items())
    within = "within" if total <= limit else "OVER"
    return f"expected on a GPU: {parts} + the start ~{START_ESTIMATE} = {total:g} s, {within} the {limit:g} s limit"


def header(args, s, device_name, budgets):
    import torch

    from .backbone import ROBERTA_ROWS

    return {
        "command": shlex.join(["scripts/gpu_proof.sh", *args.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda, "size": s.size,
        "layers": s.shape.layers, "dim": s.shape.dim, "heads": s.shape.heads, "ffn": s.shape.ffn,
        "dictionary": ROBERTA_ROWS, "batch": s.shape.batch, "length": s.shape.length, "dtype": s.dtype,
        "limit_seconds": args.limit, "budgets": budgets,
    }  # fmt: skip


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _out_of_time(proof, limit):
    with proof.lock:  # held to the end: no other write starts before the process ends
        proof.data["interrupted"] = f"the overall limit of {limit:g} s ran out"
        proof.save()
        print(f"\nout of time ({limit:g} s): {proof.out} holds what was measured", flush=True)
        _exit(124)


def _exit(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
