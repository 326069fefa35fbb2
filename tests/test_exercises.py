"""EXERCISES.md's checks: classroom/check_reward.py tells a student's reward function right from wrong, one case
at a time, without holding the solution."""
import check_reward
import rewards


def _check(capsys):
    """check_reward.main's verdict: its message, and whether it passed."""
    try:
        check_reward.main([])
    except SystemExit as e:
        return str(e.code), False
    return capsys.readouterr().out, True


def test_the_reward_check_names_what_is_missing_or_wrong(monkeypatch, capsys):
    monkeypatch.delattr(rewards, "soft_agreement", raising=False)               # as before the exercise
    assert _check(capsys) == ("rewards.py has no function soft_agreement(answers, labels, voters) yet: write it "
                              "beside agreement", False)
    monkeypatch.setattr(rewards, "soft_agreement", lambda answers, labels, voters: rewards.agreement(answers, labels),
                        raising=False)                                                     # 0/1, not a share
    message, passed = _check(capsys)
    assert not passed and message.startswith("not yet: a share of the voters, not 0 or 1")
    assert "expected [[0.5, 0.5, 0.25, 0.0]]" in message and "got      [[1.0, 1.0, 0.0, 0.0]]" in message


def test_the_reward_check_passes_what_its_cases_expect_and_then_asks_for_the_row(monkeypatch, capsys):
    """A stand-in that answers each case with its expected rewards (a look-up, not the reward) passes; the
    method's row comes next, and it must label as coreward1 does and reward with the function."""
    expected = {repr((answers, voters)): rewards_ for _, answers, _, voters, rewards_ in check_reward.CASES}
    def looked_up(answers, labels, voters):
        return expected[repr((answers, voters))]
    monkeypatch.setattr(rewards, "soft_agreement", looked_up, raising=False)
    monkeypatch.delitem(rewards.METHODS, "coreward1_soft", raising=False)      # as before the exercise's row
    assert _check(capsys) == ("soft_agreement is right; now add the method coreward1_soft as one row of "
                              "rewards.METHOD_TABLE", False)
    row = lambda labels: rewards.Method("coreward1_soft", labels, "both", None, "start", None, looked_up)
    monkeypatch.setitem(rewards.METHODS, "coreward1_soft", row("own vote"))
    message, passed = _check(capsys)
    assert not passed and "should label as coreward1 does" in message
    monkeypatch.setitem(rewards.METHODS, "coreward1_soft", row("other view's vote"))
    message, passed = _check(capsys)
    assert passed and message.startswith(f"right: soft_agreement passes all {len(check_reward.CASES)} cases")

