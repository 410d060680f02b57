"""The fixture lab's judge (tests/data/solutions/lab99.ipynb): what the pipeline's tests grade with.

add: the visible case, an edge grid and 20 drawn cases (2 points); multiply: the visible case and drawn ones
(1 + 1 points over two test cells); clamp: an edge grid around the bounds (1 point). No case of add has a sum of
0 and none of multiply a product equal to the sum, so the tests' planted wrong answers (a - b, a + b) and an
attacker's constant 0 earn nothing there, whatever the draw."""
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
    for x in (-2, -1, 4, 5, -50, 77):          # outside the range: a clamp that returns x fails every case
        with t.case(f"clamp({x}, 0, 3)"):
            _equal(t, f"clamp({x}, 0, 3)", t.call("clamp", x, 0, 3), max(0, min(x, 3)))
