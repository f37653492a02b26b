"""The one registry shape (detectors, schedulers, overlays): names, signature-checked params, specs."""

from __future__ import annotations

import pytest

from evalstop_trl.core.detectors import DETECTORS
from evalstop_trl.core.registry import Registry, Spec


@pytest.fixture
def reg():
    r: Registry = Registry("widget", context=("world",))

    @r.register("plain")
    class Plain:
        def __init__(self, size: int = 1, colour: str = "red") -> None:
            self.size, self.colour = size, colour

    def with_world(world, scale: float = 2.0):
        return ("made", world, scale)

    r.add("worldly", with_world)
    return r


def test_create_checks_names_and_params(reg):
    assert reg.create("plain", size=3).size == 3
    assert reg.create("worldly", "earth", scale=1.0) == ("made", "earth", 1.0)
    with pytest.raises(ValueError, match=r"Unknown widget 'nope'; valid widgets are: plain, worldly\."):
        reg.create("nope")
    with pytest.raises(ValueError, match=r"Unknown parameter\(s\) weight for widget 'plain'; valid parameters are: "
                                         r"size, colour\."):
        reg.create("plain", weight=2)


def test_context_is_not_a_user_parameter(reg):
    assert reg.params("worldly") == {"scale": 2.0}
    with pytest.raises(ValueError, match="valid parameters are: scale"):
        reg.check("worldly", {"world": "mars"})


def test_duplicate_names_are_refused(reg):
    with pytest.raises(ValueError, match="already registered"):
        reg.add("plain", dict)


def test_names_iteration_membership(reg):
    assert reg.names() == ("plain", "worldly") and list(reg) == ["plain", "worldly"] and len(reg) == 2
    assert "plain" in reg and "nope" not in reg


@pytest.mark.parametrize("data, name, params", [
    ("plain", "plain", {}),
    ({"name": "plain", "params": {"size": 2}}, "plain", {"size": 2}),
    ({"name": "plain", "size": 2}, "plain", {"size": 2}),
])
def test_spec_parse_and_build(reg, data, name, params):
    spec = Spec.parse(data)
    assert (spec.name, dict(spec.params)) == (name, params)
    assert reg.build(spec).size == params.get("size", 1)


def test_spec_params_are_read_only():
    spec = Spec("plain", {"size": 2})
    with pytest.raises(TypeError):
        spec.params["size"] = 3  # type: ignore[index]
    with pytest.raises(ValueError, match="non-empty string name"):
        Spec("")


def test_detectors_use_the_registry():
    assert isinstance(DETECTORS, Registry)
    assert DETECTORS.params("stop_at") == {"fraction": 0.65, "direction": "max"}
