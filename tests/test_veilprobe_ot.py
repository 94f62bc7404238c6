"""IPOT and the GiLOT OT distance against an exact linear-programming solution."""

import numpy as np
import pytest
from scipy.optimize import linprog

from calibdcd.detectors.veilprobe.ot import cosine_cost, ipot, ot_distance, top_p_support


def exact_ot(a, b, cost):
    n, m = cost.shape
    rows = [np.kron(np.eye(n)[i], np.ones(m)) for i in range(n)]
    cols = [np.kron(np.ones(n), np.eye(m)[j]) for j in range(m)]
    res = linprog(
        cost.ravel(), A_eq=np.array(rows + cols), b_eq=np.concatenate([a, b]), bounds=(0, None)
    )
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("n,m,seed", [(2, 2, 0), (3, 4, 1), (5, 5, 2), (6, 3, 3), (7, 7, 4)])
def test_ipot_matches_linear_program(n, m, seed):
    rng = np.random.default_rng(seed)
    a = rng.random(n) + 0.05
    b = rng.random(m) + 0.05
    a /= a.sum()
    b /= b.sum()
    cost = cosine_cost(rng.normal(size=(n + m, 5)))[:n, n:]
    plan = ipot(a, b, cost, beta=2.0, iterations=1000, inner=1)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-6)
    np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-6)
    assert np.all(plan >= 0)
    exact = exact_ot(a, b, cost)
    # GiLOT's setting (1000 proximal steps) is close; IPOT converges to the exact optimum
    assert np.sum(plan * cost) == pytest.approx(exact, rel=1e-3)
    long_run = ipot(a, b, cost, beta=2.0, iterations=10_000, inner=1)
    assert np.sum(long_run * cost) == pytest.approx(exact, abs=1e-8)


def test_brute_force_on_permutation_problem():
    # uniform marginals on 3 points: an optimal plan is a permutation (Birkhoff); enumerate them
    import itertools

    rng = np.random.default_rng(7)
    cost = rng.random((3, 3))
    best = min(sum(cost[i, p[i]] for i in range(3)) / 3 for p in itertools.permutations(range(3)))
    u = np.full(3, 1 / 3)
    assert np.sum(ipot(u, u, cost) * cost) == pytest.approx(best, abs=1e-6)


def test_ot_distance_is_zero_for_identical_distributions_and_grows_with_shift():
    emb = np.eye(4)
    cost = cosine_cost(emb)
    p = np.array([0.7, 0.1, 0.1, 0.1])
    assert ot_distance(p, p, cost) == pytest.approx(0.0, abs=1e-8)
    near = np.array([0.5, 0.3, 0.1, 0.1])
    far = np.array([0.1, 0.1, 0.1, 0.7])
    assert 0 < ot_distance(p, near, cost) < ot_distance(p, far, cost)


def test_cosine_cost_and_support():
    emb = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    c = cosine_cost(emb)
    np.testing.assert_allclose(np.diag(c), 0, atol=1e-12)
    assert c[0, 1] == pytest.approx(0.0)
    assert c[0, 2] == pytest.approx(1.0)
    assert c[0, 3] == pytest.approx(2.0)
    p = np.array([0.9, 0.05, 0.05, 0.0])
    q = np.array([0.0, 0.0, 0.2, 0.8])
    np.testing.assert_array_equal(top_p_support(p, q, top_p=0.9, cap=10), [0, 2, 3])
    np.testing.assert_array_equal(top_p_support(p, q, top_p=0.99, cap=1), [0, 3])


def test_ipot_rejects_bad_inputs():
    with pytest.raises(ValueError, match="equal positive mass"):
        ipot(np.array([0.5, 0.5]), np.array([1.0, 1.0]), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        ipot(np.array([1.0]), np.array([1.0]), np.zeros((2, 2)))


def _official_ipot_distance(s1, s2, cost, beta=2.0, iterations=1000):
    """The official IPOT call (STAIR-BUPT/VeilProbe key_perturb/interpreter.py), restated in
    numpy: the restricted distributions normalised, 1e-4 added, no renormalisation, P = 1/n²,
    u = v = 1, one inner step; the distance is the last sum(P * C)."""
    a, b = s1 / s1.sum() + 1e-4, s2 / s2.sum() + 1e-4
    n = a.size
    v = np.ones(n)
    p = np.full((n, n), 1.0 / n**2)
    k = np.exp(-cost / beta)
    for _ in range(iterations):
        q = k * p
        u = a / (q @ v)
        v = b / (q.T @ u)
        p = u[:, None] * q * v[None, :]
    return float(np.sum(p * cost))


def test_official_marginals_match_the_official_ipot_call():
    rng = np.random.default_rng(4)
    emb = rng.normal(size=(12, 5))
    cost = cosine_cost(emb)
    p = rng.dirichlet(np.ones(12)) * 0.9  # restricted to a support: mass below 1
    q = rng.dirichlet(np.ones(12)) * 0.8
    want = _official_ipot_distance(p, q, cost, iterations=300)
    got = ot_distance(p, q, cost, iterations=300, marginals="official")
    assert got == pytest.approx(want, rel=1e-9)
    # the renormalised variant differs by the mass factor 1 + k·eps (and the order of eps)
    other = ot_distance(p, q, cost, iterations=300, marginals="renormalized")
    assert other != pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="marginals"):
        ot_distance(p, q, cost, marginals="both")


def test_presets_choose_official_attribution_and_cpu_keeps_its_keys():
    import dataclasses

    from calibdcd.detectors.veilprobe.config import VeilProbeConfig
    from calibdcd.keys import key_dict

    for name in ("official", "paper"):
        att = VeilProbeConfig.preset(name).perturb.attribution
        assert (att.proxy_bos, att.marginals) == (False, "official")
    cpu = VeilProbeConfig.cpu()
    assert (cpu.perturb.attribution.proxy_bos, cpu.perturb.attribution.marginals) == (
        True,
        "renormalized",
    )
    # the cpu preset behaves as before the two settings existed, so it keys as before: its key
    # material is asdict without them (its cached artefacts and features stay valid)
    full = dataclasses.asdict(cpu)
    for k in ("proxy_bos", "marginals"):
        full["perturb"]["attribution"].pop(k)
    assert key_dict(cpu) == full
    official = key_dict(VeilProbeConfig.official())["perturb"]["attribution"]
    assert official["proxy_bos"] is False and official["marginals"] == "official"


@pytest.mark.parametrize("marginals", ["official", "renormalized"])
def test_batched_device_distances_equal_the_numpy_solver(marginals):
    """ot_distances (torch, float64, supports of several sizes padded with zero-mass bins into
    batches) gives each pair's ot_distance (numpy, one pair at a time) to 1e-12, whatever the
    batching: one batch, or a byte budget that splits the pairs into several."""
    from calibdcd.detectors.veilprobe.ot import ot_distances

    rng = np.random.default_rng(7)
    vocab, h = 300, 16
    emb = rng.normal(size=(vocab, h)).astype(np.float32)  # as Proxy.embeddings
    pairs = []
    for size in (1, 5, 40, 17, 64, 3, 40):
        support = np.sort(rng.choice(vocab, size=size, replace=False))
        p, q = rng.dirichlet(np.ones(size)), rng.dirichlet(np.ones(size) * 0.3)
        pairs.append((p, q, support))
    kw = {"beta": 2.0, "iterations": 1000, "inner": 1, "eps": 1e-4, "marginals": marginals}
    want = np.array([ot_distance(p, q, cosine_cost(emb[s]), **kw) for p, q, s in pairs])
    assert want[0] == 0 and np.all(want[1:] > 0)  # one bin: nothing moves
    for budget in (2**31, 3 * 8 * 2 * 64**2):  # all at once; at most two of the largest
        got = ot_distances(pairs, emb, device="cpu", max_bytes=budget, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    assert ot_distances([], emb, device="cpu").shape == (0,)
