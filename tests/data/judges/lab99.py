"""The fixture lab's judge (tests/data/solutions/lab99.ipynb): what the pipeline's tests grade with.

add: the visible case, an edge grid and 20 drawn cases (2 points); multiply: the visible case and drawn ones
(1 + 1 points over two test cells); clamp: values below and above drawn ranges (1 point). No case of add has a
sum of 0 and none of multiply a product equal to the sum or to 0, and each case of clamp checks two different
answers, so the tests' planted wrong answers (a - b, a + b, returning x) and an attacker's constant 0 earn
nothing, whatever the draw."""
from course_grading.judging import Judge

judge = Judge()


def _equal(t, label, got, want):
    t.expect(got == want, f"{label}: expected {want!r}, got {got!r}")


@judge.part("add_tests")
def add(t):
    cases = [(2, 3), (0, 5), (-7, 8), (10**6, -1)]
    while len(cases) < 24:
        a, b = t.rng.randint(-1000, 1000), t.rng.randint(-1000, 1000)
        if a + b != 0 and b != 0:
            cases.append((a, b))
    for a, b in cases:
        with t.case(f"add({a}, {b})"):
            _equal(t, f"add({a}, {b})", t.call("add", a, b), a + b)


@judge.part("multiply_tests")
def multiply_visible(t):
    with t.case("multiply(3, 4)"):
        _equal(t, "multiply(3, 4)", t.call("multiply", 3, 4), 12)


@judge.part("multiply_hidden")
def multiply(t):
    cases = [(1, 5), (-3, -4)]
    while len(cases) < 22:
        a, b = t.rng.randint(-50, 50), t.rng.randint(-50, 50)
        if a * b != a + b and a * b != 0:
            cases.append((a, b))
    for a, b in cases:
        with t.case(f"multiply({a}, {b})"):
            _equal(t, f"multiply({a}, {b})", t.call("multiply", a, b), a * b)


@judge.part("clamp_tests")
def clamp(t):
    # each case one range, a value below it and one above: the two answers differ, so no constant passes a case
    for lo, hi in ((0, 3), (-5, 2), (10, 11), (-40, -7), (1, 100), (6, 9)):
        with t.case(f"clamp below and above [{lo}, {hi}]"):
            for x in (lo - t.rng.randint(1, 50), hi + t.rng.randint(1, 50)):
                _equal(t, f"clamp({x}, {lo}, {hi})", t.call("clamp", x, lo, hi), max(lo, min(x, hi)))
