"""Checks EXERCISES.md's exercise 7, your own label-free reward: the soft cross-view vote.

    python classroom/check_reward.py

The reward asked for: a response's reward is the share of its group's voters (for coreward1's label
source, the G responses to the other view of its question) whose answer equals its own answer, as
mathematics (answers.is_equiv); a response without an answer gets 0. The exercise adds it to
rewards.py as `soft_agreement(answers, labels, voters)`, and the method `coreward1_soft` as one row
of METHOD_TABLE that labels like coreward1 and rewards with it.

This script calls your function on groups whose rewards were worked out by hand, and says which
case differs and how. It holds no solution: only the cases and their expected rewards.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (what the case checks, answers [groups][G], labels [groups], voters [groups][G], expected rewards [groups][G])
CASES = [
    ("a share of the voters, not 0 or 1",
     [["3", "3", "4", None]], ["3"], [["3", "3", "5", "4"]], [[0.5, 0.5, 0.25, 0.0]]),
    ("equal as mathematics: 1/2, 0.5 and \\frac12 are one answer",
     [["\\frac12", "2"]], ["0.5"], [["0.5", "1/2", "2", None]], [[0.5, 0.25]]),
    ("a voter without an answer counts in the share but matches nothing",
     [["7", "8"]], ["7"], [["7", None, None, None]], [[0.25, 0.0]]),
    ("no voter answered: every reward is 0",
     [["7", "7"]], [None], [[None, None]], [[0.0, 0.0]]),
    ("each group against its own voters",
     [["1", "2"], ["2", "2"]], ["1", "2"], [["1", "1"], ["2", "1"]], [[1.0, 0.0], [0.5, 0.5]]),
]


def main(argv=None):
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import rewards
    reward = getattr(rewards, "soft_agreement", None)
    if reward is None:
        sys.exit("rewards.py has no function soft_agreement(answers, labels, voters) yet: write it beside agreement")
    for what, answers, labels, voters, expected in CASES:
        got = reward(answers, labels, voters)
        if [[float(r) for r in group] for group in got] != expected:
            sys.exit(f"not yet: {what}\n  answers  {answers}\n  voters   {voters}\n  expected {expected}\n"
                     f"  got      {got}")
    method = rewards.METHODS.get("coreward1_soft")
    if method is None:
        sys.exit("soft_agreement is right; now add the method coreward1_soft as one row of rewards.METHOD_TABLE")
    if method.reward is not reward or method.labels != "other view's vote":
        sys.exit(f"coreward1_soft's row should label as coreward1 does (\"other view's vote\") and reward with "
                 f"soft_agreement; it has {method.labels!r} and {method.reward.__name__}")
    print(f"right: soft_agreement passes all {len(CASES)} cases, and coreward1_soft is a row of METHOD_TABLE. "
          f"Now run it: python train.py --method coreward1_soft ...")


if __name__ == "__main__":
    main()
