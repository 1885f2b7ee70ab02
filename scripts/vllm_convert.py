"""Convert a GGUF model to a plain HF folder vLLM loads: ``python vllm_convert.py GGUF DEST``.

Runs inside vLLM's venv (``transformers`` + ``gguf`` + ``safetensors``), offline. The weights
are dequantized on load; ``save_pretrained`` refuses a GGUF-quantized model, so the state
dict is written with ``safetensors`` (bf16, without the tied ``lm_head``) next to the config
(minus its ``quantization_config``), the tokenizer and the generation config. Written to
``DEST.part`` and renamed, so a crash never leaves a half folder at ``DEST``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, dest: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kw = {"gguf_file": gguf.name}
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.bfloat16, **kw)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {
        name: t.detach().to(torch.bfloat16).contiguous()
        for name, t in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    print(f"converted {gguf} -> {dest} ({len(state)} tensors)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_convert.py GGUF DEST")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
