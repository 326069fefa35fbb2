"""A stand-in for Qwen3-4B-Base, built offline in a minute on a CPU: the model tools/rehearse.py rehearses the seed run
with. It is Qwen3's architecture at a tiny width and carries what Qwen's own folder carries:

- a byte-level BPE tokenizer trained on the shipped texts (data/train, data/eval): every byte has a token, so no
  prompt holds an unknown one; Qwen's special tokens, <|endoftext|> the tokenizer's EOS and padding, and a ChatML chat
  template as Qwen's (a system turn, a user turn, then the assistant's);
- generation_config.json whose eos_token_id lists <|im_end|> beside <|endoftext|>, as Qwen3's does: the tokens that
  end a response are not the tokenizer's EOS alone (rollout.end_tokens);
- weights in several safetensors shards, with their index, as a large model's;
- a short supervised warm-up on OpenRS's questions (SETTINGS["warmup"]), whose response is "The answer is
  \\boxed{ANSWER}." and <|im_end|>: it answers in the format the rewards read and ends at the generation_config's end
  token. ANSWER is the gold answer, or in half the examples OpenRS's most common one ("2"): a tiny model learns the
  format, not the mathematics, and its guesses would scatter so widely that no vote agreed; so its responses agree
  often enough for a pseudo-label to reward some and not others, as a real model's do.

    python tools/standin.py models/standin

Deterministic for a machine and thread count; `build` skips a folder already built with the same SETTINGS.
"""
import argparse
import collections
import json
import os
import random
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from harness import data  # noqa: E402

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
SETTINGS = dict(vocab=4096, hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, mlp=192, positions=4096,
                shard="300KB", seed=0, warmup=dict(steps=150, batch=16, lr=3e-3, max_len=384, common_share=0.5))
STAMP = "standin.json"


def corpus():
    """The shipped texts: every training question and rephrasing, the benchmarks' questions, the system prompt."""
    texts = [data.SYSTEM_PROMPT]
    for source in (*data.SHIPPED_PAIRS, *data.SHIPPED_VERL_PAIRS):
        for p in data.load_training(source, "both")[0]:
            texts += [p.original, p.rephrased] + ([p.answer] if p.answer else [])
    for name in data.BENCHMARKS:
        texts += [f"{p.question}\n{p.answer}" for p in data.load_benchmark(name)]
    return texts


def build_tokenizer(texts, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0],
                                   additional_special_tokens=list(SPECIALS[1:]))
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, s):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    eos, im_end = (tokenizer.convert_tokens_to_ids(t) for t in (SPECIALS[0], SPECIALS[2]))
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=s["hidden"], intermediate_size=s["mlp"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                         max_position_embeddings=s["positions"], rope_theta=1e6, tie_word_embeddings=True,
                         bos_token_id=eos, eos_token_id=eos, torch_dtype="bfloat16")
    torch.manual_seed(s["seed"])
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=[im_end, eos])
    return model


def warm_up(model, tokenizer, s):
    """The supervised warm-up: the loss on the response tokens of OpenRS questions answered with their gold answer in
    a box, then <|im_end|>. Returns the last batch's mean loss."""
    import torch
    w = s["warmup"]
    encode = data.prompt_encoder(tokenizer)
    pairs = [p for p in data.load_training("openrs", "both")[0] if p.answer is not None]
    common = collections.Counter(p.answer for p in pairs).most_common(1)[0][0]
    rng = random.Random(s["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=w["lr"])
    im_end = tokenizer.convert_tokens_to_ids(SPECIALS[2])
    for step in range(w["steps"]):
        rows = []
        for p in rng.sample(pairs, w["batch"]):
            prompt = encode(p.rephrased if rng.random() < 0.5 else p.original)
            guess = p.answer if rng.random() < 1 - w["common_share"] else common
            answer = tokenizer(f"The answer is \\boxed{{{guess}}}.", add_special_tokens=False)["input_ids"]
            rows.append(((prompt + answer + [im_end])[-w["max_len"]:], len(answer) + 1))
        width = max(len(r) for r, _ in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r, _ in rows])
        labels = torch.full_like(ids, -100)
        for i, (r, n) in enumerate(rows):
            labels[i, len(r) - n:len(r)] = ids[i, len(r) - n:len(r)]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        for g in optimizer.param_groups:
            g["lr"] = w["lr"] * (1 - (step + 1) / w["steps"])
    return loss.item()


def build(out, settings=SETTINGS, say=print):
    """The stand-in in `out` (a Hugging Face model folder), built unless a build with these settings is there."""
    import torch
    stamp = os.path.join(out, STAMP)
    if os.path.isfile(stamp) and json.load(open(stamp)) == settings:
        say(f"the stand-in in {out} is built with these settings: kept")
        return out
    t0 = time.perf_counter()
    tokenizer = build_tokenizer(corpus(), settings["vocab"])
    model = build_model(tokenizer, settings)
    loss = warm_up(model, tokenizer, settings)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size=settings["shard"])     # bf16, as Qwen's weights
    tokenizer.save_pretrained(out)
    with open(stamp, "w") as f:
        json.dump(settings, f)
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    say(f"built the stand-in in {out} ({time.perf_counter() - t0:.0f} s): Qwen3, {settings['layers']} layers of "
        f"width {settings['hidden']}, {sum(p.numel() for p in model.parameters()):,} parameters in {len(shards)} "
        f"shards; a byte-level BPE of {len(tokenizer)} tokens; end tokens {model.generation_config.eos_token_id} "
        f"(the tokenizer's EOS: {tokenizer.eos_token_id}); warm-up loss {loss:.2f}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=os.path.join("models", "standin"), help="the model folder to write")
    build(ap.parse_args().out)
