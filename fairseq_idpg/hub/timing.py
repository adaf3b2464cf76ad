"""Timing mixed-task inference (``MultiTaskModel``) against the tasks' own hub models one after another, on the same
sentences: ``scripts/bench_serving.py`` and the device script (``fairseq_idpg/gpu_proof``).

Each task gets ``per_task`` SST-2-like sentences; the mixed batch interleaves the tasks' rows, tokenization
included on both sides; a time is the median of ``repeats`` calls after a warm-up, synchronised on a GPU.
"""

import statistics
import time

import torch

SENTENCES = [
    "a gripping , funny and moving film that never lets go .", "the plot is thin and the jokes fall flat .",
    "it 's fine .", "one of the year 's best , with a cast that clearly enjoys every scene .",
    "dull .", "a mess of a movie , too long by half and never sure what it wants to say about its own characters .",
    "warm and wise .", "the kind of film that makes you want to call your mother .",
]  # fmt: skip


def median_seconds(fn, repeats, device="cpu"):
    """The median seconds of ``repeats`` calls of ``fn`` after one warm-up call (synchronised on CUDA)."""
    cuda = torch.device(device).type == "cuda"
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def task_rows(names, per_task):
    """[(task name, sentence)]: ``per_task`` sentences for each task, and the same rows interleaved (the mixed
    batch's order) as (names, texts)."""
    rows = [(name, SENTENCES[(i + j) % len(SENTENCES)]) for i, name in enumerate(names) for j in range(per_task)]
    order = sorted(range(len(rows)), key=lambda r: (r * 7919) % len(rows))  # the tasks' rows interleaved
    return rows, [rows[r][0] for r in order], [rows[r][1] for r in order]


def mixed_seconds(mt, names, per_task, repeats):
    """Seconds of one mixed batch of the tasks ``names`` of ``mt`` (``MultiTaskModel``), tokenization included."""
    _, mixed_names, mixed_texts = task_rows(names, per_task)

    def mixed():
        with torch.no_grad():
            return mt.logits(mixed_names, mixed_texts)

    return median_seconds(mixed, repeats, mt.device)


def one_by_one_seconds(hubs, names, per_task, repeats, head):
    """Seconds of the hub models ``hubs`` (``RobertaModel.from_pretrained``, one per name of ``names``) answering
    their own tasks' rows one after another, tokenization included."""
    from fairseq.data.data_utils import collate_tokens

    rows, _, _ = task_rows(names, per_task)
    device = next(hubs[0].model.parameters()).device

    def one_by_one():
        with torch.no_grad():
            for hub, name in zip(hubs, names, strict=False):
                texts = [t for n, t in rows if n == name]
                tokens = collate_tokens([hub.encode(t) for t in texts], pad_idx=hub.task.dictionary.pad())
                hub.predict(head, tokens, return_logits=True)

    return median_seconds(one_by_one, repeats, device)
