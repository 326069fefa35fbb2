"""How a model's votes on the two views of a question relate: the situation Co-rewarding-I needs.

    python bench/views.py                     # the classroom base model, 300 train questions, G=8

Co-rewarding-I helps where a self-vote entrenches a wrong answer that is tied to the wording: a
view's own majority is wrong, and the other view's majority is right, or at least not the same
wrong answer. Where the views' mistakes are independent sampling noise, the two labels mostly
differ in random ways, and the cross-view label has little to add over a self-vote. This samples
G responses at temperature 1.0 to each view of the first --questions train pairs (the training
run's seeds for step 1) and counts, over each view's majority answer ("self-vote"):
- questions whose two votes agree; both right; both wrong with one answer; both wrong, differently;
  one right and the other wrong;
- of the wrong self-votes: how often the other view's vote is right, and how often it is the same
  wrong answer;
- for views with a harmless distractor and views with a trap (world.DISTRACTORS): how often a
  sample and a self-vote are right, and how often they are the answer that copying the trap gives.
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness import data  # noqa: E402
from harness import world  # noqa: E402
from harness.answers import extract_answer, is_equiv, majority_vote  # noqa: E402
from rollout import make_engine, request_seed  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="default: the classroom base model")
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--group_size", type=int, default=8)
    args = ap.parse_args()
    from transformers import AutoTokenizer
    model = args.model or world.base_model_dir()
    encode = data.prompt_encoder(AutoTokenizer.from_pretrained(model), True)
    pairs = world.make_split("train")[:args.questions]
    engine = make_engine("vllm", model, 64, 48, dtype="float32", cpu_kv_cache_gib=0.25, gpu_memory_utilization=0.75,
                         hf_kv_budget_gib=0.0)
    P = len(pairs)
    prompts = [encode(p.original) for p in pairs] + [encode(p.rephrased) for p in pairs]
    seeds = [request_seed(0, "policy", 1, i, view) for view in (0, 1) for i in range(P)]
    groups = engine.generate(prompts, args.group_size, 1.0, 48, seeds=seeds)
    engine.close()
    answers = [[extract_answer(s.text) for s in g] for g in groups]
    votes = [majority_vote(a) for a in answers]
    same = lambda a, b: a is not None and b is not None and is_equiv(a, b)
    count = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    for i, p in enumerate(pairs):
        original, rephrased = votes[i], votes[i + P]
        right = [same(original, p.answer), same(rephrased, p.answer)]
        count["votes agree"] += same(original, rephrased)
        count["both right"] += all(right)
        count["both wrong, one answer"] += not any(right) and same(original, rephrased)
        count["both wrong, differently"] += not any(right) and not same(original, rephrased)
        count["one right, one wrong"] += right[0] != right[1]
        for own, other, ok in ((original, rephrased, right[0]), (rephrased, original, right[1])):
            if not ok:
                count["wrong self-votes"] += 1
                count["other view right"] += same(other, p.answer)
                count["other view the same wrong answer"] += same(other, own)
        shape, a, b, _ = p.maths
        for view, trap in enumerate(p.traps):
            copied = None if trap is None else str(world.worked_solution(shape, a, b, trap)[1])
            k = by_kind["trap" if trap else "harmless"]
            group, vote = answers[i + view * P], votes[i + view * P]
            k["views"] += 1
            k["sample right"] += sum(same(x, p.answer) for x in group) / len(group)
            k["sample copies the trap"] += sum(same(x, copied) for x in group) / len(group)
            k["vote right"] += same(vote, p.answer)
            k["vote copies the trap"] += same(vote, copied)
    print(f"{P} questions x 2 views x G={args.group_size}, temperature 1.0, {model}")
    for key in ("votes agree", "both right", "both wrong, one answer", "both wrong, differently",
                "one right, one wrong"):
        print(f"  {key:<36} {count[key]:>4}  ({count[key] / P:.0%} of questions)")
    wrong = max(count["wrong self-votes"], 1)
    print(f"  wrong self-votes {count['wrong self-votes']} of {2 * P}: the other view's vote is right for "
          f"{count['other view right'] / wrong:.0%}, the same wrong answer for "
          f"{count['other view the same wrong answer'] / wrong:.0%}")
    for kind in ("harmless", "trap"):
        k = by_kind[kind]
        n = max(k["views"], 1)
        print(f"  views with a {kind + ' distractor' if kind == 'harmless' else 'trap'} ({k['views']}): "
              + ", ".join(f"{key} {k[key] / n:.0%}" for key in
                          ("sample right", "sample copies the trap", "vote right", "vote copies the trap")))


if __name__ == "__main__":
    main()
