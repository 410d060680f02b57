"""The lab assertions (checks.py): a failure names what was checked, what was expected and what came, and a
known misconception by name when the student's value is the one that mistake gives."""
import pytest
import torch

from course_lib.checks import check_close, check_equal, check_raises, check_shape, diagnose

MISTAKES = {"top-left": "the causal mask is aligned top-left; see notebook 07", "x2": "doubled"}


def test_a_matching_mistake_is_named_before_the_numbers():
    want, topleft = torch.ones(2, 3), torch.zeros(2, 3)
    with pytest.raises(AssertionError, match=r"^out: this looks like a known mistake: the causal mask is aligned "
                                             r"top-left; see notebook 07\. expected"):
        check_close(topleft, want, "out", mistakes={MISTAKES["top-left"]: topleft, MISTAKES["x2"]: want * 2})
    with pytest.raises(AssertionError, match=r"^n: this looks like a known mistake: doubled\. expected 3, got 6$"):
        check_equal(6, 3, "n", mistakes={MISTAKES["x2"]: 6})


def test_an_unknown_wrong_answer_gets_the_plain_message():
    with pytest.raises(AssertionError) as e:
        check_close(torch.full((2,), 5.0), torch.ones(2), "out", mistakes={"doubled": torch.full((2,), 2.0),
                                                                            "a shape": torch.ones(3)})
    assert "known mistake" not in str(e.value) and "expected [1. 1.], got [5. 5.]" in str(e.value)
    with pytest.raises(AssertionError, match=r"^s: expected 'a', got 'b'$"):
        check_equal("b", "a", "s", mistakes={"a number": 3})


def test_a_right_answer_passes_even_when_a_mistake_gives_the_same_value():
    check_close(torch.ones(2), torch.ones(2), "out", mistakes={"same": torch.ones(2)})
    check_equal(3, 3, "n", mistakes={"same": 3})


def test_diagnose_and_the_other_checks():
    assert diagnose(torch.zeros(2), {"zeros": [0.0, 0.0], "ones": [1.0, 1.0]}) == "zeros"
    assert diagnose(torch.zeros(2), {"ones": [1.0, 1.0], "other shape": [0.0]}) is None
    assert diagnose(object(), {"ones": [1.0]}) is None
    with pytest.raises(AssertionError, match="got None - did the function return its result"):
        check_close(None, 1.0, "f(x)")
    with pytest.raises(AssertionError, match=r"expected shape \(2,\), got shape \(3,\)"):
        check_close(torch.ones(3), torch.ones(2), "out")
    with pytest.raises(AssertionError, match=r"expected shape \(2, 2\), got \(3,\)"):
        check_shape(torch.ones(3), (2, 2), "out")
    with pytest.raises(AssertionError, match="expected ValueError to be raised, but nothing was raised"):
        check_raises(lambda: None, ValueError, "bad n")
    with pytest.raises(AssertionError, match="expected ValueError, got KeyError"):
        check_raises(lambda: {}["x"], ValueError, "bad n")


def test_a_long_array_names_its_first_mismatch_and_bad_kinds_fail_as_assertions():
    want = torch.arange(20)
    got = want.clone()
    got[13] = -1
    with pytest.raises(AssertionError, match=r"first mismatch at index \(13,\): expected 13, got -1"):
        check_equal(got, want, "codes")
    with pytest.raises(AssertionError, match=r"first mismatch at index \(1, 2\): expected 6, got 0"):
        check_equal(torch.tensor([[0, 1, 2, 3], [4, 5, 0, 7]]), torch.arange(8).reshape(2, 4), "codes")
    with pytest.raises(AssertionError, match=r"^codes: expected shape \(20,\), got shape \(19,\)$"):
        check_equal(want[:19], want, "codes")
    with pytest.raises(AssertionError, match=r"^codes: expected an array .*, got 'x'$"):
        check_equal("x", want, "codes")
    with pytest.raises(AssertionError, match="got None - did the function return its result"):
        check_equal(None, want, "codes")
