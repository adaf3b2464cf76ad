"""The prompted RoBERTa: a frozen RoBERTa that inserts t prompt vectors into every input and, in
the deep variants, adds a prompt to the hidden states at those slots after layers 1..L-1. The
base of the prompt family (``roberta_prompt``: prompt tuning, P-tuning v2, DPT; ``roberta_idpg``).

A subclass supplies its options, its prompts and their length, nothing else of the forward pass:

    @dataclass
    class MyOptions(Options):                   # fairseq_idpg/options.py: each field generates its flag
        title: ClassVar[str] = "My prompt"
        my_prompt_length: int = option(5, "prompt length t (5)", metavar="T")

    class MyPromptModel(PromptedRobertaModel):
        PROMPT_LENGTH = "my_prompt_length"      # the option holding t
        OPTIONS, DEFAULTS = MyOptions, MyOptions.defaults()   # flags, defaults and declared checks
        PRESET_OPTION, DEFAULT_PRESET = "my_preset", "..."    # presets: the method records'

        def prompts(self, src_tokens, **net_input):
            return P_0, layer_prompts           # [t, C] or [B, t, C]; fn(l, x) -> P_l, or None

This base owns what every prompt method shares:

- ``--prompt-position`` (IDPG appendix A.4/A.5: 0-4; default 0, right after ``<s>``), checked
  at build time against the task's layout (positions 2 and 3 need sentence pairs);
- ``num_inserted_tokens`` = t (the task-model protocol, ``tasks/model_protocol.py``: the task
  truncates inputs to ``--max-positions`` - t) and ``max_positions()`` = ``--max-positions`` - t;
  a prompt that leaves no room for the shortest input fails at build time, and a longer input
  given directly (not through the task) is refused with one line;
- the forward pass (``modules/prompts/encoder.prompted_features``): P_0 inserted into the token
  embeddings at the position before the learned positions are added, ``x[slots] += P_l`` after
  layer l = 1..L-1 when the subclass gives ``layer_prompts``; the head reads ``<s>``.

``forward`` follows ``RobertaModel.forward``: (head logits | features [B, T+t, C] | LM output,
extra) with ``extra["inner_states"]`` = [final features, (T+t) x B x C] and ``extra["prompt_slots"]``
[B, T+t] (True at the prompt vectors). Intermediate layers are not kept (``return_all_hiddens``
is refused).
"""

from dataclasses import dataclass
from typing import ClassVar

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import presets_of
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.modules.prompts.encoder import prompted_features
from fairseq_idpg.modules.prompts.insertion import MIN_INPUT_TOKENS, check_position
from fairseq_idpg.options import Options, flag, option, resolve_preset
from fairseq_idpg.tasks.model_protocol import task_is_pair


@dataclass
class PromptInsertionOptions(Options):
    """Where every prompt method inserts its prompt (checked at build time against the task's layout)."""

    title: ClassVar[str] = "Prompt insertion"

    prompt_position: int = option(
        0,  # the released IDPG scripts; DPT's prompt tuning on RoBERTa
        "where the prompt goes (IDPG appendix A.4): 0 after <s> (default), 1 before the first </s>, "
        "2 at the start of the second sentence, 3 before the last </s>, 4 after the final </s>; 2, 3 need pairs",
        metavar="N",
    )


PROMPT_DEFAULTS = PromptInsertionOptions.defaults()


class PromptedRobertaModel(FrozenBackboneRobertaModel):
    """Frozen RoBERTa + inserted (and optionally per-layer added) prompts; see the module docstring."""

    PROMPT_LENGTH = ""  # dest of the subclass's prompt-length option (t)
    PRESET_OPTION = ""  # dest of its preset option (``--my-preset NAME``)
    OPTIONS = Options  # its options (an ``Options`` dataclass): flags and the checks they declare
    DEFAULTS = {}  # value of each option that no preset sets (``OPTIONS.defaults()``)
    DEFAULT_PRESET = None

    @classmethod
    def presets(cls):
        """Preset name -> {option dest: value}: the method records that name themselves under
        ``PRESET_OPTION`` (``fairseq_idpg.methods.presets_of``), read when used."""
        return presets_of(cls.PRESET_OPTION)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        # the frozen attention through torch's fused attention with a boolean padding mask built once per
        # forward (AugmentedSelfAttention, no blocks attached): fairseq's concatenates the three projection
        # biases and converts the padding mask to a float mask in every layer, launches of their own on a GPU
        for i, layer in enumerate(encoder.sentence_encoder.layers):
            AugmentedSelfAttention.convert(layer.self_attn, i)
        self.prompt_position = args.prompt_position
        # the task reserves these positions when it truncates inputs (tasks/model_protocol.py)
        self.num_inserted_tokens = int(getattr(args, self.PROMPT_LENGTH))

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        PromptInsertionOptions.add_args(parser)

    # ------------------------------------------------------------------ configuration
    @classmethod
    def configure(cls, args):
        """Fill every option left unset from the preset, then the defaults (idempotent: fairseq
        calls the architecture at parse time, ``build_model`` again for a stored config)."""
        defaults = {**PROMPT_DEFAULTS, **cls.DEFAULTS}
        resolve_preset(args, cls.presets(), cls.PRESET_OPTION, defaults, default=cls.DEFAULT_PRESET)

    @classmethod
    def resolve_settings(cls, args):
        cls.configure(args)

    @classmethod
    def check_args(cls, args, task):
        """The subclass's checks of several options (``OPTIONS`` checks each option's choices and range before):
        ConfigError with one line naming the flag."""

    @classmethod
    def build_model(cls, args, task):
        cls.configure(args)
        max_positions = _max_positions(args, task)
        t = getattr(args, cls.PROMPT_LENGTH)
        if t < 1 or t + MIN_INPUT_TOKENS > max_positions:
            raise ConfigError(
                f"{flag(cls.PROMPT_LENGTH)} {t}: the prompt plus the shortest input ({MIN_INPUT_TOKENS} tokens) "
                f"must fit --max-positions {max_positions}: use 1 to {max_positions - MIN_INPUT_TOKENS}"
            )
        is_pair = task_is_pair(task)
        check_position(args.prompt_position, True if is_pair is None else is_pair)  # the range; pairs when known
        cls.OPTIONS.check_args(args)  # before the backbone is loaded: each option's choices and range
        cls.check_args(args, task)
        return super().build_model(args, task)

    def max_positions(self):
        """Input tokens a model call accepts: the prompt takes t of the positions."""
        return self.args.max_positions - self.num_inserted_tokens

    # ------------------------------------------------------------------ what subclasses supply
    def prompts(self, src_tokens, **net_input):
        """(P_0 [t, C] or [B, t, C], ``layer_prompts(l, x) -> P_l`` or None) for one batch."""
        raise NotImplementedError

    def log_prompt_metrics(self):
        """Called at every forward before the prompts are formed: a place to log what the prompt
        is (the DPT rank probe logs its count in eval mode)."""

    # ------------------------------------------------------------------ forward
    def forward(
        self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None, **kwargs
    ):
        """Like ``RobertaModel.forward``; see the module docstring. ``kwargs``: the rest of the
        task's ``net_input`` (``src_lengths``, IDPG's ``sentence_ids``), handed to ``prompts``."""
        if return_all_hiddens:
            raise ValueError(f"{self.args.arch} keeps the last layer only: return_all_hiddens is not supported")
        total = src_tokens.size(1) + self.num_inserted_tokens
        if total > self.args.max_positions:
            raise ValueError(
                f"{src_tokens.size(1)} input tokens + {self.num_inserted_tokens} prompt vectors "
                f"({flag(self.PROMPT_LENGTH)}) exceed --max-positions {self.args.max_positions} "
                f"(peft_sentence_prediction truncates inputs to fit)"
            )
        self.log_prompt_metrics()
        prompt, layer_prompts = self.prompts(src_tokens, **kwargs)
        features, slots = prompted_features(
            self.encoder.sentence_encoder, src_tokens, prompt, self.prompt_position, layer_prompts=layer_prompts
        )
        if classification_head_name is not None:
            x = self.classification_heads[classification_head_name](features)
        elif features_only:
            x = features
        else:
            x = self.encoder.output_layer(features, **kwargs)
        return x, {"inner_states": [features.transpose(0, 1)], "prompt_slots": slots}


def _max_positions(args, task):
    """``--max-positions`` as ``RobertaModel.build_model`` resolves it (the task's when unset)."""
    if getattr(args, "max_positions", None) is None:
        args.max_positions = getattr(args, "tokens_per_sample", None) or task.max_positions()
    return args.max_positions
