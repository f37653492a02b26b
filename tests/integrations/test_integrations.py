"""Tuner integrations with the real libraries: an Optuna study pruned by EvalStopPruner and a Ray Tune
run stopped by EvalStopStopper stop the hacked trials at the step EvalStop's detector names, and
leave the healthy ones alone."""

from __future__ import annotations

import pytest

from evalstop_trl.core.detectors import Observation, create_detector
from tests.proc_helpers import local_ray

# world feedback per step: rises, then the run over-optimises its proxy and the score falls (the
# default decline k=2 stops at step 6: 0.55 -> 0.53 -> 0.40, beyond the run's eval-to-eval noise)
HACKED = [0.30, 0.42, 0.51, 0.55, 0.53, 0.40, 0.34, 0.29, 0.25, 0.22]
HEALTHY = [0.30, 0.36, 0.41, 0.45, 0.48, 0.50, 0.52, 0.53, 0.54, 0.55]
CURVES = {"hacked": HACKED, "healthy": HEALTHY}


def _stop_step(curve: list[float], direction: str = "max", **params) -> int | None:
    """Where the coordinator's detector stops ``curve`` (steps 1..n): the reference for the tuners."""
    det = create_detector("decline", direction=direction, **params)
    for step, value in enumerate(curve, start=1):
        if det.observe(Observation("ref", step, value)).stop:
            return step
    return None


def test_the_reference_stops_the_hacked_curve_only():
    assert _stop_step(HACKED) == 6 and _stop_step(HEALTHY) is None


@pytest.mark.parametrize(("direction", "sign"), [("maximize", 1.0), ("minimize", -1.0)])
def test_an_optuna_study_prunes_hacked_trials_where_the_detector_stops(direction, sign):
    optuna = pytest.importorskip("optuna")
    from evalstop_trl.integrations import EvalStopPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = EvalStopPruner("decline", k=2)
    study = optuna.create_study(direction=direction, pruner=pruner,
                                sampler=optuna.samplers.GridSampler({"curve": ["hacked", "healthy"]}))
    last_step: dict[str, int] = {}

    def objective(trial):
        name = trial.suggest_categorical("curve", ["hacked", "healthy"])
        for step, value in enumerate(CURVES[name], start=1):
            trial.report(sign * value, step)
            last_step[name] = step
            if trial.should_prune():
                raise optuna.TrialPruned()
        return sign * CURVES[name][-1]

    study.optimize(objective, n_trials=2)
    states = {t.params["curve"]: t.state for t in study.trials}
    assert states == {"hacked": optuna.trial.TrialState.PRUNED, "healthy": optuna.trial.TrialState.COMPLETE}
    assert last_step == {"hacked": _stop_step(HACKED), "healthy": len(HEALTHY)}
    hacked = next(t for t in study.trials if t.params["curve"] == "hacked")
    worse = "declines" if direction == "maximize" else "rises"  # a minimised score that goes up rose
    assert f"2 consecutive {worse}" in pruner.reason(study, hacked.number)


def test_a_new_study_never_inherits_an_old_trials_detector_and_the_state_is_bounded(monkeypatch):
    """Issue 25 item 8: detectors were keyed by id(study) and never dropped; a new study at a freed
    address got an old trial's declines and pruned a fresh trial on its first report."""
    optuna = pytest.importorskip("optuna")
    import evalstop_trl.integrations.optuna as module
    from evalstop_trl.integrations import EvalStopPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = EvalStopPruner("decline", k=2)

    def run(study, points):
        trial = study.ask()
        pruned = []
        for step, value in points:
            trial.report(value, step)
            pruned.append(trial.should_prune())
        study.tell(trial, points[-1][1])
        return pruned

    new = optuna.create_study(direction="maximize", pruner=pruner)
    assert run(new, [(1, 0.9), (2, 0.8)]) == [False, False]  # one decline: not yet
    # a new study at the same address (what CPython does with a freed one's): the old key's collision
    storage = optuna.storages.InMemoryStorage()
    name = optuna.create_study(storage=storage, direction="maximize").study_name
    address = id(new)
    optuna.study.Study.__init__(new, study_name=name, storage=storage, pruner=pruner)
    assert id(new) == address and len(new.trials) == 0
    assert run(new, [(4, 0.7)]) == [False]  # a fresh trial is never pruned on its first report
    # a step above 2**53 cannot be judged: it never fails the trial
    assert run(new, [(2**60, 0.5)]) == [False]
    # at most MAX_TRACKED detectors are kept; a trial whose detector was dropped is replayed from its values
    monkeypatch.setattr(module, "MAX_TRACKED", 2)
    trials = [new.ask() for _ in range(3)]
    for step, value in enumerate([0.9, 0.8, 0.7], start=1):
        answers = []
        for t in trials:
            t.report(value, step)
            answers.append(t.should_prune())
        assert len(pruner._trials) <= 2
        assert answers == [step == 3] * 3, (step, answers)  # the second decline, for every trial alike


def test_the_pruner_checks_its_policy_at_once():
    pytest.importorskip("optuna")
    from evalstop_trl.integrations import EvalStopPruner

    with pytest.raises(ValueError, match="Unknown detector"):
        EvalStopPruner("nope")
    with pytest.raises(ValueError, match="k must be"):
        EvalStopPruner("decline", k=0)
    with pytest.raises(ValueError, match="n_warmup_steps"):
        EvalStopPruner("decline", n_warmup_steps=-1)


def test_the_stopper_is_fed_in_step_order_and_reads_missing_values_as_missing():
    pytest.importorskip("ray.tune")
    from evalstop_trl.integrations import EvalStopStopper

    stopper = EvalStopStopper("wf", "max", "decline", k=2)
    results = [{"training_iteration": i, "wf": v} for i, v in enumerate(HACKED, start=1)]
    results.insert(5, {"training_iteration": 5, "wf": 0.0})  # a repeated step is ignored
    results.insert(6, {"training_iteration": 6, "other": 1})  # no metric: a missing eval at step 6
    stops = [i for i, r in enumerate(results) if stopper("t1", r)]
    assert results[stops[0]]["training_iteration"] == 7  # the missing eval at 6 neither counts nor resets
    with pytest.raises(ValueError, match="mode must be"):
        EvalStopStopper("wf", "up")


@pytest.fixture(scope="module")
def ray_local():
    pytest.importorskip("ray")
    with local_ray(RAY_AIR_NEW_OUTPUT="0") as ray:
        yield ray


def test_a_ray_tune_run_stops_hacked_trials_where_the_detector_stops(ray_local, tmp_path):
    from ray import tune

    from evalstop_trl.integrations import EvalStopStopper

    def trainable(config):
        for value in CURVES[config["curve"]]:
            tune.report({"world_feedback": value})

    stopper = EvalStopStopper("world_feedback", "max", "decline", k=2)
    tuner = tune.Tuner(trainable, param_space={"curve": tune.grid_search(["hacked", "healthy"])},
                       run_config=tune.RunConfig(stop=stopper, storage_path=str(tmp_path), verbose=0))
    grid = tuner.fit()
    iterations = {r.config["curve"]: r.metrics["training_iteration"] for r in grid}
    assert iterations == {"hacked": _stop_step(HACKED), "healthy": len(HEALTHY)}
