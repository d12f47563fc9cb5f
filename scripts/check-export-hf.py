"""Reloads a fine-tuned export in Hugging Face transformers and checks it against its base: the
same model class, the vision tower (and any tensor training does not touch) bit-identical, every
trained tensor as the export's safetensors hold it, and a forward pass that runs. A helper for
the multimodal layouts (Qwen3.5, Gemma 3); CI does not run it (it needs torch and transformers).

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers safetensors
    /tmp/hf/bin/python scripts/check-export-hf.py EXPORT_DIR BASE_DIR
"""
import json
import sys

import torch
import transformers
from safetensors.torch import load_file


def tensors(folder):
    import glob
    import os
    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        out.update(load_file(f))
    return out


# Tensors a fine-tune leaves as they are (vision towers, projectors, MTP heads).
CARRIED = ("model.visual.", "mtp.", "vision_tower.", "multi_modal_projector.")


def loaded_name(name, loaded):
    """The in-memory name of a saved tensor: the same, or for Gemma 3's multimodal class as
    transformers renames its checkpoint layout on load (`language_model.model.` ->
    `model.language_model.`, `vision_tower.` -> `model.vision_tower.`, ...)."""
    if name in loaded:
        return name
    for saved, mem in (("language_model.model.", "model.language_model."),
                       ("vision_tower.", "model.vision_tower."),
                       ("multi_modal_projector.", "model.multi_modal_projector.")):
        if name.startswith(saved) and mem + name[len(saved):] in loaded:
            return mem + name[len(saved):]
    return None


def main(export, base):
    arch = json.load(open(f"{export}/config.json"))["architectures"][0]
    assert arch == json.load(open(f"{base}/config.json"))["architectures"][0], "class changed"
    cls = getattr(transformers, arch)
    model = cls.from_pretrained(export, dtype=torch.float32)
    assert type(model).__name__ == arch, type(model).__name__
    print(f"reloaded {export} as {type(model).__name__} (transformers {transformers.__version__})")
    loaded = model.state_dict()
    ours, before = tensors(export), tensors(base)
    changed = same = 0
    for name, t in ours.items():
        key = loaded_name(name, loaded)
        if key is None:
            raise SystemExit(f"{name} of the export is not in the reloaded model")
        assert torch.equal(loaded[key].float(), t.float()), f"{name} reloaded differently"
        if name.startswith(CARRIED):
            assert torch.equal(t, before[name]), f"{name} (not trained) changed"
            same += 1
        elif not torch.equal(t, before[name]):
            changed += 1
    missing = [n for n in before if n not in ours]
    assert not missing, f"tensors of the base missing from the export: {missing[:5]}"
    ids = torch.tensor([[41, 273, 317, 435, 295, 82, 220, 16, 21]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    print(f"{len(ours)} tensors: {changed} trained tensors changed, {same} vision/MTP tensors "
          f"bit-identical to the base; forward ok, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
