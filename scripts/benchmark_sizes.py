#!/usr/bin/env python3
"""Every method at roberta.base and roberta.large sizes through the real pipeline on the CPU: seconds
per update, peak memory, parameters, and the training and compact checkpoints' sizes.

    python scripts/benchmark_sizes.py                                   # every method, both sizes
    python scripts/benchmark_sizes.py --sizes roberta.large --methods finetune,lora,dpt
    python scripts/benchmark_sizes.py --table                           # the markdown table of the CSV

Each (size, method) is ``scripts/run.sh RTE --method M --model FOLDER --max-update 2 --total-batch 8``
as a user runs it (prepare_data.py with the GPT-2 BPE, fairseq-train through the launcher, fairseq-validate
of checkpoint_best.pt), then ``scripts/export_checkpoint.py`` of that checkpoint. The backbones are randomly
initialised fairseq RoBERTa folders of each size with RoBERTa's real 50,265-entry dictionary
(``conversion.tiny.write_tiny_roberta(bpe_dir=...)``): speed and memory do not depend on the weights' values.
The data: the first 64 RTE train rows whose <s> s1 </s></s> s2 </s> is 121 to 128 BPE tokens (so a batch is
8 x ~128 tokens) and the first 8 dev rows.

Measured, with one torch thread (OMP_NUM_THREADS=1):
- seconds per update: the CPU time (user + system) of the fairseq-train process between its log lines of
  update 1 and update N (``--log-interval 1``), divided by N - 1 (update 1 carries the first-call costs);
  the wall time over the same span is printed too (the machine is shared: wall times are inflated);
- peak RSS: the training process's VmHWM (/proc, read every 0.1 s while it runs);
- trained / all parameters: fairseq-train's "num. shared model params" line (classification head included);
- checkpoint MB: checkpoint_best.pt as fairseq-train saved it; compact MB: what export_checkpoint.py writes.
The reloaded model's dev loss (fairseq-validate) must equal the one fairseq-train logged, or the row fails.

Rows go to ``--csv`` as each finishes (a row already there for the same device, size, method, precision and
shape is skipped unless --force): an interrupted run keeps its rows, the same command continues it.
"""

import argparse
import csv
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SIZES = {
    "roberta.base": dict(layers=12, dim=768, heads=12, ffn=3072),
    "roberta.large": dict(layers=24, dim=1024, heads=16, ffn=4096),
}
COLUMNS = (
    "device", "model", "method", "precision", "batch_size", "tokens_per_sample", "seconds_per_update_cpu",
    "seconds_per_update_wall", "peak_rss_mb", "trained_params", "all_params", "checkpoint_mb", "compact_mb",
    "measured", "command",
)  # fmt: skip
KEY = ("device", "model", "method", "precision", "batch_size", "tokens_per_sample")
DEVICE = f"cpu ({os.cpu_count()} cores, shared)"
TOKENS = (121, 128)  # the train rows' length range (BPE tokens with <s> and separators)
GLOVE_DIM = 300  # glove.6B.300d's width, which the GloVe preset's generator takes


# ---------------------------------------------------------------------------------------- inputs
def rte_slice(out, bpe_dir, train_rows=64, dev_rows=8):
    """``out/RTE/{train,dev}.tsv``: the first ``train_rows`` RTE train rows of TOKENS tokens, the first
    ``dev_rows`` dev rows (the real rows, verbatim)."""
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    folder = Path(out) / "RTE"
    if (folder / "dev.tsv").is_file():
        return folder
    bpe = GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=f"{bpe_dir}/encoder.json", gpt2_vocab_bpe=f"{bpe_dir}/vocab.bpe"))
    raw = SHARED / "data" / "glue" / "RTE"
    header, *rows = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()
    kept = []
    for row in rows:
        s1, s2 = row.split("\t")[1:3]
        if TOKENS[0] <= len(bpe.encode(s1).split()) + len(bpe.encode(s2).split()) + 4 <= TOKENS[1]:
            kept.append(row)
        if len(kept) == train_rows:
            break
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    dev = (raw / "dev.tsv").read_text(encoding="utf-8").splitlines()[: dev_rows + 1]
    (folder / "dev.tsv").write_text("\n".join(dev) + "\n", encoding="utf-8")
    return folder


def backbone(work, size, bpe_dir):
    """A random fairseq RoBERTa folder of ``size`` with RoBERTa's dictionary (written once)."""
    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    folder = Path(work) / "models" / size
    if not (folder / "model.pt").is_file():
        print(f"writing a random {size} to {folder}", flush=True)
        write_tiny_roberta(folder, **SIZES[size], bpe_dir=bpe_dir)
    return folder


def glove_file(work, bpe_dir, words=2000):
    """A small GloVe text file (random 300-d vectors) of the commonest words of RoBERTa's vocabulary."""
    import torch

    path = Path(work) / f"glove.random.{GLOVE_DIM}d.txt"
    if not path.is_file():
        encoder = json.loads((Path(bpe_dir) / "encoder.json").read_text(encoding="utf-8"))
        chosen = [w[1:].lower() for w in encoder if w.startswith("\u0120") and w[1:].isalpha()][:words]
        g = torch.Generator().manual_seed(0)
        lines = (w + " " + " ".join(f"{v:.4f}" for v in torch.randn(GLOVE_DIM, generator=g).tolist()) for w in chosen)
        path.write_text("\n".join(dict.fromkeys(lines)) + "\n", encoding="utf-8")
    return path


def method_flags(name, work, bpe_dir):
    """The files a method needs, as fairseq-train flags (run.sh passes unknown flags on)."""
    from fairseq_idpg.methods import METHODS

    method = METHODS[name]
    if method.options.get("idpg_preset") and method.preset.get("idpg_input") == "glove":
        return ["--idpg-glove-vectors", str(glove_file(work, bpe_dir))]
    return []


# ---------------------------------------------------------------------------------------- one run
def descendants(pid):
    """Process ids below ``pid`` (Linux /proc)."""
    children, found = {}, []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class TrainingProcess:
    """The fairseq-train process below a run.sh: its CPU seconds and VmHWM, read from /proc."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, root):
        self.root, self.pid, self.peak_kb, self.done = root, None, 0, False

    def find(self):
        for pid in descendants(self.root):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                # the launcher runs the fairseq-train console script (python -m fairseq_cli.train before)
                if any(a.endswith(b"fairseq-train") or a == b"fairseq_cli.train" for a in args[:3]):
                    self.pid = pid
            except OSError:
                pass
        return self.pid

    def cpu_seconds(self):
        if self.pid is None and self.find() is None:
            return None
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.TICK  # utime + stime

    def watch(self, every=0.1):
        """Poll VmHWM until ``done`` (a thread)."""
        while not self.done:
            try:
                if self.pid is not None or self.find() is not None:
                    status = Path(f"/proc/{self.pid}/status").read_text()
                    self.peak_kb = max(self.peak_kb, int(re.search(r"VmHWM:\s+(\d+)", status).group(1)))
            except (OSError, AttributeError):
                pass
            time.sleep(every)


def run_one(size, method, model_dir, raw, work, batch, updates, log):
    """One pipeline run; returns the row's measured fields (ValueError when a check fails)."""
    cmd = [REPO / "scripts" / "run.sh", "RTE", "--method", method, "--model", model_dir, "--raw", raw]
    cmd += ["--work-dir", work, "--max-update", updates, "--total-batch", batch, "--restart", "--log-interval", 1]
    cmd += method_flags(method, work, SHARED / "roberta_bpe")
    cmd = [str(c) for c in cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log.write("+ " + shlex.join(cmd) + "\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
    train = TrainingProcess(proc.pid)
    watcher = threading.Thread(target=train.watch, daemon=True)
    watcher.start()
    marks, out = {}, []
    for line in proc.stdout:
        log.write(line)
        out.append(line)
        found = re.search(r"train_inner \| .*\"num_updates\": \"(\d+)\"", line)
        if found:
            marks[int(found.group(1))] = (train.cpu_seconds(), time.monotonic())
    code = proc.wait()
    train.done = True
    watcher.join()
    log.flush()
    text = "".join(out)
    if code:
        raise ValueError(f"run.sh exited with {code}: {''.join(out[-5:])}")
    if 1 not in marks or updates not in marks:
        raise ValueError(f"no train_inner lines of updates 1 and {updates} in the output")
    (cpu1, wall1), (cpuN, wallN) = marks[1], marks[updates]
    params = re.search(r"num\. shared model params: ([\d,]+) \(num\. trained: ([\d,]+)\)", text)
    folder = Path(re.search(r"^run folder: (.+)$", text, re.M).group(1).strip())
    record = json.loads((folder / "results.json").read_text())
    logged = [c for c in record["curve"] if c["split"] == "valid"][-1]
    if abs(float(logged["loss"]) - float(record["results"]["valid"]["loss"])) > 1e-3:
        raise ValueError(f"reloaded dev loss {record['results']['valid']['loss']} != logged {logged['loss']}")
    best = folder / "checkpoint_best.pt"
    compact = folder / "compact.pt"
    subprocess.run([sys.executable, REPO / "scripts" / "export_checkpoint.py", best, compact], check=True, env=env)
    row = {
        "seconds_per_update_cpu": round((cpuN - cpu1) / (updates - 1), 2),
        "seconds_per_update_wall": round((wallN - wall1) / (updates - 1), 2),
        "peak_rss_mb": round(train.peak_kb / 1024),
        "trained_params": int(params.group(2).replace(",", "")),
        "all_params": int(params.group(1).replace(",", "")),
        "checkpoint_mb": round(best.stat().st_size / 2**20, 2),
        "compact_mb": round(compact.stat().st_size / 2**20, 2),
    }
    shutil.rmtree(folder)  # roberta.large fine-tuning writes ~8 GB of checkpoints
    return row


# ---------------------------------------------------------------------------------------- rows
def read_rows(path):
    if not Path(path).is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def add_row(path, row, lock_file):
    """Put ``row`` into the CSV at ``path`` in place of one with its KEY (under ``lock_file``: runs of
    several sizes may share the CSV); returns the rows now there."""
    import fcntl

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = [r for r in read_rows(path) if any(r[k] != row[k] for k in KEY)] + [row]
        tmp = Path(str(path) + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
    return rows


def markdown(rows):
    head = ("model", "method", "CPU s/update", "wall s/update", "peak RSS MB", "trained", "all", "ckpt MB")
    head += ("compact MB",)
    from fairseq_idpg.methods import METHODS

    order = list(METHODS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (list(SIZES).index(r["model"]), order.index(r["method"]))):
        lines.append(
            f"| {r['model']} | {r['method']} | {r['seconds_per_update_cpu']} | {r['seconds_per_update_wall']} | "
            f"{int(r['peak_rss_mb']):,} | {int(r['trained_params']):,} | {int(r['all_params']):,} | "
            f"{r['checkpoint_mb']} | {r['compact_mb']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    from fairseq_idpg.methods import METHODS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--methods", help="comma-separated method names (default: every record, in order)")
    parser.add_argument("--batch", type=int, default=8, help="sentences per update (default 8)")
    parser.add_argument("--updates", type=int, default=2, help="training updates per run (>= 2; default 2)")
    parser.add_argument("--work-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "benchmark-sizes"))
    parser.add_argument("--csv", default=str(REPO / "docs" / "data" / "seconds_per_update_cpu.csv"))
    parser.add_argument("--log", help="where the runs' output goes (default WORK/benchmark.log)")
    parser.add_argument("--force", action="store_true", help="measure rows the CSV already has again")
    parser.add_argument("--table", action="store_true", help="print the CSV's markdown table and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(read_rows(args.csv)))
        return 0
    sizes = args.sizes.split(",")
    for size in sizes:
        if size not in SIZES:
            parser.error(f"--sizes: {size!r} is not one of {', '.join(SIZES)}")
    methods = args.methods.split(",") if args.methods else list(METHODS)
    for name in methods:
        if name not in METHODS:
            parser.error(f"--methods: {name!r} is not a method of fairseq_idpg/methods.py")
    if args.updates < 2:
        parser.error(f"--updates must be >= 2 (update 1 is not timed), got {args.updates}")
    bpe_dir = SHARED / "roberta_bpe"
    work = Path(args.work_dir).resolve()
    raw = rte_slice(work / "raw", bpe_dir)
    command = shlex.join(["python", "scripts/benchmark_sizes.py", *(sys.argv[1:] if argv is None else argv)])
    rows = read_rows(args.csv)
    with open(args.log or work / "benchmark.log", "a", encoding="utf-8") as log:
        for size in sizes:
            model_dir = backbone(work, size, bpe_dir)
            for name in methods:
                key = dict(device=DEVICE, model=size, method=name, precision="fp32", batch_size=str(args.batch),
                           tokens_per_sample=str(TOKENS[1]))  # fmt: skip
                if not args.force and any(all(r[k] == v for k, v in key.items()) for r in read_rows(args.csv)):
                    print(f"{size} {name}: in {args.csv} already", flush=True)
                    continue
                start = time.time()
                try:
                    measured = run_one(size, name, model_dir, raw, work, args.batch, args.updates, log)
                except (ValueError, subprocess.CalledProcessError, OSError) as e:
                    print(f"{size} {name}: FAILED: {e}", flush=True)
                    continue
                row = {**key, **measured, "measured": datetime.date.today().isoformat(), "command": command}
                rows = add_row(args.csv, row, work / "csv.lock")
                print(f"{size} {name}: {json.dumps(measured)} ({time.time() - start:.0f} s)", flush=True)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
