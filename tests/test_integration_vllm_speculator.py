"""SuffixSpecSpeculator (vLLM >= 0.34's registered method) against a stand-in of 0.34's calling
convention (`vllm034_standin`: the interface modules, written from the 0.34.0 source, as a fake
`vllm` package; `Runner` below: its request states and one step of its model runner as the
speculator sees them).

The runner keeps requests in request-state slots (`all_token_ids` rows holding prompt + output,
stale beyond `total_len`), schedules a subset of them each step in a new batch order (rows move;
unscheduled requests skip steps), prefills in chunks (num_sampled 0), verifies every row's full
draft width, preempts requests (their slot freed without `on_requests_finished`, re-added later in
another slot with prompt + output so far, `add_request` told) and finishes them
(`on_requests_finished` before the slot is freed). Dummy runs come between steps."""

import sys
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from vllm034_standin import write_fake_vllm

from suffixspec import Proposer

from support.vllm_requests import VOCAB, brute_best_path, copy_requests

K = 6


@pytest.fixture()
def speculator_module(tmp_path, monkeypatch):
    write_fake_vllm(tmp_path / "fake", "0.34.0")
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")] + ["suffixspec.integrations.vllm_speculator"]:
        monkeypatch.delitem(sys.modules, name, raising=False)
    import suffixspec.integrations.vllm_speculator as mod

    yield mod
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")] + ["suffixspec.integrations.vllm_speculator"]:
        sys.modules.pop(name, None)


def vllm_config(max_num_seqs=4, max_model_len=512, adaptive=False, **opts):
    spec = NS(num_speculative_tokens=K, speculator_options=opts or None, enable_adaptive_verification=adaptive)
    spec.speculator_config = NS(speculator_class="suffixspec.integrations.vllm_speculator.SuffixSpecSpeculator")
    return NS(speculative_config=spec, model_config=NS(max_model_len=max_model_len, get_vocab_size=lambda: VOCAB),
              scheduler_config=NS(max_num_seqs=max_num_seqs), additional_config=None)


class Runner:
    """0.34's request states and model-runner step, as a speculator sees them."""

    def __init__(self, spec, slots, max_model_len, rng):
        self.spec, self.rng = spec, rng
        self.req_states = NS(req_id_to_index={}, free_indices=list(range(slots)),
                             all_token_ids=NS(gpu=torch.from_numpy(rng.integers(0, VOCAB, (slots, max_model_len)).astype(np.int32))),
                             total_len=NS(gpu=torch.zeros(slots, dtype=torch.int32)))
        self.log = []  # (request id, content when proposing, draft width used, draft row)

    def add(self, req):
        """A new request, or a preempted one resumed: prompt + output so far, prefilled again."""
        slot = self.req_states.free_indices.pop()
        self.req_states.req_id_to_index[req.rid] = slot
        content = req.content
        self.req_states.all_token_ids.gpu[slot, : len(content)] = torch.tensor(content, dtype=torch.int32)
        self.req_states.total_len.gpu[slot] = len(content)
        req.prefill_left = max(req.prefill_left, 1)
        req.draft = []
        self.spec.add_request(slot)

    def remove(self, req, finished):
        if finished:
            self.spec.on_requests_finished({req.rid})
        slot = self.req_states.req_id_to_index.pop(req.rid)
        self.req_states.free_indices.append(slot)

    def step(self, reqs, width=K):
        order = [reqs[i] for i in self.rng.permutation(len(reqs))]
        slots = [self.req_states.req_id_to_index[r.rid] for r in order]
        num_sampled = np.zeros(len(order), np.int32)
        for i, (req, slot) in enumerate(zip(order, slots)):
            if req.prefill_left > 0:
                req.prefill_left -= 1
                if req.prefill_left > 0:
                    continue  # a partial prefill samples nothing
                out = req.answer[req.generated : req.generated + 1]
            else:
                acc = 0
                while acc < len(req.draft) and req.generated + acc < len(req.answer) and req.draft[acc] == req.answer[req.generated + acc]:
                    acc += 1
                out = req.answer[req.generated : req.generated + acc + 1]
            n = int(self.req_states.total_len.gpu[slot])
            self.req_states.all_token_ids.gpu[slot, n : n + len(out)] = torch.tensor(out, dtype=torch.int32)
            self.req_states.total_len.gpu[slot] = n + len(out)
            req.generated += len(out)
            num_sampled[i] = len(out)
        idx = np.array(slots, np.int64)
        batch = NS(num_reqs=len(order), idx_mapping=torch.from_numpy(idx), idx_mapping_np=idx, req_ids=[r.rid for r in order])
        drafts = self.spec.propose(batch, None, None, None, None, torch.from_numpy(num_sampled), torch.zeros(len(order)),
                                   None, None, None, None, num_speculative_tokens=width)
        assert drafts.shape == (len(order), K) and drafts.dtype == torch.int64
        for i, req in enumerate(order):
            row = drafts[i].tolist()
            if num_sampled[i]:
                n = int(self.req_states.total_len.gpu[slots[i]])
                self.log.append((req.rid, self.req_states.all_token_ids.gpu[slots[i], :n].tolist(), width, row))
            req.draft = row[:width]


def expected_row(content, spec, ref, width, max_model_len=512):
    """The best path of a fresh tree over `content` up to the width (no cost cut: every slot is
    verified), then the row's last token as filler."""
    s = ref.start(content)
    tree = s.propose(spec.max_nodes)
    s.close()
    path = brute_best_path(tree, min(width, max_model_len - len(content) - 1))
    return path + [content[-1]] * (K - len(path))


def drive(runner, requests, rng, steps=4000, preempt_prob=0.05, skip_prob=0.15, max_active=4):
    pending, active, preempted = list(requests), [], []
    for _ in range(steps):
        for req in [r for r in active if r.done]:
            runner.remove(req, finished=True)
            active.remove(req)
        while preempted and len(active) < max_active and rng.random() < 0.5:
            req = preempted.pop(0)
            req.prefill_left = int(rng.integers(1, 3))
            runner.add(req)
            active.append(req)
        while pending and len(active) < max_active:
            req = pending.pop(0)
            runner.add(req)
            active.append(req)
        if not active and not pending and not preempted:
            return
        for req in list(active):
            if req.prefill_left == 0 and rng.random() < preempt_prob:
                runner.remove(req, finished=False)
                active.remove(req)
                preempted.append(req)
        scheduled = [r for r in active if r.prefill_left > 0 or rng.random() >= skip_prob]
        if scheduled:
            runner.step(scheduled, width=int(rng.choice([K, K, K - 2])))
        if rng.random() < 0.2:
            n = runner.spec.stats["steps"]
            out = runner.spec.propose(NS(num_reqs=3, idx_mapping=torch.zeros(3, dtype=torch.int64)), None, None, None, None,
                                      torch.ones(3, dtype=torch.int32), torch.zeros(3), None, None, None, None, dummy_run=True)
            assert out.shape == (3, K) and runner.spec.stats["steps"] == n
    raise AssertionError("requests did not finish")


def test_drafts_are_the_best_paths_through_moves_skips_preemption_and_finishes(speculator_module):
    rng = np.random.default_rng(11)
    spec = speculator_module.SuffixSpecSpeculator(vllm_config(global_cache=False, learn=False, session_timeout_steps=50), "cpu",
                                                 req_states=None)
    runner = Runner(spec, slots=4, max_model_len=512, rng=rng)
    spec.req_states = runner.req_states
    requests = copy_requests(12, seed=12, answer_len=50)
    drive(runner, requests, rng)
    assert len(runner.log) > 100
    ref = Proposer(**spec.knobs)
    bad = [(rid, row, want) for rid, content, width, row in runner.log
           if row != (want := expected_row(content, spec, ref, width))]
    assert not bad, bad[:3]
    assert spec.stats["sessions_started"] == len(requests)  # preempted requests resumed their sessions
    assert spec.stats["sessions_refound"] > 0
    assert spec.stats["sessions_finished"] == len(requests) and spec.live_sessions == 0
    assert spec.stats["sessions_closed"] == len(requests)  # closed at their finish, none by a timeout


def test_construction_options_and_confidences(speculator_module):
    from suffixspec import BadInputError
    mod = speculator_module
    init = sys.modules["vllm.v1.worker.gpu.spec_decode"].init_speculator
    rs = NS(req_id_to_index={}, all_token_ids=NS(gpu=torch.zeros((2, 64), dtype=torch.int32)),
            total_len=NS(gpu=torch.zeros(2, dtype=torch.int32)))
    spec = init(vllm_config(max_num_seqs=2, max_model_len=64, adaptive=True, max_nodes=12), "cpu", rs)
    assert isinstance(spec, mod.SuffixSpecSpeculator) and spec.req_states is rs and spec.max_nodes == 12
    text = list(range(1, 20)) * 3
    rs.all_token_ids.gpu[0, :40] = torch.tensor(text[:40], dtype=torch.int32)
    rs.total_len.gpu[0] = 40
    batch = NS(num_reqs=1, idx_mapping=torch.zeros(1, dtype=torch.int64), idx_mapping_np=np.zeros(1, np.int64))
    out = spec.propose(batch, None, None, None, None, torch.ones(1, dtype=torch.int32), torch.zeros(1), None, None, None, None,
                       num_speculative_tokens=K)
    assert out[0].tolist() == text[40:40 + K]
    conf = spec.draft_token_confidence_probs[0].tolist()
    assert all(0 < c <= 1 for c in conf) and conf == sorted(conf, reverse=True)
    with pytest.raises(TypeError, match="unexpected argument 'bogus'"):
        spec.propose(batch, num_sampled=torch.ones(1), bogus=1)
    with pytest.raises(BadInputError, match="max_nodes: given both"):
        cfg = vllm_config(max_nodes=12)
        cfg.additional_config = {"suffixspec": {"max_nodes": 16}}
        mod.SuffixSpecSpeculator(cfg, "cpu", req_states=rs)
    with pytest.raises(BadInputError, match="unknown option 'nodes'"):
        mod.SuffixSpecSpeculator(vllm_config(nodes=3), "cpu", req_states=rs)
    assert spec in __import__("suffixspec.integrations.vllm", fromlist=["instances"]).instances()
