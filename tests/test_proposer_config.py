"""`ProposerConfig` (suffixspec/draft/config.py): every knob's check refuses bad values by name,
and a `Proposer` built from a config is the one built from the same knobs as keywords."""

import dataclasses
import math

import numpy as np
import pytest

from suffixspec import BadInputError, BadInputTypeError, Proposer, ProposerConfig
from suffixspec.draft.config import KNOBS

# knob -> values it refuses (type and range); every knob is listed (test_every_knob_has_bad_values)
BAD = {
    "max_nodes": [0, -1, 2.5, 64.0, True, "64", None],
    "max_depth": [-1, 1.5, False, "0"],
    "min_match": [0, 1.0, True],
    "min_prob": [-0.1, 1.5, math.nan, math.inf, True, "0.1", None],
    "match_prior": [-1.0, math.nan, -math.inf, False, "1"],
    "recency": [-0.5, math.inf, True],
    "max_children": [0, 4.0, True],
    "global_cache": [1, 0, "yes", None],
    "cache_tokens": [0, -5, 1.0, True],
    "cache_generations": [0, (1 << 16) + 1, 4.0],
    "max_session_tokens": [0, 1e6],
    "resync_tokens": [0, 1024.0],
    "threads": [0, 2.0, True],
    "match_levels": [0, 3.0],
    "vocab_size": [0, -5, True, 2.5, 2**31 + 1, "100"],
    "learn": [1, "no"],
    "prior_strength": [0, -1.0, math.nan, True],
    "session_strength": [0.0, math.inf],
    "calibration_strength": [0, "16"],
    "corpus_locality": [-1, math.nan, True, "4"],
    "recover": [-0.1, 1.5, math.nan, True, "0.3"],
    "cache_upkeep": ["later", "", 1, None],
}


def test_every_knob_has_bad_values():
    assert set(BAD) == set(KNOBS) == {f.name for f in dataclasses.fields(ProposerConfig)}


@pytest.mark.parametrize("name,bad", [(n, v) for n, values in BAD.items() for v in values])
def test_a_bad_value_is_refused_by_name(name, bad):
    with pytest.raises(BadInputError, match=rf"^{name}: expected .*, got {repr(bad).replace('(', '.').replace(')', '.')}"):
        ProposerConfig(**{name: bad})
    with pytest.raises(BadInputError, match=rf"^{name}: expected "):
        Proposer(**{name: bad})
    with pytest.raises(BadInputError, match=rf"^{name}: expected "):
        ProposerConfig().replace(**{name: bad})


def test_messages_say_what_is_expected():
    with pytest.raises(BadInputError, match=r"^max_nodes: expected a positive integer, got 0$"):
        ProposerConfig(max_nodes=0)
    with pytest.raises(BadInputError, match=r"^min_prob: expected a number in \[0, 1\], got 1.5$"):
        ProposerConfig(min_prob=1.5)
    with pytest.raises(BadInputError, match=r"^prior_strength: expected a number > 0, got 0$"):
        ProposerConfig(prior_strength=0)
    with pytest.raises(BadInputError, match=r"^vocab_size: expected None or an integer in \[1, 2147483648\], got 0$"):
        ProposerConfig(vocab_size=0)
    with pytest.raises(BadInputError, match=r"^learn: expected True or False, got 1$"):
        ProposerConfig(learn=1)
    with pytest.raises(BadInputError, match=r"^cache_upkeep: expected 'inline' or 'background', got 'later'$"):
        ProposerConfig(cache_upkeep="later")


def test_edges_and_numpy_values_are_accepted_as_python_values():
    cfg = ProposerConfig(max_nodes=np.int64(1), max_depth=0, min_prob=np.float32(1.0), match_prior=0, recency=np.int32(0),
                         global_cache=np.bool_(False), cache_generations=1 << 16, vocab_size=2**31, learn=False,
                         prior_strength=1e-9, cache_upkeep="background")
    assert type(cfg.max_nodes) is int and cfg.max_nodes == 1
    assert type(cfg.min_prob) is float and cfg.min_prob == 1.0
    assert type(cfg.match_prior) is float and type(cfg.recency) is float
    assert cfg.global_cache is False and cfg.vocab_size == 2**31
    assert ProposerConfig(vocab_size=None).vocab_size is None


def test_defaults_are_the_fields_defaults_and_the_config_is_frozen():
    cfg = ProposerConfig()
    for name, spec in KNOBS.items():
        assert getattr(cfg, name) == spec.default and spec.doc
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_nodes = 8
    assert cfg.replace(max_nodes=8).max_nodes == 8 and cfg.max_nodes == 64


def test_unknown_knobs_and_a_foreign_config_are_refused_by_name():
    with pytest.raises(TypeError, match="'max_node'"):
        Proposer(max_node=8)
    with pytest.raises(BadInputTypeError, match="'depth', 'nodes'"):
        ProposerConfig.of(None, {"nodes": 1, "depth": 2})
    with pytest.raises(BadInputTypeError, match="^config: expected a ProposerConfig or None, got dict"):
        Proposer(config={"max_nodes": 8})


def test_the_proposer_keeps_its_config():
    cfg = ProposerConfig(max_nodes=12, threads=2, resync_tokens=64, vocab_size=500, global_cache=False, learn=False)
    prop = Proposer(config=cfg)
    assert prop.config is cfg
    assert (prop.max_nodes, prop.threads, prop.resync_tokens, prop.vocab_size, prop.cache, prop.learn) == \
        (12, 2, 64, 500, None, False)
    assert Proposer(config=cfg, max_nodes=5).config == cfg.replace(max_nodes=5)  # keywords on top of the config
    assert Proposer().config == ProposerConfig()


def _drafts(prop, text, steps):
    """Every tree of a short decode of `text` (first 6 tokens the prompt), with the cache in use."""
    out = []
    for _ in range(2):  # a second request reads the first one's output from the cache
        s = prop.start(text[:6])
        for i in range(6, len(text), steps):
            tree = s.propose()
            out.append((tree.tokens.tolist(), tree.parents.tolist(), np.round(tree.scores, 12).tolist()))
            s.extend(text[i : i + steps])
        s.close()
    return out


def test_keywords_and_a_config_give_the_same_proposals():
    rng = np.random.default_rng(7)
    text = np.tile(rng.integers(0, 20, 40), 4)
    text[::17] = rng.integers(0, 20, text[::17].shape[0])
    knobs = dict(max_nodes=24, max_depth=6, min_prob=0.01, match_prior=2.0, recency=0.25, max_children=3,
                 cache_tokens=5000, match_levels=2, prior_strength=4.0, calibration_strength=8.0)
    by_keywords = _drafts(Proposer(**knobs), text, 3)
    by_config = _drafts(Proposer(config=ProposerConfig(**knobs)), text, 3)
    assert any(tokens for tokens, _, _ in by_keywords)
    assert by_keywords == by_config
    assert _drafts(Proposer(config=ProposerConfig(max_nodes=24), **{k: v for k, v in knobs.items() if k != "max_nodes"}),
                   text, 3) == by_keywords
