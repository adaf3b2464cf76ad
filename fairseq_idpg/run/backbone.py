"""The backbone of a run: its folder, its encoder sizes (read from the checkpoint, no tensor read) and
its digests. The stand-in is built when a run needs it and it is missing."""

import os
import sys
from pathlib import Path
from typing import NamedTuple

from fairseq_idpg.errors import RunError
from fairseq_idpg.layout import REPO, model_dir, model_name, standin_lock
from fairseq_idpg.run.processes import call

MAX_POSITIONS = 512


# the encoder sizes a dry run uses when the model file is absent (models/build.py's tables)
KNOWN_SIZES = {"roberta.large": "ROBERTA_LARGE", "roberta.base": "ROBERTA_BASE", "standin": "STANDIN"}


def model_dims(checkpoint):
    """Encoder flags of a fairseq RoBERTa checkpoint (new cfg or old args), no tensor read."""
    from fairseq_idpg.models.frozen_roberta import load_checkpoint_file

    try:
        state = load_checkpoint_file(checkpoint)
    except Exception as e:
        # unpickling, zip and EOF errors of a file that is not a (whole) checkpoint
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"{checkpoint}: not a fairseq checkpoint (torch.load: {reason})") from None
    try:
        m = state["cfg"]["model"] if state.get("cfg") is not None else vars(state["args"])
        get = (lambda k: getattr(m, k)) if not isinstance(m, dict) else m.__getitem__
        return {
            "--encoder-layers": get("encoder_layers"),
            "--encoder-embed-dim": get("encoder_embed_dim"),
            "--encoder-ffn-embed-dim": get("encoder_ffn_embed_dim"),
            "--encoder-attention-heads": get("encoder_attention_heads"),
            "--max-positions": get("max_positions"),
        }
    except (KeyError, AttributeError, TypeError) as e:
        raise RunError(f"{checkpoint}: a fairseq checkpoint without RoBERTa's encoder sizes (no {e})") from None


def known_dims(model):
    """Encoder flags of roberta.large / roberta.base / the stand-in without their file (dry runs)."""
    from fairseq_idpg.models import build

    sizes = getattr(build, KNOWN_SIZES[model])
    return {**{"--" + k.replace("_", "-"): v for k, v in sizes.items()}, "--max-positions": MAX_POSITIONS}


def sha256(path):
    from fairseq_idpg.data.digest import file_sha256

    return file_sha256(path)


def weights_sha256(path):
    from fairseq_idpg.data.digest import weights_sha256 as digest

    return digest(path)


class Backbone(NamedTuple):
    dir: Path  # model.pt and dict.txt
    name: str  # its folder under data-bin/ and checkpoints/
    present: bool  # the files exist (a dry run of roberta.* plans without them)
    dims: dict  # the encoder's fairseq-train flags
    missing: tuple = ()  # what a dry run found absent, one line each


def find_backbone(request):
    """The model's folder and encoder sizes (the stand-in is built when missing; a dry run of roberta.*
    uses the known sizes)."""
    mdir, dry = model_dir(request.model), request.dry_run
    if request.model == "standin" and not (mdir / "model.pt").exists() and not dry:
        os.environ.setdefault("PYTHON", sys.executable)  # the script's Python: this one
        with standin_lock(mdir):
            call(["bash", REPO / "scripts" / "build_standin.sh", mdir])
    present = (mdir / "model.pt").is_file() and (mdir / "dict.txt").is_file()
    made_by = {
        "standin": "scripts/build_standin.sh",
        "roberta.base": "scripts/download.sh roberta base",
        "roberta.large": "scripts/download.sh roberta large",
    }  # any other folder: a conversion, or the export of IDPG's supplementary stage 1
    hint = made_by.get(request.model, "scripts/convert_hf_to_fairseq.py or examples/idpg/supplementary.py make one")
    absent = f"--model {request.model}: {mdir}/model.pt and dict.txt not found ({hint})"
    if present:
        try:
            dims = model_dims(mdir / "model.pt")
        except RunError as e:
            raise RunError(f"--model {request.model}: {e}") from None
    elif dry and request.model in KNOWN_SIZES:
        dims = known_dims(request.model)
    else:
        raise RunError(absent)
    # a dry run plans without the files; the stand-in is built when a run starts
    missing = [absent] if not present and request.model != "standin" else []
    return Backbone(mdir, model_name(request.model), present, dims, missing)


def backbone_at(folder):
    """The backbone of a model folder that exists (model.pt, dict.txt), for a plan's ``backbone`` seam."""
    folder = Path(folder)
    return Backbone(folder, folder.name, True, model_dims(folder / "model.pt"))
