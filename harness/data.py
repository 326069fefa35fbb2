"""Paired training data, evaluation benchmarks and prompts.

A training example is a `Pair`: a question, its rephrasing (same mathematics and answer, new wording and scenario;
None in a plain question set) and the gold answer, which the label-free rewards never use: it feeds the `gt`
baseline and the metrics (rollout_acc, label_acc). `load_training` reads `--data`: pairs, a plain question set, or a
shipped benchmark's questions (test-time training, as TTRL does: allowed, and reported as `test_time_training`).

Malformed files are errors naming the file, the row and the problem. One leniency: a training row with an empty gold
answer is kept as `answer=None` and counted on load (the official files have three: openrs row 4303, math rows 5341
and 5343); the label-free methods never read it, and `gt` and the metrics count its group as unlabeled.
"""
import json
import math
import numbers
import os
import re
from dataclasses import dataclass
from decimal import Decimal

import torch

from harness.answers import extract_answer
from harness.errors import InputError, MissingInput

SYSTEM_PROMPT = "Let's think step by step and output the final answer within \\boxed{}."
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SHIPPED_PAIRS = {"openrs": "train/openrs_pairs.parquet", "math": "train/math_pairs.parquet"}
SHIPPED_VERL_PAIRS = {"dapo": ("train/dapo_original.parquet", "train/dapo_rephrased.parquet"),
                      "amc_ttt": ("train/amc_ttt_original.parquet", "train/amc_ttt_rephrased.parquet")}
PAIR_COLUMNS = ("original_question", "rephrased_question", "solution")
QUESTION_COLUMNS = ("question", "problem", "prompt")
REPHRASING_COLUMNS = ("rephrased_question", "rephrased")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth")
BENCHMARKS = {   # name: (file, the field holding the question; None for verl's format)
    "math500": ("eval/math500.json", "prompt"), "gsm8k": ("eval/gsm8k_test.jsonl", "question"),
    "amc": ("eval/amc.json", "prompt"), "amc23": ("eval/amc23.jsonl", "problem"),
    "aime24": ("eval/aime24.json", "prompt"), "aime25": ("eval/aime25.json", "prompt"),
    "math5000": ("eval/math_test5000.parquet", None)}


@dataclass(frozen=True)
class Pair:
    original: str
    rephrased: str | None           # None: a plain question, without a rephrased twin
    answer: str | None


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str


def question_text(value, where):
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: the question must be a non-empty string, got {value!r:.80}")
    return value


WORKED_SOLUTION_WORDS = 10  # words above which a gold answer is a worked solution; shipped ones have <= 3
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")  # a word: a run of 3+ letters outside LaTeX commands


def answer_text(value, where):
    """A gold answer as text, or None when empty; numbers as a reader writes them (1e20 -> 100000000000000000000,
    `142.0` -> `142`, other floats positional). A worked solution (a MATH `solution` column) gives its last \\boxed{};
    one without a box, of over WORKED_SOLUTION_WORDS words, is refused: it would be compared whole with every answer."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        whole = isinstance(value, numbers.Integral) or float(value).is_integer()
        value = str(int(value)) if whole else format(Decimal(repr(float(value))), "f")
    if not isinstance(value, str):
        raise InputError(f"{where}: the gold answer must be text or a number, got {value!r:.80}")
    value = value.strip()
    if "\\boxed" in value or "\\fbox" in value:
        if (boxed := extract_answer(value)) is None:
            raise InputError(f"{where}: the gold answer's last \\boxed{{}} is empty or unclosed: {value[-80:]!r}")
        value = boxed
    elif len(_WORD.findall(value)) > WORKED_SOLUTION_WORDS:
        raise InputError(f"{where}: the gold answer looks like a worked solution ({len(_WORD.findall(value))} words, "
                         f"no \\boxed{{}}): {value[:80]!r}...; give a column with the final answer")
    if re.fullmatch(r"-?\d+(\.0*)?", value):          # 142.0, 025 -> 142, 25
        value = str(int(value.split(".")[0]))
    return value or None


def gsm8k_answer(solution, where):
    """GSM8K's answer is the number after the last `####`, written with thousands commas."""
    match = re.search(r"####\s*(\S.*?)\s*$", solution if isinstance(solution, str) else "")
    if match is None:
        raise InputError(f"{where}: no '#### answer' at the end of {solution!r:.80}")
    return answer_text(match.group(1).replace(",", ""), where)


def verl_row(prompt, reward_model, where):
    """(question, gold answer) of a verl row: the user message of its `prompt` ([system, user]), its ground truth."""
    users = [m.get("content") for m in (prompt if prompt is not None else [])
             if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise InputError(f"{where}: `prompt` has no user message: {prompt!r:.120}")
    question = question_text(users[-1], where)
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise InputError(f"{where}: missing ground truth: `reward_model` has no 'ground_truth': {reward_model!r:.80}")
    return question, answer_text(reward_model["ground_truth"], where)


def load_training(source, views):
    """(pairs, test_time_training) for `--data source`; `views` 'both' needs pairs, not plain questions."""
    test_time = source in BENCHMARKS
    if test_time:
        pairs = [Pair(p.question, None, p.answer) for p in load_benchmark(source)]
    elif source.endswith((".json", ".jsonl")):
        pairs = rows_of_a_file(source, json_records(source))
    elif source.endswith(".parquet") and os.path.exists(source):
        frame = read_parquet(source)
        pairs = pairs_from_frame(frame, source) if set(PAIR_COLUMNS) <= set(frame.columns) else \
            rows_of_a_file(source, frame.to_dict("records"))
    else:
        pairs = load_pairs(source)
    if views == "both" and any(p.rephrased is None for p in pairs):
        raise InputError(f"--data {source} has no rephrased questions, and --views both samples each question's "
                         f"rephrasing too. Pairs come as a parquet, JSON or JSONL file with a rephrasing column (one "
                         f"of {list(REPHRASING_COLUMNS)}) beside its question and answer columns, or as two "
                         f"parquets in verl's format, --data ORIGINALS.parquet,REPHRASINGS.parquet, joined by "
                         f"extra_info.index or else by row (tools/rephrase.py makes a pair file); or use --views "
                         f"original (not for the methods that need the twins)")
    return pairs, test_time


def json_records(path):
    """The rows of a JSON file (a list of objects) or a JSONL file (an object per line)."""
    if not os.path.exists(path):
        raise MissingInput(f"no question file {path!r}")
    with open(path) as f:
        return json.load(f) if path.endswith(".json") else [json.loads(line) for line in f if line.strip()]


def rows_of_a_file(path, records):
    """Pairs (given a REPHRASING_COLUMNS column) or plain questions from a file's rows, by its first row's columns."""
    if not isinstance(records, list) or not records:
        raise InputError(f"{path}: expected a non-empty list of rows")
    columns = set(records[0]) if isinstance(records[0], dict) else set()
    rephrasing = next((c for c in REPHRASING_COLUMNS if c in columns), None)
    question = next((c for c in (("original_question",) if rephrasing else ()) + QUESTION_COLUMNS if c in columns),
                    None)
    answer = next((c for c in ANSWER_COLUMNS if c in columns), None)
    if question is None or answer is None:
        raise InputError(f"{path}: {'a pair file' if rephrasing else 'a question set'} needs a question column (one "
                         f"of {list(QUESTION_COLUMNS)}{', or original_question' if rephrasing else ''}) and an answer "
                         f"column (one of {list(ANSWER_COLUMNS)}); its columns are {sorted(columns)}")
    def read(record, where):
        if not isinstance(record, dict):
            raise InputError(f"{where}: expected an object with {question!r} and {answer!r}, got {record!r:.80}")
        return Pair(question_text(record.get(question), f"{where}: {question}"),
                    question_text(record.get(rephrasing), f"{where}: {rephrasing}") if rephrasing else None,
                    answer_text(record.get(answer), where))
    return report_unlabeled(every_row(path, records, read), path)


def load_pairs(source):
    """Pairs from a shipped name, `ORIGINALS.parquet,REPHRASINGS.parquet`, or a PAIR_COLUMNS parquet or hub id."""
    if source in SHIPPED_VERL_PAIRS:
        return verl_pairs(*(os.path.join(DATA_DIR, f) for f in SHIPPED_VERL_PAIRS[source]))
    if "," in source:                                     # ORIGINALS.parquet,REPHRASINGS.parquet
        files = source.split(",")
        if len(files) != 2 or not all(f.endswith(".parquet") for f in files):
            raise InputError(f"--data {source}: two files name a verl pair, ORIGINALS.parquet,REPHRASINGS.parquet")
        return verl_pairs(*files)
    if source in SHIPPED_PAIRS:
        source = os.path.join(DATA_DIR, SHIPPED_PAIRS[source])
    if os.path.exists(source) or source.endswith(".parquet"):
        return pairs_from_frame(read_parquet(source), source)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        import datasets
        try:
            return pairs_from_frame(datasets.load_dataset(source, split="train").to_pandas(), source)
        except ConnectionError as e:
            raise ConnectionError(f"cannot load {source!r} from the Hugging Face hub (offline?): {e}. "
                                  f"Download it where there is a network and pass the parquet path.") from e
    raise InputError(f"unknown training data {source!r}: use one of "
                     f"{list(SHIPPED_PAIRS) + list(SHIPPED_VERL_PAIRS)}, a parquet, JSON or JSONL path, two verl "
                     f"parquets as ORIGINALS.parquet,REPHRASINGS.parquet, or a hub dataset id")


def read_parquet(path):
    import pandas as pd
    if not os.path.exists(path):
        raise MissingInput(f"no parquet file {path!r}")
    return pd.read_parquet(path)


def pairs_from_frame(frame, name):
    """Pairs from a table with the OpenRS pair columns."""
    if missing := [c for c in PAIR_COLUMNS if c not in frame.columns]:
        raise InputError(f"{name}: missing column(s) {missing}; a pair file needs {list(PAIR_COLUMNS)}")
    if not len(frame):
        raise InputError(f"{name}: no pairs in the file")
    def read(row, where):
        q, r, a = row
        return Pair(question_text(q, f"{where}: original_question"), question_text(r, f"{where}: rephrased_question"),
                    answer_text(a, where))
    return report_unlabeled(every_row(name, frame[list(PAIR_COLUMNS)].itertuples(index=False), read), name)


def every_row(name, rows, read, shown=5):
    """[read(row, where)] per row, `where` naming file and row; all unreadable rows in one error, `shown` in full."""
    read_rows, problems = [], []
    for i, row in enumerate(rows):
        try:
            read_rows.append(read(row, f"{name}: row {i}"))
        except InputError as e:
            problems.append(str(e))
    if problems:
        raise InputError(f"{len(problems)} row(s) cannot be read: " + "; ".join(problems[:shown]) +
                         (f"; and {len(problems) - shown} more" if len(problems) > shown else ""))
    return read_rows


def verl_pairs(original_path, rephrased_path):
    """Pairs from two verl parquets (the official train_files, train_aug_files) in the originals' order, joined by
    `extra_info.index` when both carry it on every row (verl_index, rephrasing_rows), else by row; a pair's ground
    truths must agree. The index is trusted: a rephrasing under another question's index passes if the answers agree."""
    frames = read_parquet(original_path), read_parquet(rephrased_path)
    original, rephrased = verl_rows(original_path, frames[0]), verl_rows(rephrased_path, frames[1])
    o_index, r_index = verl_index(frames[0], original_path), verl_index(frames[1], rephrased_path)
    if (o_index is None) != (r_index is None):
        has, lacks = (original_path, rephrased_path) if r_index is None else (rephrased_path, original_path)
        raise InputError(f"misaligned pair files: {has} carries extra_info.index on every row, {lacks} on none (row 0 "
                         f"has none), so the rephrasings cannot be matched to their originals by it: give each row of "
                         f"{lacks} the index of its question, or drop the index from {has} to join the files by row")
    if o_index is None and len(original) != len(rephrased):
        longer, row = (original_path, "rephrasing") if len(original) > len(rephrased) else (rephrased_path, "original")
        raise InputError(f"misaligned pair files: {original_path} has {len(original)} rows, {rephrased_path} has "
                         f"{len(rephrased)}: row {min(len(original), len(rephrased))} of {longer} has no {row}; "
                         f"neither file carries extra_info.index, so they are joined by row: give every original "
                         f"its rephrasing on its own row, or give both files the index")
    partner = list(range(len(original))) if o_index is None else \
        rephrasing_rows(original_path, o_index, rephrased_path, r_index)
    pairs = []
    for i, ((q, a), j) in enumerate(zip(original, partner)):
        r, b = rephrased[j]
        if a != b:
            how = (f"; neither file carries extra_info.index, so they are joined by row: put each rephrasing on its "
                   f"original's row, or give both files the index" if o_index is None else
                   f" row {j}, joined to it by extra_info.index {o_index[i]!r}; a rephrasing has its original's "
                   f"answer: correct that row's index")
            raise InputError(f"misaligned pair files: row {i}: ground truth {a!r} in {original_path} but {b!r} in "
                             f"{rephrased_path}{how}")
        pairs.append(Pair(q, r, a))
    return report_unlabeled(pairs, original_path)


def rephrasing_rows(original_path, o_index, rephrased_path, r_index):
    """Each original's rephrasing row, by extra_info.index; refused: an index twice in a file, or without a match."""
    for path, index in ((original_path, o_index), (rephrased_path, r_index)):
        first = {}
        for i, key in enumerate(index):
            if key in first:
                raise InputError(f"{path}: row {i}: extra_info.index {key!r} again (first at row {first[key]}); an "
                                 f"index names one question, once in each file: drop the duplicate row or give it "
                                 f"its own index")
            first[key] = i
    o_row = {key: i for i, key in enumerate(o_index)}
    for j, key in enumerate(r_index):
        if key not in o_row:
            raise InputError(f"{rephrased_path}: row {j}: extra_info.index {key!r} matches no original in "
                             f"{original_path} (whose first are {o_index[:3]}); a rephrasing carries the index of the "
                             f"original it rephrases: correct it, or drop the row")
    r_row = {key: j for j, key in enumerate(r_index)}
    if len(r_row) < len(o_row):
        i, key = next((i, key) for i, key in enumerate(o_index) if key not in r_row)
        raise InputError(f"misaligned pair files: {original_path} has {len(o_index)} rows, {rephrased_path} has "
                         f"{len(r_index)}: row {i} of {original_path} (extra_info.index {key!r}) has no rephrasing; "
                         f"give every original its rephrasing, or drop the row")
    return [r_row[key] for key in o_index]


def verl_rows(path, frame=None):
    """[(question, gold answer or None)] of a parquet in verl's format (`frame`: the file, when already read)."""
    frame = read_parquet(path) if frame is None else frame
    if missing := [c for c in ("prompt", "reward_model") if c not in frame.columns]:
        raise InputError(f"{path}: missing column(s) {missing}; a verl file needs 'prompt' and 'reward_model'")
    if not len(frame):
        raise InputError(f"{path}: no rows in the file")
    return [verl_row(p, r, f"{path}: row {i}")
            for i, (p, r) in enumerate(zip(frame["prompt"].tolist(), frame["reward_model"].tolist()))]


def verl_index(frame, path):
    """Each row's `extra_info.index` (an integer or a string), or None when no row has one. Refused: an index of
    another type, and a file with the index on some rows only (joined by row, its index would be ignored)."""
    infos = frame["extra_info"].tolist() if "extra_info" in frame.columns else [None] * len(frame)
    index = [info.get("index") if isinstance(info, dict) else None for info in infos]
    index = [None if isinstance(key, float) and math.isnan(key) else key for key in index]
    carried = sum(key is not None for key in index)
    if not carried:
        return None
    if carried < len(index):
        row = index.index(None)
        raise InputError(f"{path}: row {row}: no extra_info.index, though {carried} of its {len(index)} rows carry "
                         f"one; give every row its index (the files are then joined by it) or none (joined by row)")
    return [index_key(key, f"{path}: row {i}") for i, key in enumerate(index)]


def index_key(key, where):
    """An extra_info.index as an int (a numpy or whole float one too) or a non-empty string."""
    if isinstance(key, numbers.Real) and not isinstance(key, bool) and \
            (isinstance(key, numbers.Integral) or float(key).is_integer()):
        return int(key)
    if isinstance(key, str) and key.strip():
        return key
    raise InputError(f"{where}: extra_info.index must be an integer or a non-empty string, got {key!r:.40}")


def notice(line):
    """A line about the data, printed once: every rank reads it, rank 0 says what it found."""
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line)


def report_unlabeled(pairs, name):
    if unlabeled := [i for i, p in enumerate(pairs) if p.answer is None]:
        notice(f"{name}: {len(unlabeled)} of {len(pairs)} pairs have no gold answer (rows {unlabeled[:10]}); "
               f"kept: the label-free rewards do not read it, `gt` and the metrics count them unlabeled")
    return pairs


def mismatch_rephrasings(pairs, share, seed):
    """(pairs, a line for run.log): the control of --rephrase_noise. round(share x N) of the N pairs (at least 2),
    drawn with `seed`, each take the next drawn one's rephrasing (the last the first's), keeping original and answer."""
    import hashlib
    count = max(2, round(share * len(pairs))) if share else 0           # one pair alone has no other to swap with
    # own stream: randperm seeded by `seed` is the run's question order (Questions), which would start with these
    stream = int.from_bytes(hashlib.blake2b(f"{seed}/rephrase_noise".encode(), digest_size=8).digest(), "little")
    drawn = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(stream))[:count].tolist()
    swaps, mixed = list(zip(drawn, drawn[1:] + drawn[:1])), list(pairs)      # (a drawn pair, the next drawn one)
    for i, j in swaps:
        mixed[i] = Pair(pairs[i].original, pairs[j].rephrased, pairs[i].answer)
    same_answer = sum(pairs[i].answer == pairs[j].answer for i, j in swaps)
    return mixed, (f"--rephrase_noise {share}: {len(drawn)} of the {len(pairs)} training pairs carry another "
                   f"question's rephrasing (drawn with seed {seed}, fixed for the run); {same_answer} of those have "
                   f"the same gold answer as the question they replace")


def classroom_pairs(split):
    from harness import world
    return [Pair(p.original, p.rephrased, p.answer) for p in world.make_split(split)]


def load_benchmark(name, limit=None):
    """The first `limit` (default: all) problems of a shipped benchmark, as `Problem`s."""
    if name not in BENCHMARKS:
        raise InputError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    file, field = BENCHMARKS[name]
    path = os.path.join(DATA_DIR, file)
    rows = verl_rows(path)[:limit] if field is None else \
        [benchmark_row(r, field, name == "gsm8k", f"{path}: row {i}") for i, r in enumerate(json_records(path)[:limit])]
    for i, (_, answer) in enumerate(rows):
        if answer is None:
            raise InputError(f"{path}: row {i}: missing ground truth: the answer is empty or absent")
    return [Problem(q, a) for q, a in rows]


def benchmark_row(record, field, gsm8k, where):
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object, got {record!r:.80}")
    return (question_text(record.get(field), f"{where}: {field}"),
            (gsm8k_answer if gsm8k else answer_text)(record.get("answer"), where))


@dataclass(frozen=True)
class Prompt:
    """How a question is asked: a system message (None: the chat template's default) and the user's, with {question}."""
    system: str | None
    user: str = "{question}"

    def messages(self, question):
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return system + [{"role": "user", "content": self.user.replace("{question}", question)}]


# --prompt: `official` is the paper's system prompt; the others say plainly what to write, for small models (GPUS.md).
PROMPTS = {
    "official": Prompt(SYSTEM_PROMPT),
    "user": Prompt(None, "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."),
    "oneshot": Prompt(SYSTEM_PROMPT, "Example: Ann has 2 bags with 5 pens in each. How many pens does Ann have?\n"
                                     "Answer: 2 * 5 = 10. The answer is \\boxed{10}.\n\n"
                                     "Now answer this question in the same way: {question}"),
}


def prompt_encoder(tokenizer, classroom=False, prompt="official"):
    """question -> prompt token ids in the model's format: world.format_prompt for the world's own tokenizer (`prompt`
    unused), else PROMPTS[prompt] in the chat template, or as plain text without one. `classroom`: world questions."""
    from harness import world
    if prompt not in PROMPTS:
        raise InputError(f"unknown prompt {prompt!r}; choose from {', '.join(PROMPTS)}")
    asked = PROMPTS[prompt]
    if world.is_classroom_tokenizer(tokenizer):
        return lambda q: tokenizer(world.format_prompt(q), add_special_tokens=False)["input_ids"]
    english = world.plain_english if classroom else (lambda q: q)
    if tokenizer.chat_template:
        return lambda q: tokenizer.apply_chat_template(asked.messages(english(q)), add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)
    return lambda q: tokenizer("\n\n".join(m["content"] for m in asked.messages(english(q))) + "\n",
                               add_special_tokens=False)["input_ids"]


def unknown_token_warning(tokenizer, prompts, what):
    """A warning, or None, for the prompts (token ids) that hold the tokenizer's unknown token (unreadable words);
    refused when every prompt holds it: a model that can read none of its questions has nothing to learn from."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    hit = [p for p in prompts if unknown is not None and unknown in p]
    if not hit:
        return None
    if len(hit) == len(prompts):
        raise InputError(f"all {len(prompts)} {what} hold the tokenizer's unknown token {tokenizer.unk_token!r}, "
                         f"e.g. {tokenizer.decode(hit[0])!r:.120}: the model cannot read its questions (the classroom "
                         f"model reads only the classroom world's words); give --model a model that reads them, or "
                         f"--data classroom")
    return (f"warning: {len(hit)} of {len(prompts)} {what} hold the tokenizer's unknown token "
            f"{tokenizer.unk_token!r} ({sum(p.count(unknown) for p in hit)} in all), words the model cannot read, e.g. "
            f"{tokenizer.decode(hit[0])!r:.200}; the classroom's tokenizer reads only the world's own words")


def drop_long(items, prompts_of, max_prompt_len, what):
    """The items whose prompts (prompts_of(item): token ids) all fit in max_prompt_len; refused if none fits."""
    kept = [item for item in items if all(len(prompt) <= max_prompt_len for prompt in prompts_of(item))]
    if len(kept) < len(items):
        notice(f"dropped {len(items) - len(kept)} of {len(items)} {what} whose prompt exceeds {max_prompt_len} tokens")
    if not kept:
        raise InputError(f"all {len(items)} {what} have a prompt longer than --max_prompt_len {max_prompt_len}")
    return kept


@dataclass
class Questions:
    """The training questions in the order a run takes them: P a step, a fresh shuffle each epoch (checkpointed)."""
    pairs: list
    shuffle: torch.Generator
    order: list
    cursor: int = 0

    @classmethod
    def shuffled(cls, pairs, seed):
        shuffle = torch.Generator().manual_seed(seed)
        return cls(pairs, shuffle, torch.randperm(len(pairs), generator=shuffle).tolist())

    def take(self, count, rank, world_size):
        """The next `count` questions' (indices, pairs) for this rank: its share, count / world_size. An epoch's
        last len(pairs) % count questions, too few for a step, are left out, and the next epoch shuffles every
        question again, as the official code's dataloader does (drop_last); the run says so at its start."""
        if self.cursor + count > len(self.order):                          # a new epoch
            self.order, self.cursor = torch.randperm(len(self.pairs), generator=self.shuffle).tolist(), 0
        per_rank = count // world_size
        indices = self.order[self.cursor + rank * per_rank: self.cursor + (rank + 1) * per_rank]
        self.cursor += count
        return indices, [self.pairs[i] for i in indices]

    def state(self):
        return {"order": self.order, "cursor": self.cursor, "shuffle": self.shuffle.get_state()}

    def load_state(self, state):
        self.shuffle.set_state(state["shuffle"])
        self.order, self.cursor = state["order"], state["cursor"]
