"""A run stopped and resumed (a new process: new proposers, new loop) makes the same choices as one that never
stopped: each request's random choices come from the run's seed, the generation and the parent, not from a proposer
object's history. Real SQLite; outcomes replayed from the candidate's settings; one evaluation at a time."""

from __future__ import annotations

import random

from appliance.proposers.tune import TuneProposer
from appliance.search.loop import Optimizer, OptimizeConfig, config_dict
from appliance.tasks import load_task
from tests.search.test_loop_faults import SOFTMAX, make_run
from tests.search.test_tuner_cache import settings_evaluator


def one_session(store, run_id, cfg, tmp_path):
    evaluator = settings_evaluator()
    evaluator.slots = 1
    Optimizer(store, run_id, load_task(SOFTMAX), [evaluator], [TuneProposer(random.Random(cfg.seed))], cfg,
              tmp_path / "work").run()


def sources(store, run_id) -> list[str]:
    return [c.source for c, _ in store.run_candidates(run_id)]


def test_a_resumed_run_proposes_what_an_uninterrupted_one_does(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    store_a, run_a, cfg_a, _ = make_run(tmp_path / "a", max_candidates=9, batch=2, islands=1)
    one_session(store_a, run_a, cfg_a, tmp_path / "a")
    store_b, run_b, cfg_b, _ = make_run(tmp_path / "b", max_candidates=4, batch=2, islands=1)
    one_session(store_b, run_b, cfg_b, tmp_path / "b")  # stops at 4 (its budget) ...
    resumed = OptimizeConfig.from_dict(store_b.get_run(run_b).config)
    resumed.max_candidates = 9
    store_b.update_run(run_b, config=config_dict(resumed))
    one_session(store_b, run_b, resumed, tmp_path / "b")  # ... and goes on to 9, from a fresh proposer
    assert len(sources(store_a, run_a)) >= 9
    assert sources(store_b, run_b)[:9] == sources(store_a, run_a)[:9]
