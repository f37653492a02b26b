"""``evalstop evaluate --fn``: loading the world-feedback function, and what a failure says."""

from __future__ import annotations

import pytest

from evalstop_trl.train.evaluator import load_function


def test_a_module_that_is_not_installed_names_fn_path():
    with pytest.raises(ValueError, match=r"No module named 'myeval_not_installed'; if 'myeval_not_installed' is "
                                         r"not installed, pass --fn-path DIR, the folder that holds"):
        load_function("myeval_not_installed:score")


def test_a_missing_function_of_an_installed_module_is_no_fn_path_hint():
    with pytest.raises(ValueError, match="has no attribute 'nope'") as exc:
        load_function("evalstop_trl.train.tiny:nope")
    assert "--fn-path" not in str(exc.value)
