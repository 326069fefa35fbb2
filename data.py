"""Paired training data and prompts.

A training example is a `Pair`: a question, its rephrasing (same mathematics and answer, new
wording and scenario) and the gold answer. The gold answer is never used by the label-free
rewards; it feeds the `gt` baseline and the metrics (rollout_acc, label_acc).

Sources:
- the classroom world (world.py), the default;
- a parquet file of pairs with columns `original_question, rephrased_question, solution`, the
  format of the official OpenRS and MATH pairs shipped in data/train/.

Prompts: with the model's chat template when it has one, as [system, user] messages with the
paper's system prompt; otherwise plain text (system prompt, blank line, question).
"""
import os
from dataclasses import dataclass

SYSTEM_PROMPT = "Let's think step by step and output the final answer within \\boxed{}."
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SHIPPED_PAIRS = {"openrs": "train/openrs_pairs.parquet", "math": "train/math_pairs.parquet"}
PAIR_COLUMNS = ("original_question", "rephrased_question", "solution")


@dataclass(frozen=True)
class Pair:
    original: str
    rephrased: str
    answer: str


def load_pairs(name_or_path):
    """Pairs from a shipped name ('openrs', 'math') or a parquet path; malformed rows are errors
    that name the file, the row and the problem."""
    import pandas as pd
    path = os.path.join(DATA_DIR, SHIPPED_PAIRS[name_or_path]) if name_or_path in SHIPPED_PAIRS else name_or_path
    if not os.path.exists(path):
        raise FileNotFoundError(f"no pair file {path!r}; use one of {list(SHIPPED_PAIRS)} or a parquet path")
    frame = pd.read_parquet(path)
    missing = [c for c in PAIR_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; a pair file needs {list(PAIR_COLUMNS)}")
    pairs = []
    for i, row in enumerate(frame[list(PAIR_COLUMNS)].itertuples(index=False)):
        for col, value in zip(PAIR_COLUMNS, row):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{path}: row {i}: column {col!r} must be a non-empty string, got {value!r}")
        pairs.append(Pair(row.original_question, row.rephrased_question, row.solution.strip()))
    return pairs


def classroom_pairs(split):
    import world
    return [Pair(p.original, p.rephrased, p.answer) for p in world.make_split(split)]


def prompt_encoder(tokenizer, classroom):
    """question -> prompt token ids."""
    if classroom:
        import world
        return lambda q: tokenizer(world.format_prompt(q), add_special_tokens=False)["input_ids"]
    if tokenizer.chat_template:
        return lambda q: tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}],
            add_generation_prompt=True, tokenize=True, return_dict=False)
    return lambda q: tokenizer(f"{SYSTEM_PROMPT}\n\n{q}\n", add_special_tokens=False)["input_ids"]


def drop_long(pairs, encode, max_prompt_len):
    """Keep the pairs whose two prompts both fit; say how many were dropped."""
    kept = [p for p in pairs if len(encode(p.original)) <= max_prompt_len and len(encode(p.rephrased)) <= max_prompt_len]
    if len(kept) < len(pairs):
        print(f"dropped {len(pairs) - len(kept)} of {len(pairs)} pairs whose prompt exceeds {max_prompt_len} tokens")
    if not kept:
        raise ValueError(f"every pair's prompt exceeds --max_prompt_len {max_prompt_len}")
    return kept
