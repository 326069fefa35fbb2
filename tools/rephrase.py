"""Rephrasing: make the q' of each training pair with a language model.

Co-rewarding-I needs, for each question q, a rephrasing q' with the same mathematics and the same
answer. The paper (Appendix C.2) asks an instruction model to rewrite each problem with new
wording and a new real-world scenario, keeping the mathematics and the answer, and to put the
result between markers. This command does that (the instruction's wording is ours) with vLLM
(or transformers), drops the responses whose markers are missing or empty, and writes a parquet
of pairs in the OpenRS format (`idx, original_question, rephrased_question, solution`) that
`data.load_pairs` reads.

    python tools/rephrase.py --model INSTRUCT_MODEL_DIR --data math500 --out runs/rephrased/math500.parquet

The rephrasing model must follow the instruction: SmolLM2-135M-Instruct (tools/smollm.py) does not
(it answers or paraphrases without the markers, so every response is dropped).

`--check_answers K` adds a filter that is not in the paper: the rephrasing model answers both
versions K times, in the training prompt format, and a pair is kept only when the two majority
answers exist and agree. It needs no gold answer, so it also works on unlabeled questions.

--data: a shipped benchmark (data.BENCHMARKS), a pair set of data.load_pairs (its originals
are rephrased again), or a parquet / JSON / JSONL file with a `question` (or `problem`) column
and an optional `answer` (or `solution`) column.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # the loop's modules

import config  # noqa: E402
from harness.errors import exit_on_usage_error  # noqa: E402
from harness.answers import extract_answer, is_equiv, majority_vote  # noqa: E402
from rollout import request_seed  # noqa: E402

START, END = "### Rephrased Question Start ###", "### Rephrased Question End ###"
INSTRUCTION = f"""Rewrite the math problem below as a new problem.
- Use different wording, and set it in a new, realistic real-world scenario.
- Keep exactly the same mathematics: the same quantities, relations and conditions, so that the new problem \
has the same final answer.
- Do not solve the problem, do not give hints and do not state the answer.
Write only the rewritten problem, between the line {START} and the line {END}.

Problem:
{{question}}"""


def parse_rephrased(text):
    """The text between the last complete pair of markers, stripped; None when there is none or it is empty."""
    blocks = re.findall(re.escape(START) + r"(.*?)" + re.escape(END), text or "", flags=re.DOTALL)
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1].strip()


def chat_encoder(tokenizer):
    """instruction text -> prompt ids, as a user turn of the model's chat template when it has one."""
    if tokenizer.chat_template:
        return lambda text: tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True, tokenize=True, return_dict=False)
    return lambda text: tokenizer(text + "\n", add_special_tokens=False)["input_ids"]


def majority_answers(engine, encode, questions, indices, view, k, temperature, max_tokens, seed=0):
    seeds = [request_seed(seed, "answer_check", 0, i, view) for i in indices]
    groups = engine.generate([encode(q) for q in questions], n=k, temperature=temperature, max_tokens=max_tokens,
                             seeds=seeds)
    return [majority_vote([extract_answer(s.text) for s in group]) for group in groups]


def rephrase(engine, chat, encode, questions, temperature=0.7, max_tokens=512, check_answers=0,
             answer_temperature=1.0, answer_tokens=1024, seed=0):
    """[(index, original, rephrased)] for the questions that survive; prints what was dropped.

    chat: instruction text -> prompt ids; encode: question -> training prompt ids."""
    responses = engine.generate([chat(INSTRUCTION.format(question=q)) for q in questions],
                                n=1, temperature=temperature, max_tokens=max_tokens,
                                seeds=[request_seed(seed, "rephrase", 0, i) for i in range(len(questions))])
    parsed = [parse_rephrased(group[0].text) for group in responses]
    kept = [(i, questions[i], r) for i, r in enumerate(parsed) if r is not None]
    failed = [group[0].text for group, r in zip(responses, parsed) if r is None]
    print(f"rephrasing: dropped {len(failed)} of {len(questions)} responses without text between the markers"
          + (f"; the first: {failed[0][:300]!r}" if failed else ""))
    if check_answers and kept:
        indices = [i for i, _, _ in kept]
        originals = majority_answers(engine, encode, [q for _, q, _ in kept], indices, 0, check_answers,
                                     answer_temperature, answer_tokens, seed)
        rephrased = majority_answers(engine, encode, [r for _, _, r in kept], indices, 1, check_answers,
                                     answer_temperature, answer_tokens, seed)
        agree = [a is not None and b is not None and is_equiv(a, b) for a, b in zip(originals, rephrased)]
        none = sum(a is None or b is None for a, b in zip(originals, rephrased))
        print(f"answer check (k={check_answers}): dropped {len(kept) - sum(agree)} of {len(kept)} pairs "
              f"({none} without a majority answer on one side, "
              f"{len(kept) - sum(agree) - none} whose majorities differ)")
        kept = [pair for pair, ok in zip(kept, agree) if ok]
    return kept


def load_questions(source, limit=None):
    """(questions, gold answers or None) of --data."""
    from harness import data
    if source in data.BENCHMARKS:
        problems = data.load_benchmark(source, limit)
        return [p.question for p in problems], [p.answer for p in problems]
    if source in data.SHIPPED_PAIRS or source in data.SHIPPED_VERL_PAIRS:
        pairs = data.load_pairs(source)[:limit]
        return [p.original for p in pairs], [p.answer for p in pairs]
    import pandas as pd
    if not os.path.exists(source):
        raise FileNotFoundError(f"no file {source!r}; --data is a benchmark, a pair set or a file of questions")
    frame = pd.read_parquet(source) if source.endswith(".parquet") else \
        pd.read_json(source, lines=source.endswith(".jsonl"))
    question = next((c for c in ("question", "problem") if c in frame.columns), None)
    if question is None:
        raise ValueError(f"{source}: no 'question' or 'problem' column (columns: {list(frame.columns)})")
    answer = next((c for c in ("answer", "solution") if c in frame.columns), None)
    frame = frame[:limit]
    questions = [data.question_text(q, f"{source}: row {i}: {question}") for i, q in enumerate(frame[question])]
    answers = [data.answer_text(a, f"{source}: row {i}") for i, a in enumerate(frame[answer])] if answer \
        else [None] * len(questions)
    return questions, answers


def write_pairs(path, kept, answers):
    """A parquet in the OpenRS pair format: idx, original_question, rephrased_question, solution."""
    import pandas as pd
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame({"idx": [i for i, _, _ in kept], "original_question": [q for _, q, _ in kept],
                  "rephrased_question": [r for _, _, r in kept],
                  "solution": [answers[i] for i, _, _ in kept]}).to_parquet(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the rephrasing model (a Hugging Face folder or id)")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="the parquet of pairs to write")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max_tokens", type=int, default=512, help="for the rephrasing response")
    ap.add_argument("--check_answers", type=int, default=0, metavar="K",
                    help="keep pairs whose K-sample majority answers agree")
    ap.add_argument("--answer_temperature", type=float, default=1.0)
    ap.add_argument("--answer_tokens", type=int, default=1024, help="for each answer of --check_answers")
    ap.add_argument("--backend", choices=config.BACKENDS, default="auto",
                    help="the engine: vllm, transformers' generate (hf), or auto: vLLM where it is installed, else hf")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.backend, _ = config.choose_backend(args.backend)
    from transformers import AutoTokenizer
    from harness import data
    from harness import checkpoint
    from rollout import make_engine
    model_dir = checkpoint.model_folder_for_all_ranks(args.model)
    questions, answers = load_questions(args.data, args.limit)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat, encode = chat_encoder(tokenizer), data.prompt_encoder(tokenizer, classroom=False)
    longest = max(len(chat(INSTRUCTION.format(question=q))) for q in questions)
    engine = make_engine(args.backend, model_dir, max_prompt_len=longest + args.max_tokens,
                         max_response_len=max(args.max_tokens, args.answer_tokens), dtype=args.dtype,
                         **{k: config.PRESETS["classroom"][k] for k in ("cpu_kv_cache_gib", "gpu_memory_utilization", "hf_kv_budget_gib")})
    kept = rephrase(engine, chat, encode, questions, args.temperature, args.max_tokens, args.check_answers,
                    args.answer_temperature, args.answer_tokens, args.seed)
    engine.close()
    if not kept:
        raise SystemExit(f"no pair survived; nothing written to {args.out}. Does {args.model} follow the instruction?")
    write_pairs(args.out, kept, answers)
    print(f"wrote {len(kept)} pairs of {len(questions)} questions to {args.out}")


if __name__ == "__main__":
    exit_on_usage_error(main, "rephrase.py")
