"""course_lib/validate.py: every check names the argument, says what was expected, and returns the value converted."""
import math

import numpy as np
import pytest
import torch

from course_lib.validate import integer, number, one_of, optional, power_of_two, probability


@pytest.mark.parametrize("call, message", [
    (lambda: integer(0, "n", low=1), r"^n must be a positive integer, got 0$"),
    (lambda: integer(True, "n", low=1), r"^n must be a positive integer, got True$"),
    (lambda: integer(2.0, "n"), r"^n must be an integer, got 2.0$"),
    (lambda: integer(-1, "tokens", low=0), r"^tokens must be an integer >= 0, got -1$"),
    (lambda: integer(9, "k", 0, 8), r"^k must be an integer in \[0, 8\], got 9$"),
    (lambda: integer(9, "k", high=8), r"^k must be an integer <= 8, got 9$"),
    (lambda: number(0, "t", 0, low_open=True), r"^t must be a finite positive number, got 0$"),
    (lambda: number(float("nan"), "t", 0), r"^t must be a finite number >= 0, got nan$"),
    (lambda: number(float("inf"), "t", 0), r"^t must be a finite number >= 0, got inf$"),
    (lambda: number(float("nan"), "t", 0, finite=False), r"^t must be a number >= 0, got nan$"),
    (lambda: number("1", "t"), r"^t must be a finite number, got '1'$"),
    (lambda: number(False, "t"), r"^t must be a finite number, got False$"),
    (lambda: probability(1.5, "top_p", zero=False), r"^top_p must be a finite number in \(0, 1\], got 1.5$"),
    (lambda: probability(1.0, "a", one=False), r"^a must be a finite number in \[0, 1\), got 1.0$"),
    (lambda: power_of_two(24, "BLOCK", 16), r"^BLOCK must be a power of two >= 16, got 24$"),
    (lambda: power_of_two(8, "BLOCK", 16), r"^BLOCK must be a power of two >= 16, got 8$"),
    (lambda: one_of("x", "mode", ["a", "b"]), r"^mode must be one of 'a', 'b', got 'x'$"),
    (lambda: one_of(["a"], "mode", ["a", "b"]), r"^mode must be one of 'a', 'b', got \['a'\]$"),
])
def test_refusals_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_accepted_values_come_back_converted():
    assert integer(np.int64(3), "n", low=1) == 3 and type(integer(np.int64(3), "n")) is int
    assert integer(torch.tensor(4).item(), "n") == 4
    assert number(2, "x") == 2.0 and type(number(2, "x")) is float
    assert number(np.float32(0.5), "p", 0, 1) == 0.5
    assert number(float("inf"), "x", 0, finite=False) == math.inf
    assert probability(0.0, "a") == 0.0 and probability(1, "a") == 1.0
    assert power_of_two(64, "BLOCK", 16) == 64
    assert one_of("b", "mode", ("a", "b")) == "b"
    assert optional(integer, None, "tokens", low=1) is None
    assert optional(integer, 5, "tokens", low=1) == 5
    with pytest.raises(ValueError, match="tokens must be a positive integer"):
        optional(integer, 0, "tokens", low=1)
