"""A world-feedback function that hangs (an evaluator to kill mid-eval in tests/core/test_external_eval.py)."""

import time


def score(model, tokenizer) -> float:
    time.sleep(120)
    raise AssertionError("this evaluator should have been killed mid-eval")
