"""The classroom world: a tiny, self-contained stand-in for "an LLM learning math reasoning", built in code on any CPU.

1. Problems: two-step arithmetic word problems (SHAPES) in two views, the original and a rephrasing with the same
   numbers, operations and answer but new wording, sentence order and scenario. Each view holds a distractor; half
   are traps the base model often copies (DISTRACTORS), so some of its mistakes are tied to one wording, as the paper
   assumes of real models. Split by mathematics into `warmup`, `train` (RL prompts) and `test` (held out).
2. A word-level tokenizer over all the world can say, in Hugging Face format (transformers and vLLM load it).
3. A tiny Qwen3 (4 layers, width 128, head_dim 32 since vLLM's CPU attention rejects 16).
4. The base model (`classroom/base/`): a short warm-up on `warmup` problems, stopped early and label-smoothed so that
   at temperature 1.0 one sample is right far less often than a majority of 8, which label-free rewards need.
"""
import argparse
import functools
import itertools
import json
import os
import random
import re
from dataclasses import dataclass

import torch

BASE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "classroom", "base")
EOS = "<|endoftext|>"

# -------------------------------------------------------------------------------------------- 1. Problems

# A scenario is who acts, the containers and the things counted.
SCENARIOS = [("Tom", "boxes", "pencils"), ("Mia", "bags", "apples"), ("Sam", "jars", "cookies"),
             ("Ana", "shelves", "books"), ("Leo", "crates", "eggs"), ("Zoe", "baskets", "oranges"),
             ("Ben", "trays", "muffins"), ("Eva", "packs", "cards"), ("Max", "tanks", "fish"),
             ("Ivy", "vases", "roses"), ("Kai", "cartons", "bottles"), ("Lily", "tins", "buttons")]

# Several wordings per shape, the numbers in different orders: {n} name, {c1} containers, {it} items; a, b, c numbers.
TEMPLATES = {
    "mul_add": [
        "{n} has {a} {c1} with {b} {it} in each . {n} also has {c} loose {it} . How many {it} does {n} have in all ?",
        "There are {c} {it} on the table and {a} {c1} that hold {b} {it} each . How many {it} are there altogether ?",
        ("{n} fills {a} {c1} , putting {b} {it} in every one , and then finds {c} more {it} . "
         "What is the total number of {it} ?"),
    ],
    "mul_sub": [
        "{n} has {a} {c1} with {b} {it} in each . {n} gives away {c} {it} . How many {it} are left ?",
        "Each of {a} {c1} holds {b} {it} . Then {c} {it} are lost . How many {it} remain ?",
        ("{n} packs {b} {it} into each of {a} {c1} and later uses {c} of the {it} . "
         "How many {it} does {n} still have ?"),
    ],
    "add_sub": [
        "{n} has {a} {it} . {n} gets {b} more {it} and then gives away {c} . How many {it} does {n} have now ?",
        ("A room holds {a} {it} . Someone brings {b} {it} more , and {c} {it} are taken out . "
         "How many {it} are in the room ?"),
        "After {n} buys {b} {it} to add to {a} {it} already at home , {c} {it} are eaten . How many {it} are left ?",
    ],
    "add_mul": [
        "{n} has {a} {c1} and buys {b} more {c1} . Each of the {c1} holds {c} {it} . How many {it} are there ?",
        "There are {a} {c1} on the left and {b} {c1} on the right , with {c} {it} in each . How many {it} in total ?",
        ("Every one of the {c1} holds {c} {it} . {n} owns {a} {c1} and borrows {b} more . "
         "How many {it} does {n} have ?"),
    ],
    "sub_mul": [
        "{n} has {a} {c1} and sells {b} of them . Each of the {c1} holds {c} {it} . How many {it} does {n} keep ?",
        ("Of {a} {c1} , {b} are broken and thrown out . Each good one has {c} {it} . "
         "How many {it} are in the good {c1} ?"),
        "Each of the {c1} holds {c} {it} . {n} started with {a} {c1} and lost {b} of them . How many {it} are left ?",
    ],
}

SHAPES = {"mul_add": ("*", "+"), "mul_sub": ("*", "-"), "add_sub": ("+", "-"), "add_mul": ("+", "*"),
          "sub_mul": ("-", "*")}  # shape -> (first operation on a and b, second operation on that result and c)
OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


def worked_solution(shape, a, b, c):
    """(response text, answer) of one problem."""
    op1, op2 = SHAPES[shape]
    m = OPS[op1](a, b)
    answer = OPS[op2](m, c)
    return f" {a} {op1} {b} = {m} . {m} {op2} {c} = {answer} . The answer is \\boxed{{{answer}}} .", answer


# (distractor, is a trap): a trap reads as a fact of the problem, and sloppy warm-up solutions copy its number for c.
DISTRACTORS = [("{n} is {d} years old .", False), ("The shop is {d} minutes away .", False),
               ("A friend of {n} has {d} {it} .", True), ("Last week there were {d} {it} .", True)]


@dataclass(frozen=True)
class Problem:
    original: str      # the question as first written
    rephrased: str     # same mathematics, other wording, scenario and distractor
    answer: str        # the ground truth, used only for metrics and the `gt` baseline
    maths: tuple       # (shape, a, b, c)
    traps: tuple       # per view (original, rephrased): the trap's number, or None for a harmless distractor


def make_problem(rng, shape, a, b, c):
    s1, s2 = rng.sample(SCENARIOS, 2)
    t1, t2 = rng.sample(TEMPLATES[shape], 2)
    (x1, trap1), (x2, trap2) = rng.sample(DISTRACTORS, 2)
    m = OPS[SHAPES[shape][0]](a, b)  # a distractor's number: not c, and copied for c it keeps the answer >= 0
    d1, d2 = rng.sample([d for d in range(1, 13) if d != c and (SHAPES[shape][1] != "-" or d < m)], 2)

    def fill(template, scenario, distractor, d):
        facts, question = template.rsplit(" . ", 1)          # the distractor goes just before the question
        words = dict(n=scenario[0], c1=scenario[1], it=scenario[2], a=a, b=b, c=c, d=d)
        return f"{facts} . {distractor} {question}".format(**words)

    _, answer = worked_solution(shape, a, b, c)
    return Problem(fill(t1, s1, x1, d1), fill(t2, s2, x2, d2), str(answer), (shape, a, b, c),
                   (d1 if trap1 else None, d2 if trap2 else None))


SPLIT_SIZES = {"test": 200, "train": 1500, "warmup": None}   # None: all that is left


def make_split(split, world_seed=0):
    """The problems of one split; splits are disjoint in mathematics, fixed by `world_seed` (not a run's --seed)."""
    small = range(2, 13)                        # every (shape, a, b, c) with non-negative, non-trivial answers
    maths = [(shape, a, b, c) for shape, a, b, c in itertools.product(TEMPLATES, small, small, small)
             if not ((shape == "add_sub" and c >= a + b) or (shape == "mul_sub" and c >= a * b)
                     or (shape == "sub_mul" and b >= a))]
    random.Random(world_seed).shuffle(maths)
    start = 0
    for name, size in SPLIT_SIZES.items():
        size = len(maths) - start if size is None else size
        if name == split:
            rng = random.Random(f"{world_seed}-{split}")
            return [make_problem(rng, *m) for m in maths[start:start + size]]
        start += size
    raise ValueError(f"unknown split {split!r}; choose from {list(SPLIT_SIZES)}")


def format_prompt(question):
    """Plain text, as for a base model: the world's tokenizer has no words for the paper's system prompt."""
    return f"Question: {question}\nAnswer:"


def plain_english(text):
    """A question as a person writes it, for a real model: `in each . How many ?` -> `in each. How many?`."""
    return re.sub(r" ([.,?])", r"\1", text)


# -------------------------------------------------------------------------------------------- 2. Tokenizer

def corpus():
    """Every piece of text the world can produce."""
    texts = [format_prompt(t.format(n=s[0], c1=s[1], it=s[2], a=2, b=3, c=4))
             for ts in TEMPLATES.values() for t in ts for s in SCENARIOS]
    texts += [" " + x.format(n=s[0], it=s[2], d=5) for x, _ in DISTRACTORS for s in SCENARIOS]
    texts += [f" {i} \\boxed{{{i}}} ." for i in range(0, 500)]
    return texts + [" * + - = . The answer is"]


@functools.lru_cache(maxsize=1)
def _shipped_vocabulary():
    with open(os.path.join(BASE_DIR, "tokenizer.json")) as f:
        return json.load(f)["model"]["vocab"]


def is_classroom_tokenizer(tokenizer):
    """The world's own tokenizer (the base model's and its descendants'): no chat template, build_tokenizer's words."""
    return not getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "get_vocab") and \
        tokenizer.get_vocab() == _shipped_vocabulary()


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    vocab = {EOS: 0, "<unk>": 1}  # then each word in the order the corpus first says it
    for text in corpus():
        for w, _ in pre.pre_tokenize_str(text):
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre, decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token="<unk>")


# -------------------------------------------------------------------------------------------- 3. Model

def model_config(vocab_size):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=(vocab_size + 63) // 64 * 64, hidden_size=128, intermediate_size=384,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=True,
                       eos_token_id=0, pad_token_id=0, bos_token_id=0, torch_dtype="float32")


# ---------------------------------------------------------------------- 4. The base model: a short supervised warm-up

WARMUP = dict(steps=600, batch=64, lr=2e-3, label_smoothing=0.03, seed=0, trap_copy=0.7)


def warmup_batch(tokenizer, problems, rng, batch):
    """Token ids and a loss mask (1 on response tokens) for `batch` random warm-up examples."""
    seqs, masks = [], []
    for p in rng.sample(problems, batch):
        view = int(rng.random() < 0.5)
        prompt = tokenizer(format_prompt((p.original, p.rephrased)[view]))["input_ids"]
        (shape, a, b, c), trap = p.maths, p.traps[view]
        sloppy = trap is not None and rng.random() < WARMUP["trap_copy"]
        text, _ = worked_solution(shape, a, b, trap if sloppy else c)
        response = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(prompt + response); masks.append([0] * len(prompt) + [1] * len(response))
    return padded(seqs, masks, tokenizer.pad_token_id)


def padded(seqs, masks, pad_id):
    """Token ids [B, T] and loss mask [B, T] of sequences of several lengths, right-padded to the longest."""
    width = max(map(len, seqs))
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
    return ids, torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)


def response_loss(model, ids, mask, label_smoothing=0.0):
    """The warm-up's loss: the next-token negative log-likelihood, averaged over the tokens mask marks (responses)."""
    logits = model(ids).logits[:, :-1]                                   # [B, T-1, V]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none",
                                            label_smoothing=label_smoothing)
    return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()


def build_base_model(out_dir=BASE_DIR, steps=WARMUP["steps"], seed=WARMUP["seed"]):
    """Train the base model from scratch and save it with its tokenizer; the same bit for bit with OMP_NUM_THREADS=1."""
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = Qwen3ForCausalLM(model_config(len(tokenizer)))
    problems, rng = make_split("warmup"), random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    for step in range(steps):
        ids, mask = warmup_batch(tokenizer, problems, rng, WARMUP["batch"])
        loss = response_loss(model, ids, mask, WARMUP["label_smoothing"])
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"warm-up step {step:4d}  loss {loss.item():.3f}", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def base_model_dir():
    """The shipped base model; built (a few minutes) if missing."""
    if not os.path.exists(os.path.join(BASE_DIR, "model.safetensors")):
        print(f"building the classroom base model in {BASE_DIR} ...", flush=True)
        build_base_model()
    return BASE_DIR


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Rebuild the classroom base model and show examples.")
    ap.add_argument("--steps", type=int, default=WARMUP["steps"])
    ap.add_argument("--out", default=BASE_DIR)
    args = ap.parse_args()
    p = make_split("train")[0]
    print("original :", p.original, "\nrephrased:", p.rephrased, "\nsolution :", worked_solution(*p.maths)[0])
    build_base_model(args.out, args.steps)
