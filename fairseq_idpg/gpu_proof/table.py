"""docs/benchmarks.md's GPU tables, made from the device script's JSON alone and put between the page's markers
(``BEGIN`` / ``END``), so that a rerun replaces them: ``render`` (the markdown) and ``update_doc``."""

from pathlib import Path

from fairseq_idpg.errors import ConfigError

BEGIN = "<!-- gpu_proof: begin (scripts/gpu_proof.sh writes what is between these lines) -->"
END = "<!-- gpu_proof: end -->"


def _n(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def _tf(x):
    return "-" if x is None else f"{x:.3g}"


def _gib(x):
    return "-" if x is None else f"{x / 2**30:.1f}"


def _status(part):
    said = []
    if part.get("error"):
        said.append(f"**failed**: {part['error']}")
    said += [f"**failed**: {error}" for error in part.get("errors", [])]
    if part.get("cut"):
        said.append(f"**cut**: {part['cut']}")
    timing = f"{part['seconds']:.0f} s of its {part['budget_seconds']:g} s budget, on {part['device']}"
    return f"({timing}" + ("; " + "; ".join(said) if said else "") + ")"


def fused_table(part):
    rows = part["rows"]
    lines = [
        "| method | K | lone ms/update | fused ms/round | updates/s lone | updates/s fused | fused / lone "
        "| K runs alone s | fused s | group start s | peak memory GiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        scaled = f" ({r['alone_runs_timed']} timed, scaled)" if r["alone_scaled_to_k"] else ""
        lines.append(
            f"| {r['method']}{' (cut)' if r['cut'] else ''} | {r['k']} | {_n(r['ms_per_update_alone'])} "
            f"| {_n(r['ms_per_round_fused'])} | {_n(r['updates_per_s_alone'], 2)} | {_n(r['updates_per_s_fused'], 2)} "
            f"| **{_n(r['speedup'], 2)}** | {_n(r['alone_seconds'])}{scaled} | {_n(r['fused_seconds'])} "
            f"| {_n(r['start_seconds'])} | {_gib(r['peak_memory_bytes'])} |"
        )
    memory = rows[0]["memory_measure"] if rows else ""
    return lines, f"Peak memory: {memory}." if memory else ""


def updates_table(part):
    lines = [
        "| method (PEFT's) | precision | fairseq-train update ms (TFLOP/s) | PEFT plain step ms (TFLOP/s) "
        "| HF Trainer update ms (TFLOP/s) | update / PEFT step | update / Trainer |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in part["rows"]:
        ran = "" if r.get("trainer_ran", r["precision"]) == r["precision"] else f" (ran {r['trainer_ran']})"
        peft = f" (PEFT: {r['peft_error']})" if "peft_error" in r else ""
        lines.append(
            f"| {r['method']} ({r['peft']}){peft} | {r['precision']} "
            f"| {_n(r['fairseq_update_ms'])} ({_tf(r['fairseq_update_tflops'])}) "
            f"| {_n(r.get('peft_step_ms'))} ({_tf(r.get('peft_step_tflops'))}) "
            f"| {_n(r.get('trainer_update_ms'))}{ran} ({_tf(r.get('trainer_update_tflops'))}) "
            f"| **{_n(r.get('update_over_peft'), 3)}** | {_n(r.get('update_over_trainer'), 3)} |"
        )
    return lines, "TFLOP/s: the step's FLOPs (torch's FlopCounterMode) over its time; the Trainer's are PEFT's step's."


def resume_table(part):
    lines = [
        "| method | K | updates | stopped after | precision, dropout | largest difference | moved after the stop "
        "| tolerance | equal |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for r in part["rows"]:
        lines.append(
            f"| {r['method']} ({r['layers']} x {r['dim']}) | {r['k']} | {r['updates']} | {r['stopped_after']} "
            f"| {r['precision']}, {r['dropout']:g} | {r['largest_difference']:.3g} | {r['least_moved_after_stop']:.3g} "
            f"| {r['atol']:g} + {r['rtol']:g} \\|x\\| | **{'yes' if r['equal'] else 'NO'}** |"
        )
    return lines, ""


def serving_table(part):
    lines = [
        "| tasks | method | passes | mixed ms | one after another ms | speed-up |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in part["rows"]:
        scaled = f" ({r['models_timed']} models timed, scaled)" if r["one_by_one_scaled"] else ""
        lines.append(
            f"| {r['tasks']} of {r['asked']} | {r['method']} | {r['passes']} | {_n(r['mixed_ms'])} "
            f"| {_n(r['one_by_one_ms'])}{scaled} | **{_n(r['speedup'], 2)}x** |"
        )
    return lines, f"{part['rows'][0]['sentences_per_task']} sentences per task, fp32." if part["rows"] else ""


TABLES = {
    "fused": ("K runs trained together against lone runs, whole runs", fused_table),
    "updates": ("A lone fairseq-train update against PEFT's plain step and the Hugging Face Trainer", updates_table),
    "resume": ("A fused group stopped and resumed against one run through", resume_table),
    "serving": ("Tasks served in one mixed batch against their own models one after another", serving_table),
}


def render(data):
    """The markdown between the markers: a header line, then per part its title, status and table."""
    state = "finished" if data.get("finished") else f"not finished: {data.get('interrupted') or 'stopped'}"
    out = [
        f"Measured by `{data['command']}` on {data['device']}, {data['date']} (torch {data['torch']}, CUDA "
        f"{data['cuda']}): a random backbone of {data['size']}'s shape ({data['layers']} x {data['dim']}, "
        f"{data['heads']} heads, a dictionary of {data['dictionary']:,}), batch {data['batch']} x {data['length']}, "
        f"fused runs in {data['dtype']}; {data.get('wall_seconds', 0):.0f} s of wall time, {state}. The figures: "
        f"`docs/data/gpu_proof.json`."
    ]
    for name, (title, table) in TABLES.items():
        part = data["parts"].get(name)
        if part is None:
            continue
        lines, note = table(part)
        out += ["", f"**{title}** {_status(part)}", "", *lines]
        if note:
            out += ["", note]
    return "\n".join(out)


def _region(text, doc):
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ConfigError(f"--doc {doc}: expected the lines {BEGIN!r} and {END!r} once each, in that order")
    return text.index(BEGIN) + len(BEGIN), text.index(END)


def check_markers(doc):
    """One line (a ConfigError) when ``doc`` cannot take the tables."""
    try:
        _region(Path(doc).read_text(encoding="utf-8"), doc)
    except OSError as e:
        raise ConfigError(f"--doc {doc}: cannot be read ({e.strerror or e})") from None


def region(doc):
    """The text between ``doc``'s markers, without the blank lines around it."""
    text = Path(doc).read_text(encoding="utf-8")
    begin, end = _region(text, doc)
    return text[begin:end].strip("\n")


def update_doc(doc, data):
    """Replace what is between ``doc``'s markers by ``render(data)``, atomically."""
    from fairseq_idpg.files import writing

    text = Path(doc).read_text(encoding="utf-8")
    begin, end = _region(text, doc)
    with writing(doc) as tmp:
        Path(tmp).write_text(text[:begin] + "\n" + render(data) + "\n" + text[end:], encoding="utf-8")
