"""Grading: the checks lab tests call (clear messages), and the instructor pipeline (build labs, grade)."""
from .checks import check_close, check_equal, check_raises, check_shape

__all__ = ["check_close", "check_equal", "check_raises", "check_shape"]
