"""K fairseq-train runs in one process, meeting at each update for one fused forward and backward.

Each member runs fairseq-train's own loop (``fairseq_cli.train.main``) in a thread of its own: its data order
(its seed), its optimizer and lr schedule, gradient clipping, validation, checkpoint_best/last, early stop and
divergence are fairseq's, as in a lone run. Only the computation of a training step is shared: a member's
``task.train_step`` hands its batch to the group and waits; when every running member has handed one in, the
last to arrive runs ``StackedMembers`` over all the batches (one forward and one backward through the frozen
backbone), the members' losses on their own rows (``sentence_prediction``'s for all of them at once,
``criterion.py``; any other criterion called per member), and gives each member its loss, logging output and the
gradients of its own tensors, which its fairseq trainer then clips, normalises and steps on as usual. The
logging outputs' scalars come to the host in one copy for all members (``_logs_on_host``): fairseq's meters
then add Python numbers, not device tensors.

- One thread runs at a time (the baton): fairseq keeps per-run state in module globals (the metrics
  aggregators, ``save_checkpoint.best``, ``should_stop_early``'s best and patience, numpy's and torch's
  global generators around data shuffling); each member's are swapped in when it takes the baton and out when
  it hands in a batch, so the members never see each other's.
- Member tensors live in the stacked ones: after each member has built its model and loaded its checkpoint,
  its trained parameters become views of their member's slice of the stacked tensors (``p.data = stacked[k]``),
  so what its optimizer writes is what the fused forward reads, and its validation and checkpoints see it.
- A member's frozen backbone is the first member's (shared as each member's model is built: one copy in memory).
- Batches of different sizes: a member's batch is padded to the longest sequence (masked pads) and to the most
  rows by repeating its first row; the extra rows' outputs are dropped before its criterion.
- A member that ends (its last update, early stop, divergence, an error) leaves; its slot then repeats another
  member's batch and nothing reads it.
- The fused step runs on one thread of the group's own (``_StepThread``), whichever member completes the round:
  the host allocator (glibc's malloc) gives each thread an arena of its own and keeps what a thread freed for
  that thread, so a step run by each member's thread in turn left a step's working memory (K members' activations)
  in each of the K arenas: host memory K^2 (e.g. 14.7 GB at K = 20 on the stand-in, CPU). One thread: one step's.
- Dropout: the fused step seeds torch from the members' seeds and updates, so a rerun draws the same masks;
  a member's masks are not those of its lone run (with dropout off, it computes what its lone run computes).
"""

import contextlib
import queue
import threading
import time

import numpy as np
import torch

from fairseq_idpg.host_tensors import on_host

from . import criterion as batched
from .stacked import StackedMembers


class _MemberGlobals:
    """fairseq's per-run module globals (module docstring), saved and restored per member."""

    def __init__(self):
        from fairseq.logging import metrics

        self.metrics = ({}, {}, {})
        self.saved = False
        self._metrics = metrics

    def save(self):
        from fairseq import checkpoint_utils
        from fairseq_cli import train

        m = self._metrics
        self.metrics = (m._aggregators, m._active_aggregators, m._active_aggregators_cnt)
        self.best = getattr(checkpoint_utils.save_checkpoint, "best", None)
        self.stop = {k: getattr(train.should_stop_early, k, None) for k in ("best", "num_runs")}
        self.numpy = np.random.get_state()
        self.torch = torch.get_rng_state()
        self.saved = True

    def restore(self):
        from fairseq import checkpoint_utils
        from fairseq_cli import train

        if not self.saved:  # a member's first turn: fresh state (fairseq-train's main resets its metrics)
            from collections import OrderedDict, defaultdict

            self._metrics._aggregators = OrderedDict()
            self._metrics._active_aggregators = OrderedDict()
            self._metrics._active_aggregators_cnt = defaultdict(lambda: 0)
            self._metrics.reset()
            for attr in ("best",):
                if hasattr(checkpoint_utils.save_checkpoint, attr):
                    delattr(checkpoint_utils.save_checkpoint, attr)
            for attr in ("best", "num_runs"):
                if hasattr(train.should_stop_early, attr):
                    delattr(train.should_stop_early, attr)
            return
        m = self._metrics
        m._aggregators, m._active_aggregators, m._active_aggregators_cnt = self.metrics
        _set_or_del(checkpoint_utils.save_checkpoint, "best", self.best)
        for k, v in self.stop.items():
            _set_or_del(train.should_stop_early, k, v)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)


def _set_or_del(obj, attr, value):
    if value is None:
        if hasattr(obj, attr):
            delattr(obj, attr)
    else:
        setattr(obj, attr, value)


class Member:
    """One run of the group: its fairseq objects, once its trainer is built."""

    def __init__(self, index, seed):
        self.index, self.seed = index, seed
        self.trainer = self.model = self.criterion = self.task = None
        self.params = []  # its trained parameters, in the stacked tensors' order
        self.globals = _MemberGlobals()
        self.update = 0
        self.grad_norm = None  # its gradients' norm, computed by the fused step (``_KnownNorm``)


class FusedGroup:
    """The meeting point of K member threads (module docstring)."""

    def __init__(self, seeds, round_starts=None):
        self.members = [Member(i, s) for i, s in enumerate(seeds)]
        self.round_starts = round_starts  # a list: each fused step's start (time.perf_counter), for benchmarks
        self.k = len(seeds)
        self.baton = threading.Lock()
        self.cond = threading.Condition()
        self.active = set(range(self.k))
        self.waiting = {}  # member index -> its prepared sample
        self.results = {}
        self.generation = 0
        self.stacked = None
        self.template = None  # the member whose model was built first: the others share its frozen tensors
        self.steps = 0
        self._probe, self._probe_round, self._probe_on = None, None, False  # count_round
        self._step_thread = None  # _StepThread, started by the first fused step

    def close(self):
        """Stop the group's step thread (when the members have ended)."""
        if self._step_thread is not None:
            self._step_thread.close()
            self._step_thread = None

    # ---------------------------------------------------------------- a member's thread
    @contextlib.contextmanager
    def turn(self, index):
        """Member ``index`` runs (holding the baton, its globals in place) inside."""
        self.baton.acquire()
        self.members[index].globals.restore()
        self._count(True)
        try:
            yield
        finally:
            self._count(False)
            self.members[index].globals.save()
            self.baton.release()

    def count_round(self, round_index, count):
        """Count (``launches.ThreadsCount``) what every thread does in round ``round_index`` (0-based): from the
        start of its fused step to the start of the next one's, each member's update once (its optimizer step,
        logging, next batch) and the fused forward and backward."""
        self._probe, self._probe_round, self._probe_on = count, round_index, False

    def _count(self, on):
        if self._probe is not None and (self._probe_on or not on):
            self._probe.enter() if on else self._probe.exit()

    def leave(self, index):
        """Member ``index`` has ended: the others no longer wait for it (called without the baton)."""
        with self.cond:
            self.active.discard(index)
            batches = self._claim()
        if batches is not None:
            with self.baton:
                self._run_step(batches)

    def step(self, index, sample):
        """Member ``index``'s batch in; (loss, sample_size, logging_output, grads) out, once the group stepped.
        Called from the member's ``task.train_step``, holding the baton; the last member to hand in its batch
        runs the fused step (still holding it: every other member is waiting)."""
        member = self.members[index]
        member.globals.save()
        with self.cond:
            self.waiting[index] = sample
            generation = self.generation
            batches = self._claim()
        if batches is not None:
            self._run_step(batches)
        self._count(False)
        self.baton.release()
        try:
            with self.cond:
                self.cond.wait_for(lambda: self.generation != generation)
                result = self.results.pop(index)
        finally:
            self.baton.acquire()
            member.globals.restore()
            self._count(True)
        if isinstance(result, BaseException):
            raise result
        return result

    # ---------------------------------------------------------------- the fused step
    def _claim(self):
        """The batches of a complete round (every running member's), taken; else None. Under ``cond``."""
        if not self.waiting or len(self.waiting) != len(self.active):
            return None
        batches, self.waiting = self.waiting, {}
        return batches

    def _run_step(self, batches):
        if self.round_starts is not None:
            self.round_starts.append(time.perf_counter())
        if self._probe is not None and self.steps in (self._probe_round, self._probe_round + 1):
            self._probe_on = self.steps == self._probe_round
            self._count(self._probe_on)
        if self._step_thread is None:
            self._step_thread = _StepThread()
        try:
            results = self._step_thread.run(self._counted_step, batches)
        except BaseException as e:  # every waiting member sees the failure as its own step's
            results = {i: e for i in batches}
        with self.cond:
            self.results.update(results)
            self.generation += 1
            self.cond.notify_all()

    def _counted_step(self, batches):
        """The fused step, on the step thread: counted there too while ``count_round``'s round is on."""
        self._count(True)
        try:
            return self._fused_step(batches)
        finally:
            self._count(False)

    def _build_stacked(self):
        template = self.members[self.template].model
        states = [
            {n: p.detach() for n, p in m.model.named_parameters() if p.requires_grad} if m.model is not None else None
            for m in self.members
        ]
        fill = next(s for s in states if s is not None)
        self.stacked = StackedMembers(template, members=[s if s is not None else fill for s in states])
        for m in self.members:
            if m.model is None:
                continue
            for tensor, p in zip(self.stacked.tensors, m.params, strict=True):
                p.data = tensor.data[m.index]  # the member's optimizer now writes into the stacked tensor

    def _fused_step(self, waiting):
        if self.stacked is None:
            self._build_stacked()
        filler = next(iter(waiting.values()))
        samples = [waiting.get(i, filler) for i in range(self.k)]
        template = self.members[self.template]
        tokens, per_row, targets, rows = _stack_batches(samples, template.model.encoder.sentence_encoder.padding_idx)
        seed = sum(m.seed * 1_000_003 + m.update for m in self.members) % (2**31)
        self.steps += 1
        head = template.criterion.classification_head_name
        with torch.random.fork_rng(devices=[tokens.device] if tokens.is_cuda else []):
            torch.manual_seed(seed)
            template.model.train()
            logits = self.stacked(tokens, features_only=True, classification_head_name=head, **per_row)
        if targets is not None and batched.batched_for(template.criterion, template.model):
            results = self._members_loss(waiting, samples, logits, targets, rows)
        else:
            results = self._each_members_loss(waiting, logits, rows)
        out = {}
        for i, (loss, sample_size, logging_output) in results.items():
            grads = [t.grad[i] if t.grad is not None else None for t in self.stacked.tensors]
            out[i] = (loss.detach(), sample_size, logging_output, grads)
        return out

    def _loss_scales(self, indices):
        """Each member's fp16 loss scale (fairseq's dynamic loss scaler; 1 without one), 0 for a filler slot."""
        scales = [0.0] * self.k
        for i in indices:
            scaler = getattr(self.members[i].trainer.optimizer, "scaler", None)
            scales[i] = scaler.loss_scale if scaler is not None else 1.0
        return scales

    def _members_loss(self, waiting, samples, logits, targets, rows):
        """Every member's loss and logging output in one set of operators (``criterion.members_loss``), backward
        run; the logging values on the host in one copy."""
        template = self.members[self.template]
        losses, values = batched.members_loss(template.criterion, logits, targets, rows)
        scales = self._loss_scales(waiting)
        weighted = losses if all(s == 1.0 for s in scales) else losses * losses.new_tensor(scales)
        for t in self.stacked.tensors:
            t.grad = None
        weighted.sum().backward()
        knows_norm = {i for i in waiting if _norm_known(self.members[i])}
        norms = [self._grad_norms()] if knows_norm else []
        host = torch.stack([losses.detach(), *(v.to(losses.dtype) for v in values.values()), *norms]).tolist()
        results = {}
        for i in waiting:
            self.members[i].grad_norm = host[-1][i] if i in knows_norm else None
            own = {key: int(column[i]) for key, column in zip(values, host[1 : 1 + len(values)], strict=True)}
            log = batched.logging_output(host[0][i], samples[i], rows[i], own)
            results[i] = (losses[i], rows[i], log)
        return results

    def _grad_norms(self):
        """Each member's gradient norm [K] (fp32): the norm of its tensors' norms, as fairseq's ``clip_grad_norm_``
        computes it from the same gradients."""
        grads = [t.grad for t in self.stacked.tensors if t.grad is not None]
        norms = [torch.linalg.vector_norm(g.reshape(g.size(0), -1), dim=1, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), dim=0)

    def _each_members_loss(self, waiting, logits, rows):
        """Each member's criterion on its own rows (any criterion), backward run."""
        total, results = None, {}
        for i, sample in waiting.items():
            member = self.members[i]
            output = _FixedOutput(member.model, logits[i, : rows[i]])
            loss, sample_size, logging_output = member.criterion(output, sample)
            scaler = getattr(member.trainer.optimizer, "scaler", None)
            scaled = scaler.scale(loss) if scaler is not None else loss
            total = scaled if total is None else total + scaled
            results[i] = (loss, sample_size, logging_output)
        for t in self.stacked.tensors:
            t.grad = None
        total.backward()
        _logs_on_host([log for _, _, log in results.values()])
        return results


class _StepThread:
    """One thread that runs every fused step (module docstring: one malloc arena holds the steps' memory, not
    one per member). ``run(fn, arg)`` runs ``fn(arg)`` there, in the caller's grad mode, autocast and CUDA device, and
    returns its result or raises its exception; the caller waits (it holds the baton: nothing else runs)."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="fused-step", daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, arg, grad, device, autocast, box, done = job
            try:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.set_grad_enabled(grad))
                    if device is not None:
                        stack.enter_context(torch.cuda.device(device))
                    for kind, dtype in autocast:  # fairseq's --amp: its trainer's autocast, entered by the member
                        stack.enter_context(torch.autocast(kind, dtype=dtype))
                    box.append(fn(arg))
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                box.append(e)
                box.append(None)  # marks an exception
            finally:
                done.set()

    def run(self, fn, arg):
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        kinds = [kind for kind in ("cuda", "cpu") if torch.is_autocast_enabled(kind)]
        autocast = [(kind, torch.get_autocast_dtype(kind)) for kind in kinds]
        box, done = [], threading.Event()
        self._jobs.put((fn, arg, torch.is_grad_enabled(), device, autocast, box, done))
        done.wait()
        if len(box) == 2:
            raise box[0]
        return box[0]

    def close(self):
        self._jobs.put(None)
        self._thread.join()


def _logs_on_host(logging_outputs):
    """The members' logging-output scalars (device tensors: loss, correct counts, ...) as Python numbers, in one
    copy to the host per dtype, in place. fairseq's meters then sum them on the host; on the device each value of
    each member costs a few kernels an update (about 44 a member), and its log line reads each back anyway."""
    found = {}
    for log in logging_outputs:
        for key, value in log.items():
            if torch.is_tensor(value) and value.numel() == 1:
                found.setdefault(value.dtype, []).append((log, key, value))
    for items in found.values():
        values = torch.stack([v.detach().reshape(()) for _, _, v in items]).tolist()
        for (log, key, _), value in zip(items, values, strict=True):
            log[key] = value


def _norm_known(member):
    """Whether ``member``'s gradient norm comes from the fused step (``_KnownNorm``, installed here once): under
    fairseq's ``FP16Optimizer`` (fp16, bf16); fp32 runs compute theirs as fairseq does."""
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    optimizer = member.trainer.optimizer
    if not isinstance(optimizer, _FP16OptimizerMixin):
        return False
    inner = optimizer.fp32_optimizer
    if not isinstance(inner.__dict__.get("clip_grad_norm"), _KnownNorm):
        inner.clip_grad_norm = _KnownNorm(member, inner.clip_grad_norm)
    return True


class _KnownNorm:
    """A member's fp32 optimizer's ``clip_grad_norm`` under ``FP16Optimizer``, which asks it for the norm of the
    gradients only (``max_norm`` 0) and then scales, clips and checks for overflow as it does: the norm the fused
    step computed for every member at once (``FusedGroup._grad_norms``), as a host tensor. fairseq computes it per
    member on the device (a norm per tensor, their norm) and its trainer checks and logs it there: ~20 launches a
    member-update. Anything else (a norm not known, clipping asked here) is fairseq's own."""

    def __init__(self, member, own):
        self.member, self.own = member, own

    def __call__(self, max_norm, aggregate_norm_fn=None):
        norm, self.member.grad_norm = self.member.grad_norm, None
        if norm is None or max_norm > 0 or aggregate_norm_fn is not None:
            return self.own(max_norm, aggregate_norm_fn)
        return on_host(torch.tensor(norm, dtype=torch.float32))


class _FixedOutput:
    """Stands for a member's model in its criterion: returns the fused forward's rows of this member."""

    def __init__(self, model, logits):
        self._model, self._logits = model, logits
        self.training = True

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._logits, {}


def _stack_batches(samples, pad):
    """[K, B, T] tokens (each member's right-padded to the longest T, its rows repeated to the most B), the other
    per-row net_input tensors [K, B, ...] (src_lengths, IDPG's sentence_ids), the targets [K, B] (None without
    them), each member's own row count."""
    rows = [s["net_input"]["src_tokens"].size(0) for s in samples]
    most_rows = max(rows)
    longest = max(s["net_input"]["src_tokens"].size(1) for s in samples)

    def fill_rows(t):
        extra = most_rows - t.size(0)
        return t if extra == 0 else torch.cat([t, t[:1].expand(extra, *t.shape[1:])])

    tokens = []
    for s in samples:
        t = s["net_input"]["src_tokens"]
        t = torch.nn.functional.pad(t, (0, longest - t.size(1)), value=pad)
        tokens.append(fill_rows(t))
    keys = [k for k, v in samples[0]["net_input"].items() if torch.is_tensor(v) and k != "src_tokens"]
    per_row = {k: torch.stack([fill_rows(s["net_input"][k]) for s in samples]) for k in keys}
    targets = None
    if all(torch.is_tensor(s.get("target")) for s in samples):
        targets = torch.stack([fill_rows(s["target"].view(-1)) for s in samples])
    return torch.stack(tokens), per_row, targets, rows
