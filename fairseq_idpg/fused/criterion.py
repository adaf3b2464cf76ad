"""fairseq's ``sentence_prediction`` training loss for K members at once, from the fused forward's logits.

    losses, logs = members_loss(criterion, logits, targets, rows)   # logits [K, B, C]; targets [K, B]

Each member's loss is what its own criterion computes on its own rows (``sentence_prediction``: the sum over
rows of the fp32 cross-entropy, or of the squared error with ``--regression-target``), its logging values
(``ncorrect``) likewise; rows past a member's own count (``group._stack_batches`` repeats a row to fill a
batch) are masked out. One set of operators for all K members where calling each member's criterion on its
rows costs a dozen operators each way per member (tests/test_fused.py compares the two).

Only criteria whose training forward is exactly ``sentence_prediction``'s take this path (``batched_for``);
any other (or one with fairseq's head/FFN regularisers on) is called per member as before.
"""

import torch
import torch.nn.functional as F


def batched_for(criterion, model):
    """Whether ``criterion``'s training loss is ``sentence_prediction``'s (so ``members_loss`` computes it)."""
    from fairseq.criterions.sentence_prediction import SentencePredictionCriterion

    from fairseq_idpg.criterions.sentence_prediction_metrics import SentencePredictionMetricsCriterion

    if type(criterion) not in (SentencePredictionCriterion, SentencePredictionMetricsCriterion):
        return False
    args = getattr(model, "args", None)
    regularised = any(getattr(args, f"{name}_reg_scale_factor", 0) for name in ("mha", "ffn"))
    return not regularised


def members_loss(criterion, logits, targets, rows):
    """Each member's ``sentence_prediction`` loss [K] (fp32) and its logging tensors ({"ncorrect": [K]} for
    classification, {} for regression). ``logits`` [K, B, C] (C = 1 for regression), ``targets`` [K, B],
    ``rows``: each member's own row count (its rows first)."""
    k, b = targets.shape
    own = None  # every row is its member's own (the usual case: no mask, no operator)
    if any(r != b for r in rows):
        own = torch.arange(b, device=targets.device) < torch.tensor(rows, device=targets.device).unsqueeze(1)

    def summed(per_row):
        return (per_row if own is None else torch.where(own, per_row, 0)).sum(1)

    if criterion.regression_target:
        return summed((logits.reshape(k, b).float() - targets.float()).square()), {}
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    correct = logits.argmax(dim=-1) == targets
    return summed(-lprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)), {"ncorrect": summed(correct)}


def logging_output(loss, sample, rows, values):
    """A member's logging output, as ``sentence_prediction`` makes it (its values already on the host)."""
    out = {"loss": loss, "ntokens": sample["ntokens"], "nsentences": rows, "sample_size": rows}
    out.update(values)
    return out
