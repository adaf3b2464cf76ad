"""``python -m fairseq_idpg.serve --backbone PATH --task NAME=RUN [--task NAME=RUN ...]``: serve every task on
one frozen backbone over HTTP (docs/serving.md). A bad flag, a busy port or a run that cannot attach is one line,
exit 2: flags, paths and the port are checked before any model loads."""

import argparse
import errno
import logging
import os
import socket
import sys
import time

from fairseq_idpg.errors import ConfigError, one_line_errors


def port_number(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: expected a port number, 0 to 65535 (0: a free port)")
    return value


def parser():
    p = one_line_errors(
        argparse.ArgumentParser(prog="python -m fairseq_idpg.serve", description=__doc__.split("\n\n")[0])
    )
    p.add_argument("--backbone", required=True, metavar="PATH", help="the frozen backbone (fairseq checkpoint)")
    p.add_argument("--task", action="append", required=True, metavar="NAME=RUN", help="a run folder or checkpoint")
    p.add_argument("--task-data", action="append", default=[], metavar="NAME=DATA", help="a task's prepared data")
    p.add_argument("--bpe", help="the BPE (default: the one each checkpoint records), e.g. wordpiece or gpt2")
    p.add_argument("--wordpiece-vocab", metavar="PATH", help="vocab.txt of --bpe wordpiece (the stand-in's)")
    p.add_argument("--gpt2-encoder-json", metavar="PATH", help="encoder.json of --bpe gpt2")
    p.add_argument("--gpt2-vocab-bpe", metavar="PATH", help="vocab.bpe of --bpe gpt2")
    p.add_argument("--device", default="cpu", help="where the backbone and tasks live (cpu, cuda, cuda:1, ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000, help="0: a free port (printed)")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a request waits for others to batch")
    p.add_argument("--max-batch-rows", type=int, default=64, help="a batch's rows beyond which it waits no longer")
    p.add_argument("--max-request-rows", type=int, default=256, help="sentences one request may hold")
    return p


def pairs(p, values, flag):
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            p.error(f"{flag} {value}: expected NAME=PATH")
        if name in out:
            p.error(f"{flag} {value}: task {name} given twice")
        out[name] = path
    return out


def checked(p, args):
    """({task: run}, {task: data}) once every flag and path is right: a mistake costs no model load."""
    from fairseq_idpg.hub.attached import resolve_run

    if args.max_wait_ms < 0 or args.max_batch_rows < 1 or args.max_request_rows < 1:
        p.error("--max-wait-ms must be >= 0, --max-batch-rows and --max-request-rows >= 1")
    runs, data = pairs(p, args.task, "--task"), pairs(p, args.task_data, "--task-data")
    for name in sorted(set(data) - set(runs)):
        p.error(f"--task-data {name}=...: no --task {name}")
    if not os.path.isfile(args.backbone):
        p.error(f"--backbone {args.backbone}: no such file")
    for flag in ("wordpiece_vocab", "gpt2_encoder_json", "gpt2_vocab_bpe"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            p.error(f"--{flag.replace('_', '-')} {path}: no such file")
    for name, run in runs.items():
        try:
            resolve_run(run)
        except OSError as error:
            p.error(f"task {name}: {error}")
    for name, folder in data.items():
        if not os.path.isdir(folder):  # else the hub's config refuses it without naming it
            p.error(f"--task-data {name}={folder}: no such folder")
    return runs, data


def listen(p, host, port):
    """The service's socket, bound before the models load (minutes, for many tasks): a busy port is said at
    once. ``port`` 0 takes a free one."""
    try:
        return socket.create_server((host, port))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            p.error(f"--port {port}: {host}:{port} is in use (another process listens there); --port 0: a free one")
        p.error(f"--host {host} --port {port}: cannot listen there ({error.strerror or error})")


def build_model(p, args, runs, data):
    from fairseq_idpg.hub import MultiTaskModel

    options = {k: getattr(args, k) for k in ("bpe", "wordpiece_vocab", "gpt2_encoder_json", "gpt2_vocab_bpe")}
    model = MultiTaskModel(args.backbone, device=args.device, **{k: v for k, v in options.items() if v})
    for name, run in runs.items():
        try:
            model.attach(name, run, data=data.get(name))
        except (ConfigError, OSError, RuntimeError, ValueError) as error:
            p.error(f"task {name}: {error}" if f"task {name}" not in str(error) else str(error))
    return model


def warm_up(model):
    """One row of every task through its pass, before the service says it is ready: a process's first batch
    pays one-time costs that would otherwise fall on the first client (torch imports torch._dynamo on the
    folded attention's first call: 2 to 4 s on two cores)."""
    names = list(model.tasks)
    model.logits_of_tokens(names, [model.encode(n, ("a", "b") if model.tasks[n].pair else "a") for n in names])


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    runs, data = checked(p, args)
    listening = listen(p, args.host, args.port)

    import uvicorn

    from .app import build_app
    from .requests import Limits

    for logger in ("fairseq", "fairseq_idpg"):  # else each task logs fairseq's whole configuration (~13 KB)
        logging.getLogger(logger).setLevel(logging.WARNING)
    model = build_model(p, args, runs, data)
    for name, task in model.describe().items():
        print(f"task {name}: {task['arch']}, pass {task['group']}", file=sys.stderr)
    start = time.monotonic()
    warm_up(model)
    print(f"warmed up in {time.monotonic() - start:.1f} s (one row of every task)", file=sys.stderr)
    limits = Limits(max_rows=args.max_request_rows)
    app = build_app(model, limits, args.max_batch_rows, args.max_wait_ms / 1000)
    host, port = listening.getsockname()[:2]
    print(f"serving {len(model.tasks)} tasks on http://{host}:{port}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])


if __name__ == "__main__":
    main()
