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


def test_a_function_returning_world_feedback_posts_its_score_and_says_the_proxy_stays_behind(tmp_path, caplog):
    """An external eval posts a score (and per-example evidence) only: a WorldFeedback's score is
    taken, per-example scores summarized, and its proxy is not carried, which is said once at WARNING."""
    pytest.importorskip("transformers")
    from evalstop_trl import Coordinator, MemoryStore, WorldFeedback
    from evalstop_trl.clients.embedded import EmbeddedClient
    from evalstop_trl.train.evaluator import Evaluator
    from evalstop_trl.train.tiny import build_model, build_tokenizer, save_tiny

    tok = build_tokenizer()
    client = EmbeddedClient(Coordinator(MemoryStore()))
    client.register_job("ext", "grpo")
    evaluator = Evaluator(client, lambda model, t: WorldFeedback([0.25, 0.75], proxy=0.9), root=tmp_path, idle_s=0.05)
    for step in (10, 20):
        snap = save_tiny(build_model(tok, hidden=16, layers=1, heads=2), tok, tmp_path / f"checkpoint-{step}")
        client.publish_snapshot("ext", step, str(snap))
        assert evaluator.evaluate(client.claim_eval("w", 5), "w") == pytest.approx(0.5)
    assert [(e.score, e.eval_n) for e in client.evals("ext")] == [(0.5, 2), (0.5, 2)]
    said = [r for r in caplog.records if "WorldFeedback.proxy" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"
