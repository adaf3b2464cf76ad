"""The entailment head of EFL: an MNLI classification head read as entailed / not entailed.

EFL (Wang et al. 2021) fine-tunes an MNLI model on entailment pairs. The head keeps the MNLI layout of
fairseq's ``roberta.large.mnli`` (its ``mnli`` head: [contradiction, neutral, entailment]; the project's
MNLI label order is the same), so that model's head loads unchanged and its entailment probability is
EFL's starting point. Its three logits z [B, 3] become the binary pair logits

    [not entailed, entailed] = [logsumexp(z_contradiction, z_neutral), z_entailment]       [B, 2]

so that softmax of the two is exactly [P(c) + P(n), P(e)] of the MNLI head: the binary entailment loss
trains the MNLI head itself, with no new parameter. On a model without an MNLI head (the stand-in,
roberta.large) the head starts from fairseq's random initialisation, as a new head would.
"""

import torch
from fairseq.models.roberta.model import RobertaClassificationHead

MNLI_CLASSES = ("contradiction", "neutral", "entailment")
ENTAILMENT = MNLI_CLASSES.index("entailment")


class EntailmentHead(RobertaClassificationHead):
    """RoBERTa's classification head with 3 MNLI outputs, returning binary entailment logits.

    Shapes: features [B, T, d] -> [B, 2] (``[not entailed, entailed]``); ``mnli_logits`` gives the [B, 3].
    """

    def __init__(self, input_dim, inner_dim, activation_fn, pooler_dropout, **kwargs):
        super().__init__(input_dim, inner_dim, len(MNLI_CLASSES), activation_fn, pooler_dropout, **kwargs)

    def mnli_logits(self, features, **kwargs):
        return super().forward(features, **kwargs)

    def forward(self, features, **kwargs):
        z = self.mnli_logits(features, **kwargs)
        others = [i for i in range(len(MNLI_CLASSES)) if i != ENTAILMENT]
        return torch.stack([torch.logsumexp(z[:, others], dim=-1), z[:, ENTAILMENT]], dim=-1)


def install_entailment_head(model, name):
    """Register ``EntailmentHead`` as ``model.classification_heads[name]`` with the options fairseq's
    ``register_classification_head`` would use, so that an MNLI checkpoint's head of that name loads."""
    args = model.args
    model.classification_heads[name] = EntailmentHead(
        input_dim=args.encoder_embed_dim,
        inner_dim=args.encoder_embed_dim,
        activation_fn=args.pooler_activation_fn,
        pooler_dropout=args.pooler_dropout,
        q_noise=args.quant_noise_pq,
        qn_block_size=args.quant_noise_pq_block_size,
        do_spectral_norm=args.spectral_norm_classification_head,
    )
    return model.classification_heads[name]
